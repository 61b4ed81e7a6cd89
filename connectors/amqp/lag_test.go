package amqp

import (
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/epochflow/epochflow/dataflow"
)

// The source reports epochflow_source_lag: it rises while a backlog waits in the queue (the
// sink holds the first epoch open, so nothing is acknowledged and the prefetch stops the
// broker), rises again when more messages come, and falls to 0 once everything is read and
// committed.
func TestSourceLag(t *testing.T) {
	defer goleak.VerifyNone(t)
	q := newQueue(t, nil)
	publish(t, q, false, numbered(300)...)
	g := &gate{open: make(chan struct{})}
	stop := make(chan struct{})
	mon := dataflow.NewMonitor()
	done := make(chan error, 1)
	go func() {
		done <- dataflow.Run(withTimeout(t, 2*time.Minute),
			flowOf(Consume(SourceConfig{URL: brokerURL(), Queue: q, Prefetch: 50, Consumers: 2}), dataflow.ToDynamic[Message](g)),
			dataflow.Options{EpochInterval: 20 * time.Millisecond, Stop: stop, Monitor: mon})
	}()
	lag := func() float64 { l, _ := mon.SourceLag("amqp.in"); return l }
	// At most the two prefetches are delivered; the rest wait in the queue.
	eventually(t, 30*time.Second, "a lag of at least the 200 waiting messages", func() bool { return lag() >= 200 })
	publish(t, q, false, numbered(300)...)
	eventually(t, 30*time.Second, "the lag to rise past 500 with 300 more messages", func() bool { return lag() >= 500 })
	if l := lag(); l > 600 {
		t.Fatalf("lag %v, more than the 600 messages published", l)
	}
	close(g.open)
	eventually(t, 30*time.Second, "the lag to fall to 0 once drained", func() bool { return g.count() == 600 && lag() == 0 })
	close(stop)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if r, u := counts(t, q); r != 0 || u != 0 {
		t.Fatalf("queue: %d ready, %d unacked; want 0 and 0", r, u)
	}
}
