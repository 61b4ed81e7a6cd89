package sqs_test

import (
	"context"
	"testing"
	"time"

	"github.com/epochflow/epochflow/connectors/flowtest"
	"github.com/epochflow/epochflow/connectors/sqs"
	"github.com/epochflow/epochflow/dataflow"
)

// The source reports epochflow_source_lag: it rises while a backlog waits (the sink holds the
// first epoch, and MaxInFlight stops receiving), rises again with more messages, and falls to
// 0 once everything is read, committed and deleted.
func TestSourceLag(t *testing.T) {
	q := emu.MustQueue(t, "lag", sqstest30())
	send(t, q, numbered("a", 50)...)
	g := flowtest.NewGateSink[sqs.Message]()
	stop := make(chan struct{})
	mon := dataflow.NewMonitor()
	flow := dataflow.New("sqs-lag")
	dataflow.Output("write", dataflow.Input(flow, "read", sqs.Receive(emu.Client, q, sqs.MaxInFlight(10), sqs.WaitTime(time.Second), sqs.Logger(quiet))),
		g.Output())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- dataflow.Run(ctx, flow, dataflow.Options{EpochInterval: 50 * time.Millisecond, Stop: stop, Monitor: mon, Logger: quiet})
	}()
	lag := func() float64 { l, _ := mon.SourceLag("sqs-lag.read"); return l }
	waitFor(t, 20*time.Second, "a lag of the 50 waiting messages", func() bool { return lag() >= 50 })
	send(t, q, numbered("b", 50)...)
	waitFor(t, 20*time.Second, "the lag to rise to 100 with 50 more", func() bool { return lag() >= 100 })
	g.Open()
	waitFor(t, 30*time.Second, "the lag to fall to 0 once drained", func() bool { return g.Count() == 100 && lag() == 0 })
	close(stop)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
