package dataflow_test

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/epochflow/epochflow/dataflow"
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
		m := drawModel(rt, 5, 4)
		procs := rapid.IntRange(1, 3).Draw(rt, "processes")
		workers := rapid.IntRange(1, 3).Draw(rt, "workers")
		opts := dataflow.Options{Logger: quiet,
			EpochInterval: time.Duration(rapid.IntRange(100, 5000).Draw(rt, "epoch_us")) * time.Microsecond}
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		for p, err := range runCluster(ctx, freeAddrs(rt, procs), workers, opts, m.build) {
			if err != nil {
				rt.Fatalf("process %d: %v", p, err)
			}
		}
		m.check(rt, fmt.Sprintf("%d processes x %d workers", procs, workers))
	})
}
