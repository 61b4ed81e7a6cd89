package dataflow_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/epochflow/epochflow/dataflow"
	"github.com/epochflow/epochflow/operators"
	"github.com/epochflow/epochflow/recovery"
)

// BenchmarkResume1MKeys measures how long a flow takes to resume from a store whose stateful
// step holds 1,000,000 keys: open the store (SQLite's quick check of the whole file, and the
// checks of its small tables), load every key (Load checks every chunk's checksum and the
// step's totals as it reads them; see recovery/verify.go), route and decode
// it, run (the source has nothing more) and commit. It reports seconds per resume, and the
// CPU seconds the process used per resume where /proc/self/stat tells them (less sensitive
// than the time to other processes on a busy machine; Load reads and merges the runs in a
// goroutine beside the decoding, so with a free core the time is less than the CPU time).
//
// The store is built once per sub-benchmark, outside the timing:
//   - after=1: one commit of every key, a single run, which Load reads without a merge;
//   - after=100: a commit of every key, then 99 commits of a tenth of the keys each (every
//     key rewritten about ten times), which leave the step in several runs (the binary
//     counter of compaction's plan) that Load merges. Commits of every key would not: without
//     a backup window, each merges the step into one run again.
//
// EPOCHFLOW_BENCH_KEYS (1,000,000) makes the store smaller, to check that the benchmark runs.
func BenchmarkResume1MKeys(b *testing.B) {
	keys := benchSize(b, "EPOCHFLOW_BENCH_KEYS", 1_000_000)
	for _, commits := range []int{1, 100} {
		b.Run(fmt.Sprint("after=", commits), func(b *testing.B) { benchResume(b, keys, commits) })
	}
}

// resumeFlow is the flow BenchmarkResume1MKeys resumes: an empty source, and a stateful step
// "resume.state" whose state is an int per key.
func resumeFlow() *dataflow.Flow {
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

// buildResumeStore creates the store of resumeFlow in dir with keys keys of its stateful
// step: commit 1 writes every key, and each of commits 2 to commits a tenth of them (the
// next tenth, round the keys), each state an int64 varint as the engine's codec writes it.
func buildResumeStore(b *testing.B, dir string, keys, commits int) {
	b.Helper()
	ctx := context.Background()
	store, err := recovery.OpenSQLite(ctx, dir, recovery.SQLiteOptions{})
	if err != nil {
		b.Fatal(err)
	}
	defer store.Close()
	if _, err := store.Begin(ctx, recovery.Execution{Flow: "resume", Steps: resumeFlow().StepIDs(), Workers: 1}); err != nil {
		b.Fatal(err)
	}
	names := make([]string, keys)
	for i := range names {
		names[i] = fmt.Sprintf("key-%07d", i)
	}
	tenth := max(keys/10, 1)
	var snaps []recovery.Snapshot
	for e := 1; e <= commits; e++ {
		snaps = snaps[:0]
		lo, n := 0, keys
		if e > 1 {
			lo, n = (e-2)*tenth, tenth
		}
		for j := range n {
			i := (lo + j) % keys
			snaps = append(snaps, recovery.Snapshot{Step: "resume.state", Key: names[i], Epoch: uint64(e),
				State: binary.AppendVarint(nil, int64(i+e))})
		}
		if err := store.Commit(ctx, recovery.Epoch{Epoch: uint64(e), Frontiers: []uint64{uint64(e)}, Snapshots: snaps}); err != nil {
			b.Fatal(err)
		}
	}
}

// resumeShape returns what the store in dir holds of the step "resume.state".
func resumeShape(b *testing.B, dir string) recovery.StepInfo {
	b.Helper()
	store, err := recovery.OpenSQLite(context.Background(), dir, recovery.SQLiteOptions{ReadOnly: true})
	if err != nil {
		b.Fatal(err)
	}
	defer store.Close()
	steps, err := store.Steps(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	for _, st := range steps {
		if st.Step == "resume.state" {
			return st
		}
	}
	b.Fatalf("the store holds no state of resume.state: %+v", steps)
	return recovery.StepInfo{}
}

// benchResume is BenchmarkResume1MKeys over a store of keys keys built by commits commits.
func benchResume(b *testing.B, keys, commits int) {
	dir := b.TempDir()
	buildResumeStore(b, dir, keys, commits)
	// Without a backup window, a key has more than one snapshot only in different runs.
	shape := resumeShape(b, dir)
	if shape.Keys != keys || commits > 1 && shape.Rows <= shape.Keys {
		b.Fatalf("the store holds %d keys in %d snapshots, want %d keys (in more snapshots than keys, several runs, after %d commits)",
			shape.Keys, shape.Rows, keys, commits)
	}
	ctx := context.Background()
	cpu0, cpuOK := processCPU()
	for b.Loop() {
		store, err := recovery.OpenSQLite(ctx, dir, recovery.SQLiteOptions{})
		if err != nil {
			b.Fatal(err)
		}
		err = dataflow.Run(ctx, resumeFlow(), dataflow.Options{Workers: 2, Recovery: store})
		store.Close()
		if err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(b.Elapsed().Seconds()/float64(b.N), "s/resume")
	if cpu1, ok := processCPU(); ok && cpuOK {
		b.ReportMetric((cpu1-cpu0).Seconds()/float64(b.N), "cpu-s/resume")
	}
	// Every resume found the same store: it wrote no state.
	if after := resumeShape(b, dir); after != shape {
		b.Errorf("after %d resumes the store holds %+v, before %+v", b.N, after, shape)
	}
}

// processCPU returns the user and system CPU time of this process so far, read from
// /proc/self/stat (false where there is none), in clock ticks of 10 ms.
func processCPU() (time.Duration, bool) {
	b, err := os.ReadFile("/proc/self/stat")
	if err != nil {
		return 0, false
	}
	// The fields after the command (which is in parentheses and may hold spaces): state is
	// the first, utime the 12th and stime the 13th.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, false
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0, false
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, false
	}
	return time.Duration(utime+stime) * 10 * time.Millisecond, true
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
