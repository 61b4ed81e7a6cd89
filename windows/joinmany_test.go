package windows_test

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/epochflow/epochflow/connectors/flowtest"
	"github.com/epochflow/epochflow/dataflow"
	"github.com/epochflow/epochflow/operators"
	"github.com/epochflow/epochflow/windows"
)

// The N-way join tests read one partition of events whose value tells the side: side V/100.
// The sides are split off the one input after it is read, so that the join sees the items in
// the order of the partition when its batches hold one item each (a batch of several would
// reach the join side by side, and which item a running result includes would depend on the
// batch size).

func sideOf(v int) int { return v / 100 }

// joinRows prints the rows of a window whose items (values) are vals, in the order they came,
// as the product of the sides' items, "-" for a side without: sorted, one string.
func joinRows(n int, vals []int) string {
	lists := make([][]int, n)
	for _, v := range vals {
		lists[sideOf(v)] = append(lists[sideOf(v)], v)
	}
	var rows []string
	for _, r := range operators.JoinProduct(lists) {
		rows = append(rows, showRow(r))
	}
	slices.Sort(rows)
	return "[" + strings.Join(rows, " ") + "]"
}

func showRow(r operators.JoinRow[int]) string {
	parts := make([]string, len(r.Values))
	for i, v := range r.Values {
		parts[i] = "-"
		if r.Present[i] {
			parts[i] = fmt.Sprint(v)
		}
	}
	return strings.Join(parts, "/")
}

func joinResult(key string, start, end int64, rows string, update, early bool) string {
	s := fmt.Sprintf("J %s [%d,%d) %s", key, start, end, rows)
	if update {
		s += " update"
	}
	if early {
		s += " early"
	}
	return s
}

// modelJoin is a plain sequential model of a window join of n sides over the events of one
// partition, in order: the watermark before an event is the largest time before it minus the
// wait; a window gives its rows when the watermark reaches its end (JoinComplete only when
// every side has items), or, for JoinRunning, at every item; an item within the lateness gives
// them again at once as an update; an item whose window is gone is late.
func modelJoin(s spec, n int, mode windows.JoinMode, events []ev) []string {
	type win struct {
		key        string
		start, end int64
		vals       []int
		fired, due bool
	}
	var open []*win
	var out []string
	fire := func(w *win, early bool) {
		complete := true
		for side := range n {
			if !slices.ContainsFunc(w.vals, func(v int) bool { return sideOf(v) == side }) {
				complete = false
			}
		}
		if mode != windows.JoinComplete || complete {
			out = append(out, joinResult(w.key, w.start, w.end, joinRows(n, w.vals), w.fired && !early, early))
		}
		w.fired, w.due = true, false
	}
	added := func(w *win, wm int64) {
		switch {
		case mode == windows.JoinRunning:
			fire(w, wm < w.end)
		case w.end <= wm:
			fire(w, false)
		default:
			w.due = true
		}
	}
	advance := func(wm int64) {
		kept := open[:0]
		for _, w := range open {
			if w.due && w.end <= wm {
				fire(w, false)
			}
			if w.end+s.lateness > wm {
				kept = append(kept, w)
			}
		}
		open = kept
	}
	wm, maxSeen := int64(math.MinInt64), int64(math.MinInt64)
	for _, e := range events {
		advance(wm)
		if s.kind == kSession {
			gap := s.length
			var hit []*win
			rest := open[:0:0]
			for _, w := range open {
				if w.key == e.Key && w.start < e.T+gap && e.T < w.end {
					hit = append(hit, w)
				} else {
					rest = append(rest, w)
				}
			}
			if len(hit) == 0 && e.T+gap+s.lateness <= wm {
				out = append(out, late(e.Key, e.T, e.T+gap, e.V))
			} else {
				m := &win{key: e.Key, start: e.T, end: e.T + gap}
				slices.SortFunc(hit, func(a, b *win) int { return int(a.start - b.start) })
				for _, w := range hit {
					m.start, m.end = min(m.start, w.start), max(m.end, w.end)
					m.vals = append(m.vals, w.vals...)
					m.fired = m.fired || w.fired
				}
				m.vals = append(m.vals, e.V)
				open = append(rest, m)
				added(m, wm)
			}
		} else {
			for _, sp := range s.spans(e.T) {
				if sp[1]+s.lateness <= wm {
					out = append(out, late(e.Key, sp[0], sp[1], e.V))
					continue
				}
				i := slices.IndexFunc(open, func(w *win) bool { return w.key == e.Key && w.start == sp[0] })
				if i < 0 {
					open = append(open, &win{key: e.Key, start: sp[0], end: sp[1]})
					i = len(open) - 1
				}
				open[i].vals = append(open[i].vals, e.V)
				added(open[i], wm)
			}
		}
		maxSeen = max(maxSeen, e.T)
		wm = maxSeen - s.wait
	}
	advance(math.MaxInt64)
	return out
}

// joinFlow joins the n sides split off in (side V/100) per key with the windower, wait and
// lateness of s (and opts' other fields), and prints the results and the late items.
func joinFlow(in dataflow.Stream[ev], s spec, n int, mode windows.JoinMode, opts windows.Options) dataflow.Stream[string] {
	keyed := operators.KeyOn("key", in, func(e ev) string { return e.Key })
	sides := make([]dataflow.Stream[dataflow.KV[ev]], n)
	for i := range sides {
		sides[i] = operators.FilterValue(fmt.Sprint("side", i), keyed, func(e ev) bool { return sideOf(e.V) == i })
	}
	clock := dataflow.EventClock(func(e ev) time.Time { return ms(e.T) }, time.Duration(s.wait)*time.Millisecond)
	opts.Lateness = time.Duration(s.lateness) * time.Millisecond
	out := windows.Join("join", sides, clock, s.windower(), mode, opts)
	res := operators.Map("res", out.Results, func(r windows.Result[[]operators.JoinRow[ev]]) string {
		var rows []string
		for _, row := range r.Value {
			vals := make([]int, len(row.Values))
			for i, e := range row.Values {
				vals[i] = e.V
			}
			rows = append(rows, showRow(operators.JoinRow[int]{Values: vals, Present: row.Present}))
		}
		slices.Sort(rows)
		return joinResult(r.Key, r.Window.Start.UnixMilli(), r.Window.End.UnixMilli(), "["+strings.Join(rows, " ")+"]", r.Update, r.Early)
	})
	lt := operators.Map("late", out.Late, func(l windows.Late[windows.Tagged[ev]]) string {
		if l.Item.Side != sideOf(l.Item.Value.V) {
			return fmt.Sprintf("late item %d tagged with side %d", l.Item.Value.V, l.Item.Side)
		}
		return late(l.Key, l.Window.Start.UnixMilli(), l.Window.End.UnixMilli(), l.Item.Value.V)
	})
	return operators.Merge("all", res, lt)
}

// TestJoinEdges runs the N-way join at the edges, in each mode, on one and two workers: an
// item exactly on a window's boundary, windows closed by EOF, a window with a side empty
// (no rows in JoinComplete, a missing entry in the others), an item within the allowed
// lateness (rows again, as an update) and one beyond it (late), sessions merged by an item
// that bridges them, and the running results of JoinRunning (early, then updates).
func TestJoinEdges(t *testing.T) {
	tumbling := spec{kind: kTumbling, length: 10}
	for _, tc := range []struct {
		name     string
		s        spec
		n        int
		events   []ev
		complete []string // per mode
		final    []string
		running  []string
	}{
		{
			name: "boundary, EOF, a side empty", s: tumbling, n: 3,
			// [0,10) gets an item of every side, [10,20) (from the item at 10 on) two sides.
			events:   []ev{e("a", 0, 1), e("a", 9, 101), e("a", 9, 201), e("a", 10, 2), e("a", 19, 102)},
			complete: []string{"J a [0,10) [1/101/201]"},
			final:    []string{"J a [0,10) [1/101/201]", "J a [10,20) [2/102/-]"},
			running: []string{"J a [0,10) [1/-/-] early", "J a [0,10) [1/101/-] early", "J a [0,10) [1/101/201] early",
				"J a [10,20) [2/-/-] early", "J a [10,20) [2/102/-] early"},
		},
		{
			name: "lateness", s: spec{kind: kTumbling, length: 10, lateness: 5}, n: 3,
			// The item at 20 closes [10,20) (wait 0) and drops [0,10) (10+5 <= 20): the items at
			// 15 and 16 are within [10,20)'s lateness, the one at 3 is late.
			events: []ev{e("a", 0, 1), e("a", 1, 101), e("a", 2, 201), e("a", 14, 3), e("a", 20, 4),
				e("a", 15, 103), e("a", 16, 203), e("a", 3, 202)},
			complete: []string{"J a [0,10) [1/101/201]", "J a [10,20) [3/103/203] update", "L a [0,10) 202"},
			final: []string{"J a [0,10) [1/101/201]", "J a [10,20) [3/-/-]", "J a [10,20) [3/103/-] update",
				"J a [10,20) [3/103/203] update", "J a [20,30) [4/-/-]", "L a [0,10) 202"},
			running: []string{"J a [0,10) [1/-/-] early", "J a [0,10) [1/101/-] early", "J a [0,10) [1/101/201] early",
				"J a [10,20) [3/-/-] early", "J a [20,30) [4/-/-] early",
				"J a [10,20) [3/103/-] update", "J a [10,20) [3/103/203] update", "L a [0,10) 202"},
		},
		{
			name: "sessions merged", s: spec{kind: kSession, length: 20, wait: 100}, n: 2,
			// [0,20) and [30,50) of two keys; the item at 15 bridges a's two sessions.
			events:   []ev{e("a", 0, 1), e("a", 30, 101), e("b", 0, 2), e("b", 30, 102), e("a", 15, 3)},
			complete: []string{"J a [0,50) [1/101 3/101]"},
			final:    []string{"J a [0,50) [1/101 3/101]", "J b [0,20) [2/-]", "J b [30,50) [-/102]"},
			running: []string{"J a [0,20) [1/-] early", "J a [30,50) [-/101] early", "J b [0,20) [2/-] early",
				"J b [30,50) [-/102] early", "J a [0,50) [1/101 3/101] early"},
		},
	} {
		for _, mode := range []windows.JoinMode{windows.JoinComplete, windows.JoinFinal, windows.JoinRunning} {
			want := [][]string{tc.complete, tc.final, tc.running}[mode]
			for _, workers := range []int{1, 2} {
				t.Run(fmt.Sprintf("%s/%v/workers=%d", tc.name, mode, workers), func(t *testing.T) {
					f := dataflow.New("j")
					in := operators.Input(f, "in", gated{flowtest.NewSource(1, []flowtest.Event[ev]{flowtest.Items(tc.events...)})}.Input())
					sink := flowtest.NewSink[string]()
					operators.Output("out", joinFlow(in, tc.s, tc.n, mode, windows.Options{}), sink.Output())
					ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
					defer cancel()
					if err := dataflow.Run(ctx, f, dataflow.Options{Workers: workers, EpochInterval: 2 * time.Millisecond, Logger: quiet}); err != nil {
						t.Fatalf("Run: %v", err)
					}
					same(t, "output", sorted(sink.Items()), want)
					if d := diff(sink.Items(), modelJoin(tc.s, tc.n, mode, tc.events)); d != "" {
						t.Errorf("output differs from the model:\n%s", d)
					}
				})
			}
		}
	}
}

// TestJoinBuildErrors: a join of fewer than two sides, an unknown mode, and JoinRunning with
// Options.Early are build errors that name the step.
func TestJoinBuildErrors(t *testing.T) {
	clock := dataflow.EventClock(func(e ev) time.Time { return ms(e.T) }, 0)
	w := windows.Tumbling(time.Second, time.Time{})
	for _, tc := range []struct {
		name  string
		build func(sides []dataflow.Stream[dataflow.KV[ev]])
		want  string
	}{
		{"one side", func(s []dataflow.Stream[dataflow.KV[ev]]) {
			windows.Join("j", s[:1], clock, w, windows.JoinFinal)
		}, `step "j": a join needs at least 2 sides, got 1`},
		{"unknown mode", func(s []dataflow.Stream[dataflow.KV[ev]]) {
			windows.Join("j", s, clock, w, windows.JoinMode(7))
		}, `step "j": unknown join mode JoinMode(7)`},
		{"running and early", func(s []dataflow.Stream[dataflow.KV[ev]]) {
			windows.Join("j", s, clock, w, windows.JoinRunning, windows.Options{Early: time.Second})
		}, `step "j": JoinRunning emits at every item; Options.Early (1s) does not apply`},
		{"Join2 running and early", func(s []dataflow.Stream[dataflow.KV[ev]]) {
			windows.Join2("j", s[0], s[1], func(e ev) time.Time { return ms(e.T) }, func(e ev) time.Time { return ms(e.T) },
				0, w, windows.JoinRunning, windows.Options{Early: time.Second})
		}, `step "j": JoinRunning emits at every item; Options.Early (1s) does not apply`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := dataflow.New("j")
			keyed := operators.KeyOn("key", operators.Input(f, "in", flowtest.List(e("a", 1, 1))), func(e ev) string { return e.Key })
			tc.build([]dataflow.Stream[dataflow.KV[ev]]{keyed, keyed})
			if err := f.Err(); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want one saying %s", err, tc.want)
			}
		})
	}
}

// TestJoinMatchesModel: two to four sides, any windower, disorder and lateness, each mode, 1 to
// 8 workers (changing at each resume), crashes and resumes: the visible results and late items
// are exactly the sequential model's. One partition read one item per batch (see above).
func TestJoinMatchesModel(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		s := drawSpec(t, false)
		n := rapid.IntRange(2, 4).Draw(t, "sides")
		mode := windows.JoinMode(rapid.IntRange(0, 2).Draw(t, "mode"))
		events := drawEvents(t, "p0", rapid.IntRange(1, 3).Draw(t, "keys"), 0, int64(rapid.IntRange(0, 40).Draw(t, "disorder")))
		// At most 30 items, so that a window's product stays small.
		events = events[:min(len(events), 30)]
		for i := range events {
			events[i].V = 100*rapid.IntRange(0, n-1).Draw(t, "side") + i
		}
		cuts, aborts := drawCuts(t, "p0", len(events))
		got := runCrashing(t, [][]ev{events}, [][]int{cuts}, [][]int{aborts}, 1, 1,
			time.Duration(rapid.IntRange(1, 5).Draw(t, "interval_ms"))*time.Millisecond,
			func(in dataflow.Stream[ev]) dataflow.Stream[string] {
				return joinFlow(in, s, n, mode, windows.Options{})
			})
		want := modelJoin(s, n, mode, events)
		if d := diff(got, want); d != "" {
			t.Fatalf("output differs from the model (%+v, %d sides, %v):\n%s", s, n, mode, d)
		}
	})
}
