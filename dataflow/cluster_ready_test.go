package dataflow_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/epochflow/epochflow/connectors/flowtest"
	"github.com/epochflow/epochflow/dataflow"
	"github.com/epochflow/epochflow/operators"
)

// On a cluster, /readyz (the readiness probe of deploy/kubernetes) answers 503 while a process
// waits for its peers, and 200 once they are connected and the cluster has committed an epoch.
func TestClusterReadyOnlyWithPeers(t *testing.T) {
	addrs := freeAddrs(t, 2)
	src := flowtest.NewSource(10, []flowtest.Event[int]{flowtest.Items(1, 2, 3), flowtest.Pause[int](10 * time.Minute)},
		[]flowtest.Event[int]{flowtest.Items(4, 5, 6), flowtest.Pause[int](10 * time.Minute)})
	build := func() *dataflow.Flow {
		f := dataflow.New("ready")
		in := operators.Input(f, "in", src.Input())
		sums := operators.StatefulMap("sum", operators.KeyOn("key", in, func(v int) string { return fmt.Sprint(v % 3) }),
			func(s, v int) (int, int, bool) { return s + v, s + v, true })
		operators.Output("out", sums, flowtest.NewSink[dataflow.KV[int]]().Output())
		return f
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	mons := []*dataflow.Monitor{dataflow.NewMonitor(), dataflow.NewMonitor()}
	var servers []*httptest.Server
	var logs syncBuffer
	errs := make([]error, 2)
	var errMu sync.Mutex
	t.Cleanup(func() {
		if t.Failed() {
			errMu.Lock()
			t.Logf("Run returned: process 0 %v, process 1 %v\nlogs:\n%s", errs[0], errs[1], logs.String())
			errMu.Unlock()
		}
	})
	start := func(p int) {
		f := build()
		srv := httptest.NewServer(mons[p].Handler(f, false))
		t.Cleanup(srv.Close)
		servers = append(servers, srv)
		o := dataflow.Options{Workers: 1, EpochInterval: 10 * time.Millisecond, Monitor: mons[p],
			Logger:  slog.New(slog.NewTextHandler(&logs, nil)).With("test_process", p),
			Cluster: &dataflow.ClusterOptions{Addresses: addrs, Process: p, Secret: "s", StartTimeout: time.Minute}}
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := dataflow.Run(ctx, f, o)
			errMu.Lock()
			errs[p] = err
			errMu.Unlock()
		}()
	}
	readyz := func(p int) int {
		resp, err := http.Get(servers[p].URL + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	start(0)
	waitFor(t, 30*time.Second, "process 0 to listen", func() bool { return listening(addrs[0]) })
	if code := readyz(0); code != http.StatusServiceUnavailable {
		t.Fatalf("process 0 alone, waiting for its peer: /readyz %d, want 503", code)
	}
	start(1)
	waitFor(t, 30*time.Second, "both processes to be ready", func() bool {
		return readyz(0) == http.StatusOK && readyz(1) == http.StatusOK
	})
}
