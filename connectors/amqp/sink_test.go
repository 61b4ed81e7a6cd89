package amqp

import (
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"
	"go.uber.org/goleak"

	"github.com/epochflow/epochflow/connectors/flowtest"
	"github.com/epochflow/epochflow/dataflow"
)

// runSink publishes bodies to routing key key of the default exchange through the sink.
func runSink(t *testing.T, key string, workers int, bodies ...string) error {
	t.Helper()
	f := dataflow.New("publish")
	in := dataflow.Input(f, "in", flowtest.List(bodies...))
	dataflow.Output("out", in, PublishEncoded(SinkConfig{URL: brokerURL()}, func(b string) (Outgoing, error) {
		return Outgoing{RoutingKey: key, Msg: amqp091.Publishing{Body: []byte(b), MessageId: b}}, nil
	}))
	return dataflow.Run(withTimeout(t, time.Minute), f, dataflow.Options{Workers: workers, EpochInterval: 10 * time.Millisecond})
}

// Every item is published and confirmed; a consumer reads them all.
func TestSinkPublishes(t *testing.T) {
	defer goleak.VerifyNone(t)
	q := newQueue(t, nil)
	want := numbered(3000)
	if err := runSink(t, q, 2, want...); err != nil {
		t.Fatal(err)
	}
	if r := ready(t, q); r != len(want) {
		t.Fatalf("%d messages in the queue, want %d", r, len(want))
	}
	g := &gate{}
	if err := dataflow.Run(withTimeout(t, time.Minute), flowOf(Consume(SourceConfig{URL: brokerURL(), Queue: q, IdleExit: 200 * time.Millisecond}), dataflow.ToDynamic[Message](g)),
		dataflow.Options{}); err != nil {
		t.Fatal(err)
	}
	got := g.bodies()
	slices.SortFunc(got, func(a, b string) int { x, _ := strconv.Atoi(a); y, _ := strconv.Atoi(b); return x - y })
	if !slices.Equal(got, want) {
		t.Fatalf("read back %d messages, want %d", len(got), len(want))
	}
}

// A mandatory message that no queue receives fails the flow, naming the routing key.
func TestSinkUnroutableFails(t *testing.T) {
	defer goleak.VerifyNone(t)
	err := runSink(t, "epochflow-test-nowhere", 1, "a", "b")
	t.Log(err)
	if err == nil || !strings.Contains(err.Error(), `routing key "epochflow-test-nowhere"`) || !strings.Contains(err.Error(), "NO_ROUTE") {
		t.Fatalf("run: %v, want an error naming the unroutable routing key", err)
	}
}

// A message the broker nacks (a full queue that rejects publishes) fails the pre-commit.
func TestSinkNackFails(t *testing.T) {
	defer goleak.VerifyNone(t)
	q := newQueue(t, amqp091.Table{"x-max-length": int32(5), "x-overflow": "reject-publish"})
	err := runSink(t, q, 1, numbered(20)...)
	t.Log(err)
	if err == nil || !strings.Contains(err.Error(), "nacked") {
		t.Fatalf("run: %v, want an error about a nacked message", err)
	}
}
