package dataflow_test

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/epochflow/epochflow/connectors/flowtest"
	"github.com/epochflow/epochflow/dataflow"
	"github.com/epochflow/epochflow/operators"
)

// freeAddrs returns n loopback addresses whose ports were free a moment ago.
func freeAddrs(t interface{ Fatal(...any) }, n int) []string {
	var addrs []string
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addrs = append(addrs, l.Addr().String())
		l.Close()
	}
	return addrs
}

// listening tells whether a process listens on addr. A probe that TCP connected to itself
// (nothing listening yet, and the kernel picked addr's port as the source port) is reset, so
// that it leaves no TIME_WAIT on the port to keep the process from listening there.
func listening(addr string) bool {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		return false
	}
	self := c.LocalAddr().String() == c.RemoteAddr().String()
	if self {
		c.(*net.TCPConn).SetLinger(0)
	}
	c.Close()
	return !self
}

// runCluster runs build's flow on len(addrs) processes in this test binary, over loopback gRPC,
// and returns each process's error.
func runCluster(ctx context.Context, addrs []string, workers int, opts dataflow.Options, build func() *dataflow.Flow) []error {
	errs := make([]error, len(addrs))
	var wg sync.WaitGroup
	for p := range addrs {
		o := opts
		o.Workers = workers
		o.Cluster = &dataflow.ClusterOptions{Addresses: addrs, Process: p, Secret: "s3cret", PeerTimeout: 5 * time.Second,
			StartTimeout: 20 * time.Second}
		f := build()
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[p] = dataflow.Run(ctx, f, o)
		}()
	}
	wg.Wait()
	return errs
}

// For random inputs, process counts (1 to 3) and worker counts (1 to 3), a flow of KeyOn,
// StatefulMap, Reduce and Join run on a cluster over loopback gRPC gives the same output (as a
// multiset) as a plain sequential Go computation of the same thing.
func TestClusterEqualsSequentialModel(t *testing.T) {
	quiet := slog.New(slog.DiscardHandler)
	rapid.Check(t, func(rt *rapid.T) {
		keys := rapid.IntRange(1, 20).Draw(rt, "keys")
		parts := rapid.IntRange(1, 5).Draw(rt, "partitions")
		var scripts [][]flowtest.Event[int]
		var all []int
		for p := range parts {
			var script []flowtest.Event[int]
			for c := range rapid.IntRange(0, 4).Draw(rt, fmt.Sprint("chunks", p)) {
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
		src := flowtest.NewSource(rapid.IntRange(1, 50).Draw(rt, "batch"), scripts...)
		countOut := flowtest.NewSink[dataflow.KV[int]]()
		joinOut := flowtest.NewSink[dataflow.KV[operators.JoinRow[int]]]()
		build := func() *dataflow.Flow {
			f := dataflow.New("prop")
			in := operators.Input(f, "in", src.Input())
			keyed := operators.KeyOn("key", in, key)
			counts := operators.StatefulMap("count", keyed, func(n int, _ int) (int, int, bool) { return n + 1, n + 1, true })
			countSums := operators.Reduce("sum_counts", counts, func(a, b int) int { return a + b })
			valueSums := operators.Reduce("sum_values", keyed, func(a, b int) int { return a + b })
			joined := operators.Join("join", operators.JoinOptions{Emit: operators.EmitComplete}, valueSums, countSums)
			operators.Output("counts_out", counts, countOut.Output())
			operators.Output("join_out", joined, joinOut.Output())
			return f
		}
		procs := rapid.IntRange(1, 3).Draw(rt, "processes")
		workers := rapid.IntRange(1, 3).Draw(rt, "workers")
		opts := dataflow.Options{Logger: quiet,
			EpochInterval: time.Duration(rapid.IntRange(100, 5000).Draw(rt, "epoch_us")) * time.Microsecond}
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		for p, err := range runCluster(ctx, freeAddrs(rt, procs), workers, opts, build) {
			if err != nil {
				rt.Fatalf("process %d: %v", p, err)
			}
		}

		// The model.
		n := map[string]int{}
		sumCounts := map[string]int{}
		sumValues := map[string]int{}
		var wantCounts []string
		for _, v := range all {
			k := key(v)
			n[k]++
			wantCounts = append(wantCounts, fmt.Sprint(k, "=", n[k]))
			sumCounts[k] += n[k]
			sumValues[k] += v
		}
		var wantJoin []string
		for k := range n {
			wantJoin = append(wantJoin, fmt.Sprint(k, "=", sumValues[k], ",", sumCounts[k]))
		}
		var gotCounts, gotJoin []string
		for _, kv := range countOut.Items() {
			gotCounts = append(gotCounts, fmt.Sprint(kv.Key, "=", kv.Value))
		}
		for _, kv := range joinOut.Items() {
			gotJoin = append(gotJoin, fmt.Sprint(kv.Key, "=", kv.Value.Values[0], ",", kv.Value.Values[1]))
		}
		for _, s := range [][]string{wantCounts, wantJoin, gotCounts, gotJoin} {
			slices.Sort(s)
		}
		if !slices.Equal(gotCounts, wantCounts) {
			rt.Fatalf("counts on %d processes x %d workers:\n got %v\nwant %v", procs, workers, gotCounts, wantCounts)
		}
		if !slices.Equal(gotJoin, wantJoin) {
			rt.Fatalf("join on %d processes x %d workers:\n got %v\nwant %v", procs, workers, gotJoin, wantJoin)
		}
	})
}
