package nats

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/epochflow/epochflow/dataflow"
)

// srvURL is the URL of the embedded JetStream server the tests of this package share.
var srvURL string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "epochflow-nats-test")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	s, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: dir, NoSigs: true, NoLog: true})
	if err != nil {
		fmt.Fprintln(os.Stderr, "starting the embedded NATS server:", err)
		os.Exit(1)
	}
	go s.Start()
	if !s.ReadyForConnections(30 * time.Second) {
		fmt.Fprintln(os.Stderr, "the embedded NATS server did not start")
		os.Exit(1)
	}
	srvURL = s.ClientURL()
	code := m.Run()
	s.Shutdown()
	s.WaitForShutdown()
	os.RemoveAll(dir)
	os.Exit(code)
}

func withTimeout(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// connect opens a connection and a JetStream context for the test, closed at its end.
func connect(t testing.TB) (*natsgo.Conn, jetstream.JetStream) {
	t.Helper()
	nc, err := natsgo.Connect(srvURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return nc, js
}

// newStream creates a stream with a name unique to the test, on subject NAME.>, and returns
// the name.
func newStream(t testing.TB, retention jetstream.RetentionPolicy) string {
	t.Helper()
	name := fmt.Sprintf("T%s%d", strings.NewReplacer("/", "_", " ", "_", "-", "_").Replace(t.Name()), rand.Uint32())
	_, js := connect(t)
	if _, err := js.CreateStream(withTimeout(t, 10*time.Second), jetstream.StreamConfig{Name: name, Subjects: []string{name + ".>"}, Retention: retention}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { js.DeleteStream(context.Background(), name) })
	return name
}

// newConsumer creates a durable consumer with ack policy all.
func newConsumer(t testing.TB, stream, name string, ackWait time.Duration) {
	t.Helper()
	_, js := connect(t)
	_, err := js.CreateConsumer(withTimeout(t, 10*time.Second), stream, jetstream.ConsumerConfig{
		Durable: name, AckPolicy: jetstream.AckAllPolicy, AckWait: ackWait, MaxAckPending: 20000, MaxDeliver: -1})
	if err != nil {
		t.Fatal(err)
	}
}

// publish publishes bodies "0" .. "n-1" (from first on) to stream.x, each acknowledged.
func publish(t testing.TB, stream string, first, n int) {
	t.Helper()
	_, js := connect(t)
	// In rounds of 1,000, each awaited, so that a loaded machine never stalls the publisher.
	for i := first; i < first+n; i++ {
		if _, err := js.PublishAsync(stream+".x", []byte(fmt.Sprint(i))); err != nil {
			t.Fatal(err)
		}
		if (i-first)%1000 == 999 || i == first+n-1 {
			select {
			case <-js.PublishAsyncComplete():
			case <-time.After(2 * time.Minute):
				t.Fatal("publishing timed out")
			}
		}
	}
}

// info returns the consumer's state.
func info(t testing.TB, stream, name string) *jetstream.ConsumerInfo {
	t.Helper()
	_, js := connect(t)
	c, err := js.Consumer(withTimeout(t, 10*time.Second), stream, name)
	if err != nil {
		t.Fatal(err)
	}
	return c.CachedInfo()
}

func eventually(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// gate is a DynamicSink that keeps every message and, while closed, blocks Write: an epoch
// whose items it holds cannot finish, so nothing of it is committed.
type gate struct {
	mu   sync.Mutex
	msgs []Message
	open chan struct{}
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

// seqs returns the stream sequences written, as a set.
func (g *gate) seqs() map[uint64]int {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := make(map[uint64]int, len(g.msgs))
	for _, m := range g.msgs {
		out[m.Sequence]++
	}
	return out
}

func flowOf[T any](src dataflow.Source[T], sink dataflow.Sink[T]) *dataflow.Flow {
	f := dataflow.New("nats")
	dataflow.Output("out", dataflow.Input(f, "in", src), sink)
	return f
}

// checkLeaks fails the test if a goroutine it started outlives it: checked after every other
// cleanup of the test (its connections closed), ignoring the shared server's goroutines.
func checkLeaks(t *testing.T) {
	t.Helper()
	opt := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, opt) })
}
