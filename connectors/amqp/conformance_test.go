package amqp

import (
	"log/slog"
	"testing"
	"time"

	"github.com/rabbitmq/amqp091-go"

	"github.com/epochflow/epochflow/connectors/conformance"
	"github.com/epochflow/epochflow/dataflow"
)

// The source acknowledges (multiple) at the Commit of the epoch that read the messages; a
// crash closes the connection and the broker requeues what it had not acknowledged: at least
// once.
func TestSourceConformance(t *testing.T) {
	conformance.TestSource(t, conformance.SourceKit[Message, uint64]{
		Setup: func(t *testing.T) conformance.SourceSystem[Message, uint64] {
			q := newQueue(t, nil)
			return conformance.SourceSystem[Message, uint64]{
				New: func() dataflow.PartitionedSource[Message, uint64] {
					return NewSource[Message](SourceConfig{URL: brokerURL(), Queue: q, IdleExit: 300 * time.Millisecond, Logger: quietLog}, nil)
				},
				Produce:   func(ids []string) { publish(t, q, false, ids...) },
				Remaining: func() int { return remaining(t, q) },
			}
		},
		ID:        func(m Message) string { return string(m.Body) },
		Guarantee: conformance.AtLeastOnce,
	})
}

// The sink publishes with confirms at once (consumers see a message before its epoch
// commits), and a replayed epoch publishes again: at least once.
func TestSinkConformance(t *testing.T) {
	conformance.TestSink(t, conformance.SinkKit[Outgoing, uint64]{
		Setup: func(t *testing.T) conformance.SinkSystem[Outgoing, uint64] {
			q := newQueue(t, nil)
			var seen []string
			return conformance.SinkSystem[Outgoing, uint64]{
				New: func() dataflow.PartitionedSink[Outgoing, uint64] {
					return NewSink(SinkConfig{URL: brokerURL()}, func(o Outgoing) (Outgoing, error) { return o, nil })
				},
				Item: func(id string) Outgoing {
					return Outgoing{RoutingKey: q, Msg: amqp091.Publishing{Body: []byte(id)}}
				},
				Visible: func() []string {
					seen = append(seen, getAll(t, q)...)
					return append([]string(nil), seen...)
				},
			}
		},
		Guarantee:    conformance.AtLeastOnce,
		VisibleEarly: true,
	})
}

// remaining returns how many messages q holds for delivery, called while no flow runs: once
// the broker has dropped the closed connections' consumers (it requeues their unacknowledged
// messages as it drops them), the ready count, read until it holds still for 100 ms. Through
// AMQP: rabbitmqctl would say the same in seconds instead of milliseconds.
func remaining(t *testing.T, q string) int {
	t.Helper()
	conn := dial(t)
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	last := -1
	for {
		st, err := ch.QueueDeclarePassive(q, false, false, false, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		if st.Consumers == 0 && st.Messages == last {
			return last
		}
		if time.Now().After(deadline) {
			t.Fatalf("queue %s: still %d consumers after 20 s", q, st.Consumers)
		}
		if st.Consumers == 0 {
			last = st.Messages
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// getAll takes (and acknowledges) every message ready in q now.
func getAll(t *testing.T, q string) []string {
	t.Helper()
	conn := dial(t)
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for {
		m, ok, err := ch.Get(q, true)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			return out
		}
		out = append(out, string(m.Body))
	}
}

var quietLog = slog.New(slog.DiscardHandler)
