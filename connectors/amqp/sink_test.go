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
	if err := dataflow.Run(withTimeout(t, time.Minute), flowOf(Consume(SourceConfig{URL: brokerURL(), Queue: q, IdleExit: time.Second}), dataflow.ToDynamic[Message](g)),
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

// A connection that drops (cut three times by a proxy) while the flow publishes is made again,
// and what was not confirmed is published again: every item reaches the queue (at least once),
// and the flow does not fail.
func TestSinkReconnects(t *testing.T) {
	defer goleak.VerifyNone(t)
	px := newProxy(t)
	defer px.close()
	q := newQueue(t, nil)
	const n = 30_000
	want := numbered(n)
	f := dataflow.New("publish")
	in := dataflow.Input(f, "in", flowtest.List(want...))
	dataflow.Output("out", in, PublishEncoded(SinkConfig{URL: px.url(t), ReconnectMin: 10 * time.Millisecond},
		func(b string) (Outgoing, error) {
			return Outgoing{RoutingKey: q, Msg: amqp091.Publishing{Body: []byte(b), MessageId: b}}, nil
		}))
	done := make(chan error, 1)
	go func() {
		done <- dataflow.Run(withTimeout(t, 2*time.Minute), f, dataflow.Options{Workers: 2, EpochInterval: 10 * time.Millisecond})
	}()
	cuts := 0
	for cuts < 3 {
		select {
		case err := <-done:
			t.Fatalf("the flow ended after %d cuts (%v): publish more, or cut sooner", cuts, err)
		default:
		}
		if r := ready(t, q); r >= (cuts+1)*n/5 {
			if px.cut() > 0 {
				cuts++
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := <-done; err != nil {
		t.Fatalf("after %d cuts: %v", cuts, err)
	}
	g := &gate{}
	if err := dataflow.Run(withTimeout(t, time.Minute), flowOf(Consume(SourceConfig{URL: brokerURL(), Queue: q, IdleExit: time.Second}), dataflow.ToDynamic[Message](g)),
		dataflow.Options{}); err != nil {
		t.Fatal(err)
	}
	seen := map[string]int{}
	for _, b := range g.bodies() {
		seen[b]++
	}
	missing := 0
	for _, w := range want {
		if seen[w] == 0 {
			missing++
		}
	}
	if missing > 0 {
		t.Fatalf("%d of %d items missing after %d cuts", missing, n, cuts)
	}
	t.Logf("%d cuts; %d messages in the queue for %d items (the rest published twice)", cuts, len(g.bodies()), n)
}

// A channel the broker closes for a refused operation (an exchange that does not exist) is not
// a lost connection: the flow fails, naming the exchange, instead of reconnecting forever.
func TestSinkMissingExchangeFails(t *testing.T) {
	defer goleak.VerifyNone(t)
	f := dataflow.New("publish")
	in := dataflow.Input(f, "in", flowtest.List("a", "b"))
	dataflow.Output("out", in, PublishEncoded(SinkConfig{URL: brokerURL()}, func(b string) (Outgoing, error) {
		return Outgoing{Exchange: "epochflow-test-no-such-exchange", Msg: amqp091.Publishing{Body: []byte(b)}}, nil
	}))
	err := dataflow.Run(withTimeout(t, time.Minute), f, dataflow.Options{})
	t.Log(err)
	if err == nil || !strings.Contains(err.Error(), "NOT_FOUND") || !strings.Contains(err.Error(), "epochflow-test-no-such-exchange") {
		t.Fatalf("run: %v, want an error naming the missing exchange", err)
	}
}
