package windows_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/epochflow/epochflow/connectors/flowtest"
	"github.com/epochflow/epochflow/dataflow"
	"github.com/epochflow/epochflow/operators"
	"github.com/epochflow/epochflow/recovery"
	"github.com/epochflow/epochflow/windows"
)

func ms(t int64) time.Time { return time.UnixMilli(t).UTC() }

func (s spec) windower() windows.Windower {
	switch s.kind {
	case kTumbling:
		return windows.Tumbling(time.Duration(s.length)*time.Millisecond, ms(s.origin))
	case kSliding:
		return windows.Sliding(time.Duration(s.length)*time.Millisecond, time.Duration(s.offset)*time.Millisecond, ms(s.origin))
	}
	return windows.Session(time.Duration(s.length) * time.Millisecond)
}

// drawSpec draws a windower with its wait and lateness, and with early results if early.
func drawSpec(t *rapid.T, early bool) spec {
	s := spec{kind: wkind(rapid.IntRange(0, 2).Draw(t, "kind"))}
	s.length = int64(rapid.IntRange(1, 40).Draw(t, "length"))
	if s.kind == kSliding {
		s.offset = int64(rapid.IntRange(1, 40).Draw(t, "offset"))
	}
	s.origin = int64(rapid.IntRange(-50, 50).Draw(t, "origin"))
	s.wait = int64(rapid.IntRange(0, 20).Draw(t, "wait"))
	if rapid.Bool().Draw(t, "lateness?") {
		s.lateness = int64(rapid.IntRange(1, 30).Draw(t, "lateness"))
	}
	if early && rapid.Bool().Draw(t, "early?") {
		s.early = int64(rapid.IntRange(1, 20).Draw(t, "early"))
	}
	s.maxDrift = drawMaxDrift(t)
	return s
}

// drawMaxDrift draws no watermark alignment half the time, else a drift of 1 to 30 ms.
func drawMaxDrift(t *rapid.T) int64 {
	if rapid.Bool().Draw(t, "aligned?") {
		return int64(rapid.IntRange(1, 30).Draw(t, "max-drift"))
	}
	return 0
}

// drawEvents draws n events on a clock that moves forward; each event is behind the clock by a
// random disorder below maxDisorder.
func drawEvents(t *rapid.T, label string, keys, first int, maxDisorder int64) []ev {
	n := rapid.IntRange(1, 60).Draw(t, label+"-n")
	clock := int64(rapid.IntRange(-20, 20).Draw(t, label+"-start"))
	out := make([]ev, n)
	for i := range out {
		clock += int64(rapid.IntRange(0, 6).Draw(t, label+"-step"))
		d := int64(0)
		if maxDisorder > 0 {
			d = rapid.Int64Range(0, maxDisorder-1).Draw(t, label+"-disorder")
		}
		out[i] = ev{Key: fmt.Sprint("k", rapid.IntRange(0, keys-1).Draw(t, label+"-key")), T: clock - d, V: first + i}
	}
	return out
}

// script cuts a partition's events into items and pauses (which close epochs), with an abort
// before event abortAt (-1 for none). Every run gets the same events and aborts at the same
// indexes, so resume positions stay valid; abort k of a partition only aborts in run k.
func script(events []ev, cuts []int, aborts []int, run int) []flowtest.Event[ev] {
	var out []flowtest.Event[ev]
	prev := 0
	for i, c := range append(slices.Clone(cuts), len(events)) {
		out = append(out, flowtest.Items(events[prev:c]...))
		prev = c
		if i < len(cuts) {
			out = append(out, flowtest.Pause[ev](time.Millisecond))
			if k := slices.Index(aborts, c); k >= 0 {
				if k == run {
					out = append(out, flowtest.Abort[ev]())
				} else {
					out = append(out, flowtest.Items[ev]())
				}
			}
		}
	}
	return out
}

// runWindowed runs the windowed Collect of spec over the partitions' events (see runCrashing)
// and returns the results and late items made visible. It counts the calls of Logic.Merge (in
// every run, including those that crashed) in merges, if not nil.
func runWindowed(t *rapid.T, s spec, parts [][]ev, cuts [][]int, aborts [][]int, minWorkers, batch int, interval time.Duration, merges *atomic.Int64) []string {
	return runCrashing(t, parts, cuts, aborts, minWorkers, batch, interval, func(in dataflow.Stream[ev]) dataflow.Stream[string] {
		keyed := operators.KeyOn("key", in, func(e ev) string { return e.Key })
		vals := operators.MapValue("val", keyed, func(e ev) ev { return e })
		clock := dataflow.EventClock(func(e ev) time.Time { return ms(e.T) }, time.Duration(s.wait)*time.Millisecond)
		out := windows.Apply("win", vals, clock, s.windower(), windows.Logic[ev, []int, []int]{
			Add: func(acc []int, e ev) []int { return append(acc, e.V) },
			Merge: func(a, b []int) []int {
				if merges != nil {
					merges.Add(1)
				}
				return append(a, b...)
			},
			Close: func(_ string, _ windows.Window, acc []int) []int { return slices.Clone(acc) },
		}, windows.Options{Lateness: time.Duration(s.lateness) * time.Millisecond, Early: time.Duration(s.early) * time.Millisecond,
			MaxDrift: time.Duration(s.maxDrift) * time.Millisecond})
		res := operators.Map("res", out.Results, func(r windows.Result[[]int]) string {
			return result(r.Key, r.Window.Start.UnixMilli(), r.Window.End.UnixMilli(), r.Value, r.Update, r.Early)
		})
		lt := operators.Map("late", out.Late, func(l windows.Late[ev]) string {
			return late(l.Key, l.Window.Start.UnixMilli(), l.Window.End.UnixMilli(), l.Item.V)
		})
		return operators.Merge("all", res, lt)
	})
}

// runCrashing runs the flow that build makes of the scripts' events until a run finishes, with
// a recovery store, aborting where the scripts say, and returns what a two-phase sink made
// visible (each output exactly once if recovery is right).
//
// Each run draws its own number of workers (at least minWorkers), so a resume may change it: the
// keys' state moves to their new owners and the watermark is restored on every worker.
func runCrashing(t *rapid.T, parts [][]ev, cuts [][]int, aborts [][]int, minWorkers, batch int, interval time.Duration, build func(dataflow.Stream[ev]) dataflow.Stream[string]) []string {
	dir, err := os.MkdirTemp("", "windows-prop")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	sink := flowtest.NewTwoPhaseSink[string](nil)
	runs := 1
	for _, a := range aborts {
		runs = max(runs, len(a)+1)
	}
	for run := 0; ; run++ {
		scripts := make([][]flowtest.Event[ev], len(parts))
		for p := range parts {
			scripts[p] = script(parts[p], cuts[p], aborts[p], run)
		}
		f := dataflow.New("w")
		in := operators.Input(f, "in", gated{flowtest.NewSource(batch, scripts...)}.Input())
		operators.Output("out", build(in), sink.Output())
		store, err := recovery.OpenSQLite(context.Background(), dir, recovery.SQLiteOptions{})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		workers := rapid.IntRange(minWorkers, 8).Draw(t, "workers")
		err = dataflow.Run(ctx, f, dataflow.Options{Workers: workers, EpochInterval: interval, Recovery: store, Logger: quiet})
		cancel()
		store.Close()
		if err == nil {
			if run < runs-1 {
				t.Fatalf("run %d finished, but aborts were planned up to run %d", run, runs-1)
			}
			break
		}
		if !errors.Is(err, flowtest.ErrAbort) || run >= runs-1 {
			t.Fatalf("run %d: %v", run, err)
		}
	}
	return sink.Visible()
}

func drawCuts(t *rapid.T, label string, n int) (cuts, aborts []int) {
	for i := 1; i < n; i++ {
		if rapid.IntRange(0, 9).Draw(t, label+"-cut") == 0 {
			cuts = append(cuts, i)
		}
	}
	for _, c := range cuts {
		if len(aborts) < 2 && rapid.IntRange(0, 3).Draw(t, label+"-abort") == 0 {
			aborts = append(aborts, c)
		}
	}
	return cuts, aborts
}

// TestOrderedPartitionMatchesModel: one partition with any disorder (so items are late, within
// the lateness or not), with or without early results, 1 to 8 workers for the windowed step
// (changing at each resume), crashes and resumes: the visible results and late items are
// exactly the sequential model's, and each early result is one it allows (see modelOrdered).
func TestOrderedPartitionMatchesModel(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		s := drawSpec(t, true)
		events := drawEvents(t, "p0", rapid.IntRange(1, 4).Draw(t, "keys"), 0, int64(rapid.IntRange(0, 60).Draw(t, "disorder")))
		cuts, aborts := drawCuts(t, "p0", len(events))
		got := runWindowed(t, s, [][]ev{events}, [][]int{cuts}, [][]int{aborts},
			1, rapid.IntRange(1, 10).Draw(t, "batch"),
			time.Duration(rapid.IntRange(1, 5).Draw(t, "interval_ms"))*time.Millisecond, nil)
		if d := diffOrdered(got, modelOrdered(s, events)); d != "" {
			t.Fatalf("output differs from the model (%+v):\n%s", s, d)
		}
	})
}

// TestPartitionsMatchOfflineModel: up to four partitions, on 1 to 8 workers, each with disorder
// within the wait: nothing is late whatever the interleaving of the partitions, so every
// window's result is the offline computation over all events, exactly once, with crashes.
func TestPartitionsMatchOfflineModel(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		s := drawSpec(t, false)
		nparts := rapid.IntRange(1, 4).Draw(t, "parts")
		keys := rapid.IntRange(1, 4).Draw(t, "keys")
		var parts [][]ev
		var cuts, aborts [][]int
		var all []ev
		for p := range nparts {
			// Disorder below the wait: every item is at or after its partition's watermark.
			events := drawEvents(t, fmt.Sprint("p", p), keys, 1000*p, s.wait+1)
			c, a := drawCuts(t, fmt.Sprint("p", p), len(events))
			parts, cuts, aborts = append(parts, events), append(cuts, c), append(aborts, a)
			all = append(all, events...)
		}
		// Any number of workers, also fewer than the partitions: a worker reading several holds
		// the watermark to the slowest of them (see docs/time.md).
		got := runWindowed(t, s, parts, cuts, aborts, 1, rapid.IntRange(1, 10).Draw(t, "batch"),
			time.Duration(rapid.IntRange(1, 5).Draw(t, "interval_ms"))*time.Millisecond, nil)
		want := modelOffline(s, all)
		if d := diff(got, want); d != "" {
			t.Fatalf("output differs from the offline model (%+v):\n%s", s, d)
		}
	})
}

// drawBridged draws the events of one partition for session windows of spec s (s.wait >= 1,
// s.length >= 2): events on a clock that moves forward, each behind it by a disorder below
// maxDisorder, and at least one bridge. A bridge of a key is an event at the clock p, then one at
// q = p+J with J in [gap, 2*gap-2] (two sessions, as they are at least a gap apart), then at once
// one at a time in [q-gap+1, p+gap-1], which overlaps both and so merges them. As J < gap +
// lateness + wait, the watermark (at most q-wait) has not yet dropped the first session, so the
// model merges at every bridge; the item of the merge may be after the first session's end (an
// update).
func drawBridged(t *rapid.T, s spec, keys int, maxDisorder int64) (events []ev, bridges int) {
	gap := s.length
	n := rapid.IntRange(1, 60).Draw(t, "n")
	clock := int64(rapid.IntRange(-20, 20).Draw(t, "start"))
	add := func(key string, at int64) { events = append(events, ev{Key: key, T: at, V: len(events)}) }
	for i := 0; i < n || bridges == 0; i++ {
		key := fmt.Sprint("k", rapid.IntRange(0, keys-1).Draw(t, "key"))
		clock += int64(rapid.IntRange(0, 6).Draw(t, "step"))
		if i >= n || rapid.IntRange(0, 3).Draw(t, "bridge?") == 0 {
			p := clock
			clock += rapid.Int64Range(gap, min(2*gap-2, gap+s.lateness+s.wait-1)).Draw(t, "jump")
			add(key, p)
			add(key, clock)
			add(key, rapid.Int64Range(clock-gap+1, p+gap-1).Draw(t, "bridge"))
			bridges++
			continue
		}
		d := int64(0)
		if maxDisorder > 0 {
			d = rapid.Int64Range(0, maxDisorder-1).Draw(t, "disorder")
		}
		add(key, clock-d)
	}
	return events, bridges
}

// TestSessionMergesMatchModel: sessions of one partition whose events are drawn so that
// sessions merge (drawBridged), with any other disorder, with or without lateness and early
// results, 1 to 8 workers, crashes and resumes: the output is the model's, the model merged
// sessions at least once per bridge, and the step called Logic.Merge.
func TestSessionMergesMatchModel(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		s := spec{kind: kSession, length: int64(rapid.IntRange(2, 20).Draw(t, "gap")),
			wait: int64(rapid.IntRange(1, 20).Draw(t, "wait"))}
		if rapid.Bool().Draw(t, "lateness?") {
			s.lateness = int64(rapid.IntRange(1, 30).Draw(t, "lateness"))
		}
		if rapid.Bool().Draw(t, "early?") {
			s.early = int64(rapid.IntRange(1, 20).Draw(t, "early"))
		}
		s.maxDrift = drawMaxDrift(t)
		events, bridges := drawBridged(t, s, rapid.IntRange(1, 4).Draw(t, "keys"), int64(rapid.IntRange(0, 40).Draw(t, "disorder")))
		cuts, aborts := drawCuts(t, "p0", len(events))
		var merged atomic.Int64
		got := runWindowed(t, s, [][]ev{events}, [][]int{cuts}, [][]int{aborts},
			1, rapid.IntRange(1, 10).Draw(t, "batch"),
			time.Duration(rapid.IntRange(1, 5).Draw(t, "interval_ms"))*time.Millisecond, &merged)
		m := modelOrdered(s, events)
		if d := diffOrdered(got, m); d != "" {
			t.Fatalf("output differs from the model (%+v):\n%s\nEVENTS %v\nCUTS %v ABORTS %v\nGOT %v", s, d, events, cuts, aborts, got)
		}
		if m.merges < bridges || merged.Load() == 0 {
			t.Fatalf("%d bridges, but the model merged %d times and the step called Merge %d times", bridges, m.merges, merged.Load())
		}
	})
}
