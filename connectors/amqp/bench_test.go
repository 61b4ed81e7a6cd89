package amqp

import (
	"cmp"
	"context"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

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
	if d.n.Add(int64(len(b))) >= d.want && d.n.Load()-int64(len(b)) < d.want {
		close(d.done)
	}
	return nil
}

func (d *discard) Close() error { return nil }

// fill publishes benchMessages small transient messages (the broker keeps them in memory; a
// test of the consumer, not of the broker's disk).
func fill(b *testing.B, persistent bool) string {
	b.Helper()
	var q string
	if persistent {
		q = newDurableQueue(b)
	} else {
		q = newQueue(b, nil)
	}
	publish(b, q, persistent, numbered(benchMessages)...)
	return q
}

// result is one consumer's measurement: messages per second, and the CPU time per message of
// this process (the client) and of the broker (its beam.smp processes). CPU time per message
// does not depend on what else the machine runs, which the rate does.
type result struct {
	rate, clientCPU, brokerCPU float64
}

// rate runs consume on a freshly filled queue and measures it.
func rate(b *testing.B, persistent bool, consume func(q string)) result {
	b.Helper()
	b.StopTimer()
	q := fill(b, persistent)
	b.StartTimer()
	c0, b0 := clientCPU(), brokerCPU()
	start := time.Now()
	consume(q)
	d := time.Since(start)
	c1, b1 := clientCPU(), brokerCPU()
	b.StopTimer()
	if r := ready(b, q); r != 0 {
		b.Fatalf("%d messages left in the queue", r)
	}
	per := func(d time.Duration) float64 { return float64(d.Microseconds()) / benchMessages }
	return result{rate: benchMessages / d.Seconds(), clientCPU: per(c1 - c0), brokerCPU: per(b1 - b0)}
}

// clientCPU returns the CPU time this process used so far.
func clientCPU() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// brokerCPU returns the CPU time the broker's Erlang VMs (every beam.smp process) used so far,
// from /proc (0 where that cannot be read).
func brokerCPU() time.Duration {
	dirs, _ := os.ReadDir("/proc")
	var ticks int64
	for _, d := range dirs {
		if _, err := strconv.Atoi(d.Name()); err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + d.Name() + "/stat")
		if err != nil || !strings.Contains(string(b), "(beam.smp)") {
			continue
		}
		_, rest, _ := strings.Cut(string(b), ") ")
		f := strings.Fields(rest)
		if len(f) < 13 {
			continue
		}
		u, _ := strconv.ParseInt(f[11], 10, 64) // utime, field 14
		s, _ := strconv.ParseInt(f[12], 10, 64) // stime, field 15
		ticks += u + s
	}
	return time.Duration(ticks) * 10 * time.Millisecond // USER_HZ is 100 on Linux
}

// plain reads benchMessages with a bare amqp091-go consumer, acknowledging with autoAck or
// with one Ack per message.
func plain(b *testing.B, q string, autoAck bool, prefetch int) {
	conn := dial(b)
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		b.Fatal(err)
	}
	if !autoAck {
		if err := ch.Qos(prefetch, 0, false); err != nil {
			b.Fatal(err)
		}
	}
	ds, err := ch.Consume(q, "", autoAck, false, false, false, nil)
	if err != nil {
		b.Fatal(err)
	}
	for i := 0; i < benchMessages; i++ {
		d := <-ds
		if !autoAck {
			if err := d.Ack(false); err != nil {
				b.Fatal(err)
			}
		}
	}
	ch.Close() // waits for close-ok: every ack was processed
}

// lateAck reads benchMessages with a bare amqp091-go consumer that acknowledges the way the
// flow does, with no flow around it: manual acks, the flow's default prefetch, and one
// multiple ack of everything received every interval. It is the best a consumer that acks
// only after the fact can do, and shows what the flow itself costs on top.
func lateAck(b *testing.B, q string, interval time.Duration) {
	conn := dial(b)
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		b.Fatal(err)
	}
	if err := ch.Qos(DefaultPrefetch, 0, false); err != nil {
		b.Fatal(err)
	}
	ds, err := ch.Consume(q, "", false, false, false, false, nil)
	if err != nil {
		b.Fatal(err)
	}
	next := time.Now().Add(interval)
	for i := 1; i <= benchMessages; i++ {
		d := <-ds
		if i == benchMessages || time.Now().After(next) {
			if err := d.Ack(true); err != nil {
				b.Fatal(err)
			}
			next = time.Now().Add(interval)
		}
	}
	ch.Close()
}

// viaFlow reads benchMessages through a flow (one worker, default prefetch, epochs of interval)
// into a discarding sink; acknowledgement is one multiple ack per commit.
func viaFlow(b *testing.B, q string, interval time.Duration) {
	d := &discard{want: benchMessages, done: make(chan struct{})}
	stop := make(chan struct{})
	go func() {
		<-d.done
		close(stop)
	}()
	err := dataflow.Run(context.Background(), flowOf(Consume(SourceConfig{URL: brokerURL(), Queue: q}), dataflow.ToDynamic[Message](d)),
		dataflow.Options{EpochInterval: interval, Stop: stop})
	if err != nil {
		b.Fatal(err)
	}
}

// benchEpoch is the epoch interval of the flow in BenchmarkConsume, and the ack interval of
// its lateAck consumer. The broker's cost per message grows with the messages it holds
// unacknowledged; a flow holds those of its open epoch and of the one committing, so short
// epochs keep that cost down (measured, persistent messages: ~58-61k msg/s with 20 ms epochs,
// ~55-56k with 100 ms).
const benchEpoch = 20 * time.Millisecond

// BenchmarkConsume compares, on 200,000 messages each, a flow reading a queue (acks on commit:
// one multiple ack per epoch, benchEpoch epochs, no recovery store) with a plain amqp091-go
// consumer using autoAck, with one that acks every message (with the same prefetch as the
// flow's source), and with a bare consumer that acks late like the flow but has no flow
// around it (lateAck: one multiple ack every benchEpoch). Each consumer starts on a freshly filled queue, filled outside the timed
// region. The broker shares this machine's cores and its speed varies from one queue to the
// next, so each case runs five rounds in rotating order and reports the median of each
// consumer. "persistent" is a durable queue of persistent messages (what a production queue
// holds); "transient" keeps the messages in the broker's memory. Ratios above 1 mean the flow
// is faster. The CPU figures (client and broker, per message) say where the time goes: a
// broker that tracks unacknowledged messages spends more per message than one that forgets
// them on delivery (autoAck), whoever acknowledges. The broker also has two speeds that a run
// falls into at random (its CPU per message about 8 or about 12.5 µs, transient messages,
// whichever consumer reads): the rounds and medians keep one lucky run from deciding a
// ratio. The targets of the issue that asked for this benchmark, flow/autoack ≥ 0.8 and
// flow/ackeach ≥ 1.5, hold for "persistent", the queue at-least-once delivery is for; with
// transient messages an autoAck consumer costs the broker so little that no consumer that
// acknowledges comes near it (see lateack-msg/s). Run it once:
//
//	go test ./connectors/amqp -run '^$' -bench Consume -benchtime 1x
func BenchmarkConsume(b *testing.B) {
	for _, c := range []struct {
		name       string
		persistent bool
	}{{"persistent", true}, {"transient", false}} {
		b.Run(c.name, func(b *testing.B) {
			const rounds = 5
			names := []string{"flow", "autoAck", "ack-each", "late-ack"}
			consumers := []func(q string){
				func(q string) { viaFlow(b, q, benchEpoch) },
				func(q string) { plain(b, q, true, 0) },
				func(q string) { plain(b, q, false, DefaultPrefetch) },
				func(q string) { lateAck(b, q, benchEpoch) },
			}
			rates := make([][]result, len(consumers))
			for i := 0; i < b.N; i++ {
				for r := 0; r < rounds; r++ {
					for k := range consumers {
						j := (k + r) % len(consumers)
						rates[j] = append(rates[j], rate(b, c.persistent, consumers[j]))
					}
				}
			}
			flow, auto, each, late := median(rates[0]), median(rates[1]), median(rates[2]), median(rates[3])
			for i, name := range names {
				b.Logf("%s per round: %v (msg/s, client and broker CPU µs/msg)", name, rates[i])
			}
			b.ReportMetric(flow.rate, "flow-msg/s")
			b.ReportMetric(auto.rate, "autoack-msg/s")
			b.ReportMetric(each.rate, "ackeach-msg/s")
			b.ReportMetric(late.rate, "lateack-msg/s")
			b.ReportMetric(flow.rate/auto.rate, "flow/autoack")
			b.ReportMetric(flow.rate/each.rate, "flow/ackeach")
			b.ReportMetric(flow.rate/late.rate, "flow/lateack")
			// The ceiling of the two targets: what a consumer that acks late can reach at
			// best against each baseline on this broker.
			b.ReportMetric(late.rate/auto.rate, "lateack/autoack")
			b.ReportMetric(late.rate/each.rate, "lateack/ackeach")
			// Total CPU per message, client and broker: the cost that bounds the rate on a
			// machine where both share the cores, whatever else runs there.
			cost := func(r result) float64 { return r.clientCPU + r.brokerCPU }
			b.ReportMetric(cost(flow), "flow-cpu-µs/msg")
			b.ReportMetric(cost(auto)/cost(flow), "cpu-autoack/flow")
			b.ReportMetric(cost(each)/cost(flow), "cpu-ackeach/flow")
			b.ReportMetric(cost(late)/cost(flow), "cpu-lateack/flow")
		})
	}
}

// median returns the result with the median rate (and its CPU figures).
func median(v []result) result {
	s := slices.Clone(v)
	slices.SortFunc(s, func(a, b result) int { return cmp.Compare(a.rate, b.rate) })
	return s[len(s)/2]
}
