package kafka

import (
	"context"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/epochflow/epochflow/connectors/flowtest"
	"github.com/epochflow/epochflow/dataflow"
)

// The source reports the records not yet committed as epochflow_source_lag: it rises while
// records wait, rises with more, and falls to 0 once everything is read and committed.
func TestSourceLag(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	brokers := cluster(t, 1, "in")
	produceNumbers(t, brokers, "in", 0, 100)
	g := flowtest.NewGateSink[Record]()
	mon := dataflow.NewMonitor()
	stop := make(chan struct{})
	f := dataflow.New("kafka-lag")
	dataflow.Output("write", dataflow.Input(f, "read", Consume(SourceConfig{Brokers: brokers, Topics: []string{"in"}})), g.Output())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- dataflow.Run(ctx, f, dataflow.Options{EpochInterval: 20 * time.Millisecond, Stop: stop, Monitor: mon, Logger: quiet})
	}()
	lag := func() float64 { l, _ := mon.SourceLag("kafka-lag.read"); return l }
	wait := func(what string, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s (lag %v)", what, lag())
			}
		}
	}
	wait("a lag of the 100 records", func() bool { return lag() == 100 })
	produceNumbers(t, brokers, "in", 100, 50)
	wait("the lag to rise to 150", func() bool { return lag() == 150 })
	g.Open()
	wait("the lag to fall to 0", func() bool { return g.Count() == 150 && lag() == 0 })
	close(stop)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
