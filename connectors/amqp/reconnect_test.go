package amqp

import (
	"io"
	"log/slog"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/epochflow/epochflow/dataflow"
)

// outage is a TCP proxy to the broker that can go down (its listener closed, every connection
// cut: connections are refused, as by a stopped broker) and come back on the same port.
type outage struct {
	addr, target string
	mu           sync.Mutex
	ln           net.Listener
	conns        map[net.Conn]bool
	wg           sync.WaitGroup
}

func newOutage(t *testing.T) *outage {
	t.Helper()
	px := newProxy(t) // for its address and target
	o := &outage{target: px.target, conns: map[net.Conn]bool{}}
	px.close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	o.addr = ln.Addr().String()
	o.serve(ln)
	t.Cleanup(o.down)
	return o
}

func (o *outage) serve(ln net.Listener) {
	o.mu.Lock()
	o.ln = ln
	o.mu.Unlock()
	o.wg.Add(1)
	go func() {
		defer o.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", o.target)
			if err != nil {
				c.Close()
				continue
			}
			o.mu.Lock()
			o.conns[c], o.conns[s] = true, true
			o.mu.Unlock()
			o.wg.Add(2)
			pipe := func(dst, src net.Conn) {
				defer o.wg.Done()
				io.Copy(dst, src)
				dst.Close()
				src.Close()
			}
			go pipe(c, s)
			go pipe(s, c)
		}
	}()
}

// down closes the listener and cuts every connection.
func (o *outage) down() {
	o.mu.Lock()
	if o.ln != nil {
		o.ln.Close()
		o.ln = nil
	}
	for c := range o.conns {
		c.Close()
	}
	clear(o.conns)
	o.mu.Unlock()
	o.wg.Wait()
}

// up listens again on the same address.
func (o *outage) up(t *testing.T) {
	t.Helper()
	var ln net.Listener
	var err error
	for range 50 {
		if ln, err = net.Listen("tcp", o.addr); err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	o.serve(ln)
}

// With the default back-off, a consumer reconnects within 5 s (plus slack for a loaded machine)
// of the broker's return, however long the outage: here 13 s, after which a back-off doubling
// up to 10 s (the old default) waited until about 22.7 s, 9.7 s after the broker was back. 5 s
// is what a stream processor may lag behind a restarted broker (a rolling restart of a cluster
// node takes about that long) for a few failed dials a minute while it stays down.
func TestDefaultReconnectBound(t *testing.T) {
	const sane = 5 * time.Second
	q := newQueue(t, nil)
	o := newOutage(t)
	var mu sync.Mutex
	sessions := map[uint64]time.Time{}
	src := NewSource[Message](SourceConfig{URL: "amqp://guest:guest@" + o.addr + "/", Queue: q, Consumers: 1,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}, nil)
	src.onSession = func(_ string, gen uint64) {
		mu.Lock()
		sessions[gen] = time.Now()
		mu.Unlock()
	}
	session := func(gen uint64) bool {
		mu.Lock()
		defer mu.Unlock()
		_, ok := sessions[gen]
		return ok
	}
	stop := make(chan struct{})
	done := make(chan error, 1)
	g := &gate{}
	go func() {
		done <- dataflow.Run(withTimeout(t, 2*time.Minute), flowOf(dataflow.FromPartitioned[Message, uint64](src), dataflow.ToDynamic[Message](g)),
			dataflow.Options{Workers: 1, EpochInterval: 50 * time.Millisecond, Stop: stop})
	}()
	defer func() {
		close(stop)
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	publish(t, q, false, "before")
	eventually(t, time.Minute, "the first message", func() bool { return g.count() == 1 })
	o.down()
	cut := time.Now()
	for time.Since(cut) < 13*time.Second {
		time.Sleep(50 * time.Millisecond)
	}
	o.up(t)
	back := time.Now()
	eventually(t, time.Minute, "a new session", func() bool { return session(2) })
	mu.Lock()
	wait := sessions[2].Sub(back)
	mu.Unlock()
	if wait > sane+2*time.Second {
		t.Errorf("the consumer reconnected %v after the broker was back, want within %v (plus 2 s); DefaultReconnectMax is %v", wait, sane, DefaultReconnectMax)
	}
	t.Logf("reconnected %v after a %v outage", wait.Round(time.Millisecond), back.Sub(cut).Round(time.Millisecond))
	publish(t, q, false, "after")
	eventually(t, time.Minute, "the message sent after the outage", func() bool { return g.count() >= 2 })
}
