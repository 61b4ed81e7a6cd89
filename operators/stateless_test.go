package operators_test

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/epochflow/epochflow/connectors/flowtest"
	"github.com/epochflow/epochflow/dataflow"
	"github.com/epochflow/epochflow/operators"
)

type S = dataflow.Stream[string]
type KS = dataflow.Stream[dataflow.KV[string]]

// printed applies op to items in a one-partition flow and prints the output items with %v, in
// the order the sink got them (stateless steps keep the order of a partition).
func printed[T, U any](t *testing.T, workers int, items []T, op func(dataflow.Stream[T]) dataflow.Stream[U]) []string {
	t.Helper()
	out := oneShot(t, workers, 3, items, op)
	s := make([]string, len(out))
	for i, u := range out {
		s[i] = fmt.Sprintf("%v", u)
	}
	return s
}

// manyLines are lines of 0 to 6 words, to make FlatMap grow its output in odd steps.
func manyLines() ([]string, []string) {
	var lines, words []string
	for i := range 2000 {
		var ws []string
		for j := range (i * 7) % 7 {
			ws = append(ws, fmt.Sprintf("w%d.%d", i, j))
		}
		if i%97 == 0 {
			ws = append(ws, strings.Split(strings.Repeat("x ", 100), " ")[:100]...)
		}
		lines = append(lines, strings.Join(ws, " "))
		words = append(words, ws...)
	}
	return lines, words
}

func TestStateless(t *testing.T) {
	words := []string{"a", "bb", "c", "dd", "eee"}
	keyed := []dataflow.KV[string]{kv("k1", "a"), kv("k2", "bb"), kv("k1", "ccc")}
	lines, lineWords := manyLines()
	cases := []struct {
		name string
		run  func(t *testing.T, workers int) []string
		want []string
	}{
		{"Map", func(t *testing.T, w int) []string {
			return printed(t, w, words, func(in S) dataflow.Stream[int] {
				return operators.Map("m", in, func(s string) int { return len(s) })
			})
		}, []string{"1", "2", "1", "2", "3"}},
		{"MapErr", func(t *testing.T, w int) []string {
			return printed(t, w, []string{"1", "22", "3"}, func(in S) dataflow.Stream[int] {
				return operators.MapErr("m", in, strconv.Atoi)
			})
		}, []string{"1", "22", "3"}},
		{"MapValue", func(t *testing.T, w int) []string {
			return printed(t, w, keyed, func(in KS) dataflow.Stream[dataflow.KV[int]] {
				return operators.MapValue("m", in, func(s string) int { return len(s) })
			})
		}, []string{"{k1 1}", "{k2 2}", "{k1 3}"}},
		{"Filter", func(t *testing.T, w int) []string {
			return printed(t, w, words, func(in S) S {
				return operators.Filter("f", in, func(s string) bool { return len(s) > 1 })
			})
		}, []string{"bb", "dd", "eee"}},
		{"Filter/all", func(t *testing.T, w int) []string {
			return printed(t, w, words, func(in S) S {
				return operators.Filter("f", in, func(string) bool { return true })
			})
		}, words},
		{"Filter/none", func(t *testing.T, w int) []string {
			return printed(t, w, words, func(in S) S {
				return operators.Filter("f", in, func(string) bool { return false })
			})
		}, []string{}},
		{"Filter/last", func(t *testing.T, w int) []string {
			return printed(t, w, words, func(in S) S {
				return operators.Filter("f", in, func(s string) bool { return s != "eee" && s != "c" })
			})
		}, []string{"a", "bb", "dd"}},
		{"FilterErr", func(t *testing.T, w int) []string {
			return printed(t, w, words, func(in S) S {
				return operators.FilterErr("f", in, func(s string) (bool, error) { return len(s) == 1, nil })
			})
		}, []string{"a", "c"}},
		{"FilterValue", func(t *testing.T, w int) []string {
			return printed(t, w, keyed, func(in KS) KS {
				return operators.FilterValue("f", in, func(s string) bool { return len(s) != 2 })
			})
		}, []string{"{k1 a}", "{k1 ccc}"}},
		{"FilterMap", func(t *testing.T, w int) []string {
			return printed(t, w, []string{"1", "x", "3", "y"}, func(in S) dataflow.Stream[int] {
				return operators.FilterMap("f", in, func(s string) (int, bool) {
					n, err := strconv.Atoi(s)
					return n, err == nil
				})
			})
		}, []string{"1", "3"}},
		{"FilterMapErr", func(t *testing.T, w int) []string {
			return printed(t, w, []string{"1", "-2", "3"}, func(in S) dataflow.Stream[int] {
				return operators.FilterMapErr("f", in, func(s string) (int, bool, error) {
					n, err := strconv.Atoi(s)
					return n, n > 0, err
				})
			})
		}, []string{"1", "3"}},
		{"FlatMap", func(t *testing.T, w int) []string {
			return printed(t, w, []string{"a b", "", "c", "d e f"}, func(in S) S {
				return operators.FlatMap("f", in, strings.Fields)
			})
		}, []string{"a", "b", "c", "d", "e", "f"}},
		{"FlatMap/grow", func(t *testing.T, w int) []string {
			out := oneShot(t, w, 500, lines, func(in S) S { return operators.FlatMap("f", in, strings.Fields) })
			return out
		}, lineWords},
		{"FlatMapSeq", func(t *testing.T, w int) []string {
			return printed(t, w, []string{"a b", "", "c", "d e f"}, func(in S) S {
				return operators.FlatMapSeq("f", in, strings.FieldsSeq)
			})
		}, []string{"a", "b", "c", "d", "e", "f"}},
		{"FlatMapSeq/grow", func(t *testing.T, w int) []string {
			return oneShot(t, w, 500, lines, func(in S) S { return operators.FlatMapSeq("f", in, strings.FieldsSeq) })
		}, lineWords},
		{"FlatMapErr", func(t *testing.T, w int) []string {
			return printed(t, w, []string{"a b", "", "c"}, func(in S) S {
				return operators.FlatMapErr("f", in, func(s string) ([]string, error) { return strings.Fields(s), nil })
			})
		}, []string{"a", "b", "c"}},
		{"FlatMapValue", func(t *testing.T, w int) []string {
			return printed(t, w, []dataflow.KV[string]{kv("k", "a b"), kv("j", ""), kv("i", "c")}, func(in KS) KS {
				return operators.FlatMapValue("f", in, strings.Fields)
			})
		}, []string{"{k a}", "{k b}", "{i c}"}},
		{"Flatten", func(t *testing.T, w int) []string {
			return printed(t, w, [][]int{{1, 2}, nil, {3}, {}, {4, 5, 6}}, func(in dataflow.Stream[[]int]) dataflow.Stream[int] {
				return operators.Flatten("f", in)
			})
		}, []string{"1", "2", "3", "4", "5", "6"}},
		{"KeyOn", func(t *testing.T, w int) []string {
			return printed(t, w, words, func(in S) KS {
				return operators.KeyOn("k", in, func(s string) string { return s[:1] + "!" })
			})
		}, []string{"{a! a}", "{b! bb}", "{c! c}", "{d! dd}", "{e! eee}"}},
		{"KeyRm", func(t *testing.T, w int) []string {
			return printed(t, w, keyed, func(in KS) S { return operators.KeyRm("k", in) })
		}, []string{"a", "bb", "ccc"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			eachWorkers(t, func(t *testing.T, workers int) {
				got := c.run(t, workers)
				if len(got) == 0 && len(c.want) == 0 {
					return
				}
				if !slices.Equal(got, c.want) {
					t.Fatalf("got  %q\nwant %q", got, c.want)
				}
			})
		})
	}
}

func TestInspect(t *testing.T) {
	eachWorkers(t, func(t *testing.T, workers int) {
		var mu sync.Mutex
		var seen []string
		got := oneShot(t, workers, 2, []string{"a", "b", "c"}, func(in S) S {
			return operators.Inspect("i", in, func(s string) {
				mu.Lock()
				seen = append(seen, s)
				mu.Unlock()
			})
		})
		want := []string{"a", "b", "c"}
		if !slices.Equal(got, want) || !slices.Equal(seen, want) {
			t.Fatalf("output %q, inspected %q, want %q", got, seen, want)
		}
	})
}

func TestBranch(t *testing.T) {
	eachWorkers(t, func(t *testing.T, workers int) {
		f := dataflow.New("t")
		in := operators.Input(f, "in", flowtest.List(1, 2, 3, 4, 5, 6, 7))
		even, odd := operators.Branch("b", in, func(n int) bool { return n%2 == 0 })
		se, so := flowtest.NewSink[int](), flowtest.NewSink[int]()
		operators.Output("even", even, se.Output())
		operators.Output("odd", odd, so.Output())
		mustRun(t, f, workers)
		if got := se.Items(); !slices.Equal(got, []int{2, 4, 6}) {
			t.Errorf("trues: %v", got)
		}
		if got := so.Items(); !slices.Equal(got, []int{1, 3, 5, 7}) {
			t.Errorf("falses: %v", got)
		}
	})
}

func TestMergeRedistribute(t *testing.T) {
	eachWorkers(t, func(t *testing.T, workers int) {
		f := dataflow.New("t")
		var ins []S
		var want []string
		for i := range 3 {
			var items []string
			for j := range 50 {
				items = append(items, fmt.Sprintf("s%d-%02d", i, j))
			}
			want = append(want, items...)
			src := flowtest.NewSource(7, []flowtest.Event[string]{flowtest.Items(items[:25]...)}, []flowtest.Event[string]{flowtest.Items(items[25:]...)})
			ins = append(ins, operators.Input(f, fmt.Sprintf("in%d", i), src.Input()))
		}
		merged := operators.Merge("merge", ins...)
		spread := operators.Redistribute("spread", merged)
		sink := flowtest.NewSink[string]()
		operators.Output("out", spread, sink.Output())
		mustRun(t, f, workers)
		slices.Sort(want)
		if got := strs(sink.Items()); !slices.Equal(got, want) {
			t.Fatalf("got %d items %q\nwant %d", len(got), got, len(want))
		}
	})
}

// TestEpochsStateless checks that items keep the epoch they were read in through stateless
// steps: a pause longer than the epoch interval puts the items after it in a later epoch.
func TestEpochsStateless(t *testing.T) {
	eachWorkers(t, func(t *testing.T, workers int) {
		f := dataflow.New("t")
		src := flowtest.NewSource(10, []flowtest.Event[string]{
			flowtest.Items("a b", "c"), flowtest.Pause[string](20 * epochInterval), flowtest.Items("d"),
		})
		words := operators.FlatMap("split", operators.Input(f, "in", src.Input()), strings.Fields)
		upper := operators.Map("upper", words, strings.ToUpper)
		sink := flowtest.NewSink[string]()
		operators.Output("out", operators.Redistribute("spread", upper), sink.Output())
		mustRun(t, f, workers)
		ep := epochOf(sink.ByEpoch())
		if len(ep) != 4 {
			t.Fatalf("got %v", sink.ByEpoch())
		}
		if ep["A"] != ep["B"] || ep["A"] != ep["C"] || ep["D"] <= ep["A"] {
			t.Fatalf("epochs: %v", ep)
		}
	})
}

// TestBuildErrors checks that nil functions and bad streams are recorded on the flow, not
// panics, and that operators on a zero Stream return zero Streams.
func TestBuildErrors(t *testing.T) {
	cases := []struct {
		name  string
		build func(f *dataflow.Flow, in S, keyed KS)
		want  string
	}{
		{"Map nil", func(_ *dataflow.Flow, in S, _ KS) { operators.Map[string, int]("m", in, nil) }, `step "t.m": the map function is nil`},
		{"MapErr nil", func(_ *dataflow.Flow, in S, _ KS) { operators.MapErr[string, int]("m", in, nil) }, `step "t.m": the map function is nil`},
		{"MapValue nil", func(_ *dataflow.Flow, _ S, k KS) { operators.MapValue[string, int]("m", k, nil) }, `step "t.m": the map function is nil`},
		{"Filter nil", func(_ *dataflow.Flow, in S, _ KS) { operators.Filter("m", in, nil) }, `the predicate is nil`},
		{"FilterErr nil", func(_ *dataflow.Flow, in S, _ KS) { operators.FilterErr("m", in, nil) }, `the predicate is nil`},
		{"FilterValue nil", func(_ *dataflow.Flow, _ S, k KS) { operators.FilterValue("m", k, nil) }, `the predicate is nil`},
		{"FilterMap nil", func(_ *dataflow.Flow, in S, _ KS) { operators.FilterMap[string, int]("m", in, nil) }, `is nil`},
		{"FilterMapErr nil", func(_ *dataflow.Flow, in S, _ KS) { operators.FilterMapErr[string, int]("m", in, nil) }, `is nil`},
		{"FlatMap nil", func(_ *dataflow.Flow, in S, _ KS) { operators.FlatMap[string, int]("m", in, nil) }, `is nil`},
		{"FlatMapErr nil", func(_ *dataflow.Flow, in S, _ KS) { operators.FlatMapErr[string, int]("m", in, nil) }, `is nil`},
		{"FlatMapValue nil", func(_ *dataflow.Flow, _ S, k KS) { operators.FlatMapValue[string, int]("m", k, nil) }, `is nil`},
		{"Inspect nil", func(_ *dataflow.Flow, in S, _ KS) { operators.Inspect("m", in, nil) }, `is nil`},
		{"Branch nil", func(_ *dataflow.Flow, in S, _ KS) { operators.Branch("m", in, nil) }, `is nil`},
		{"KeyOn nil", func(_ *dataflow.Flow, in S, _ KS) { operators.KeyOn("m", in, nil) }, `the key function is nil`},
		{"StatefulMap nil", func(_ *dataflow.Flow, _ S, k KS) { operators.StatefulMap[string, int, int]("m", k, nil) }, `is nil`},
		{"StatefulMapErr nil", func(_ *dataflow.Flow, _ S, k KS) { operators.StatefulMapErr[string, int, int]("m", k, nil) }, `is nil`},
		{"StatefulFlatMap nil", func(_ *dataflow.Flow, _ S, k KS) { operators.StatefulFlatMap[string, int, int]("m", k, nil) }, `is nil`},
		{"Stateful nil", func(_ *dataflow.Flow, _ S, k KS) { operators.Stateful[string, int, int]("m", k, nil) }, `the build function is nil`},
		{"Reduce nil", func(_ *dataflow.Flow, _ S, k KS) { operators.Reduce("m", k, nil) }, `is nil`},
		{"Fold nil init", func(_ *dataflow.Flow, _ S, k KS) {
			operators.Fold("m", k, nil, func(int, string) int { return 0 })
		}, `the init function is nil`},
		{"Fold nil fn", func(_ *dataflow.Flow, _ S, k KS) {
			operators.Fold[string, int]("m", k, func(string) int { return 0 }, nil)
		}, `the fold function is nil`},
		{"Count nil", func(_ *dataflow.Flow, in S, _ KS) { operators.Count("m", in, nil) }, `the key function is nil`},
		{"Count empty name", func(_ *dataflow.Flow, in S, _ KS) { operators.Count("", in, strings.ToLower) }, `empty name`},
		{"MaxBy nil", func(_ *dataflow.Flow, _ S, k KS) { operators.MaxBy("m", k, nil) }, `the less function is nil`},
		{"MinBy nil", func(_ *dataflow.Flow, _ S, k KS) { operators.MinBy("m", k, nil) }, `the less function is nil`},
		{"Collect negative max", func(_ *dataflow.Flow, _ S, k KS) { operators.Collect("c", k, -1, time.Second) }, `step "t.c": maxItems is -1`},
		{"Collect negative timeout", func(_ *dataflow.Flow, _ S, k KS) { operators.Collect("c", k, 3, -time.Second) }, `step "t.c": timeout is -1s`},
		{"Collect no bound", func(_ *dataflow.Flow, _ S, k KS) { operators.Collect("c", k, 0, 0) }, `step "t.c": neither maxItems nor timeout`},
		{"Join one side", func(_ *dataflow.Flow, _ S, k KS) { operators.Join("j", operators.JoinOptions{}, k) }, `step "t.j": a join needs at least 2 sides, got 1`},
		{"Join bad insert", func(_ *dataflow.Flow, _ S, k KS) {
			operators.Join("j", operators.JoinOptions{Insert: 7}, k, k)
		}, `unknown insert mode InsertMode(7)`},
		{"Join bad emit", func(_ *dataflow.Flow, _ S, k KS) {
			operators.Join("j", operators.JoinOptions{Emit: 9}, k, k)
		}, `unknown emit mode EmitMode(9)`},
		{"Join zero side", func(_ *dataflow.Flow, _ S, k KS) { operators.Join("j", operators.JoinOptions{}, k, KS{}) }, `step "t.j": input 1 is a zero Stream`},
		{"Join other flow", func(_ *dataflow.Flow, _ S, k KS) {
			g := dataflow.New("other")
			k2 := operators.KeyOn("k", operators.Input(g, "in", flowtest.List("x")), strings.ToLower)
			operators.Join("j", operators.JoinOptions{}, k, k2)
		}, `step "t.j": input 1 belongs to flow "other", not "t"`},
		{"Merge zero input", func(_ *dataflow.Flow, in S, _ KS) { operators.Merge("m", S{}, in) }, `step "t.m": input 0 is a zero Stream`},
		{"Duplicate step", func(_ *dataflow.Flow, in S, _ KS) { operators.Map("in", in, strings.ToLower) }, `step id "t.in" is used twice`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := dataflow.New("t")
			in := operators.Input(f, "in", flowtest.List("a", "b"))
			keyed := operators.KeyOn("key", in, strings.ToLower)
			c.build(f, in, keyed)
			err := f.Err()
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Err() = %v, want it to contain %q", err, c.want)
			}
			if rerr := runFlow(t, f, 1); rerr == nil || !strings.Contains(rerr.Error(), c.want) {
				t.Fatalf("Run = %v", rerr)
			}
		})
	}
}

// TestZeroStreams checks that every operator given a zero Stream returns zero Streams and does
// not panic.
func TestZeroStreams(t *testing.T) {
	var s S
	var k KS
	id := func(x string) string { return x }
	check := func(name string, got interface{ Flow() *dataflow.Flow }) {
		t.Helper()
		if got.Flow() != nil {
			t.Errorf("%s: got a stream of flow %v", name, got.Flow())
		}
	}
	check("Input", operators.Input(nil, "in", flowtest.List("a")))
	check("Map", operators.Map("m", s, id))
	check("MapErr", operators.MapErr("m", s, strconv.Atoi))
	check("MapValue", operators.MapValue("m", k, id))
	check("Filter", operators.Filter("m", s, func(string) bool { return true }))
	check("FilterErr", operators.FilterErr("m", s, func(string) (bool, error) { return true, nil }))
	check("FilterValue", operators.FilterValue("m", k, func(string) bool { return true }))
	check("FilterMap", operators.FilterMap("m", s, func(x string) (string, bool) { return x, true }))
	check("FilterMapErr", operators.FilterMapErr("m", s, func(x string) (string, bool, error) { return x, true, nil }))
	check("FlatMap", operators.FlatMap("m", s, strings.Fields))
	check("FlatMapErr", operators.FlatMapErr("m", s, func(x string) ([]string, error) { return nil, nil }))
	check("FlatMapValue", operators.FlatMapValue("m", k, strings.Fields))
	check("Flatten", operators.Flatten("m", dataflow.Stream[[]int]{}))
	check("Inspect", operators.Inspect("m", s, func(string) {}))
	a, b := operators.Branch("m", s, func(string) bool { return true })
	check("Branch trues", a)
	check("Branch falses", b)
	check("Merge", operators.Merge("m", s, s))
	check("Merge none", operators.Merge[string]("m"))
	check("Redistribute", operators.Redistribute("m", s))
	check("KeyOn", operators.KeyOn("m", s, id))
	check("KeyRm", operators.KeyRm("m", k))
	check("StatefulMap", operators.StatefulMap("m", k, func(n int, _ string) (int, int, bool) { return n, n, true }))
	check("StatefulMapErr", operators.StatefulMapErr("m", k, func(n int, _ string) (int, int, bool, error) { return n, n, true, nil }))
	check("StatefulFlatMap", operators.StatefulFlatMap("m", k, func(n int, _ string) (int, []int, bool) { return n, nil, true }))
	check("Stateful", operators.Stateful("m", k, func(string, *int) (operators.Logic[string, string, int], error) { return nil, nil }))
	check("Reduce", operators.Reduce("m", k, func(a, b string) string { return a + b }))
	check("Fold", operators.Fold("m", k, func(string) int { return 0 }, func(n int, _ string) int { return n }))
	check("Count", operators.Count("m", s, id))
	check("Max", operators.Max("m", k))
	check("Min", operators.Min("m", k))
	check("MaxBy", operators.MaxBy("m", k, func(a, b string) bool { return a < b }))
	check("MinBy", operators.MinBy("m", k, func(a, b string) bool { return a < b }))
	check("Collect", operators.Collect("m", k, 2, time.Second))
	check("Join", operators.Join("m", operators.JoinOptions{}, k, k))
	check("Join none", operators.Join[string]("m", operators.JoinOptions{}))
	operators.Output("o", s, flowtest.NewSink[string]().Output())

	// After a build error, operators on the flow's valid streams do nothing either.
	f := dataflow.New("t")
	in := operators.Input(f, "in", flowtest.List("a"))
	f.Fail(errors.New("earlier mistake"))
	check("after error", operators.Map("m", in, id))
	if got := f.StepIDs(); !reflect.DeepEqual(got, []string{"t.in"}) {
		t.Errorf("steps after the error: %v", got)
	}
}
