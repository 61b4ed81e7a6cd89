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

// For random inputs, worker counts, batch sizes, epoch intervals and pauses, a flow of KeyOn,
// StatefulMap, Reduce and Join gives the same output (as a multiset) as a plain sequential Go
// computation of the same thing.
func TestFlowEqualsSequentialModel(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		keys := rapid.IntRange(1, 20).Draw(rt, "keys")
		parts := rapid.IntRange(1, 4).Draw(rt, "partitions")
		var scripts [][]flowtest.Event[int]
		var all []int
		for p := range parts {
			var script []flowtest.Event[int]
			for c := range rapid.IntRange(0, 5).Draw(rt, fmt.Sprint("chunks", p)) {
				items := rapid.SliceOfN(rapid.IntRange(-1000, 1000), 0, 60).Draw(rt, fmt.Sprint("items", p, c))
				all = append(all, items...)
				script = append(script, flowtest.Items(items...))
				if rapid.Bool().Draw(rt, fmt.Sprint("pause", p, c)) {
					script = append(script, flowtest.Pause[int](time.Duration(rapid.IntRange(0, 3).Draw(rt, "pause_ms"))*time.Millisecond))
				}
			}
			scripts = append(scripts, script)
		}
		key := func(v int) string { return fmt.Sprint("k", ((v%keys)+keys)%keys) }

		f := dataflow.New("prop")
		in := operators.Input(f, "in", flowtest.NewSource(rapid.IntRange(1, 50).Draw(rt, "batch"), scripts...).Input())
		keyed := operators.KeyOn("key", in, key)
		// The n-th item of a key emits n: the multiset of outputs does not depend on order.
		counts := operators.StatefulMap("count", keyed, func(n int, _ int) (int, int, bool) { return n + 1, n + 1, true })
		countSums := operators.Reduce("sum_counts", counts, func(a, b int) int { return a + b })
		valueSums := operators.Reduce("sum_values", keyed, func(a, b int) int { return a + b })
		joined := operators.Join("join", operators.JoinOptions{Emit: operators.EmitComplete}, valueSums, countSums)
		countOut := flowtest.NewSink[dataflow.KV[int]]()
		joinOut := flowtest.NewSink[dataflow.KV[operators.JoinRow[int]]]()
		operators.Output("counts_out", counts, countOut.Output())
		operators.Output("join_out", joined, joinOut.Output())

		opts := dataflow.Options{
			Workers:       rapid.IntRange(1, 8).Draw(rt, "workers"),
			EpochInterval: time.Duration(rapid.IntRange(1, 5000).Draw(rt, "epoch_us")) * time.Microsecond,
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := dataflow.Run(ctx, f, opts); err != nil {
			rt.Fatal(err)
		}

		// The model: a plain loop.
		n := map[string]int{}
		sumV := map[string]int{}
		var wantCounts []string
		for _, v := range all {
			k := key(v)
			n[k]++
			sumV[k] += v
			wantCounts = append(wantCounts, fmt.Sprint(k, "=", n[k]))
		}
		var wantJoin []string
		for k, c := range n {
			wantJoin = append(wantJoin, fmt.Sprint(k, "=", sumV[k], ",", c*(c+1)/2))
		}
		var gotCounts, gotJoin []string
		for _, kv := range countOut.Items() {
			gotCounts = append(gotCounts, fmt.Sprint(kv.Key, "=", kv.Value))
		}
		for _, kv := range joinOut.Items() {
			r := kv.Value
			if len(r.Values) != 2 || !r.Present[0] || !r.Present[1] {
				rt.Fatalf("join row %+v is not complete", kv)
			}
			gotJoin = append(gotJoin, fmt.Sprint(kv.Key, "=", r.Values[0], ",", r.Values[1]))
		}
		for _, s := range [][]string{wantCounts, wantJoin, gotCounts, gotJoin} {
			slices.Sort(s)
		}
		if !slices.Equal(gotCounts, wantCounts) {
			rt.Fatalf("StatefulMap output:\n got %v\nwant %v", gotCounts, wantCounts)
		}
		if !slices.Equal(gotJoin, wantJoin) {
			rt.Fatalf("Join output:\n got %v\nwant %v", gotJoin, wantJoin)
		}
	})
}
