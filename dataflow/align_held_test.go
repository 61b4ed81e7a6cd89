package dataflow_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/epochflow/epochflow/dataflow"
)

// Holds count only for the partitions they hold back: step x is aligned over source S1 (its
// partition "a" on worker 0 is held back most of the time, waiting for "b"), and step y merges
// S1 with S2, whose partition "c" on worker 0 reads nothing until b has ended. No gate holds
// S2, so c is idle for y after y's idle timeout (100 ms), and y's watermark follows a and b.
// (When a hold of S1 counted for every partition of y, c was never idle, and y's watermark
// stayed at the beginning of time for the whole run.)
func TestHoldsCountOnlyForTheHeldSource(t *testing.T) {
	const n = 300
	relA, relC := make(chan struct{}), make(chan struct{})
	var onceA, onceC sync.Once
	a := &listPart{name: "a", release: relA}
	for i := range n {
		a.batches = append(a.batches, []int64{int64(i) * 10})
	}
	s1 := scriptedSource{names: []string{"a", "b"}, parts: map[string]dataflow.StatefulSource[stamp, int]{
		"a": a, "b": &pacedPart{name: "b", n: n, every: 2 * time.Millisecond}}}
	s2 := scriptedSource{names: []string{"c", "d"}, parts: map[string]dataflow.StatefulSource[stamp, int]{
		"c": &listPart{name: "c", batches: [][]int64{{1_000_000}}, hold: 0, release: relC}, "d": &listPart{name: "d"}}}
	f := dataflow.New("held-merge")
	k1 := keyByPartAs("k1", dataflow.Input(f, "in1", dataflow.FromPartitioned[stamp, int](s1)))
	k2 := keyByPartAs("k2", dataflow.Input(f, "in2", dataflow.FromPartitioned[stamp, int](s2)))
	ts := func(s stamp) time.Time { return time.UnixMilli(s.T) }
	discardOutput("x.out", dataflow.StatefulTime("x", k1, dataflow.EventClock(ts, 0).WithMaxDrift(50*time.Millisecond),
		dataflow.TimedLogic[stamp, bool, string]{OnItem: func(_ string, _ *bool, _ bool, s stamp, _, _ time.Time, _ *dataflow.Emitter[string]) (bool, error) {
			if s.Part == "b" {
				onceA.Do(func() { close(relA) })
			}
			return false, nil
		}}))
	var maxWm atomic.Int64
	maxWm.Store(-1 << 62)
	discardOutput("y.out", dataflow.StatefulTime("y", dataflow.Merge("m", k1, k2), dataflow.EventClock(ts, 0).WithIdleTimeout(100*time.Millisecond),
		dataflow.TimedLogic[stamp, bool, string]{OnItem: func(_ string, _ *bool, _ bool, s stamp, _, wm time.Time, _ *dataflow.Emitter[string]) (bool, error) {
			if s.Part == "b" {
				if w := wm.UnixMilli(); wm.After(dataflow.BeginningOfTime) && w > maxWm.Load() {
					maxWm.Store(w)
				}
				if s.T == (n-1)*10 {
					onceC.Do(func() { close(relC) })
				}
			}
			return false, nil
		}}))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	start := time.Now()
	if err := dataflow.Run(ctx, f, dataflow.Options{Workers: 2, EpochInterval: 20 * time.Millisecond}); err != nil {
		t.Fatalf("Run: %v", err)
	}
	t.Logf("run took %v; y's largest watermark seen with b's items: %d ms", time.Since(start), maxWm.Load())
	if maxWm.Load() < 1000 {
		t.Fatalf("y's watermark never passed 1 s of event time while b read 3 s of it: c (of a source no gate holds) was never idle for y")
	}
}
