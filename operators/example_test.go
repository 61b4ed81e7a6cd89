package operators_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/epochflow/epochflow/connectors/flowtest"
	"github.com/epochflow/epochflow/dataflow"
	"github.com/epochflow/epochflow/operators"
)

// run runs a flow with the default options and prints its error, if any.
func run(f *dataflow.Flow) {
	if err := dataflow.Run(context.Background(), f, dataflow.Options{}); err != nil {
		fmt.Println(err)
	}
}

// printSorted prints items with %v, one a line, sorted: with more than one worker the order
// of a flow's output is not fixed.
func printSorted[T any](items []T) {
	for _, s := range strs(items) {
		fmt.Println(s)
	}
}

func ExampleInput() {
	f := dataflow.New("example")
	words := operators.Input(f, "read", flowtest.List("hello", "world"))
	sink := flowtest.NewSink[string]()
	operators.Output("write", words, sink.Output())
	run(f)
	fmt.Println(sink.Items())
	// Output: [hello world]
}

func ExampleOutput() {
	f := dataflow.New("example")
	nums := operators.Input(f, "read", flowtest.List(1, 2, 3))
	sink := flowtest.NewSink[int]()
	operators.Output("write", nums, sink.Output())
	run(f)
	fmt.Println(sink.Items(), "committed epoch:", sink.Committed())
	// Output: [1 2 3] committed epoch: 1
}

func ExampleMap() {
	f := dataflow.New("example")
	words := operators.Input(f, "read", flowtest.List("a", "bb", "ccc"))
	lens := operators.Map("len", words, func(s string) int { return len(s) })
	sink := flowtest.NewSink[int]()
	operators.Output("write", lens, sink.Output())
	run(f)
	fmt.Println(sink.Items())
	// Output: [1 2 3]
}

func ExampleMapErr() {
	f := dataflow.New("example")
	in := operators.Input(f, "read", flowtest.List("1", "2", "three"))
	nums := operators.MapErr("parse", in, strconv.Atoi)
	operators.Output("write", nums, flowtest.NewSink[int]().Output())
	err := dataflow.Run(context.Background(), f, dataflow.Options{})
	fmt.Println(err)
	var se *dataflow.StepError
	var ie *dataflow.ItemError
	if errors.As(err, &se) && errors.As(err, &ie) {
		fmt.Printf("step %s, worker %d, item %s\n", se.Step, se.Worker, ie.Item)
	}
	// Output:
	// flow "example": step "example.parse" (worker 0): item "three": strconv.Atoi: parsing "three": invalid syntax
	// step example.parse, worker 0, item "three"
}

func ExampleMapValue() {
	f := dataflow.New("example")
	in := operators.Input(f, "read", flowtest.List(dataflow.KV[int]{Key: "a", Value: 1}, dataflow.KV[int]{Key: "b", Value: 2}))
	doubled := operators.MapValue("double", in, func(n int) int { return 2 * n })
	sink := flowtest.NewSink[dataflow.KV[int]]()
	operators.Output("write", doubled, sink.Output())
	run(f)
	fmt.Println(sink.Items())
	// Output: [{a 2} {b 4}]
}

func ExampleFilter() {
	f := dataflow.New("example")
	nums := operators.Input(f, "read", flowtest.List(1, 2, 3, 4, 5))
	odd := operators.Filter("odd", nums, func(n int) bool { return n%2 == 1 })
	sink := flowtest.NewSink[int]()
	operators.Output("write", odd, sink.Output())
	run(f)
	fmt.Println(sink.Items())
	// Output: [1 3 5]
}

func ExampleFilterErr() {
	f := dataflow.New("example")
	in := operators.Input(f, "read", flowtest.List("1", "20", "x"))
	small := operators.FilterErr("small", in, func(s string) (bool, error) {
		n, err := strconv.Atoi(s)
		return n < 10, err
	})
	operators.Output("write", small, flowtest.NewSink[string]().Output())
	run(f)
	// Output: flow "example": step "example.small" (worker 0): item "x": strconv.Atoi: parsing "x": invalid syntax
}

func ExampleFilterValue() {
	f := dataflow.New("example")
	in := operators.Input(f, "read", flowtest.List(dataflow.KV[int]{Key: "a", Value: -1}, dataflow.KV[int]{Key: "b", Value: 2}))
	pos := operators.FilterValue("positive", in, func(n int) bool { return n > 0 })
	sink := flowtest.NewSink[dataflow.KV[int]]()
	operators.Output("write", pos, sink.Output())
	run(f)
	fmt.Println(sink.Items())
	// Output: [{b 2}]
}

func ExampleFilterMap() {
	f := dataflow.New("example")
	in := operators.Input(f, "read", flowtest.List("1", "x", "3"))
	nums := operators.FilterMap("parse", in, func(s string) (int, bool) {
		n, err := strconv.Atoi(s)
		return n, err == nil // skip what does not parse
	})
	sink := flowtest.NewSink[int]()
	operators.Output("write", nums, sink.Output())
	run(f)
	fmt.Println(sink.Items())
	// Output: [1 3]
}

func ExampleFilterMapErr() {
	f := dataflow.New("example")
	in := operators.Input(f, "read", flowtest.List("1", "", "3", "x"))
	nums := operators.FilterMapErr("parse", in, func(s string) (int, bool, error) {
		if s == "" {
			return 0, false, nil // skip empty lines
		}
		n, err := strconv.Atoi(s)
		return n, true, err // fail on anything else that does not parse
	})
	sink := flowtest.NewSink[int]()
	operators.Output("write", nums, sink.Output())
	run(f)
	// Output: flow "example": step "example.parse" (worker 0): item "x": strconv.Atoi: parsing "x": invalid syntax
}

func ExampleFlatMap() {
	f := dataflow.New("example")
	lines := operators.Input(f, "read", flowtest.List("to be", "or not to be"))
	words := operators.FlatMap("split", lines, strings.Fields)
	sink := flowtest.NewSink[string]()
	operators.Output("write", words, sink.Output())
	run(f)
	fmt.Println(sink.Items())
	// Output: [to be or not to be]
}

func ExampleFlatMapSeq() {
	f := dataflow.New("example")
	lines := operators.Input(f, "read", flowtest.List("to be", "or not to be"))
	words := operators.FlatMapSeq("split", lines, strings.FieldsSeq)
	sink := flowtest.NewSink[string]()
	operators.Output("write", words, sink.Output())
	run(f)
	fmt.Println(sink.Items())
	// Output: [to be or not to be]
}

func ExampleFlatMapErr() {
	f := dataflow.New("example")
	in := operators.Input(f, "read", flowtest.List("1,2", "3"))
	nums := operators.FlatMapErr("parse", in, func(s string) ([]int, error) {
		var out []int
		for _, field := range strings.Split(s, ",") {
			n, err := strconv.Atoi(field)
			if err != nil {
				return nil, err
			}
			out = append(out, n)
		}
		return out, nil
	})
	sink := flowtest.NewSink[int]()
	operators.Output("write", nums, sink.Output())
	run(f)
	fmt.Println(sink.Items())
	// Output: [1 2 3]
}

func ExampleFlatMapValue() {
	f := dataflow.New("example")
	in := operators.Input(f, "read", flowtest.List(dataflow.KV[string]{Key: "doc1", Value: "a b"}))
	words := operators.FlatMapValue("split", in, strings.Fields)
	sink := flowtest.NewSink[dataflow.KV[string]]()
	operators.Output("write", words, sink.Output())
	run(f)
	fmt.Println(sink.Items())
	// Output: [{doc1 a} {doc1 b}]
}

func ExampleFlatten() {
	f := dataflow.New("example")
	in := operators.Input(f, "read", flowtest.List([]int{1, 2}, nil, []int{3}))
	flat := operators.Flatten("flatten", in)
	sink := flowtest.NewSink[int]()
	operators.Output("write", flat, sink.Output())
	run(f)
	fmt.Println(sink.Items())
	// Output: [1 2 3]
}

func ExampleInspect() {
	f := dataflow.New("example")
	in := operators.Input(f, "read", flowtest.List("a", "b"))
	// With one worker fn runs on one goroutine; with more, guard what it shares.
	seen := operators.Inspect("log", in, func(s string) { fmt.Println("saw", s) })
	operators.Output("write", seen, flowtest.NewSink[string]().Output())
	run(f)
	// Output:
	// saw a
	// saw b
}

func ExampleBranch() {
	f := dataflow.New("example")
	nums := operators.Input(f, "read", flowtest.List(1, 2, 3, 4))
	even, odd := operators.Branch("parity", nums, func(n int) bool { return n%2 == 0 })
	evens, odds := flowtest.NewSink[int](), flowtest.NewSink[int]()
	operators.Output("evens", even, evens.Output())
	operators.Output("odds", odd, odds.Output())
	run(f)
	fmt.Println(evens.Items(), odds.Items())
	// Output: [2 4] [1 3]
}

func ExampleMerge() {
	f := dataflow.New("example")
	a := operators.Input(f, "a", flowtest.List("a1", "a2"))
	b := operators.Input(f, "b", flowtest.List("b1"))
	all := operators.Merge("merge", a, b)
	sink := flowtest.NewSink[string]()
	operators.Output("write", all, sink.Output())
	run(f)
	printSorted(sink.Items())
	// Output:
	// a1
	// a2
	// b1
}

func ExampleRedistribute() {
	f := dataflow.New("example")
	// One partition: without Redistribute, one worker would do all the parsing.
	in := operators.Input(f, "read", flowtest.List("1", "2", "3", "4"))
	spread := operators.Redistribute("spread", in)
	nums := operators.MapErr("parse", spread, strconv.Atoi)
	sink := flowtest.NewSink[int]()
	operators.Output("write", nums, sink.Output())
	if err := dataflow.Run(context.Background(), f, dataflow.Options{Workers: 2}); err != nil {
		fmt.Println(err)
	}
	printSorted(sink.Items())
	// Output:
	// 1
	// 2
	// 3
	// 4
}

func ExampleKeyOn() {
	f := dataflow.New("example")
	in := operators.Input(f, "read", flowtest.List("apple", "banana"))
	keyed := operators.KeyOn("initial", in, func(s string) string { return s[:1] })
	sink := flowtest.NewSink[dataflow.KV[string]]()
	operators.Output("write", keyed, sink.Output())
	run(f)
	fmt.Println(sink.Items())
	// Output: [{a apple} {b banana}]
}

func ExampleKeyRm() {
	f := dataflow.New("example")
	in := operators.Input(f, "read", flowtest.List(dataflow.KV[int]{Key: "a", Value: 1}, dataflow.KV[int]{Key: "b", Value: 2}))
	values := operators.KeyRm("values", in)
	sink := flowtest.NewSink[int]()
	operators.Output("write", values, sink.Output())
	run(f)
	fmt.Println(sink.Items())
	// Output: [1 2]
}

func ExampleStatefulMap() {
	f := dataflow.New("example")
	words := operators.Input(f, "read", flowtest.List("a", "b", "a", "a"))
	keyed := operators.KeyOn("key", words, func(w string) string { return w })
	// A running count per word: new state, output, keep.
	counts := operators.StatefulMap("count", keyed, func(n int, _ string) (int, int, bool) {
		n++
		return n, n, true
	})
	sink := flowtest.NewSink[dataflow.KV[int]]()
	operators.Output("write", counts, sink.Output())
	run(f)
	fmt.Println(sink.Items())
	// Output: [{a 1} {b 1} {a 2} {a 3}]
}

func ExampleStatefulMapErr() {
	f := dataflow.New("example")
	in := operators.Input(f, "read", flowtest.List(
		dataflow.KV[int]{Key: "acct", Value: 10}, dataflow.KV[int]{Key: "acct", Value: -4}, dataflow.KV[int]{Key: "acct", Value: -7}))
	// A balance that must not go below zero.
	balances := operators.StatefulMapErr("balance", in, func(bal, amount int) (int, int, bool, error) {
		if bal+amount < 0 {
			return bal, 0, true, fmt.Errorf("overdraft: balance %d, amount %d", bal, amount)
		}
		return bal + amount, bal + amount, true, nil
	})
	operators.Output("write", balances, flowtest.NewSink[dataflow.KV[int]]().Output())
	run(f)
	// Output: flow "example": step "example.balance" (worker 0): item {Key:acct Value:-7}: overdraft: balance 6, amount -7
}

func ExampleStatefulFlatMap() {
	f := dataflow.New("example")
	in := operators.Input(f, "read", flowtest.List(
		dataflow.KV[string]{Key: "s1", Value: "login"}, dataflow.KV[string]{Key: "s1", Value: "view"},
		dataflow.KV[string]{Key: "s1", Value: "logout"}, dataflow.KV[string]{Key: "s1", Value: "view"}))
	// Emit a session's events at logout, and forget the session then.
	sessions := operators.StatefulFlatMap("session", in, func(events []string, ev string) ([]string, []string, bool) {
		events = append(events, ev)
		if ev == "logout" {
			return nil, events, false
		}
		return events, nil, true
	})
	sink := flowtest.NewSink[dataflow.KV[string]]()
	operators.Output("write", sessions, sink.Output())
	run(f)
	fmt.Println(sink.Items())
	// Output: [{s1 login} {s1 view} {s1 logout}]
}

func ExampleReduce() {
	f := dataflow.New("example")
	in := operators.Input(f, "read", flowtest.List(
		dataflow.KV[int]{Key: "a", Value: 1}, dataflow.KV[int]{Key: "b", Value: 10}, dataflow.KV[int]{Key: "a", Value: 2}))
	sums := operators.Reduce("sum", in, func(acc, v int) int { return acc + v })
	sink := flowtest.NewSink[dataflow.KV[int]]()
	operators.Output("write", sums, sink.Output())
	run(f)
	printSorted(sink.Items())
	// Output:
	// {a 3}
	// {b 10}
}

func ExampleFold() {
	f := dataflow.New("example")
	in := operators.Input(f, "read", flowtest.List(
		dataflow.KV[string]{Key: "fruit", Value: "apple"}, dataflow.KV[string]{Key: "fruit", Value: "fig"}))
	lists := operators.Fold("list", in,
		func(key string) []string { return []string{key + ":"} },
		func(acc []string, v string) []string { return append(acc, v) })
	sink := flowtest.NewSink[dataflow.KV[[]string]]()
	operators.Output("write", lists, sink.Output())
	run(f)
	fmt.Println(sink.Items())
	// Output: [{fruit [fruit: apple fig]}]
}

func ExampleCount() {
	f := dataflow.New("wordcount")
	lines := operators.Input(f, "read", flowtest.List("the cat", "the dog"))
	words := operators.FlatMap("split", lines, strings.Fields)
	counts := operators.Count("count", words, func(w string) string { return w })
	sink := flowtest.NewSink[dataflow.KV[int]]()
	operators.Output("write", counts, sink.Output())
	run(f)
	printSorted(sink.Items())
	// Output:
	// {cat 1}
	// {dog 1}
	// {the 2}
}

func ExampleMax() {
	f := dataflow.New("example")
	in := operators.Input(f, "read", flowtest.List(
		dataflow.KV[float64]{Key: "t", Value: 20.5}, dataflow.KV[float64]{Key: "t", Value: 22}, dataflow.KV[float64]{Key: "t", Value: 19}))
	hottest := operators.Max("max", in)
	sink := flowtest.NewSink[dataflow.KV[float64]]()
	operators.Output("write", hottest, sink.Output())
	run(f)
	fmt.Println(sink.Items())
	// Output: [{t 22}]
}

func ExampleMin() {
	f := dataflow.New("example")
	in := operators.Input(f, "read", flowtest.List(
		dataflow.KV[string]{Key: "k", Value: "pear"}, dataflow.KV[string]{Key: "k", Value: "fig"}))
	first := operators.Min("min", in)
	sink := flowtest.NewSink[dataflow.KV[string]]()
	operators.Output("write", first, sink.Output())
	run(f)
	fmt.Println(sink.Items())
	// Output: [{k fig}]
}

type reading struct {
	Sensor string
	Temp   float64
	At     int
}

func ExampleMaxBy() {
	f := dataflow.New("example")
	in := operators.Input(f, "read", flowtest.List(reading{"s1", 20, 1}, reading{"s1", 25, 2}, reading{"s1", 21, 3}))
	keyed := operators.KeyOn("sensor", in, func(r reading) string { return r.Sensor })
	hottest := operators.MaxBy("hottest", keyed, func(a, b reading) bool { return a.Temp < b.Temp })
	sink := flowtest.NewSink[dataflow.KV[reading]]()
	operators.Output("write", hottest, sink.Output())
	run(f)
	fmt.Println(sink.Items())
	// Output: [{s1 {s1 25 2}}]
}

func ExampleMinBy() {
	f := dataflow.New("example")
	in := operators.Input(f, "read", flowtest.List(reading{"s1", 20, 1}, reading{"s1", 25, 2}, reading{"s1", 21, 3}))
	keyed := operators.KeyOn("sensor", in, func(r reading) string { return r.Sensor })
	earliest := operators.MinBy("earliest", keyed, func(a, b reading) bool { return a.At < b.At })
	sink := flowtest.NewSink[dataflow.KV[reading]]()
	operators.Output("write", earliest, sink.Output())
	run(f)
	fmt.Println(sink.Items())
	// Output: [{s1 {s1 20 1}}]
}

func ExampleCollect() {
	f := dataflow.New("example")
	src := flowtest.NewSource(10, []flowtest.Event[dataflow.KV[int]]{
		flowtest.Items(dataflow.KV[int]{Key: "k", Value: 1}, dataflow.KV[int]{Key: "k", Value: 2}, dataflow.KV[int]{Key: "k", Value: 3}),
		flowtest.Pause[dataflow.KV[int]](200 * time.Millisecond), // the 50ms timeout fires here
		flowtest.Items(dataflow.KV[int]{Key: "k", Value: 4}),
	})
	in := operators.Input(f, "read", src.Input())
	// Lists of at most 2 values, or what came within 50ms of a list's first value.
	lists := operators.Collect("batch", in, 2, 50*time.Millisecond)
	sink := flowtest.NewSink[dataflow.KV[[]int]]()
	operators.Output("write", lists, sink.Output())
	run(f)
	fmt.Println(sink.Items())
	// Output: [{k [1 2]} {k [3]} {k [4]}]
}

func ExampleJoin() {
	f := dataflow.New("example")
	names := operators.Input(f, "names", flowtest.List(
		dataflow.KV[string]{Key: "u1", Value: "Ann"}, dataflow.KV[string]{Key: "u2", Value: "Bob"}))
	emails := operators.Input(f, "emails", flowtest.List(
		dataflow.KV[string]{Key: "u1", Value: "ann@example.com"}, dataflow.KV[string]{Key: "u3", Value: "cyd@example.com"}))
	// EmitFinal: one row per key at EOF, with whatever sides are present.
	rows := operators.Join("join", operators.JoinOptions{Emit: operators.EmitFinal}, names, emails)
	sink := flowtest.NewSink[dataflow.KV[operators.JoinRow[string]]]()
	operators.Output("write", rows, sink.Output())
	run(f)
	items := sink.Items()
	slices.SortFunc(items, func(a, b dataflow.KV[operators.JoinRow[string]]) int { return strings.Compare(a.Key, b.Key) })
	for _, kv := range items {
		fmt.Printf("%s %q %v\n", kv.Key, kv.Value.Values, kv.Value.Present)
	}
	// Output:
	// u1 ["Ann" "ann@example.com"] [true true]
	// u2 ["Bob" ""] [true false]
	// u3 ["" "cyd@example.com"] [false true]
}
