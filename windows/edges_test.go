package windows_test

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/epochflow/epochflow/connectors/flowtest"
	"github.com/epochflow/epochflow/dataflow"
	"github.com/epochflow/epochflow/operators"
	"github.com/epochflow/epochflow/windows"
)

// show prints a result of a windowed Collect for the table tests, with its flags.
func show(r windows.Result[[]int]) string { return showAs(r, sortedInts) }

// showAs prints a result as "key [start,end) value", with its flags, value printing its value.
func showAs[R any](r windows.Result[R], value func(R) string) string {
	s := fmt.Sprintf("%s [%d,%d) %s", r.Key, r.Window.Start.UnixMilli(), r.Window.End.UnixMilli(), value(r.Value))
	if r.Update {
		s += " update"
	}
	if r.Early {
		s += " early"
	}
	return s
}

func sortedInts(v []int) string {
	v = slices.Clone(v)
	slices.Sort(v)
	return fmt.Sprint(v)
}

func showLate(l windows.Late[ev]) string {
	return fmt.Sprintf("%s [%d,%d) %d", l.Key, l.Window.Start.UnixMilli(), l.Window.End.UnixMilli(), l.Item.V)
}

// The aggregates of the table tests take ints, as Max and Min need an ordered value, and an
// item's int holds both its time and its value (which names it): value*valueUnit + time, with
// the time in [0, valueUnit/1000) ms, so that a sum of up to 1000 of them still tells the sum of
// the values (sum/valueUnit).
const valueUnit = 1_000_000

func enc(x ev) int {
	if x.T < 0 || x.T >= valueUnit/1000 || x.V < 0 {
		panic(fmt.Sprintf("table test item %+v: the time must be in [0, %d) and the value not negative", x, valueUnit/1000))
	}
	return x.V*valueUnit + int(x.T)
}

func encTime(n int) time.Time { return ms(int64(n % valueUnit)) }
func encValue(n int) int      { return n / valueUnit }

// aggregate is a windowed operator of the table tests over encoded items (see enc). build adds
// it and returns its results printed by showAs, with the late items' values decoded; want is
// what it gives for a window of the items valued vs ("[1 2]" for Collect, "2" for Count).
type aggregate struct {
	name  string
	build func(name string, in dataflow.Stream[dataflow.KV[int]], c dataflow.Clock[int], w windows.Windower, o windows.Options) (dataflow.Stream[string], dataflow.Stream[string], dataflow.Stream[windows.Meta])
	want  func(vs []int) string
}

// windowed is the signature of the operators of aggregate.go over encoded items.
type windowed[R any] = func(name string, in dataflow.Stream[dataflow.KV[int]], c dataflow.Clock[int], w windows.Windower, o ...windows.Options) windows.Outputs[int, R]

// newAggregate makes an aggregate of an operator whose result is R, value printing a result.
func newAggregate[R any](name string, op windowed[R], value func(R) string, want func(vs []int) string) aggregate {
	return aggregate{name: name, want: want,
		build: func(name string, in dataflow.Stream[dataflow.KV[int]], c dataflow.Clock[int], w windows.Windower, o windows.Options) (dataflow.Stream[string], dataflow.Stream[string], dataflow.Stream[windows.Meta]) {
			out := op(name, in, c, w, o)
			res := operators.Map("show", out.Results, func(r windows.Result[R]) string { return showAs(r, value) })
			late := operators.Map("show-late", out.Late, func(l windows.Late[int]) string {
				return showLate(windows.Late[ev]{Key: l.Key, Window: l.Window, Item: ev{V: encValue(l.Item)}})
			})
			return res, late, out.Meta
		}}
}

func sum(vs []int) int {
	n := 0
	for _, v := range vs {
		n += v
	}
	return n
}

func itoa(n int) string { return fmt.Sprint(n) }

// aggregates are the windowed operators of aggregate.go, each tested at every edge.
var aggregates = []aggregate{
	// Fold starts each window at 100 (so init is used), adds the values, and merges two
	// sessions without counting the 100 twice.
	newAggregate("Fold", func(name string, in dataflow.Stream[dataflow.KV[int]], c dataflow.Clock[int], w windows.Windower, o ...windows.Options) windows.Outputs[int, int] {
		return windows.Fold(name, in, c, w, func() int { return 100 }, func(acc, x int) int { return acc + encValue(x) },
			func(a, b int) int { return a + b - 100 }, o...)
	}, itoa, func(vs []int) string { return itoa(100 + sum(vs)) }),
	newAggregate("Reduce", func(name string, in dataflow.Stream[dataflow.KV[int]], c dataflow.Clock[int], w windows.Windower, o ...windows.Options) windows.Outputs[int, int] {
		return windows.Reduce(name, in, c, w, func(a, b int) int { return a + b }, o...)
	}, func(n int) string { return itoa(encValue(n)) }, func(vs []int) string { return itoa(sum(vs)) }),
	newAggregate("Count", windows.Count[int], itoa, func(vs []int) string { return itoa(len(vs)) }),
	newAggregate("Collect", windows.Collect[int], func(xs []int) string {
		vs := make([]int, len(xs))
		for i, x := range xs {
			vs[i] = encValue(x)
		}
		return sortedInts(vs)
	}, sortedInts),
	newAggregate("Max", windows.Max[int], func(n int) string { return itoa(encValue(n)) },
		func(vs []int) string { return itoa(slices.Max(vs)) }),
	newAggregate("Min", windows.Min[int], func(n int) string { return itoa(encValue(n)) },
		func(vs []int) string { return itoa(slices.Min(vs)) }),
}

// resultLine is a result line of a table: key and window, the values of its items, and flags.
var resultLine = regexp.MustCompile(`^(\S+ \[-?\d+,-?\d+\)) \[([-\d ]*)\](.*)$`)

// wantOf turns the table's results, written as the items' values of each window ("a [0,10)
// [1 2] update"), into what agg gives for them ("a [0,10) 2 update" for Count).
func (agg aggregate) wantOf(t *testing.T, results []string) []string {
	t.Helper()
	out := make([]string, len(results))
	for i, r := range results {
		m := resultLine.FindStringSubmatch(r)
		if m == nil {
			t.Fatalf("bad result line %q in the table", r)
		}
		var vs []int
		for _, f := range strings.Fields(m[2]) {
			v, err := strconv.Atoi(f)
			if err != nil {
				t.Fatalf("bad result line %q in the table: %v", r, err)
			}
			vs = append(vs, v)
		}
		out[i] = m[1] + " " + agg.want(vs) + m[3]
	}
	return out
}

// tableRun runs a windowed aggregate over the scripts (one partition each) and returns the
// results, the late items and the metadata, each sorted.
type tableRun struct {
	windower windows.Windower
	wait     time.Duration
	idle     time.Duration
	opts     windows.Options
	workers  int
	scripts  [][]flowtest.Event[ev]
}

func (tr tableRun) run(t *testing.T, agg aggregate) (results, lates, metas []string) {
	t.Helper()
	f := dataflow.New("t")
	// Gated: the items wait for their worker's first epoch to end, so that every other worker's
	// end mark is in before (see gated); else the watermark an item meets would depend on how
	// fast the workers without input start.
	in := operators.Input(f, "in", gated{flowtest.NewSource(3, tr.scripts...)}.Input())
	keyed := operators.MapValue("enc", operators.KeyOn("key", in, func(e ev) string { return e.Key }), enc)
	clock := dataflow.EventClock(encTime, tr.wait).WithIdleTimeout(tr.idle)
	res, late, meta := agg.build("win", keyed, clock, tr.windower, tr.opts)
	rs, ls, ms := flowtest.NewSink[string](), flowtest.NewSink[string](), flowtest.NewSink[string]()
	operators.Output("results", res, rs.Output())
	operators.Output("late", late, ls.Output())
	operators.Output("meta", operators.Map("show-meta", meta, func(m windows.Meta) string {
		return fmt.Sprintf("%s [%d,%d) items=%d results=%d", m.Key, m.Window.Start.UnixMilli(), m.Window.End.UnixMilli(), m.Items, m.Results)
	}), ms.Output())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := dataflow.Run(ctx, f, dataflow.Options{Workers: max(tr.workers, 1), EpochInterval: 2 * time.Millisecond, Logger: quiet}); err != nil {
		t.Fatalf("Run: %v", err)
	}
	return sorted(rs.Items()), sorted(ls.Items()), sorted(ms.Items())
}

func e(key string, t int64, v int) ev { return ev{Key: key, T: t, V: v} }

func one(items ...ev) [][]flowtest.Event[ev] {
	return [][]flowtest.Event[ev]{{flowtest.Items(items...)}}
}

func same(t *testing.T, what string, got, want []string) {
	t.Helper()
	if !slices.Equal(got, sorted(want)) {
		t.Errorf("%s:\n got  %q\n want %q", what, got, sorted(want))
	}
}

// TestEdges runs every windower and every aggregate of aggregate.go (Fold, Reduce, Count,
// Collect, Max, Min) at the edges: an item exactly on a boundary, windows closed only by EOF,
// an item beyond the allowed lateness, an update within it, a session merged by an item within
// the lateness, early results followed by the final one. The table writes each result as its
// items' values; each aggregate turns them into what it gives (aggregate.wantOf).
func TestEdges(t *testing.T) {
	tumbling := windows.Tumbling(10*time.Millisecond, ms(0))
	for _, tc := range []struct {
		name                  string
		tr                    tableRun
		results, lates, metas []string
	}{{
		name:    "tumbling: an item on a boundary opens the next window",
		tr:      tableRun{windower: tumbling, scripts: one(e("a", 0, 1), e("a", 9, 2), e("a", 10, 3), e("a", 20, 4))},
		results: []string{"a [0,10) [1 2]", "a [10,20) [3]", "a [20,30) [4]"},
		metas:   []string{"a [0,10) items=2 results=1", "a [10,20) items=1 results=1", "a [20,30) items=1 results=1"},
	}, {
		name: "tumbling: an item exactly at the watermark is on time, one before it is late",
		// After 20 (wait 5) the watermark is 15: 15 is on time in [10,20), 9 is late.
		tr:      tableRun{windower: tumbling, wait: 5 * time.Millisecond, scripts: one(e("a", 20, 1), e("a", 15, 2), e("a", 9, 3))},
		results: []string{"a [10,20) [2]", "a [20,30) [1]"},
		lates:   []string{"a [0,10) 3"},
		metas:   []string{"a [10,20) items=1 results=1", "a [20,30) items=1 results=1"},
	}, {
		name: "sliding: an item on a boundary is in the windows that start there, not those that end there",
		tr: tableRun{windower: windows.Sliding(10*time.Millisecond, 5*time.Millisecond, ms(0)),
			scripts: one(e("a", 10, 1))},
		results: []string{"a [5,15) [1]", "a [10,20) [1]"},
		metas:   []string{"a [5,15) items=1 results=1", "a [10,20) items=1 results=1"},
	}, {
		name: "session: items exactly a gap apart are two sessions, closer ones one",
		tr: tableRun{windower: windows.Session(10 * time.Millisecond), wait: 15 * time.Millisecond,
			scripts: one(e("a", 0, 1), e("a", 10, 2), e("a", 19, 3), e("b", 5, 4))},
		results: []string{"a [0,10) [1]", "a [10,29) [2 3]", "b [5,15) [4]"},
		metas:   []string{"a [0,10) items=1 results=1", "a [10,29) items=2 results=1", "b [5,15) items=1 results=1"},
	}, {
		name: "windows closed by EOF: a wait longer than the input closes nothing before the end",
		tr: tableRun{windower: tumbling, wait: time.Hour, workers: 3,
			scripts: [][]flowtest.Event[ev]{{flowtest.Items(e("a", 1, 1), e("b", 35, 2))}, {flowtest.Items(e("a", 12, 3))}}},
		results: []string{"a [0,10) [1]", "a [10,20) [3]", "b [30,40) [2]"},
		metas:   []string{"a [0,10) items=1 results=1", "a [10,20) items=1 results=1", "b [30,40) items=1 results=1"},
	}, {
		name: "lateness: an item within it updates the window, one after it is late",
		// Lateness 10: [0,10) is final at watermark 10 and gone at 20.
		tr: tableRun{windower: tumbling, opts: windows.Options{Lateness: 10 * time.Millisecond},
			scripts: one(e("a", 1, 1), e("a", 12, 2), e("a", 3, 3), e("a", 25, 4), e("a", 4, 5))},
		results: []string{"a [0,10) [1]", "a [0,10) [1 3] update", "a [10,20) [2]", "a [20,30) [4]"},
		lates:   []string{"a [0,10) 5"},
		metas:   []string{"a [0,10) items=2 results=2", "a [10,20) items=1 results=1", "a [20,30) items=1 results=1"},
	}, {
		name: "lateness: a window that got no item before its end emits its first result as final",
		tr: tableRun{windower: tumbling, opts: windows.Options{Lateness: 10 * time.Millisecond},
			scripts: one(e("a", 12, 1), e("a", 3, 2))},
		results: []string{"a [0,10) [2]", "a [10,20) [1]"},
		metas:   []string{"a [0,10) items=1 results=1", "a [10,20) items=1 results=1"},
	}, {
		name: "session: an item within the lateness merges two closed sessions, as an update",
		// Gap 10: [0,10) and [14,24); z at 30 moves the watermark past both; 7 bridges them.
		tr: tableRun{windower: windows.Session(10 * time.Millisecond), opts: windows.Options{Lateness: 25 * time.Millisecond},
			scripts: one(e("a", 0, 1), e("a", 14, 2), e("z", 30, 3), e("a", 7, 4))},
		results: []string{"a [0,10) [1]", "a [14,24) [2]", "a [0,24) [1 2 4] update", "z [30,40) [3]"},
		metas:   []string{"a [0,24) items=3 results=3", "z [30,40) items=1 results=1"},
	}, {
		name: "session: an item beyond the lateness does not merge and is late",
		tr: tableRun{windower: windows.Session(10 * time.Millisecond), opts: windows.Options{Lateness: 5 * time.Millisecond},
			scripts: one(e("a", 0, 1), e("a", 14, 2), e("z", 30, 3), e("a", 7, 4))},
		results: []string{"a [0,10) [1]", "a [14,24) [2]", "z [30,40) [3]"},
		lates:   []string{"a [7,17) 4"},
		metas:   []string{"a [0,10) items=1 results=1", "a [14,24) items=1 results=1", "z [30,40) items=1 results=1"},
	}, {
		name: "early: running results while the window is open, then the final one",
		// Window [0,100) with early results every 20. a: at watermark 21 ([1 2]), at 45
		// ([1 2 4]), none at 65 (nothing new), the final at EOF. b: at 21 ([3]), at 45 ([3 5]),
		// at 65 (the end mark of watermark 65: [3 5 6]), the final at EOF.
		tr: tableRun{windower: windows.Tumbling(100*time.Millisecond, ms(0)), opts: windows.Options{Early: 20 * time.Millisecond},
			scripts: one(e("a", 1, 1), e("a", 5, 2), e("b", 21, 3), e("a", 30, 4), e("b", 45, 5), e("b", 65, 6))},
		results: []string{"a [0,100) [1 2] early", "a [0,100) [1 2 4] early", "a [0,100) [1 2 4]",
			"b [0,100) [3] early", "b [0,100) [3 5] early", "b [0,100) [3 5 6] early", "b [0,100) [3 5 6]"},
		metas: []string{"a [0,100) items=3 results=3", "b [0,100) items=3 results=4"},
	}, {
		name: "early: a session merged with one that has fired emits no early result, only the update at its end",
		// Gap 10, early every 5: a [0,10) is final at watermark 10; a@15 opens [15,25), which
		// would emit early at 20; a@6 (watermark 15) merges the two into [0,25), which has
		// fired, so watermark 22 emits nothing for it and EOF the update. z [10,20) emits early
		// at 15 and its final at 22.
		tr: tableRun{windower: windows.Session(10 * time.Millisecond), opts: windows.Options{Lateness: 20 * time.Millisecond, Early: 5 * time.Millisecond},
			scripts: one(e("a", 0, 1), e("z", 10, 2), e("a", 15, 3), e("a", 6, 4), e("z", 22, 5))},
		results: []string{"a [0,10) [1]", "a [0,25) [1 3 4] update", "z [10,20) [2] early", "z [10,20) [2]", "z [22,32) [5]"},
		metas:   []string{"a [0,25) items=3 results=2", "z [10,20) items=1 results=2", "z [22,32) items=1 results=1"},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			for _, agg := range aggregates {
				for _, workers := range []int{1, 3} {
					tr := tc.tr
					if tr.workers == 0 {
						tr.workers = workers
					} else if workers > 1 {
						continue
					}
					results, lates, metas := tr.run(t, agg)
					what := fmt.Sprintf("%s, workers=%d", agg.name, tr.workers)
					same(t, what+": results", results, agg.wantOf(t, tc.results))
					same(t, what+": late", lates, tc.lates)
					same(t, what+": meta", metas, tc.metas)
				}
			}
		})
	}
}

// TestLateItemsAreCounted: every item sent to the late stream is counted in the Monitor's
// epochflow_late_items_total.
func TestLateItemsAreCounted(t *testing.T) {
	f := dataflow.New("t")
	in := operators.Input(f, "in", flowtest.List(e("a", 50, 1), e("a", 1, 2), e("b", 2, 3), e("a", 55, 4)))
	keyed := operators.KeyOn("key", in, func(x ev) string { return x.Key })
	out := windows.Count("count", keyed, dataflow.EventClock(func(x ev) time.Time { return ms(x.T) }, 0),
		windows.Tumbling(10*time.Millisecond, ms(0)))
	ls := flowtest.NewSink[windows.Late[ev]]()
	operators.Output("late", out.Late, ls.Output())
	operators.Output("results", out.Results, flowtest.NewSink[windows.Result[int]]().Output())
	m := dataflow.NewMonitor()
	if err := dataflow.Run(context.Background(), f, dataflow.Options{Workers: 1, Monitor: m, Logger: quiet}); err != nil {
		t.Fatal(err)
	}
	families, err := m.Gatherer().Gather()
	if err != nil {
		t.Fatal(err)
	}
	counted := -1.0
	for _, mf := range families {
		if mf.GetName() == "epochflow_late_items_total" {
			counted = mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	if len(ls.Items()) != 2 || counted != 2 {
		t.Fatalf("%d late items, %v counted; want 2 and 2", len(ls.Items()), counted)
	}
}
