package nats

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/epochflow/epochflow/dataflow"
)

// The source reports the consumer's backlog as epochflow_source_lag: it rises while messages
// wait (the sink holds the first epoch, so nothing is acknowledged), rises with more, and falls
// to 0 once everything is read and acknowledged.
func TestSourceLag(t *testing.T) {
	checkLeaks(t)
	st := newStream(t, jetstream.InterestPolicy)
	newConsumer(t, st, "c", 30*time.Second)
	publish(t, st, 0, 100)
	g := &gate{open: make(chan struct{})}
	mon := dataflow.NewMonitor()
	stop := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- dataflow.Run(withTimeout(t, time.Minute), flowOf(Consume(SourceConfig{URL: srvURL, Stream: st, Consumers: []string{"c"}}), dataflow.ToDynamic[Message](g)),
			dataflow.Options{EpochInterval: 20 * time.Millisecond, Stop: stop, Monitor: mon})
	}()
	lag := func() float64 { l, _ := mon.SourceLag("nats.in"); return l }
	eventually(t, 20*time.Second, "a lag of the 100 messages", func() bool { return lag() == 100 })
	publish(t, st, 100, 50)
	eventually(t, 20*time.Second, "the lag to rise to 150", func() bool { return lag() == 150 })
	close(g.open)
	eventually(t, 20*time.Second, "the lag to fall to 0", func() bool { return g.count() == 150 && lag() == 0 })
	close(stop)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
