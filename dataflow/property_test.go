package dataflow_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/epochflow/epochflow/connectors/flowtest"
	"github.com/epochflow/epochflow/dataflow"
	"github.com/epochflow/epochflow/operators"
)

// model is the flow the property tests run against a plain sequential computation: KeyOn,
// StatefulMap (the n-th item of a key emits n, so the multiset of outputs does not depend on
// order), two Reduces and a Join of them, over random partitions of random items.
type model struct {
	all      []int // every item, in no particular order
	key      func(int) string
	src      *flowtest.Source[int]
	countOut *flowtest.Sink[dataflow.KV[int]]
	joinOut  *flowtest.Sink[dataflow.KV[operators.JoinRow[int]]]
}

// drawModel draws the keys and up to maxParts partitions of up to maxChunks chunks (each
// followed by a pause or not) and the source's batch size.
func drawModel(rt *rapid.T, maxParts, maxChunks int) *model {
	keys := rapid.IntRange(1, 20).Draw(rt, "keys")
	m := &model{key: func(v int) string { return fmt.Sprint("k", ((v%keys)+keys)%keys) },
		countOut: flowtest.NewSink[dataflow.KV[int]](), joinOut: flowtest.NewSink[dataflow.KV[operators.JoinRow[int]]]()}
	var scripts [][]flowtest.Event[int]
	for p := range rapid.IntRange(1, maxParts).Draw(rt, "partitions") {
		var script []flowtest.Event[int]
		for c := range rapid.IntRange(0, maxChunks).Draw(rt, fmt.Sprint("chunks", p)) {
			items := rapid.SliceOfN(rapid.IntRange(-1000, 1000), 0, 60).Draw(rt, fmt.Sprint("items", p, c))
			m.all = append(m.all, items...)
			script = append(script, flowtest.Items(items...))
			if rapid.Bool().Draw(rt, fmt.Sprint("pause", p, c)) {
				script = append(script, flowtest.Pause[int](time.Duration(rapid.IntRange(0, 3).Draw(rt, "pause_ms"))*time.Millisecond))
			}
		}
		scripts = append(scripts, script)
	}
	m.src = flowtest.NewSource(rapid.IntRange(1, 50).Draw(rt, "batch"), scripts...)
	return m
}

// build returns the model's flow (a new one at each call, on the same source and sinks).
func (m *model) build() *dataflow.Flow {
	f := dataflow.New("prop")
	in := operators.Input(f, "in", m.src.Input())
	keyed := operators.KeyOn("key", in, m.key)
	counts := operators.StatefulMap("count", keyed, func(n int, _ int) (int, int, bool) { return n + 1, n + 1, true })
	countSums := operators.Reduce("sum_counts", counts, func(a, b int) int { return a + b })
	valueSums := operators.Reduce("sum_values", keyed, func(a, b int) int { return a + b })
	joined := operators.Join("join", operators.JoinOptions{Emit: operators.EmitComplete}, valueSums, countSums)
	operators.Output("counts_out", counts, m.countOut.Output())
	operators.Output("join_out", joined, m.joinOut.Output())
	return f
}

// check compares what the sinks got with a plain loop over the items; on is what ran (for
// the failure message).
func (m *model) check(rt *rapid.T, on string) {
	n := map[string]int{}
	sumV := map[string]int{}
	var wantCounts []string
	for _, v := range m.all {
		k := m.key(v)
		n[k]++
		sumV[k] += v
		wantCounts = append(wantCounts, fmt.Sprint(k, "=", n[k]))
	}
	var wantJoin []string
	for k, c := range n {
		wantJoin = append(wantJoin, fmt.Sprint(k, "=", sumV[k], ",", c*(c+1)/2))
	}
	var gotCounts, gotJoin []string
	for _, kv := range m.countOut.Items() {
		gotCounts = append(gotCounts, fmt.Sprint(kv.Key, "=", kv.Value))
	}
	for _, kv := range m.joinOut.Items() {
		r := kv.Value
		if len(r.Values) != 2 || !r.Present[0] || !r.Present[1] {
			rt.Fatalf("%s: join row %+v is not complete", on, kv)
		}
		gotJoin = append(gotJoin, fmt.Sprint(kv.Key, "=", r.Values[0], ",", r.Values[1]))
	}
	for _, s := range [][]string{wantCounts, wantJoin, gotCounts, gotJoin} {
		slices.Sort(s)
	}
	if !slices.Equal(gotCounts, wantCounts) {
		rt.Fatalf("%s: StatefulMap output:\n got %v\nwant %v", on, gotCounts, wantCounts)
	}
	if !slices.Equal(gotJoin, wantJoin) {
		rt.Fatalf("%s: Join output:\n got %v\nwant %v", on, gotJoin, wantJoin)
	}
}

// For random inputs, worker counts, batch sizes, epoch intervals and pauses, a flow of KeyOn,
// StatefulMap, Reduce and Join gives the same output (as a multiset) as a plain sequential Go
// computation of the same thing.
func TestFlowEqualsSequentialModel(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		m := drawModel(rt, 4, 5)
		opts := dataflow.Options{
			Workers:       rapid.IntRange(1, 8).Draw(rt, "workers"),
			EpochInterval: time.Duration(rapid.IntRange(1, 5000).Draw(rt, "epoch_us")) * time.Microsecond,
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := dataflow.Run(ctx, m.build(), opts); err != nil {
			rt.Fatal(err)
		}
		m.check(rt, fmt.Sprintf("%d workers", opts.Workers))
	})
}
