package windows_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/epochflow/epochflow/connectors/flowtest"
	"github.com/epochflow/epochflow/dataflow"
	"github.com/epochflow/epochflow/operators"
	"github.com/epochflow/epochflow/windows"
)

// rightEv is the right side's type of the interval join tests (a type of its own).
type rightEv struct{ E ev }

func intervalFlow(in dataflow.Stream[ev], wait, lower, upper time.Duration) (dataflow.Stream[string], dataflow.Stream[string]) {
	keyed := operators.KeyOn("key", in, func(e ev) string { return e.Key })
	left := operators.FilterValue("lefts", keyed, func(e ev) bool { return e.V%2 == 0 })
	right := operators.MapValue("rights", operators.FilterValue("odd", keyed, func(e ev) bool { return e.V%2 == 1 }),
		func(e ev) rightEv { return rightEv{e} })
	out := windows.IntervalJoin("ij", left, right, func(e ev) time.Time { return ms(e.T) }, func(r rightEv) time.Time { return ms(r.E.T) },
		wait, lower, upper)
	rows := operators.Map("rows", out.Rows, func(r windows.Row[ev, rightEv]) string {
		return fmt.Sprintf("row %s %d-%d", r.Key, r.Left.V, r.Right.E.V)
	})
	lates := operators.Map("lates", out.Late, func(l windows.Late[windows.Either[ev, rightEv]]) string {
		v := l.Item.Left.V
		if l.Item.IsRight {
			v = l.Item.Right.E.V
		}
		return fmt.Sprintf("late %s %d [%d,%d]", l.Key, v, l.Window.Start.UnixMilli(), l.Window.End.Add(-time.Nanosecond).UnixMilli())
	})
	return rows, lates
}

// pairsModel lists every row of the interval join of events when none is late: each even
// (left) event at t with each odd (right) event of its key at s in [t-lower, t+upper].
func pairsModel(events []ev, lower, upper int64) []string {
	var out []string
	for _, l := range events {
		if l.V%2 != 0 {
			continue
		}
		for _, r := range events {
			if r.V%2 == 1 && r.Key == l.Key && r.T >= l.T-lower && r.T <= l.T+upper {
				out = append(out, fmt.Sprintf("row %s %d-%d", l.Key, l.V, r.V))
			}
		}
	}
	return out
}

// TestIntervalJoinMatchesModel: partitions (at most one per worker) whose disorder stays within
// the wait, crashes and resumes with changing worker counts: the rows are exactly every pair
// of a left and a right item of a key within the interval, each once, and the state that
// expires with the watermark never loses a row.
func TestIntervalJoinMatchesModel(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		// The left and right items of one source batch reach the join in two runs (lefts, then
		// rights), so an item may follow others of its batch that came after it: the wait
		// covers the disorder plus a batch's spread (at most 10 items of 6 ms).
		disorder := int64(rapid.IntRange(1, 30).Draw(t, "disorder"))
		wait := time.Duration(disorder+60) * time.Millisecond
		lower := int64(rapid.IntRange(-5, 20).Draw(t, "lower"))
		upper := int64(rapid.IntRange(max(0, -int(lower)), 20).Draw(t, "upper"))
		nparts := rapid.IntRange(1, 3).Draw(t, "parts")
		var parts [][]ev
		var cuts, aborts [][]int
		var all []ev
		for p := range nparts {
			events := drawEvents(t, fmt.Sprint("p", p), rapid.IntRange(1, 3).Draw(t, "keys"), 1000*p, disorder)
			c, a := drawCuts(t, fmt.Sprint("p", p), len(events))
			parts, cuts, aborts = append(parts, events), append(cuts, c), append(aborts, a)
			all = append(all, events...)
		}
		got := runCrashing(t, parts, cuts, aborts, nparts, rapid.IntRange(1, 10).Draw(t, "batch"),
			time.Duration(rapid.IntRange(1, 5).Draw(t, "interval_ms"))*time.Millisecond,
			func(in dataflow.Stream[ev]) dataflow.Stream[string] {
				rows, lates := intervalFlow(in, wait, time.Duration(lower)*time.Millisecond, time.Duration(upper)*time.Millisecond)
				return operators.Merge("all", rows, lates)
			})
		if d := diff(got, pairsModel(all, lower, upper)); d != "" {
			t.Fatalf("rows differ from the model (lower %d, upper %d):\n%s", lower, upper, d)
		}
	})
}

// TestIntervalJoinEdges: the interval's ends are inclusive, an item before the watermark is
// late (with the interval it would have matched in) and joins nothing, and an item on time
// still finds the other side's items the watermark has not expired (the left at 30 when the
// watermark is 33 and the interval's upper end 3).
func TestIntervalJoinEdges(t *testing.T) {
	// Lefts are even, rights odd. Interval [t-2, t+3].
	events := []ev{
		e("a", 10, 0),  // left at 10: matches rights in [8, 13]
		e("a", 8, 1),   // right at 8 (after the watermark, 5): the lower end, matches
		e("a", 13, 3),  // right at 13: the upper end, matches
		e("a", 14, 5),  // right at 14: outside
		e("a", 26, 8),  // left at 26: the watermark (21) expires the items above
		e("a", 30, 2),  // left at 30: the watermark moves to 25 (wait 5)
		e("a", 12, 7),  // right at 12, before the watermark: late, joins nothing
		e("a", 31, 9),  // right at 31: matches the left at 30
		e("b", 38, 4),  // the watermark moves to 33: the left at 26 expires, the one at 30 stays
		e("a", 33, 11), // right at 33, on time: matches the left at 30 (its upper end)
		e("a", 41, 6),  // left at 41: matches no right
	}
	f := dataflow.New("t")
	// One item a batch: the join's sides are split from one stream, and the items of a batch
	// reach it lefts first, then rights.
	in := operators.Input(f, "in", flowtest.NewSource(1, []flowtest.Event[ev]{flowtest.Items(events...)}).Input())
	rows, lates := intervalFlow(in, 5*time.Millisecond, 2*time.Millisecond, 3*time.Millisecond)
	rs, ls := flowtest.NewSink[string](), flowtest.NewSink[string]()
	operators.Output("rows-out", rows, rs.Output())
	operators.Output("late-out", lates, ls.Output())
	if err := dataflow.Run(context.Background(), f, dataflow.Options{Workers: 1, Logger: quiet}); err != nil {
		t.Fatal(err)
	}
	same(t, "rows", sorted(rs.Items()), []string{"row a 0-1", "row a 0-3", "row a 2-11", "row a 2-9"})
	// A right item at 12 would have matched lefts in [12-3, 12+2] = [9, 14].
	same(t, "late", sorted(ls.Items()), []string{"late a 7 [9,14]"})
}
