package operators_test

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	"pgregory.net/rapid"

	"github.com/epochflow/epochflow/connectors/flowtest"
	"github.com/epochflow/epochflow/dataflow"
	"github.com/epochflow/epochflow/operators"
)

// jev is one value of one side of a join test.
type jev struct {
	Side int
	Key  string
	Val  int
}

// rowString prints a row as [v0 v1 ...] with _ for a missing side; it fails the test when a
// missing side's value is not the zero value or the slices disagree in length.
func rowString(t tb, r operators.JoinRow[int]) string {
	if len(r.Values) != len(r.Present) {
		t.Fatalf("row %+v: %d values, %d presence flags", r, len(r.Values), len(r.Present))
	}
	parts := make([]string, len(r.Values))
	for i, v := range r.Values {
		switch {
		case r.Present[i]:
			parts[i] = fmt.Sprint(v)
		case v != 0:
			t.Fatalf("row %+v: side %d is missing but has the value %d", r, i, v)
		default:
			parts[i] = "_"
		}
	}
	return "[" + strings.Join(parts, " ") + "]"
}

// runJoin joins n sides split out of one partition that plays evs one by one, so that the
// values of a key reach the join in the order of evs, and returns each key's rows in order.
func runJoin(t tb, workers, n int, opts operators.JoinOptions, evs []jev) map[string][]string {
	f := dataflow.New("t")
	src := flowtest.NewSource(1, []flowtest.Event[jev]{flowtest.Items(evs...)})
	in := operators.Input(f, "in", src.Input())
	sides := make([]dataflow.Stream[dataflow.KV[int]], n)
	for i := range sides {
		sides[i] = operators.FilterMap(fmt.Sprintf("side%d", i), in, func(e jev) (dataflow.KV[int], bool) {
			return kv(e.Key, e.Val), e.Side == i
		})
	}
	sink := flowtest.NewSink[dataflow.KV[operators.JoinRow[int]]]()
	operators.Output("out", operators.Join("join", opts, sides...), sink.Output())
	mustRun(t, f, workers)
	out := map[string][]string{}
	for _, kv := range sink.Items() {
		out[kv.Key] = append(out[kv.Key], rowString(t, kv.Value))
	}
	return out
}

// modelJoin is Bytewax's join semantics in plain Go: every side keeps a list of values.
func modelJoin(n int, opts operators.JoinOptions, evs []jev) map[string][]string {
	states := map[string][][]int{}
	out := map[string][]string{}
	var order []string
	for _, e := range evs {
		s, ok := states[e.Key]
		if !ok {
			s = make([][]int, n)
			order = append(order, e.Key)
		}
		switch opts.Insert {
		case operators.InsertFirst:
			if len(s[e.Side]) == 0 {
				s[e.Side] = []int{e.Val}
			}
		case operators.InsertLast:
			s[e.Side] = []int{e.Val}
		case operators.InsertProduct:
			s[e.Side] = append(s[e.Side], e.Val)
		}
		states[e.Key] = s
		switch opts.Emit {
		case operators.EmitComplete:
			if !slices.ContainsFunc(s, func(l []int) bool { return len(l) == 0 }) {
				out[e.Key] = append(out[e.Key], modelRows(s)...)
				delete(states, e.Key)
			}
		case operators.EmitRunning:
			out[e.Key] = append(out[e.Key], modelRows(s)...)
		}
	}
	if opts.Emit == operators.EmitFinal {
		for _, k := range order {
			if s, ok := states[k]; ok {
				out[k] = append(out[k], modelRows(s)...)
			}
		}
	}
	return out
}

// modelRows is the cartesian product of the sides' lists, the first side varying slowest, with
// _ for a side without values.
func modelRows(lists [][]int) []string {
	rows := [][]string{{}}
	for _, l := range lists {
		choices := []string{"_"}
		if len(l) > 0 {
			choices = nil
			for _, v := range l {
				choices = append(choices, fmt.Sprint(v))
			}
		}
		var next [][]string
		for _, r := range rows {
			for _, c := range choices {
				next = append(next, append(slices.Clone(r), c))
			}
		}
		rows = next
	}
	out := make([]string, len(rows))
	for i, r := range rows {
		out[i] = "[" + strings.Join(r, " ") + "]"
	}
	return out
}

var joinEvents2 = []jev{
	{0, "a", 1}, {0, "a", 2}, {1, "a", 10}, {0, "b", 3}, {1, "a", 11},
	{0, "a", 4}, {1, "c", 20}, {1, "b", 30}, {1, "b", 31}, {0, "b", 5},
}

var joinEvents3 = []jev{
	{0, "a", 1}, {0, "a", 2}, {1, "a", 10}, {2, "a", 100}, {0, "b", 3}, {1, "a", 11},
	{2, "c", 300}, {0, "a", 4}, {2, "a", 101}, {1, "c", 20}, {1, "b", 30}, {2, "b", 200},
	{1, "b", 31}, {0, "b", 5}, {2, "b", 201}, {0, "c", 7},
}

type m = map[string][]string

// joinWant2 is what a 2-sided join of joinEvents2 emits, worked out by hand.
var joinWant2 = map[operators.JoinOptions]m{
	{operators.InsertLast, operators.EmitComplete}:    {"a": {"[2 10]", "[4 11]"}, "b": {"[3 30]", "[5 31]"}},
	{operators.InsertFirst, operators.EmitComplete}:   {"a": {"[1 10]", "[4 11]"}, "b": {"[3 30]", "[5 31]"}},
	{operators.InsertProduct, operators.EmitComplete}: {"a": {"[1 10]", "[2 10]", "[4 11]"}, "b": {"[3 30]", "[5 31]"}},
	{operators.InsertLast, operators.EmitFinal}:       {"a": {"[4 11]"}, "b": {"[5 31]"}, "c": {"[_ 20]"}},
	{operators.InsertFirst, operators.EmitFinal}:      {"a": {"[1 10]"}, "b": {"[3 30]"}, "c": {"[_ 20]"}},
	{operators.InsertProduct, operators.EmitFinal}: {
		"a": {"[1 10]", "[1 11]", "[2 10]", "[2 11]", "[4 10]", "[4 11]"},
		"b": {"[3 30]", "[3 31]", "[5 30]", "[5 31]"}, "c": {"[_ 20]"}},
	{operators.InsertLast, operators.EmitRunning}: {
		"a": {"[1 _]", "[2 _]", "[2 10]", "[2 11]", "[4 11]"},
		"b": {"[3 _]", "[3 30]", "[3 31]", "[5 31]"}, "c": {"[_ 20]"}},
	{operators.InsertFirst, operators.EmitRunning}: {
		"a": {"[1 _]", "[1 _]", "[1 10]", "[1 10]", "[1 10]"},
		"b": {"[3 _]", "[3 30]", "[3 30]", "[3 30]"}, "c": {"[_ 20]"}},
	{operators.InsertProduct, operators.EmitRunning}: {
		"a": {"[1 _]", "[1 _]", "[2 _]", "[1 10]", "[2 10]", "[1 10]", "[1 11]", "[2 10]", "[2 11]",
			"[1 10]", "[1 11]", "[2 10]", "[2 11]", "[4 10]", "[4 11]"},
		"b": {"[3 _]", "[3 30]", "[3 30]", "[3 31]", "[3 30]", "[3 31]", "[5 30]", "[5 31]"},
		"c": {"[_ 20]"}},
}

var (
	insertModes = []operators.InsertMode{operators.InsertLast, operators.InsertFirst, operators.InsertProduct}
	emitModes   = []operators.EmitMode{operators.EmitComplete, operators.EmitFinal, operators.EmitRunning}
)

// TestJoinModes runs all 9 mode combinations with 2 sides (against results worked out by hand
// and the model) and 3 sides (against the model).
func TestJoinModes(t *testing.T) {
	for _, ins := range insertModes {
		for _, em := range emitModes {
			opts := operators.JoinOptions{Insert: ins, Emit: em}
			t.Run(fmt.Sprintf("%v/%v", ins, em), func(t *testing.T) {
				want2 := joinWant2[opts]
				if model := modelJoin(2, opts, joinEvents2); !maps.EqualFunc(model, want2, slices.Equal) {
					t.Fatalf("the model disagrees with the hand-made result:\nmodel %v\nwant  %v", model, want2)
				}
				want3 := modelJoin(3, opts, joinEvents3)
				eachWorkers(t, func(t *testing.T, workers int) {
					if got := runJoin(t, workers, 2, opts, joinEvents2); !maps.EqualFunc(got, want2, slices.Equal) {
						t.Errorf("2 sides:\ngot  %v\nwant %v", got, want2)
					}
					if got := runJoin(t, workers, 3, opts, joinEvents3); !maps.EqualFunc(got, want3, slices.Equal) {
						t.Errorf("3 sides:\ngot  %v\nwant %v", got, want3)
					}
				})
			})
		}
	}
}

// TestJoinDefault checks that the zero JoinOptions is InsertLast, EmitComplete, and that a join
// of streams from separate sources works.
func TestJoinDefault(t *testing.T) {
	eachWorkers(t, func(t *testing.T, workers int) {
		f := dataflow.New("t")
		names := operators.Input(f, "names", flowtest.List(kv("1", "ann"), kv("2", "bob"), kv("3", "cyd")))
		emails := operators.Input(f, "emails", flowtest.List(kv("2", "bob@x"), kv("1", "ann@x"), kv("4", "dan@x")))
		rows := operators.Join("join", operators.JoinOptions{}, names, emails)
		sink := flowtest.NewSink[dataflow.KV[operators.JoinRow[string]]]()
		operators.Output("out", rows, sink.Output())
		mustRun(t, f, workers)
		want := []string{"{1 {[ann ann@x] [true true]}}", "{2 {[bob bob@x] [true true]}}"}
		if got := strs(sink.Items()); !slices.Equal(got, want) {
			t.Fatalf("got %q\nwant %q", got, want)
		}
	})
}

// TestJoinEpochs checks that a complete row carries the epoch of the value that completed it,
// and that EmitFinal rows come at EOF.
func TestJoinEpochs(t *testing.T) {
	for _, em := range []operators.EmitMode{operators.EmitComplete, operators.EmitFinal} {
		t.Run(em.String(), func(t *testing.T) {
			eachWorkers(t, func(t *testing.T, workers int) {
				f := dataflow.New("t")
				src := flowtest.NewSource(10, []flowtest.Event[jev]{
					flowtest.Items(jev{0, "a", 1}, jev{0, "b", 2}, jev{1, "a", 3}),
					flowtest.Pause[jev](20 * epochInterval),
					flowtest.Items(jev{1, "b", 4}),
				})
				in := operators.Input(f, "in", src.Input())
				seen := flowtest.NewSink[jev]()
				operators.Output("seen", in, seen.Output())
				side := func(i int) dataflow.Stream[dataflow.KV[int]] {
					return operators.FilterMap(fmt.Sprint("side", i), in, func(e jev) (dataflow.KV[int], bool) {
						return kv(e.Key, e.Val), e.Side == i
					})
				}
				sink := flowtest.NewSink[dataflow.KV[operators.JoinRow[int]]]()
				operators.Output("out", operators.Join("join", operators.JoinOptions{Emit: em}, side(0), side(1)), sink.Output())
				mustRun(t, f, workers)
				ep := map[string]uint64{}
				for e, rows := range sink.ByEpoch() {
					for _, r := range rows {
						ep[r.Key+rowString(t, r.Value)] = e
					}
				}
				if len(ep) != 2 || ep["a[1 3]"] == 0 || ep["b[2 4]"] == 0 {
					t.Fatalf("rows: %v", sink.ByEpoch())
				}
				if em == operators.EmitComplete && ep["a[1 3]"] >= ep["b[2 4]"] {
					t.Fatalf("row a came in epoch %d, not before row b's %d", ep["a[1 3]"], ep["b[2 4]"])
				}
				last := slices.Max(slices.Collect(maps.Keys(seen.ByEpoch())))
				if em == operators.EmitFinal && (ep["a[1 3]"] < last || ep["b[2 4]"] < last) {
					t.Fatalf("final rows in epochs %v, before the last input's epoch %d", ep, last)
				}
			})
		})
	}
}

// TestJoinRowsOwnTheirSlices checks that a running join's rows do not change when the state
// changes later.
func TestJoinRowsOwnTheirSlices(t *testing.T) {
	for _, ins := range insertModes {
		got := runJoin(t, 1, 2, operators.JoinOptions{Insert: ins, Emit: operators.EmitRunning},
			[]jev{{0, "a", 1}, {0, "a", 2}, {1, "a", 3}})
		want := modelJoin(2, operators.JoinOptions{Insert: ins, Emit: operators.EmitRunning},
			[]jev{{0, "a", 1}, {0, "a", 2}, {1, "a", 3}})
		if !maps.EqualFunc(got, want, slices.Equal) {
			t.Errorf("%v: got %v, want %v", ins, got, want)
		}
	}
}

// TestJoinProperty compares Join with the model on random inputs, modes and side counts.
func TestJoinProperty(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		n := rapid.IntRange(2, 4).Draw(rt, "sides")
		opts := operators.JoinOptions{
			Insert: rapid.SampledFrom(insertModes).Draw(rt, "insert"),
			Emit:   rapid.SampledFrom(emitModes).Draw(rt, "emit"),
		}
		evs := rapid.SliceOfN(rapid.Custom(func(rt *rapid.T) jev {
			return jev{
				Side: rapid.IntRange(0, n-1).Draw(rt, "side"),
				Key:  rapid.SampledFrom([]string{"a", "b", "c", "d"}).Draw(rt, "key"),
				Val:  rapid.IntRange(1, 9).Draw(rt, "val"),
			}
		}), 0, 25).Draw(rt, "events")
		workers := rapid.SampledFrom(workerCounts).Draw(rt, "workers")
		want := modelJoin(n, opts, evs)
		got := runJoin(rt, workers, n, opts, evs)
		if !maps.EqualFunc(got, want, slices.Equal) {
			rt.Fatalf("got  %v\nwant %v", got, want)
		}
	})
}
