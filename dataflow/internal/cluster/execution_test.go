package cluster

import (
	"context"
	"encoding/binary"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"
)

func freeAddrs(t *testing.T, n int) []string {
	t.Helper()
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

// recorder is a Handler that keeps the first failure.
type recorder struct {
	mu     sync.Mutex
	err    error
	failed chan struct{}
}

func (r *recorder) handler() Handler {
	return Handler{
		Data:   func(int, int, int, uint8, uint64, []byte) error { return nil },
		Ack:    func(int, int, int, uint64) error { return nil },
		Report: func(int, uint64, bool, []byte) error { return nil },
		Commit: func(uint64, bool) {},
		Stop:   func(int) {},
		Fail: func(err error) {
			r.mu.Lock()
			defer r.mu.Unlock()
			if r.err == nil {
				r.err = err
				close(r.failed)
			}
		},
	}
}

// Process 0's execution number (the recovery store's) and resume reach the other process in
// the hello; a frame of another execution (a process left from an earlier one) is refused,
// naming the peer, and fails the transport.
func TestExecutionAndResumeFromProcessZero(t *testing.T) {
	addrs := freeAddrs(t, 2)
	ctx := context.Background()
	cfg := func(p int) Config {
		c := Config{Addresses: addrs, Process: p, Secret: []byte("s"), Workers: 1, PeerTimeout: 10 * time.Second,
			StartTimeout: 30 * time.Second, Logger: slog.New(slog.DiscardHandler)}
		if p == 0 {
			c.Execution, c.Resume = 7, []byte("the state")
		}
		return c
	}
	var ts [2]*Transport
	var errs [2]error
	var wg sync.WaitGroup
	for p := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ts[p], errs[p] = Start(ctx, cfg(p))
		}()
	}
	wg.Wait()
	for p, err := range errs {
		if err != nil {
			t.Fatalf("process %d: %v", p, err)
		}
	}
	if ts[1].Execution() != 7 || string(ts[1].Resume()) != "the state" || string(ts[0].Resume()) != "the state" {
		t.Fatalf("process 1 has execution %d, resume %q", ts[1].Execution(), ts[1].Resume())
	}
	recs := [2]*recorder{{failed: make(chan struct{})}, {failed: make(chan struct{})}}
	for p := range 2 {
		ts[p].Attach(recs[p].handler())
	}
	// A frame of execution 6 from process 1.
	p := ts[1].peers[0]
	p.mu.Lock()
	p.chunks = append(p.chunks, append(binary.LittleEndian.AppendUint64(nil, 6), kindHeartbeat))
	p.mu.Unlock()
	p.wake <- struct{}{}
	select {
	case <-recs[0].failed:
	case <-time.After(30 * time.Second):
		t.Fatal("process 0 accepted a frame of another execution")
	}
	recs[0].mu.Lock()
	err := recs[0].err
	recs[0].mu.Unlock()
	if !strings.Contains(err.Error(), "process 1 (") || !strings.Contains(err.Error(), "execution 6, this execution is 7: refused") {
		t.Fatalf("the refusal does not say it: %v", err)
	}
	ts[0].Close(err)
	ts[1].Close(nil)
}
