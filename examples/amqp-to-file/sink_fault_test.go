package main

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/epochflow/epochflow/connectors/amqp"
	"github.com/epochflow/epochflow/connectors/flowtest"
	"github.com/epochflow/epochflow/dataflow"
)

// Issue 9's fault test for the AMQP sink (connectors/amqp), on a node of the test's own: a flow
// publishes 50,000 persistent messages to a durable queue while the node is stopped
// (rabbitmqctl stop_app) and started again twice. The flow keeps running (the sink reconnects
// and publishes again what the broker had not confirmed), and in the end the queue holds every
// item. The sink is at-least-once (see its package doc): a message whose confirm the restart
// lost is published again, so the check is exactly once by message id, as a consumer of such a
// sink deduplicates, and every copy of an id carries its own item.
func TestSinkBrokerRestartedTwice(t *testing.T) {
	t.Parallel()
	const n = 50_000
	node := startNode(t)
	url := node.url()
	q := "epochflow-sink-fault-" + strconv.Itoa(node.port)
	conn, ch := nodeChannel(t, url)
	if _, err := ch.QueueDeclare(q, true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	conn.Close()

	// 50 items every 10 ms (about 5,000 a second), so that the run lasts through two restarts.
	var script []flowtest.Event[string]
	for i := 0; i < n; i += 50 {
		batch := make([]string, 0, 50)
		for j := i; j < i+50; j++ {
			batch = append(batch, strconv.Itoa(j))
		}
		script = append(script, flowtest.Items(batch...), flowtest.Pause[string](10*time.Millisecond))
	}
	f := dataflow.New("publish")
	in := dataflow.Input(f, "in", flowtest.NewSource(50, script).Input())
	dataflow.Output("out", in, amqp.PublishEncoded(amqp.SinkConfig{URL: url, ReconnectMin: 50 * time.Millisecond,
		ReconnectMax: time.Second, ConfirmTimeout: 2 * time.Minute},
		func(s string) (amqp.Outgoing, error) {
			return amqp.Outgoing{RoutingKey: q, Msg: amqp091.Publishing{Body: []byte(s), MessageId: s, DeliveryMode: amqp091.Persistent}}, nil
		}))
	done := make(chan struct{})
	var runErr error
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	go func() {
		runErr = dataflow.Run(ctx, f, dataflow.Options{EpochInterval: 50 * time.Millisecond})
		close(done)
	}()
	defer func() { cancel(); <-done }()

	ready := func() int { r, _ := queueCountsIfUp(node, q); return r }
	for restart := range 2 {
		at := max(ready(), 0) + 5000
		waitUntil(t, 2*time.Minute, done, fmt.Sprintf("%d messages in the queue before restart %d", at, restart+1), func() bool { return ready() >= at })
		node.ctl(t, "stop_app")
		down := time.Now()
		waitUntil(t, time.Minute, done, "the broker to be gone", func() bool { return !node.answers() })
		for time.Since(down) < 2*time.Second { // down for several of the sink's reconnect attempts
			time.Sleep(50 * time.Millisecond)
		}
		node.ctl(t, "start_app")
		t.Logf("restart %d at %d messages in the queue", restart+1, at)
	}
	select {
	case <-done:
	case <-time.After(3 * time.Minute):
		t.Fatal("the flow did not end within 3 minutes after the second restart")
	}
	if runErr != nil {
		t.Fatalf("the flow failed: %v", runErr)
	}

	// Read the queue back: every id once at least, each copy with its own body.
	conn, ch = nodeChannel(t, url)
	defer conn.Close()
	deliveries, err := ch.Consume(q, "", true, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	seen := make(map[string]int, n)
	copies := 0
	for len(seen) < n {
		select {
		case d := <-deliveries:
			if string(d.Body) != d.MessageId {
				t.Fatalf("message id %q carries %q", d.MessageId, d.Body)
			}
			seen[d.MessageId]++
			copies++
		case <-time.After(10 * time.Second):
			missing := 0
			for i := range n {
				if seen[strconv.Itoa(i)] == 0 {
					missing++
				}
			}
			t.Fatalf("%d of %d items missing from the queue after two broker restarts (%d messages read)", missing, n, copies)
		}
	}
	t.Logf("every one of %d items in the queue after two restarts; %d published again after a lost confirm", n, copies-n)
}
