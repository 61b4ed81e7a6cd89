package nats

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/epochflow/epochflow/dataflow"
)

// benchMessages is how many messages each consumer of BenchmarkConsume reads.
const benchMessages = 200_000

// discard is a DynamicSink that counts items and closes done when it has seen want of them.
type discard struct {
	n    atomic.Int64
	want int64
	done chan struct{}
}

func (d *discard) Build(context.Context, dataflow.Worker) (dataflow.WorkerSink[Message], error) {
	return d, nil
}

func (d *discard) Write(_ context.Context, b []Message) error {
	if n := d.n.Add(int64(len(b))); n >= d.want && n-int64(len(b)) < d.want {
		close(d.done)
	}
	return nil
}

func (d *discard) Close() error { return nil }

// benchStream makes an interest stream with consumer "c" (ack policy all) holding
// benchMessages messages.
func benchStream(b *testing.B) string {
	b.Helper()
	b.StopTimer()
	defer b.StartTimer()
	st := newStream(b, jetstream.InterestPolicy)
	newConsumer(b, st, "c", 30*time.Second)
	publish(b, st, 0, benchMessages)
	return st
}

// measure runs consume on a fresh stream and returns messages per second; the consumer must be
// fully acknowledged at the end.
func measure(b *testing.B, name string, consume func(st string)) float64 {
	st := benchStream(b)
	start := time.Now()
	consume(st)
	d := time.Since(start)
	if i := info(b, st, "c"); i.NumAckPending != 0 || i.NumPending != 0 {
		b.Fatalf("%s, after the run of %v: %d pending acks, %d pending", name, d, i.NumAckPending, i.NumPending)
	}
	return benchMessages / d.Seconds()
}

// plain reads with a bare nats.go pull consumer; ackEvery 0 acks every message, else the last
// message read is acked (ack-all) every ackEvery, on time also when no message comes (with
// MaxAckPending reached, none would until the ack); the last ack is a confirmed request.
func plain(b *testing.B, st string, ackEvery time.Duration) {
	_, js := connect(b)
	ctx := withTimeout(b, 5*time.Minute)
	c, err := js.Consumer(ctx, st, "c")
	if err != nil {
		b.Fatal(err)
	}
	it, err := c.Messages(jetstream.PullMaxMessages(DefaultPullBatch))
	if err != nil {
		b.Fatal(err)
	}
	defer it.Stop()
	last := time.Now()
	var unacked jetstream.Msg
	for n := 0; n < benchMessages; {
		nctx := ctx
		cancel := func() {}
		if ackEvery > 0 {
			nctx, cancel = context.WithDeadline(ctx, last.Add(ackEvery))
		}
		m, err := it.Next(jetstream.NextContext(nctx))
		cancel()
		if err != nil && ackEvery > 0 && ctx.Err() == nil && nctx.Err() != nil {
			if unacked != nil { // the ack is due and no message came
				unacked.Ack()
				unacked = nil
			}
			last = time.Now()
			continue
		}
		if err != nil {
			b.Fatal(err)
		}
		n++
		switch {
		case n == benchMessages:
			if err := m.DoubleAck(ctx); err != nil {
				b.Fatal(err)
			}
		case ackEvery == 0:
			m.Ack()
		case time.Since(last) >= ackEvery:
			m.Ack()
			unacked = nil
			last = time.Now()
		default:
			unacked = m
		}
	}
}

// BenchmarkConsume compares a flow reading a stream into a discarding sink (50 ms epochs) with
// a bare nats.go consumer acking every message and one acking all every 100 ms, each reading
// benchMessages messages per iteration. It reports the three rates and the ratios.
func BenchmarkConsume(b *testing.B) {
	var flow, each, all float64
	for b.Loop() {
		flow += measure(b, "flow", func(st string) {
			d := &discard{want: benchMessages, done: make(chan struct{})}
			stop := make(chan struct{})
			go func() { <-d.done; close(stop) }()
			err := dataflow.Run(withTimeout(b, 5*time.Minute), flowOf(Consume(SourceConfig{URL: srvURL, Stream: st, Consumers: []string{"c"}}), dataflow.ToDynamic[Message](d)),
				dataflow.Options{EpochInterval: 50 * time.Millisecond, Stop: stop})
			if err != nil {
				b.Fatal(err)
			}
		})
		each += measure(b, "ack-each consumer", func(st string) { plain(b, st, 0) })
		all += measure(b, "ack-all consumer", func(st string) { plain(b, st, 100*time.Millisecond) })
	}
	n := float64(b.N)
	b.ReportMetric(flow/n, "flow-msg/s")
	b.ReportMetric(each/n, "ack-each-msg/s")
	b.ReportMetric(all/n, "ack-all-100ms-msg/s")
	b.ReportMetric(flow/all, "flow/ack-all")
	b.ReportMetric(flow/each, "flow/ack-each")
}
