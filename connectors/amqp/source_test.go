package amqp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"
	"go.uber.org/goleak"

	"github.com/epochflow/epochflow/dataflow"
	"github.com/epochflow/epochflow/recovery"
)

// gate is a DynamicSink that keeps every message and, while closed, blocks Write: an epoch
// whose items it holds cannot finish, so nothing of it is committed.
type gate struct {
	mu   sync.Mutex
	msgs []Message
	open chan struct{} // Write waits for it to be closed (nil: never waits)
}

func (g *gate) Build(context.Context, dataflow.Worker) (dataflow.WorkerSink[Message], error) {
	return g, nil
}

func (g *gate) Write(ctx context.Context, b []Message) error {
	g.mu.Lock()
	g.msgs = append(g.msgs, b...)
	open := g.open
	g.mu.Unlock()
	if open != nil {
		select {
		case <-open:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

func (g *gate) Close() error { return nil }

func (g *gate) count() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.msgs)
}

func (g *gate) bodies() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := make([]string, len(g.msgs))
	for i, m := range g.msgs {
		out[i] = string(m.Body)
	}
	return out
}

func flowOf[T any](src dataflow.Source[T], sink dataflow.Sink[T]) *dataflow.Flow {
	f := dataflow.New("amqp")
	dataflow.Output("out", dataflow.Input(f, "in", src), sink)
	return f
}

// While a message's epoch is not committed, the message stays unacknowledged on the broker;
// once the epoch commits, it is acknowledged and gone, while the flow still runs.
func TestUnackedUntilCommit(t *testing.T) {
	defer goleak.VerifyNone(t)
	q := newQueue(t, nil)
	publish(t, q, false, numbered(100)...)
	g := &gate{open: make(chan struct{})}
	stop := make(chan struct{})
	var ops sync.Map // acks sent, by generation
	src := NewSource[Message](SourceConfig{URL: brokerURL(), Queue: q}, nil)
	src.onOp = func(_ string, op ackOp, sent bool, err error) {
		if sent && err == nil {
			ops.Store(op, true)
		}
	}
	done := make(chan error, 1)
	go func() {
		done <- dataflow.Run(withTimeout(t, time.Minute), flowOf(dataflow.FromPartitioned[Message, uint64](src), dataflow.ToDynamic[Message](g)),
			dataflow.Options{EpochInterval: 20 * time.Millisecond, Stop: stop})
	}()
	eventually(t, 20*time.Second, "the first messages to arrive", func() bool { return g.count() > 0 })
	// The sink holds the epoch open: every message is delivered and none is acked.
	eventually(t, 20*time.Second, "100 unacknowledged messages", func() bool {
		r, u := counts(t, q)
		return r == 0 && u == 100
	})
	n := 0
	ops.Range(func(any, any) bool { n++; return true })
	if n != 0 {
		t.Fatalf("%d acks sent before any epoch committed", n)
	}
	close(g.open)
	eventually(t, 20*time.Second, "the committed messages to be acknowledged", func() bool {
		r, u := counts(t, q)
		return r == 0 && u == 0
	})
	select {
	case err := <-done:
		t.Fatalf("the run ended early: %v", err)
	default:
	}
	close(stop)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	got := g.bodies()
	slices.SortFunc(got, func(a, b string) int { x, _ := strconv.Atoi(a); y, _ := strconv.Atoi(b); return x - y })
	if !slices.Equal(got, numbered(100)) {
		t.Fatalf("got %d messages %v, want 0..99 once each", len(got), got)
	}
	if r := ready(t, q); r != 0 {
		t.Fatalf("%d messages back in the queue after the run", r)
	}
}

// A run that crashes before its epoch is recorded as committed acknowledges nothing: every
// message comes back, redelivered, and the next run (resuming from the store) reads and
// acknowledges them all, then ends on IdleExit.
func TestCrashBeforeCommitAcksNothing(t *testing.T) {
	defer goleak.VerifyNone(t)
	q := newQueue(t, nil)
	publish(t, q, true, numbered(50)...)
	dir := t.TempDir()
	var sent sync.Mutex
	acks := 0
	src := NewSource[Message](SourceConfig{URL: brokerURL(), Queue: q, IdleExit: time.Second}, nil)
	src.onOp = func(_ string, op ackOp, ok bool, err error) {
		if ok {
			sent.Lock()
			acks++
			sent.Unlock()
		}
	}
	g := &gate{}
	store, err := recovery.OpenSQLite(context.Background(), dir, recovery.SQLiteOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// One long epoch holds every message; Stop ends it, and the crash hook stops the run
	// before the store records it as committed.
	crash := func(point string) bool { return point == "before-commit-record" }
	stop := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- dataflow.Run(withTimeout(t, time.Minute), flowOf(dataflow.FromPartitioned[Message, uint64](src), dataflow.ToDynamic[Message](g)),
			dataflow.Options{EpochInterval: time.Hour, Recovery: store, CrashHook: crash, Stop: stop})
	}()
	eventually(t, 20*time.Second, "50 messages", func() bool { return g.count() == 50 })
	close(stop)
	err = <-done
	store.Close()
	if !errors.Is(err, dataflow.ErrCrashed) {
		t.Fatalf("run: %v, want a crash", err)
	}
	sent.Lock()
	if acks != 0 {
		t.Fatalf("%d acks sent by a run that never committed", acks)
	}
	sent.Unlock()
	// The crash cut the connection: the broker requeues everything.
	eventually(t, 20*time.Second, "the 50 messages to come back", func() bool { return ready(t, q) == 50 })

	store, err = recovery.OpenSQLite(context.Background(), dir, recovery.SQLiteOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	g2 := &gate{}
	src2 := NewSource[Message](SourceConfig{URL: brokerURL(), Queue: q, IdleExit: time.Second}, nil)
	if err := dataflow.Run(withTimeout(t, time.Minute), flowOf(dataflow.FromPartitioned[Message, uint64](src2), dataflow.ToDynamic[Message](g2)),
		dataflow.Options{EpochInterval: 50 * time.Millisecond, Recovery: store}); err != nil {
		t.Fatal(err)
	}
	if g2.count() != 50 {
		t.Fatalf("the second run read %d messages, want 50", g2.count())
	}
	for _, m := range g2.msgs {
		if !m.Redelivered {
			t.Fatalf("%s is not marked redelivered", m)
		}
	}
	if r, u := counts(t, q); r != 0 || u != 0 {
		t.Fatalf("after the second run: %d ready, %d unacked; want 0 and 0", r, u)
	}
}

// Cutting the TCP connection in the middle of a run: the source reconnects and carries on;
// every message arrives (one copy of each at most not marked redelivered), the queue ends empty, and every
// ack went to the channel that delivered its tag, never to a dead one (the broker would close
// the channel with 406 PRECONDITION_FAILED, which fails the run).
func TestReconnectAfterCut(t *testing.T) {
	defer goleak.VerifyNone(t)
	const n = 20000
	q := newQueue(t, nil)
	publish(t, q, false, numbered(n)...)
	px := newProxy(t)
	defer px.close()

	var mu sync.Mutex
	live := map[string]uint64{}    // per consumer, the generation of its open channel
	sentPerGen := map[string]int{} // per consumer and channel generation
	dropped := 0
	var bad []string
	src := NewSource[Message](SourceConfig{URL: px.url(t), Queue: q, Consumers: 2, Prefetch: 2000,
		IdleExit: time.Second, ReconnectMin: 10 * time.Millisecond}, nil)
	src.onSession = func(part string, gen uint64) {
		mu.Lock()
		live[part] = gen
		mu.Unlock()
	}
	src.onOp = func(part string, op ackOp, sent bool, err error) {
		mu.Lock()
		defer mu.Unlock()
		switch {
		case !sent:
			dropped++
		case op.gen != live[part]:
			bad = append(bad, fmt.Sprintf("%s: %+v sent while generation %d is live", part, op, live[part]))
		case err == nil:
			sentPerGen[fmt.Sprintf("%s/gen%d", part, op.gen)]++
		}
	}
	g := &gate{}
	done := make(chan error, 1)
	go func() {
		done <- dataflow.Run(withTimeout(t, 2*time.Minute), flowOf(dataflow.FromPartitioned[Message, uint64](src), dataflow.ToDynamic[Message](g)),
			dataflow.Options{Workers: 2, EpochInterval: 20 * time.Millisecond})
	}()
	cuts := 0
	for _, at := range []int{n / 5, n / 2, 4 * n / 5} {
		eventually(t, time.Minute, fmt.Sprintf("%d messages", at), func() bool { return g.count() >= at })
		if c := px.cut(); c > 0 {
			cuts++
		}
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(bad) > 0 {
		t.Fatalf("acks on a dead channel: %v", bad)
	}
	// Each message has one first delivery; every other copy must be a redelivery. Which copy
	// the sink sees first is not fixed: a consumer that has not yet noticed its connection died
	// still hands on what the library had buffered, while the other consumer may already have
	// written the broker's redelivery of it (CI saw that order).
	seen, first := map[string]int{}, map[string]int{}
	for _, m := range g.msgs {
		seen[string(m.Body)]++
		if !m.Redelivered {
			first[string(m.Body)]++
		}
		if first[string(m.Body)] > 1 {
			t.Fatalf("%s arrived twice not marked redelivered: the source handed one delivery on twice", m)
		}
	}
	for _, b := range numbered(n) {
		if seen[b] == 0 {
			t.Fatalf("message %s lost", b)
		}
	}
	if r, u := counts(t, q); r != 0 || u != 0 {
		t.Fatalf("after the run: %d ready, %d unacked; want 0 and 0", r, u)
	}
	gens := map[string]int{} // per consumer, the channels that acked
	most := 0
	for k := range sentPerGen {
		part, _, _ := strings.Cut(k, "/")
		gens[part]++
		most = max(most, gens[part])
	}
	if most < 2 {
		t.Fatalf("acks per channel %v after %d cuts: no consumer acked on a channel it opened after a cut", sentPerGen, cuts)
	}
	t.Logf("%d cuts; %d deliveries for %d messages; acks sent per generation %v; %d ops of dead channels dropped",
		cuts, len(g.msgs), n, sentPerGen, dropped)
}

// RabbitMQ itself: acking a tag that was nacked closes the channel with 406
// PRECONDITION_FAILED, while a multiple ack above a nacked tag is fine. This is the broker
// behaviour the ledger's ordering (nacks first, then one ack of the highest accepted tag)
// relies on.
func TestBrokerRejectsAckOfNackedTag(t *testing.T) {
	q := newQueue(t, nil)
	publish(t, q, false, "a", "b", "c")
	conn := dial(t)
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	closed := ch.NotifyClose(make(chan *amqp091.Error, 1))
	ds, err := ch.Consume(q, "", false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		<-ds
	}
	// Nack 2, then ack up to 3: fine (2 is skipped).
	if err := ch.Nack(2, false, false); err != nil {
		t.Fatal(err)
	}
	if err := ch.Ack(3, true); err != nil {
		t.Fatal(err)
	}
	// Now ack 2 again: an unknown tag.
	if err := ch.Ack(2, false); err != nil {
		t.Fatal(err)
	}
	select {
	case e := <-closed:
		if e == nil || e.Code != amqp091.PreconditionFailed {
			t.Fatalf("channel closed with %v, want 406 PRECONDITION_FAILED", e)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the broker accepted an ack of a nacked tag")
	}
}

// decodeInt accepts bodies that are numbers.
func decodeInt(m Message) (int, error) { return strconv.Atoi(string(m.Body)) }

// collectInts is a DynamicSink of ints.
type collectInts struct {
	mu sync.Mutex
	v  []int
}

func (c *collectInts) Build(context.Context, dataflow.Worker) (dataflow.WorkerSink[int], error) {
	return c, nil
}
func (c *collectInts) Write(_ context.Context, b []int) error {
	c.mu.Lock()
	c.v = append(c.v, b...)
	c.mu.Unlock()
	return nil
}
func (c *collectInts) Close() error { return nil }

// Without dead-lettering, a message the decode function rejects stops the flow with an error
// naming the queue and the message, and nothing is acknowledged: every message is back.
func TestPoisonWithoutDeadLetterStops(t *testing.T) {
	defer goleak.VerifyNone(t)
	q := newQueue(t, nil)
	publish(t, q, false, "1", "2", "bad", "4")
	err := dataflow.Run(withTimeout(t, time.Minute),
		flowOf(ConsumeDecoded(SourceConfig{URL: brokerURL(), Queue: q}, decodeInt), dataflow.ToDynamic[int](&collectInts{})),
		dataflow.Options{EpochInterval: time.Hour})
	if err == nil {
		t.Fatal("the run succeeded")
	}
	for _, want := range []string{q, "message 2 ", "DeadLetter", "invalid syntax"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
	if !dataflow.IsPermanent(err) {
		t.Errorf("error %q is not marked permanent: a restart would read the message and fail again", err)
	}
	eventually(t, 20*time.Second, "the 4 messages to be back", func() bool { return ready(t, q) == 4 })
}

// With dead-lettering, rejected messages go to the dead-letter queue when their epoch
// commits, the others are acknowledged, and no tag is acked after its nack: also when the
// last message of an epoch is the rejected one (the ack then names an earlier tag).
func TestPoisonToDeadLetter(t *testing.T) {
	defer goleak.VerifyNone(t)
	dlq := newQueue(t, nil)
	q := newQueue(t, amqp091.Table{"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq})
	bodies := []string{"1", "x", "2", "3", "y", "4", "z"} // ends with a rejected one
	publish(t, q, false, bodies...)
	out := &collectInts{}
	var mu sync.Mutex
	var sent []ackOp
	src := NewSource(SourceConfig{URL: brokerURL(), Queue: q, DeadLetter: true, IdleExit: time.Second}, decodeInt)
	src.onOp = func(_ string, op ackOp, ok bool, err error) {
		mu.Lock()
		defer mu.Unlock()
		if ok {
			sent = append(sent, op)
		}
	}
	if err := dataflow.Run(withTimeout(t, time.Minute), flowOf(dataflow.FromPartitioned[int, uint64](src), dataflow.ToDynamic[int](out)),
		dataflow.Options{EpochInterval: time.Hour}); err != nil {
		t.Fatal(err)
	}
	slices.Sort(out.v)
	if !slices.Equal(out.v, []int{1, 2, 3, 4}) {
		t.Fatalf("read %v, want 1 2 3 4", out.v)
	}
	want := []ackOp{{1, 2, true}, {1, 5, true}, {1, 7, true}, {1, 6, false}}
	if !slices.Equal(sent, want) {
		t.Fatalf("ops sent %v, want %v", sent, want)
	}
	if r, u := counts(t, q); r != 0 || u != 0 {
		t.Fatalf("queue: %d ready, %d unacked; want 0 and 0", r, u)
	}
	eventually(t, 20*time.Second, "3 dead letters", func() bool { return ready(t, dlq) == 3 })
}

// A queue that does not exist fails the run at start, naming it.
func TestMissingQueue(t *testing.T) {
	defer goleak.VerifyNone(t)
	err := dataflow.Run(withTimeout(t, time.Minute),
		flowOf(Consume(SourceConfig{URL: brokerURL(), Queue: "epochflow-test-no-such-queue"}), dataflow.ToDynamic[Message](&gate{})),
		dataflow.Options{})
	if err == nil || !strings.Contains(err.Error(), `"epochflow-test-no-such-queue"`) || !strings.Contains(err.Error(), "does not exist") {
		t.Fatalf("run: %v, want an error naming the missing queue", err)
	}
}

// Bad configuration fails at start, naming the field.
func TestBadConfig(t *testing.T) {
	for _, c := range []struct {
		cfg  SourceConfig
		want string
	}{
		{SourceConfig{}, "SourceConfig.Queue"},
		{SourceConfig{Queue: "q", Prefetch: 70000}, "SourceConfig.Prefetch"},
		{SourceConfig{Queue: "q", URL: "http://x"}, "SourceConfig.URL"},
		{SourceConfig{Queue: "q", IdleExit: -1}, "SourceConfig.IdleExit"},
	} {
		_, err := NewSource[Message](c.cfg, nil).Parts(context.Background())
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want an error naming %s", c.cfg, err, c.want)
		}
	}
	if s := redact("amqp://user:secret@host/"); strings.Contains(s, "secret") {
		t.Errorf("redact left the password in %s", s)
	}
}

// logBuffer is a concurrency-safe io.Writer for a test logger.
type logBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// A consumer at its prefetch limit warns once, still reads everything (one prefetch-full per
// commit), and does not take the limit for an empty queue when IdleExit is set.
func TestPrefetchLimit(t *testing.T) {
	defer goleak.VerifyNone(t)
	q := newQueue(t, nil)
	publish(t, q, false, numbered(300)...)
	var logs logBuffer
	logger := slog.New(slog.NewTextHandler(&logs, nil))
	g := &gate{}
	err := dataflow.Run(withTimeout(t, time.Minute),
		flowOf(Consume(SourceConfig{URL: brokerURL(), Queue: q, Prefetch: 10, IdleExit: time.Second, Logger: logger}), dataflow.ToDynamic[Message](g)),
		dataflow.Options{EpochInterval: 5 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if g.count() != 300 {
		t.Fatalf("read %d messages, want 300", g.count())
	}
	if n := strings.Count(logs.String(), "as many unacknowledged messages as its prefetch allows"); n != 1 {
		t.Fatalf("%d prefetch warnings, want 1 (at most one a minute):\n%s", n, logs.String())
	}
	if r, u := counts(t, q); r != 0 || u != 0 {
		t.Fatalf("queue: %d ready, %d unacked; want 0 and 0", r, u)
	}
}

// An idle consumer costs no CPU (no polling: the worker waits on the consumer's channel), and
// a message published to the idle queue arrives at once.
func TestIdleConsumerBurnsNothing(t *testing.T) {
	defer goleak.VerifyNone(t)
	q := newQueue(t, nil)
	arrived := make(chan time.Time, 100)
	sink := dataflow.ToDynamic[Message](sinkFunc(func(b []Message) {
		for range b {
			arrived <- time.Now()
		}
	}))
	stop := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- dataflow.Run(withTimeout(t, time.Minute), flowOf(Consume(SourceConfig{URL: brokerURL(), Queue: q}), sink),
			dataflow.Options{EpochInterval: time.Second, Stop: stop})
	}()
	time.Sleep(300 * time.Millisecond)
	before := clientCPU()
	time.Sleep(3 * time.Second)
	used := clientCPU() - before
	t.Logf("CPU used by an idle consumer in 3 s: %v", used)
	if used > 100*time.Millisecond {
		t.Errorf("an idle consumer used %v of CPU in 3 s, want < 100ms", used)
	}
	var lat []time.Duration
	for i := range 10 {
		time.Sleep(20 * time.Millisecond)
		sent := time.Now()
		publish(t, q, false, strconv.Itoa(i))
		select {
		case at := <-arrived:
			lat = append(lat, at.Sub(sent))
		case <-time.After(10 * time.Second):
			t.Fatal("a message published to the idle queue never arrived")
		}
	}
	close(stop)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	slices.Sort(lat)
	t.Logf("publish-to-flow latency (includes the test's dial and confirm): median %v, max %v", lat[len(lat)/2], lat[len(lat)-1])
}

// sinkFunc is a DynamicSink calling a function with every batch.
type sinkFunc func([]Message)

func (f sinkFunc) Build(context.Context, dataflow.Worker) (dataflow.WorkerSink[Message], error) {
	return f, nil
}
func (f sinkFunc) Write(_ context.Context, b []Message) error { f(b); return nil }
func (f sinkFunc) Close() error                               { return nil }

// Messages published in bursts with pauses between them, so that the worker reads some runs of
// them straight off the stream and hands it back to the consumer's goroutine when it runs dry,
// many times: the flow sees every message once, in the order published, with short epochs
// committing all the while (an out-of-order tag fails the run), and the queue ends empty.
func TestOrderAcrossHandoffs(t *testing.T) {
	defer goleak.VerifyNone(t)
	q := newQueue(t, nil)
	const n = 5000
	conn := dial(t)
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	published := make(chan error, 1)
	go func() {
		rng := rand.New(rand.NewPCG(1, 2))
		for i := 0; i < n; {
			for end := min(i+1+rng.IntN(300), n); i < end; i++ {
				if err := ch.PublishWithContext(context.Background(), "", q, false, false, amqp091.Publishing{Body: []byte(strconv.Itoa(i))}); err != nil {
					published <- err
					return
				}
			}
			time.Sleep(time.Duration(rng.IntN(3000)) * time.Microsecond)
		}
		published <- nil
	}()
	out := &collectInts{}
	if err := dataflow.Run(withTimeout(t, 2*time.Minute),
		flowOf(ConsumeDecoded(SourceConfig{URL: brokerURL(), Queue: q, IdleExit: time.Second}, decodeInt), dataflow.ToDynamic[int](out)),
		dataflow.Options{EpochInterval: 5 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	if err := <-published; err != nil {
		t.Fatal(err)
	}
	if len(out.v) != n {
		t.Fatalf("read %d messages, want %d", len(out.v), n)
	}
	for i, v := range out.v {
		if v != i {
			t.Fatalf("message %d is %d: out of order", i, v)
		}
	}
	if r, u := counts(t, q); r != 0 || u != 0 {
		t.Fatalf("queue: %d ready, %d unacked; want 0 and 0", r, u)
	}
}

// IdleExit ends a drain only when nothing arrives, not when the flow is busy: a sink that holds
// the worker for several IdleExit periods while thousands of delivered messages wait in the
// client (the broker reports no ready message: they are all prefetched) must not end the
// stream before every message is read.
func TestIdleExitWaitsForABusyWorker(t *testing.T) {
	defer goleak.VerifyNone(t)
	q := newQueue(t, nil)
	const n = 3000
	publish(t, q, false, numbered(n)...)
	var got int
	slow := true
	sink := dataflow.ToDynamic[Message](sinkFunc(func(b []Message) {
		got += len(b)
		if slow {
			slow = false
			time.Sleep(1500 * time.Millisecond)
		}
	}))
	if err := dataflow.Run(withTimeout(t, time.Minute),
		flowOf(Consume(SourceConfig{URL: brokerURL(), Queue: q, IdleExit: 300 * time.Millisecond}), sink),
		dataflow.Options{EpochInterval: 20 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	if got != n {
		t.Fatalf("the stream ended after %d of %d messages", got, n)
	}
	if r, u := counts(t, q); r != 0 || u != 0 {
		t.Fatalf("queue: %d ready, %d unacked; want 0 and 0", r, u)
	}
}
