package dataflow_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/epochflow/epochflow/connectors/flowtest"
	"github.com/epochflow/epochflow/dataflow"
	"github.com/epochflow/epochflow/recovery"
)

func openStore(t *testing.T, dir string) *recovery.SQLiteStore {
	t.Helper()
	s, err := recovery.OpenSQLite(context.Background(), dir, recovery.SQLiteOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// crashAt returns a crash hook that fires the nth time point is reached.
func crashAt(point string, n int) func(string) bool {
	var left atomic.Int64
	left.Store(int64(n))
	return func(p string) bool {
		return p == point && left.Add(-1) == 0
	}
}

// A stateful flow that crashes after a commit resumes from the store: its sums come out as if
// it had never crashed.
func TestResumeAfterCrashKeepsState(t *testing.T) {
	dir := t.TempDir()
	var script []flowtest.Event[int]
	want := map[string]int{}
	for i := range 50 {
		script = append(script, flowtest.Items(i, i+100), flowtest.Pause[int](2*time.Millisecond))
		want[fmt.Sprint(i%3)] += i
		want[fmt.Sprint((i+100)%3)] += i + 100
	}
	build := func(sink *flowtest.Sink[dataflow.KV[int]]) *dataflow.Flow {
		f := dataflow.New("resume")
		in := dataflow.Input(f, "in", flowtest.NewSource(2, script).Input())
		sums := dataflow.Stateful("sum", dataflow.Transform("key", in, keyed), sum())
		dataflow.Output("out", sums, sink.Output())
		return f
	}
	ctx := context.Background()
	points := []string{"after-snapshot", "before-commit-record", "after-commit-record", "before-commit-calls", "inside-commit"}
	crashed := 0
	for i, point := range points {
		store := openStore(t, dir)
		err := dataflow.Run(ctx, build(flowtest.NewSink[dataflow.KV[int]]()), dataflow.Options{
			Workers: 1 + i%3, EpochInterval: time.Millisecond, Recovery: store, CrashHook: crashAt(point, 2)})
		store.Close()
		if err == nil {
			break // finished before the crash point was reached twice
		}
		if !errors.Is(err, dataflow.ErrCrashed) {
			t.Fatalf("run %d: %v, want a crash", i, err)
		}
		crashed++
	}
	if crashed < 2 {
		t.Fatalf("only %d runs crashed; the test needs several", crashed)
	}
	store := openStore(t, dir)
	defer store.Close()
	sink := flowtest.NewSink[dataflow.KV[int]]()
	if err := dataflow.Run(ctx, build(sink), dataflow.Options{Workers: 2, EpochInterval: time.Millisecond, Recovery: store}); err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	for _, kv := range sink.Items() {
		got[kv.Key] += kv.Value
	}
	keys := func(m map[string]int) []string {
		var k []string
		for key, v := range m {
			k = append(k, fmt.Sprint(key, "=", v))
		}
		sort.Strings(k)
		return k
	}
	if fmt.Sprint(keys(got)) != fmt.Sprint(keys(want)) {
		t.Fatalf("after crashes got %v, want %v", keys(got), keys(want))
	}
}

// recordingStore wraps a store and remembers the newest epoch it has durably recorded.
type recordingStore struct {
	recovery.Store
	mu        sync.Mutex
	committed uint64
}

func newRecordingStore(t *testing.T, s recovery.Store) *recordingStore {
	c, err := s.Committed(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return &recordingStore{Store: s, committed: c.Epoch}
}

func (s *recordingStore) Commit(ctx context.Context, e recovery.Epoch) error {
	if err := s.Store.Commit(ctx, e); err != nil {
		return err
	}
	s.mu.Lock()
	s.committed = e.Epoch
	s.mu.Unlock()
	return nil
}

func (s *recordingStore) recorded() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.committed
}

// epochSource has one partition per worker slot; its snapshot is the number of epochs it has
// seen end, which on a fresh run is the epoch itself, so Commit can check the store.
type epochSource struct {
	parts, items int
	store        *recordingStore
	violations   chan string
}

func (s *epochSource) Parts(context.Context) ([]string, error) {
	var p []string
	for i := range s.parts {
		p = append(p, fmt.Sprint("p", i))
	}
	return p, nil
}

func (s *epochSource) Build(_ context.Context, part string, _ *uint64) (dataflow.StatefulSource[int, uint64], error) {
	return &epochPart{s: s, part: part}, nil
}

type epochPart struct {
	s      *epochSource
	part   string
	next   int
	epochs uint64
	last   time.Time
}

func (p *epochPart) Next(context.Context) ([]int, error) {
	if p.next >= p.s.items {
		return nil, io.EOF
	}
	if time.Since(p.last) < 200*time.Microsecond {
		return nil, nil
	}
	p.last = time.Now()
	p.next++
	return []int{p.next}, nil
}

func (p *epochPart) NextAwake() time.Time { return p.last.Add(200 * time.Microsecond) }
func (p *epochPart) Snapshot() uint64     { p.epochs++; return p.epochs }
func (p *epochPart) Close() error         { return nil }
func (p *epochPart) Commit(_ context.Context, epoch uint64) error {
	if rec := p.s.store.recorded(); rec < epoch {
		p.s.violations <- fmt.Sprintf("partition %s: Commit of epoch %d when the store had recorded only %d", p.part, epoch, rec)
	}
	return nil
}

// epochSink checks the same for a sink partition.
type epochSink struct {
	store      *recordingStore
	violations chan string
	epochs     uint64
}

func (s *epochSink) Parts(context.Context) ([]string, error) { return []string{"a", "b", "c"}, nil }
func (s *epochSink) PartFor(v dataflow.KV[int], n int) int {
	return int(dataflow.KeyHash(v.Key) % uint64(n))
}
func (s *epochSink) Build(context.Context, string, *uint64) (dataflow.StatefulSink[dataflow.KV[int], uint64], error) {
	return &epochSink{store: s.store, violations: s.violations}, nil
}
func (s *epochSink) Write(context.Context, []dataflow.KV[int]) error { return nil }
func (s *epochSink) Snapshot() (uint64, error)                       { s.epochs++; return s.epochs, nil }
func (s *epochSink) Close() error                                    { return nil }
func (s *epochSink) Commit(_ context.Context, epoch uint64) error {
	if rec := s.store.recorded(); rec < epoch {
		s.violations <- fmt.Sprintf("sink: Commit of epoch %d when the store had recorded only %d", epoch, rec)
	}
	return nil
}

// Commit for epoch e is never called, on any worker, before the store has durably recorded e.
func TestCommitOnlyAfterTheStoreRecordedTheEpoch(t *testing.T) {
	for workers := 1; workers <= 8; workers++ {
		t.Run(fmt.Sprint("workers=", workers), func(t *testing.T) {
			store := newRecordingStore(t, openStore(t, t.TempDir()))
			defer store.Close()
			violations := make(chan string, 1000)
			src := &epochSource{parts: 8, items: 60, store: store, violations: violations}
			f := dataflow.New("commits")
			in := dataflow.Input(f, "in", dataflow.FromPartitioned[int, uint64](src))
			sums := dataflow.Stateful("sum", dataflow.Transform("key", in, keyed), sum())
			dataflow.Output("out", dataflow.Stateful("again", sums, sum()),
				dataflow.ToPartitioned[dataflow.KV[int], uint64](&epochSink{store: store, violations: violations}))
			err := dataflow.Run(context.Background(), f, dataflow.Options{Workers: workers, EpochInterval: time.Millisecond, Recovery: store})
			if err != nil {
				t.Fatal(err)
			}
			close(violations)
			for v := range violations {
				t.Error(v)
			}
			if store.recorded() < 3 {
				t.Errorf("only %d epochs were committed; the test needs several", store.recorded())
			}
		})
	}
}

// With the test queue (acked only in Commit) and the two-phase sink, crashed at random points
// and restarted until it finishes: every message is visible in the sink exactly once, and no
// message is acked before the epoch that carried it is committed (its output visible).
func TestQueueToTwoPhaseSinkSurvivesCrashes(t *testing.T) {
	points := []string{"after-snapshot", "before-commit-record", "after-commit-record", "before-commit-calls", "inside-commit"}
	rapid.Check(t, func(rt *rapid.T) {
		n := rapid.IntRange(1, 400).Draw(rt, "messages")
		q := flowtest.NewQueue(time.Hour)
		var bodies []string
		for i := range n {
			bodies = append(bodies, fmt.Sprint("m", i))
		}
		q.Send(bodies...)
		sink := flowtest.NewTwoPhaseSink(func(s string) string { return s })
		var mu sync.Mutex
		var early []string
		var store *recordingStore
		// An ack is allowed once the message's output is durable: visible, or prepared in a
		// transaction of an epoch the store has recorded as committed.
		q.OnAck = func(m flowtest.Message) {
			if !sink.Durable(func(s string) bool { return s == m.Body }, store.recorded()) {
				mu.Lock()
				early = append(early, m.Body)
				mu.Unlock()
			}
		}
		dir := t.TempDir()
		crashes := rapid.IntRange(0, 6).Draw(rt, "crashes")
		for run := 0; ; run++ {
			f := dataflow.New("queue")
			in := dataflow.Input(f, "in", q.Input(rapid.IntRange(1, 50).Draw(rt, "batch")))
			bodies := dataflow.Transform("body", in, func(b []flowtest.Message) ([]string, error) {
				out := make([]string, len(b))
				for i, m := range b {
					out[i] = m.Body
				}
				return out, nil
			})
			dataflow.Output("out", dataflow.Redistribute("spread", bodies), sink.Output())
			store = newRecordingStore(t, openStore(t, dir))
			opts := dataflow.Options{
				Workers:       rapid.IntRange(1, 4).Draw(rt, "workers"),
				EpochInterval: time.Duration(rapid.IntRange(1, 3).Draw(rt, "interval_ms")) * time.Millisecond,
				Recovery:      store,
			}
			if run < crashes {
				opts.CrashHook = crashAt(rapid.SampledFrom(points).Draw(rt, "point"), rapid.IntRange(1, 20).Draw(rt, "nth"))
			}
			// The queue drains: the flow's input never ends, so stop it once it is empty.
			stop := make(chan struct{})
			opts.Stop = stop
			go func() {
				for q.Unacked() > 0 {
					time.Sleep(time.Millisecond)
				}
				close(stop)
			}()
			err := dataflow.Run(context.Background(), f, opts)
			opts.Recovery.Close()
			if err == nil {
				break
			}
			if !errors.Is(err, dataflow.ErrCrashed) {
				rt.Fatalf("run %d: %v", run, err)
			}
			q.ExpireAll() // the crashed consumer's messages come back
		}
		got := sink.Visible()
		sort.Strings(got)
		sort.Strings(bodies)
		if fmt.Sprint(got) != fmt.Sprint(bodies) {
			rt.Fatalf("visible %d items, want each of %d once", len(got), len(bodies))
		}
		if len(early) > 0 {
			rt.Fatalf("acked before their output was committed: %v", early)
		}
		if sink.Prepared() != 0 {
			rt.Fatalf("%d prepared transactions left", sink.Prepared())
		}
	})
}

// fileBytes reads every file of a directory, to check that a refused start wrote nothing.
func fileBytes(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		out[e.Name()] = string(b)
	}
	return out
}

// A store written by another flow, or by a flow with other stateful steps, is refused with a
// message that says which and what to do, and nothing in it changes.
func TestRefusesAStoreOfAnotherFlow(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	// A running sum that keeps its state at EOF, so that the store holds it.
	keep := sum()
	keep.OnEOF = nil
	sumFlow := func(name, step string) *dataflow.Flow {
		f := dataflow.New(name)
		in := dataflow.Input(f, "in", flowtest.List(1, 2, 3, 4))
		dataflow.Output("out", dataflow.Stateful(step, dataflow.Transform("key", in, keyed), keep),
			flowtest.NewSink[dataflow.KV[int]]().Output())
		return f
	}
	store := openStore(t, dir)
	if err := dataflow.Run(ctx, sumFlow("first", "sum"), dataflow.Options{Recovery: store}); err != nil {
		t.Fatal(err)
	}
	store.Close()
	before := fileBytes(t, dir)

	for _, c := range []struct {
		flow *dataflow.Flow
		want []string
	}{
		{sumFlow("second", "sum"), []string{`"second"`, `"first"`}},
		{sumFlow("first", "total"), []string{`"first.sum"`, "another flow or by another version", "new recovery directory"}},
	} {
		store := openStore(t, dir)
		err := dataflow.Run(ctx, c.flow, dataflow.Options{Recovery: store})
		store.Close()
		if err == nil {
			t.Fatalf("flow %q started on a store of another flow", c.flow.Name())
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("error %q does not say %s", err, w)
			}
		}
	}
	if after := fileBytes(t, dir); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Error("a refused start changed the store's files")
	}
}

// perWorker lists one partition per worker, like a queue consumer; with consumers set it
// declares them ConsumerPartitions.
type perWorker struct{}

func (s perWorker) Parts(ctx context.Context) ([]string, error) {
	var p []string
	for i := range dataflow.WorkerCount(ctx) {
		p = append(p, fmt.Sprint("consumer-", i))
	}
	return p, nil
}

func (s perWorker) Build(context.Context, string, *int) (dataflow.StatefulSource[int, int], error) {
	return endedPart{}, nil
}

// endedPart is a partition with nothing to read.
type endedPart struct{}

func (endedPart) Next(context.Context) ([]int, error) { return nil, io.EOF }
func (endedPart) Snapshot() int                       { return 7 }
func (endedPart) Commit(context.Context, int) error   { return nil }
func (endedPart) Close() error                        { return nil }

type consumers struct{ perWorker }

func (consumers) ConsumerPartitions() {}

type endedParts struct{ perWorker }

// A source whose partitions are consumers resumes with fewer workers (the state of the
// partitions it no longer lists is dropped); one whose partitions are data is refused.
func TestConsumerPartitionsFollowTheWorkers(t *testing.T) {
	for _, c := range []struct {
		name    string
		src     dataflow.PartitionedSource[int, int]
		refused bool
	}{{"consumers", consumers{}, false}, {"data", endedParts{perWorker{}}, true}} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			run := func(workers int) error {
				store := openStore(t, dir)
				defer store.Close()
				f := dataflow.New("consumers")
				in := dataflow.Input(f, "in", dataflow.FromPartitioned(c.src))
				dataflow.Output("out", in, flowtest.NewSink[int]().Output())
				return dataflow.Run(context.Background(), f, dataflow.Options{Workers: workers, Recovery: store})
			}
			if err := run(3); err != nil {
				t.Fatal(err)
			}
			err := run(1)
			if c.refused != (err != nil) {
				t.Fatalf("resume with 1 worker: %v", err)
			}
			if c.refused && !strings.Contains(err.Error(), `"consumer-`) {
				t.Errorf("the refusal %q does not name the partition", err)
			}
			if !c.refused {
				store := openStore(t, dir)
				defer store.Close()
				var keys []string
				store.Load(context.Background(), "consumers.in", func(k string, _ uint64, _ []byte) error {
					keys = append(keys, k)
					return nil
				})
				if !slices.Equal(keys, []string{"consumer-0"}) {
					t.Errorf("the store keeps partitions %v, want only consumer-0", keys)
				}
			}
		})
	}
}
