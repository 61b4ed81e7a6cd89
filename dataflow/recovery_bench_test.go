package dataflow_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/epochflow/epochflow/dataflow"
	"github.com/epochflow/epochflow/operators"
	"github.com/epochflow/epochflow/recovery"
)

// BenchmarkResume1MKeys measures how long a flow takes to resume from a store whose stateful
// step holds 1,000,000 keys: open the store, load and route every key, decode it, run (the
// source has nothing more) and commit. It reports seconds per resume.
func BenchmarkResume1MKeys(b *testing.B) {
	const keys = 1_000_000
	dir := b.TempDir()
	build := func() *dataflow.Flow {
		f := dataflow.New("resume")
		in := operators.Input(f, "in", dataflow.FromDynamic[int](emptySource{}))
		kept := dataflow.Stateful("state", operators.KeyOn("key", in, func(v int) string { return fmt.Sprint(v) }),
			dataflow.StatefulLogic[int, int, int]{
				OnItem: func(_ string, s *int, _ bool, v int, _ *dataflow.Emitter[int]) (bool, error) {
					*s += v
					return true, nil
				},
			})
		operators.Output("out", kept, dataflow.ToDynamic[dataflow.KV[int]](&discard[dataflow.KV[int]]{}))
		return f
	}
	store, err := recovery.OpenSQLite(context.Background(), dir, recovery.SQLiteOptions{})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	if _, err := store.Begin(ctx, recovery.Execution{Flow: "resume", Steps: build().StepIDs(), Workers: 1}); err != nil {
		b.Fatal(err)
	}
	snaps := make([]recovery.Snapshot, keys)
	for i := range snaps {
		snaps[i] = recovery.Snapshot{Step: "resume.state", Key: fmt.Sprintf("key-%07d", i), Epoch: 1,
			State: binary.AppendVarint(nil, int64(i))}
	}
	if err := store.Commit(ctx, recovery.Epoch{Epoch: 1, Frontiers: []uint64{1}, Snapshots: snaps}); err != nil {
		b.Fatal(err)
	}
	store.Close()
	for b.Loop() {
		store, err := recovery.OpenSQLite(ctx, dir, recovery.SQLiteOptions{})
		if err != nil {
			b.Fatal(err)
		}
		err = dataflow.Run(ctx, build(), dataflow.Options{Workers: 2, Recovery: store})
		store.Close()
		if err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(b.Elapsed().Seconds()/float64(b.N), "s/resume")
}

type emptySource struct{}

func (emptySource) Build(context.Context, dataflow.Worker) (dataflow.WorkerSource[int], error) {
	return emptySource{}, nil
}
func (emptySource) Next(context.Context) ([]int, error) { return nil, io.EOF }
func (emptySource) Close() error                        { return nil }

// latencySource yields a batch every few hundred microseconds for a while, and records when
// each of its snapshots was taken (the end of an epoch on its worker) and when Commit arrived
// for it.
type latencySource struct {
	mu      sync.Mutex
	taken   map[uint64]time.Time
	latency []time.Duration
	items   int
}

func (s *latencySource) Parts(context.Context) ([]string, error) { return []string{"p0", "p1"}, nil }
func (s *latencySource) Build(context.Context, string, *uint64) (dataflow.StatefulSource[int, uint64], error) {
	return &latencyPart{s: s}, nil
}

type latencyPart struct {
	s    *latencySource
	seq  uint64
	sent int
}

func (p *latencyPart) Next(context.Context) ([]int, error) {
	if p.sent >= p.s.items {
		return nil, io.EOF
	}
	p.sent += 100
	out := make([]int, 100)
	for i := range out {
		out[i] = p.sent + i
	}
	return out, nil
}

func (p *latencyPart) NextAwake() time.Time { return time.Now().Add(500 * time.Microsecond) }
func (p *latencyPart) Close() error         { return nil }
func (p *latencyPart) Snapshot() uint64 {
	p.seq++
	p.s.mu.Lock()
	p.s.taken[p.seq] = time.Now()
	p.s.mu.Unlock()
	return p.seq
}
func (p *latencyPart) Commit(_ context.Context, seq uint64) error {
	now := time.Now()
	p.s.mu.Lock()
	if t, ok := p.s.taken[seq]; ok {
		p.s.latency = append(p.s.latency, now.Sub(t))
		delete(p.s.taken, seq)
	}
	p.s.mu.Unlock()
	return nil
}

// BenchmarkEpochEndToCommit measures, with the SQLite store and 20 ms epochs, the time from a
// source partition's snapshot (its epoch's end on its worker) to the Commit of that snapshot,
// over a flow with a stateful step that changes 10 or 1,000 keys an epoch (each changed key
// is a row the store writes in the epoch's transaction). It reports p50 and p99 in
// milliseconds.
func BenchmarkEpochEndToCommit(b *testing.B) {
	for _, keys := range []int{10, 1000} {
		b.Run(fmt.Sprint("keys=", keys), func(b *testing.B) { benchEpochEndToCommit(b, keys) })
	}
}

func benchEpochEndToCommit(b *testing.B, keys int) {
	var all []time.Duration
	for b.Loop() {
		store, err := recovery.OpenSQLite(context.Background(), b.TempDir(), recovery.SQLiteOptions{})
		if err != nil {
			b.Fatal(err)
		}
		src := &latencySource{taken: map[uint64]time.Time{}, items: 200_000}
		f := dataflow.New("latency")
		in := operators.Input(f, "in", dataflow.FromPartitioned[int, uint64](src))
		sums := operators.StatefulMap("sum", operators.KeyOn("key", in, func(v int) string { return fmt.Sprint(v % keys) }),
			func(s, v int) (int, int, bool) { return s + v, s + v, true })
		operators.Output("out", sums, dataflow.ToDynamic[dataflow.KV[int]](&discard[dataflow.KV[int]]{}))
		err = dataflow.Run(context.Background(), f, dataflow.Options{Workers: 2, EpochInterval: 20 * time.Millisecond, Recovery: store})
		store.Close()
		if err != nil {
			b.Fatal(err)
		}
		all = append(all, src.latency...)
	}
	slices.Sort(all)
	if len(all) == 0 {
		b.Fatal("no commits measured")
	}
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	b.ReportMetric(ms(all[len(all)/2]), "p50-ms")
	b.ReportMetric(ms(all[len(all)*99/100]), "p99-ms")
	b.ReportMetric(float64(len(all))/float64(b.N), "commits/run")
}
