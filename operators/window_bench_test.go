package operators_test

import (
	"context"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/epochflow/epochflow/dataflow"
	"github.com/epochflow/epochflow/operators"
	"github.com/epochflow/epochflow/windows"
)

// BenchmarkWindow is issue 11's acceptance 4 (go test ./operators/... -run '^$' -bench Window):
// a count per key in 10 s tumbling windows and in sessions with a 2 s gap, each in a plain
// single-goroutine loop and through the engine (windows.Count) with 1 and 2 workers, over the
// same events (see windowBenchEvent). Each of those reports events/s; then <case>/ratios
// reports workers=1/plain and workers=2/workers=1 from the same run. (The ratios are a
// sub-benchmark of their own because the testing package prints no result of a benchmark that
// has sub-benchmarks.)
//
// Clock: event time, no wait, and watermark alignment with a max drift of 500 ms
// (WINDOW_BENCH_DRIFT sets another, 0 for none), as a user with partitions read at different
// speeds would set it: without it the two workers drift seconds apart in event time, and most
// items find their key with two windows open (docs/time.md).
//
// Size: WINDOW_BENCH_EVENTS events per run (default 10,000,000, the size) over 100,000
// keys.
//
// Rounds: each operation runs the computation WINDOW_BENCH_ROUNDS times (default 3) and reports
// the events/s of its median run. On this kind of machine (a VM on shared cores) one run of the
// same code varies by up to 40 %, the first one of a process being the slowest (its heap is
// still growing); the median of three is steadier, and the plain loop and the engine are
// measured the same way.
func BenchmarkWindow(b *testing.B) {
	n := windowBenchEvents()
	for _, tc := range []struct {
		name  string
		w     windows.Windower
		plain func(int) windowCounts
	}{
		{"tumbling", windows.Tumbling(windowBenchLength, time.Unix(0, 0)), plainTumblingCount},
		{"session", windows.Session(windowBenchGap), plainSessionCount},
	} {
		b.Run(tc.name, func(b *testing.B) {
			var want windowCounts
			expected := func() windowCounts {
				if want.results == 0 {
					want = tc.plain(n)
				}
				return want
			}
			rates := map[string]float64{}
			b.Run("plain", func(b *testing.B) {
				var runs []time.Duration
				for b.Loop() {
					runs = timeRounds(runs, func() {
						got := tc.plain(n)
						if got.total != int64(n) || want.results != 0 && got != want {
							b.Fatalf("plain count: %+v, want %d items", got, n)
						}
						want = got
					})
				}
				rates["plain"] = eventsPerSecond(b, n, runs)
			})
			for _, workers := range []int{1, 2} {
				name := fmt.Sprintf("workers=%d", workers)
				b.Run(name, func(b *testing.B) {
					rates[name] = windowFlow(b, n, workers, tc.w, expected())
				})
			}
			b.Run("ratios", func(b *testing.B) {
				plain, w1, w2 := rates["plain"], rates["workers=1"], rates["workers=2"]
				if plain == 0 || w1 == 0 || w2 == 0 {
					b.Skip("the ratios need plain, workers=1 and workers=2 in the same run")
				}
				b.ReportMetric(0, "ns/op")
				b.ReportMetric(w1/plain, "workers=1/plain")
				b.ReportMetric(w2/w1, "workers=2/workers=1")
			})
		})
	}
}

const (
	windowBenchKeys   = 100_000
	windowBenchLength = 10 * time.Second // the tumbling windows
	windowBenchGap    = 2 * time.Second  // the session gap
)

// windowBenchDrift is the clock's MaxDrift: WINDOW_BENCH_DRIFT (a duration, 0 for none), else
// 500 ms.
func windowBenchDrift() time.Duration {
	if d, err := time.ParseDuration(os.Getenv("WINDOW_BENCH_DRIFT")); err == nil {
		return d
	}
	return 500 * time.Millisecond
}

func windowBenchEvents() int {
	if v, err := strconv.Atoi(os.Getenv("WINDOW_BENCH_EVENTS")); err == nil && v > 0 {
		return v
	}
	return 10_000_000
}

var windowBenchKeyNames = sync.OnceValue(func() []string {
	k := make([]string, windowBenchKeys)
	for i := range k {
		k[i] = "k" + strconv.Itoa(i)
	}
	return k
})

// windowBenchEvent is event i: its time is i*10µs (100,000 events a second), and its key comes
// in bursts. Key k is active in seconds k%10 to k%10+4 of every 10 s, with an event every
// 0.5 s, and quiet for the other 5 s: so each key has a session of 10 events every 10 s,
// which closes (its gap of 2 s passes) while other keys go on, and a 10 s tumbling window
// holds one burst or the parts of two.
func windowBenchEvent(i int) (string, int64) {
	t := int64(i) * 10_000
	sec := int(t/int64(time.Second)) % 10
	j := (i * 7919) % (windowBenchKeys / 2) // each of the 50,000 active keys twice a second
	phase := (sec - j%5 + 10) % 10          // one of the 5 phases active in this second
	return windowBenchKeyNames()[(j/5)*10+phase], t
}

// windowCounts is what a run computed: how many results (windows or sessions) and the sum of
// their counts (every event once).
type windowCounts struct{ results, total int64 }

func windowBenchRounds() int {
	if v, err := strconv.Atoi(os.Getenv("WINDOW_BENCH_ROUNDS")); err == nil && v > 0 {
		return v
	}
	return 3
}

// timeRounds runs run windowBenchRounds times, appending the time of each run to runs.
func timeRounds(runs []time.Duration, run func()) []time.Duration {
	for range windowBenchRounds() {
		start := time.Now()
		run()
		runs = append(runs, time.Since(start))
	}
	return runs
}

// eventsPerSecond reports (and returns) the events/s of the median of runs, each of n events.
func eventsPerSecond(b *testing.B, n int, runs []time.Duration) float64 {
	slices.Sort(runs)
	r := float64(n) / runs[len(runs)/2].Seconds()
	b.ReportMetric(r, "events/s")
	return r
}

// plainTumblingCount counts per key and tumbling window, emitting a window once the events'
// time (they come in time order) passes its end, and the rest at the end.
func plainTumblingCount(n int) windowCounts {
	type win struct {
		key   string
		start int64
	}
	const length = int64(windowBenchLength)
	counts := map[win]int{}
	var c windowCounts
	open := int64(0)
	for i := range n {
		k, t := windowBenchEvent(i)
		start := t - t%length
		if start > open {
			for w, v := range counts {
				if w.start < start {
					delete(counts, w)
					c.results++
					c.total += int64(v)
				}
			}
			open = start
		}
		counts[win{k, start}]++
	}
	for _, v := range counts {
		c.results++
		c.total += int64(v)
	}
	return c
}

// plainSessionCount counts per key the sessions of events less than the gap apart, emitting a
// session when the key's next event is a gap or more after its last, and the rest at the end.
func plainSessionCount(n int) windowCounts {
	const gap = int64(windowBenchGap)
	type sess struct {
		last int64
		n    int
	}
	open := map[string]*sess{}
	var c windowCounts
	for i := range n {
		k, t := windowBenchEvent(i)
		s := open[k]
		if s != nil && t-s.last < gap {
			s.last, s.n = t, s.n+1
			continue
		}
		if s != nil {
			c.results++
			c.total += int64(s.n)
		}
		open[k] = &sess{last: t, n: 1}
	}
	for _, s := range open {
		c.results++
		c.total += int64(s.n)
	}
	return c
}

// windowFlow runs windows.Count over the events with workers workers, each reading one
// partition, in rounds (see timeRounds), checks the results against want and returns the
// events/s it reported.
func windowFlow(b *testing.B, n, workers int, w windows.Windower, want windowCounts) float64 {
	b.ReportAllocs()
	var runs []time.Duration
	for b.Loop() {
		runs = timeRounds(runs, func() { windowRun(b, n, workers, w, want) })
	}
	return eventsPerSecond(b, n, runs)
}

// windowRun is one run of windowFlow.
func windowRun(b *testing.B, n, workers int, w windows.Windower, want windowCounts) {
	f := dataflow.New("bench")
	in := operators.Input(f, "gen", dataflow.FromPartitioned[dataflow.KV[int64], int](windowSource{n: n, parts: workers}))
	clock := dataflow.EventClock(func(t int64) time.Time { return time.Unix(0, t) }, 0).WithMaxDrift(windowBenchDrift())
	out := windows.Count("count", in, clock, w)
	sink := &windowSink{}
	operators.Output("out", out.Results, dataflow.ToDynamic[windows.Result[int]](sink))
	if err := dataflow.Run(context.Background(), f, dataflow.Options{Workers: workers, EpochInterval: time.Second, Logger: quiet}); err != nil {
		b.Fatal(err)
	}
	if got := (windowCounts{sink.results.Load(), sink.total.Load()}); got != want {
		b.Fatalf("%+v, want %+v (the plain loop's)", got, want)
	}
}

// windowSource yields the events from parts partitions: partition p yields events p,
// p+parts, p+2*parts, ... (each in time order).
type windowSource struct{ n, parts int }

func (s windowSource) Parts(context.Context) ([]string, error) {
	out := make([]string, s.parts)
	for i := range out {
		out[i] = strconv.Itoa(i)
	}
	return out, nil
}

func (s windowSource) Build(_ context.Context, part string, _ *int) (dataflow.StatefulSource[dataflow.KV[int64], int], error) {
	p, _ := strconv.Atoi(part)
	return &windowPart{next: p, step: s.parts, n: s.n}, nil
}

type windowPart struct{ next, step, n int }

func (g *windowPart) Next(context.Context) ([]dataflow.KV[int64], error) {
	if g.next >= g.n {
		return nil, io.EOF
	}
	out := make([]dataflow.KV[int64], 0, 1024)
	for ; g.next < g.n && len(out) < cap(out); g.next += g.step {
		k, t := windowBenchEvent(g.next)
		out = append(out, dataflow.KV[int64]{Key: k, Value: t})
	}
	return out, nil
}

func (g *windowPart) Snapshot() int                     { return g.next }
func (g *windowPart) Commit(context.Context, int) error { return nil }
func (g *windowPart) Close() error                      { return nil }

// windowSink counts the results and sums their counts.
type windowSink struct{ results, total atomic.Int64 }

func (s *windowSink) Build(context.Context, dataflow.Worker) (dataflow.WorkerSink[windows.Result[int]], error) {
	return s, nil
}

func (s *windowSink) Write(_ context.Context, b []windows.Result[int]) error {
	var total int64
	for _, r := range b {
		total += int64(r.Value)
	}
	s.results.Add(int64(len(b)))
	s.total.Add(total)
	return nil
}

func (s *windowSink) Close() error { return nil }
