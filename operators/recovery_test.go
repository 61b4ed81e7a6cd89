package operators_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/epochflow/epochflow/connectors/flowtest"
	"github.com/epochflow/epochflow/dataflow"
	"github.com/epochflow/epochflow/operators"
	"github.com/epochflow/epochflow/recovery"
)

// totalLogic sums a key's values and emits the sum at EOF; its snapshot is the sum.
type totalLogic struct {
	operators.BaseLogic[int]
	sum int
}

func (l *totalLogic) OnItem(v int) ([]int, bool, error) { l.sum += v; return nil, false, nil }
func (l *totalLogic) OnEOF() ([]int, bool, error)       { return []int{l.sum}, true, nil }
func (l *totalLogic) Snapshot() int                     { return l.sum }

// recoverySinks are the outputs of the flow recoveryFlow builds.
type recoverySinks struct {
	total   *flowtest.Sink[dataflow.KV[int]]
	running *flowtest.Sink[dataflow.KV[int]]
	count   *flowtest.Sink[dataflow.KV[int]]
	collect *flowtest.Sink[dataflow.KV[[]int]]
	join    *flowtest.Sink[dataflow.KV[operators.JoinRow[int]]]
}

// recoveryFlow runs every kind of state this package keeps over script: a Stateful Logic, a
// StatefulMap, Count, a Collect that only emits at EOF and a final Join.
func recoveryFlow(script []flowtest.Event[KI], resumed *atomic.Int32) (*dataflow.Flow, recoverySinks) {
	f := dataflow.New("rec")
	in := operators.Input(f, "in", flowtest.NewSource(3, script).Input())
	s := recoverySinks{
		total: flowtest.NewSink[dataflow.KV[int]](), running: flowtest.NewSink[dataflow.KV[int]](),
		count: flowtest.NewSink[dataflow.KV[int]](), collect: flowtest.NewSink[dataflow.KV[[]int]](),
		join: flowtest.NewSink[dataflow.KV[operators.JoinRow[int]]](),
	}
	total := operators.Stateful("total", in, func(_ string, resume *int) (operators.Logic[int, int, int], error) {
		l := &totalLogic{}
		if resume != nil {
			resumed.Add(1)
			l.sum = *resume
		}
		return l, nil
	})
	operators.Output("total-out", total, s.total.Output())
	operators.Output("running-out", operators.StatefulMap("running", in, func(n, _ int) (int, int, bool) {
		return n + 1, n + 1, true
	}), s.running.Output())
	operators.Output("count-out", operators.Count("count", in, func(kv KI) string { return kv.Key }), s.count.Output())
	operators.Output("collect-out", operators.Collect("collect", in, 0, time.Hour), s.collect.Output())
	odd := operators.FilterValue("odd", in, func(v int) bool { return v%2 == 1 })
	even := operators.FilterValue("even", in, func(v int) bool { return v%2 == 0 })
	join := operators.Join("join", operators.JoinOptions{Insert: operators.InsertProduct, Emit: operators.EmitFinal}, odd, even)
	operators.Output("join-out", join, s.join.Output())
	return f, s
}

var quiet = slog.New(slog.DiscardHandler)

func crashAt(point string, n int) func(string) bool {
	var left atomic.Int64
	left.Store(int64(n))
	return func(p string) bool { return p == point && left.Add(-1) == 0 }
}

// TestRecovery crashes a flow of every stateful operator several times (with 1, 2 and 3
// workers), resumes it from the store each time, and checks that what it emits at the end is
// what a run without crashes emits: the state of every key was restored.
func TestRecovery(t *testing.T) {
	var script []flowtest.Event[KI]
	var items []KI
	for i := range 40 {
		kvs := []KI{kv(fmt.Sprint("k", i%3), i), kv(fmt.Sprint("k", i%4), 100+i)}
		items = append(items, kvs...)
		script = append(script, flowtest.Items(kvs...), flowtest.Pause[KI](3*time.Millisecond))
	}
	// What a run without crashes emits.
	var resumed atomic.Int32
	f, want := recoveryFlow(script, &resumed)
	mustRun(t, f, 2)

	dir := t.TempDir()
	ctx := context.Background()
	crashed := 0
	for i, point := range []string{"after-commit-record", "after-snapshot", "before-commit-calls", "after-commit-record"} {
		store, err := recovery.OpenSQLite(ctx, dir, recovery.SQLiteOptions{})
		if err != nil {
			t.Fatal(err)
		}
		f, _ := recoveryFlow(script, &resumed)
		err = dataflow.Run(ctx, f, dataflow.Options{Workers: 1 + i%3, EpochInterval: time.Millisecond,
			Recovery: store, CrashHook: crashAt(point, 3), Logger: quiet})
		store.Close()
		if err == nil {
			break
		}
		if !errors.Is(err, dataflow.ErrCrashed) {
			t.Fatalf("run %d: %v, want a crash", i, err)
		}
		crashed++
	}
	if crashed < 2 {
		t.Fatalf("only %d runs crashed; the test needs several", crashed)
	}
	store, err := recovery.OpenSQLite(ctx, dir, recovery.SQLiteOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	f, got := recoveryFlow(script, &resumed)
	if err := dataflow.Run(ctx, f, dataflow.Options{Workers: 3, EpochInterval: time.Millisecond, Recovery: store, Logger: quiet}); err != nil {
		t.Fatal(err)
	}
	if resumed.Load() == 0 {
		t.Fatal("no Logic was built from a snapshot")
	}
	same := func(name string, got, want map[string][]string) {
		t.Helper()
		if !maps.EqualFunc(got, want, slices.Equal) {
			t.Errorf("%s after crashes:\ngot  %v\nwant %v", name, got, want)
		}
	}
	same("Stateful", perKey(got.total.Items()), perKey(want.total.Items()))
	same("Count", perKey(got.count.Items()), perKey(want.count.Items()))
	same("Collect", perKey(got.collect.Items()), perKey(want.collect.Items()))
	rows := func(s *flowtest.Sink[dataflow.KV[operators.JoinRow[int]]]) map[string][]string {
		out := map[string][]string{}
		for _, kv := range s.Items() {
			out[kv.Key] = append(out[kv.Key], rowString(t, kv.Value))
		}
		return out
	}
	same("Join", rows(got.join), rows(want.join))
	// A StatefulMap's last output per key is the count of all the key's items.
	last := func(s *flowtest.Sink[dataflow.KV[int]]) map[string][]string {
		out := map[string][]string{}
		for k, vs := range perKey(s.Items()) {
			out[k] = vs[len(vs)-1:]
		}
		return out
	}
	same("StatefulMap", last(got.running), last(want.running))
	if len(items) != 80 || len(perKey(want.count.Items())) != 4 {
		t.Fatalf("bad test input")
	}
}

// TestRecoveryRefusesOpaqueState checks that a StatefulMap whose state the default codec
// cannot store fails to start with recovery, naming the step.
func TestRecoveryRefusesOpaqueState(t *testing.T) {
	type opaque struct{ n int }
	f, in := keyedFlow(1, flowtest.Items(kv("a", 1)))
	out := operators.StatefulMap("count", in, func(s opaque, _ int) (opaque, int, bool) { s.n++; return s, s.n, true })
	operators.Output("out", out, flowtest.NewSink[KI]().Output())
	store, err := recovery.OpenSQLite(context.Background(), t.TempDir(), recovery.SQLiteOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	err = dataflow.Run(context.Background(), f, dataflow.Options{Recovery: store, Logger: quiet})
	var se *dataflow.StepError
	if !errors.As(err, &se) || se.Step != "t.count" {
		t.Fatalf("got %v, want an error of step t.count", err)
	}
}

// TestCollectTimeoutSurvivesResume: a Collect's pending timeout (a processing-time timer) is
// part of the committed state. Run 1 reads the items and crashes once an epoch that holds
// them is committed, before the timeout; run 2 resumes with no new input (its source stays
// idle) and must emit each key's list when the timeout comes, once, before it is stopped;
// run 3 ends its input at once and must emit nothing more (the lists' state is gone).
func TestCollectTimeoutSurvivesResume(t *testing.T) {
	const timeout = time.Second
	items := []KI{kv("a", 1), kv("b", 2), kv("a", 3)}
	want := map[string][]string{"a": {"[1 3]"}, "b": {"[2]"}}
	eachWorkers(t, func(t *testing.T, workers int) {
		sink := flowtest.NewTwoPhaseSink[dataflow.KV[[]int]](nil)
		dir := t.TempDir()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		// run runs the flow over src on the store; emitted sees every list Collect emits.
		run := func(src *flowtest.Source[KI], o dataflow.Options, emitted func(dataflow.KV[[]int])) error {
			store, err := recovery.OpenSQLite(ctx, dir, recovery.SQLiteOptions{})
			if err != nil {
				t.Fatal(err)
			}
			defer store.Close()
			f := dataflow.New("t")
			lists := operators.Collect("collect", operators.Input(f, "in", src.Input()), 0, timeout)
			operators.Output("out", operators.Inspect("emitted", lists, emitted), sink.Output())
			o.Workers, o.EpochInterval, o.Recovery, o.Logger = workers, 5*time.Millisecond, store, quiet
			return dataflow.Run(ctx, f, o)
		}
		idle := func() *flowtest.Source[KI] {
			return flowtest.NewSource(len(items), []flowtest.Event[KI]{flowtest.Items(items...), flowtest.Pause[KI](time.Hour)})
		}

		// Run 1: crash at the first commit after one whose source position is past the items
		// (the source's Commit comes after the commit record).
		start := time.Now()
		src := idle()
		crash := func(point string) bool {
			c := src.Commits()["part-0"]
			return point == "after-commit-record" && len(c) > 0 && (c[len(c)-1].Event > 0 || c[len(c)-1].Item == len(items))
		}
		var lists atomic.Int32
		count := func(dataflow.KV[[]int]) { lists.Add(1) }
		if err := run(src, dataflow.Options{CrashHook: crash}, count); !errors.Is(err, dataflow.ErrCrashed) {
			t.Fatalf("run 1: %v, want a crash", err)
		}
		if n := lists.Load(); n > 0 {
			t.Fatalf("run 1 emitted %d lists in %v: the timeout came before the crash (a slow machine?)", n, time.Since(start))
		}

		// Run 2: no new input; stopped once both lists are out.
		lists.Store(0)
		stop := make(chan struct{})
		var once sync.Once
		var firedAt atomic.Int64
		err := run(idle(), dataflow.Options{Stop: stop}, func(kv dataflow.KV[[]int]) {
			if lists.Add(1) == int32(len(want)) {
				firedAt.Store(time.Now().UnixNano())
				once.Do(func() { close(stop) })
			}
		})
		if err != nil {
			t.Fatalf("run 2: %v (%d lists emitted: a timer lost in the resume never fires)", err, lists.Load())
		}
		if n := lists.Load(); n != int32(len(want)) {
			t.Fatalf("run 2 emitted %d lists, want %d", n, len(want))
		}
		if at := time.Unix(0, firedAt.Load()); at.Before(start.Add(timeout)) {
			t.Errorf("the lists came %v after run 1 started, before the timeout of %v", at.Sub(start), timeout)
		}
		if got := perKey(sink.Visible()); !maps.EqualFunc(got, want, slices.Equal) {
			t.Fatalf("after run 2: %v, want %v", got, want)
		}

		// Run 3: the input ends; an EOF would emit any list still held.
		lists.Store(0)
		ended := flowtest.NewSource(len(items), []flowtest.Event[KI]{flowtest.Items(items...), flowtest.EOF[KI]()})
		if err := run(ended, dataflow.Options{}, count); err != nil {
			t.Fatalf("run 3: %v", err)
		}
		if got := perKey(sink.Visible()); lists.Load() != 0 || !maps.EqualFunc(got, want, slices.Equal) {
			t.Fatalf("after run 3 (%d lists emitted): %v, want %v", lists.Load(), got, want)
		}
	})
}
