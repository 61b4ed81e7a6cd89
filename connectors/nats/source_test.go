package nats

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/epochflow/epochflow/dataflow"
	"github.com/epochflow/epochflow/recovery"
)

// During an epoch the consumer's pending acks hold its messages and nothing is acked; after
// the commit they are acked (one confirmed ack-all), while the flow still runs.
func TestPendingUntilCommit(t *testing.T) {
	checkLeaks(t)
	st := newStream(t, jetstream.InterestPolicy)
	newConsumer(t, st, "c", 30*time.Second)
	publish(t, st, 0, 100)
	g := &gate{open: make(chan struct{})}
	var acks atomic.Int64
	var lastAck atomic.Uint64
	src := NewSource[Message](SourceConfig{URL: srvURL, Stream: st, Consumers: []string{"c"}}, nil)
	src.onAck = func(_ string, seq uint64) { acks.Add(1); lastAck.Store(seq) }
	stop := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- dataflow.Run(withTimeout(t, time.Minute), flowOf(dataflow.FromPartitioned[Message, QueueState](src), dataflow.ToDynamic[Message](g)),
			dataflow.Options{EpochInterval: 20 * time.Millisecond, Stop: stop})
	}()
	eventually(t, 20*time.Second, "100 messages pending acknowledgement", func() bool {
		i := info(t, st, "c")
		return i.NumAckPending == 100 && i.NumPending == 0
	})
	if n := acks.Load(); n != 0 {
		t.Fatalf("%d ack-alls sent before any epoch committed", n)
	}
	close(g.open)
	eventually(t, 20*time.Second, "the committed messages to be acknowledged", func() bool {
		i := info(t, st, "c")
		return i.NumAckPending == 0 && i.AckFloor.Stream == 100
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
	if got := g.seqs(); len(got) != 100 {
		t.Fatalf("got %d distinct messages, want 100", len(got))
	}
	if lastAck.Load() != 100 {
		t.Fatalf("the last ack-all was on %d, want 100", lastAck.Load())
	}
}

// A run that crashes before its epoch is recorded as committed acknowledges nothing; the next
// run reads every message again (redelivered after AckWait) and acks them all.
func TestCrashBeforeCommitAcksNothing(t *testing.T) {
	checkLeaks(t)
	st := newStream(t, jetstream.InterestPolicy)
	newConsumer(t, st, "c", time.Second)
	publish(t, st, 0, 50)
	dir := t.TempDir()
	var acks atomic.Int64
	src := NewSource[Message](SourceConfig{URL: srvURL, Stream: st, Consumers: []string{"c"}}, nil)
	src.onAck = func(string, uint64) { acks.Add(1) }
	g := &gate{}
	store, err := recovery.OpenSQLite(context.Background(), dir, recovery.SQLiteOptions{})
	if err != nil {
		t.Fatal(err)
	}
	crash := func(point string) bool { return point == "before-commit-record" }
	stop := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- dataflow.Run(withTimeout(t, time.Minute), flowOf(dataflow.FromPartitioned[Message, QueueState](src), dataflow.ToDynamic[Message](g)),
			dataflow.Options{EpochInterval: time.Hour, Recovery: store, CrashHook: crash, Stop: stop})
	}()
	eventually(t, 20*time.Second, "50 messages", func() bool { return g.count() == 50 })
	close(stop)
	err = <-done
	store.Close()
	if !errors.Is(err, dataflow.ErrCrashed) {
		t.Fatalf("run: %v, want a crash", err)
	}
	if n := acks.Load(); n != 0 {
		t.Fatalf("%d ack-alls sent by a run that never committed", n)
	}
	if i := info(t, st, "c"); i.AckFloor.Stream != 0 {
		t.Fatalf("ack floor %d after a run that never committed, want 0", i.AckFloor.Stream)
	}

	store, err = recovery.OpenSQLite(context.Background(), dir, recovery.SQLiteOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	g2 := &gate{}
	src2 := NewSource[Message](SourceConfig{URL: srvURL, Stream: st, Consumers: []string{"c"}, IdleExit: 500 * time.Millisecond}, nil)
	if err := dataflow.Run(withTimeout(t, time.Minute), flowOf(dataflow.FromPartitioned[Message, QueueState](src2), dataflow.ToDynamic[Message](g2)),
		dataflow.Options{EpochInterval: 50 * time.Millisecond, Recovery: store}); err != nil {
		t.Fatal(err)
	}
	got := g2.seqs()
	if len(got) != 50 || g2.count() != 50 {
		t.Fatalf("the second run read %d messages (%d distinct), want 50", g2.count(), len(got))
	}
	if i := info(t, st, "c"); i.NumAckPending != 0 || i.NumPending != 0 {
		t.Fatalf("after the second run: %d pending acks, %d pending; want 0 and 0", i.NumAckPending, i.NumPending)
	}
}

// With an AckWait shorter than an epoch, the messages of the open epoch are kept alive and
// never redelivered; the in-progress signals go out in rounds, each one flush carrying one
// signal for every held message, and the server sees exactly those.
func TestKeepAliveInRounds(t *testing.T) {
	checkLeaks(t)
	st := newStream(t, jetstream.InterestPolicy)
	const ackWait = time.Second
	newConsumer(t, st, "c", ackWait)
	publish(t, st, 0, 100)
	// Every +WPI the server receives for the consumer is seen by this subscription too.
	nc, _ := connect(t)
	var wpi atomic.Int64
	sub, err := nc.Subscribe("$JS.ACK."+st+".c.>", func(m *natsgo.Msg) {
		if string(m.Data) == "+WPI" {
			wpi.Add(1)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var rounds []int
	g := &gate{open: make(chan struct{})}
	src := NewSource[Message](SourceConfig{URL: srvURL, Stream: st, Consumers: []string{"c"}}, nil)
	src.onKeepAlive = func(_ string, n int) { mu.Lock(); rounds = append(rounds, n); mu.Unlock() }
	stop := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- dataflow.Run(withTimeout(t, time.Minute), flowOf(dataflow.FromPartitioned[Message, QueueState](src), dataflow.ToDynamic[Message](g)),
			dataflow.Options{EpochInterval: 20 * time.Millisecond, Stop: stop})
	}()
	eventually(t, 20*time.Second, "100 messages pending acknowledgement", func() bool { return info(t, st, "c").NumAckPending == 100 })
	// Hold the epoch for five AckWaits.
	time.Sleep(5 * ackWait)
	if i := info(t, st, "c"); i.NumRedelivered != 0 || i.NumAckPending != 100 {
		t.Fatalf("while held: %d waiting redelivery, %d pending acks; want 0 and 100", i.NumRedelivered, i.NumAckPending)
	}
	close(g.open)
	eventually(t, 20*time.Second, "everything acked", func() bool { return info(t, st, "c").NumAckPending == 0 })
	close(stop)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got := g.seqs(); len(got) != 100 || g.count() != 100 {
		t.Fatalf("read %d messages (%d distinct), want 100 once each: some were redelivered", g.count(), len(got))
	}
	mu.Lock()
	defer mu.Unlock()
	if len(rounds) < 4 {
		t.Fatalf("%d keep-alive rounds in five AckWaits, want at least 4", len(rounds))
	}
	sent := 0
	for _, n := range rounds {
		sent += n
	}
	// A round signals each held message at most once; messages that arrived at different
	// times may first fall into different rounds, then share them.
	full := 0
	for i, n := range rounds {
		if n > 100 {
			t.Fatalf("keep-alive round %d sent %d signals for 100 held messages (rounds %v)", i, n, rounds)
		}
		if n == 100 {
			full++
		}
	}
	if full < 3 {
		t.Fatalf("%d keep-alive rounds carried all 100 held messages, want at least 3 (rounds %v)", full, rounds)
	}
	eventually(t, 10*time.Second, "the server to see every signal", func() bool { return int(wpi.Load()) == sent })
	// One round per AckWait/4 at most, not one signal per message per timer.
	if max := int(5*ackWait/(ackWait/4)) + 8; len(rounds) > max {
		t.Fatalf("%d keep-alive rounds, want at most %d", len(rounds), max)
	}
}

// Messages an earlier run received and never acknowledged come back only after their AckWait,
// after newer ones: no ack-all may cover them before their own epoch has committed.
func TestAckAllNeverPassesAnUnprocessedRedelivery(t *testing.T) {
	checkLeaks(t)
	st := newStream(t, jetstream.InterestPolicy)
	newConsumer(t, st, "c", 2*time.Second)
	publish(t, st, 0, 10)
	// Run 1 reads 1..10 and crashes without committing.
	store, err := recovery.OpenSQLite(context.Background(), t.TempDir(), recovery.SQLiteOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	g := &gate{}
	crash := func(point string) bool { return point == "before-commit-record" }
	stop := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- dataflow.Run(withTimeout(t, time.Minute), flowOf(Consume(SourceConfig{URL: srvURL, Stream: st, Consumers: []string{"c"}}), dataflow.ToDynamic[Message](g)),
			dataflow.Options{EpochInterval: time.Hour, Recovery: store, CrashHook: crash, Stop: stop})
	}()
	eventually(t, 20*time.Second, "10 messages", func() bool { return g.count() == 10 })
	close(stop)
	if err := <-done; !errors.Is(err, dataflow.ErrCrashed) {
		t.Fatalf("run: %v, want a crash", err)
	}
	if i := info(t, st, "c"); i.NumAckPending != 10 || i.AckFloor.Stream != 0 {
		t.Fatalf("after the crash: %d pending acks, ack floor %d; want 10 and 0", i.NumAckPending, i.AckFloor.Stream)
	}
	publish(t, st, 10, 10) // 11..20, delivered before 1..10 come back
	g2 := &gate{}
	var bad atomic.Value
	var acked atomic.Uint64
	src := NewSource[Message](SourceConfig{URL: srvURL, Stream: st, Consumers: []string{"c"}, IdleExit: 500 * time.Millisecond}, nil)
	src.onAck = func(_ string, seq uint64) {
		acked.Store(seq)
		have := g2.seqs()
		for s := uint64(1); s <= seq; s++ {
			if have[s] == 0 {
				bad.Store(seq)
			}
		}
	}
	if err := dataflow.Run(withTimeout(t, time.Minute), flowOf(dataflow.FromPartitioned[Message, QueueState](src), dataflow.ToDynamic[Message](g2)),
		dataflow.Options{EpochInterval: 20 * time.Millisecond, Recovery: store}); err != nil {
		t.Fatal(err)
	}
	if v := bad.Load(); v != nil {
		t.Fatalf("an ack-all on %d covered a message not yet written", v)
	}
	first := g2.msgs[0].Sequence
	if first <= 10 {
		t.Fatalf("the second run read %d first; the test needs the new messages to come first", first)
	}
	if got := g2.seqs(); len(got) != 20 {
		t.Fatalf("the second run read %d distinct messages, want 20", len(got))
	}
	if i := info(t, st, "c"); i.NumAckPending != 0 || i.NumPending != 0 || acked.Load() != 20 {
		t.Fatalf("after the run: %d pending acks, %d pending, last ack-all %d; want 0, 0, 20", i.NumAckPending, i.NumPending, acked.Load())
	}
}

// A consumer without ack policy all is refused, naming the fix.
func TestRefusesAckExplicit(t *testing.T) {
	checkLeaks(t)
	st := newStream(t, jetstream.InterestPolicy)
	_, js := connect(t)
	if _, err := js.CreateConsumer(withTimeout(t, 10*time.Second), st, jetstream.ConsumerConfig{Durable: "c", AckPolicy: jetstream.AckExplicitPolicy}); err != nil {
		t.Fatal(err)
	}
	err := dataflow.Run(withTimeout(t, time.Minute), flowOf(Consume(SourceConfig{URL: srvURL, Stream: st, Consumers: []string{"c"}}), dataflow.ToDynamic[Message](&gate{})), dataflow.Options{})
	if err == nil || !strings.Contains(err.Error(), "AckPolicy") {
		t.Fatalf("run: %v, want a refusal naming AckPolicy", err)
	}
}

// Create makes the consumer with ack policy all and the in-flight cap as MaxAckPending.
func TestCreateSizesTheConsumer(t *testing.T) {
	checkLeaks(t)
	st := newStream(t, jetstream.LimitsPolicy)
	publish(t, st, 0, 10)
	g := &gate{}
	err := dataflow.Run(withTimeout(t, time.Minute), flowOf(Consume(SourceConfig{URL: srvURL, Stream: st, Consumers: []string{"c"}, Create: true,
		EpochInterval: 20 * time.Second, MaxInFlight: 5000, IdleExit: 300 * time.Millisecond}), dataflow.ToDynamic[Message](g)), dataflow.Options{EpochInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	i := info(t, st, "c")
	if i.Config.AckPolicy != jetstream.AckAllPolicy || i.Config.MaxAckPending != 5000 || i.Config.AckWait != 80*time.Second {
		t.Fatalf("created %+v, want ack all, MaxAckPending 5000, AckWait 80s", i.Config)
	}
	if g.count() != 10 || i.NumAckPending != 0 {
		t.Fatalf("read %d, %d left pending; want 10 and 0", g.count(), i.NumAckPending)
	}
}

// A work-queue stream is refused at start with the reason and the way out: the server refuses
// ack policy all on it.
func TestRefusesWorkQueueStream(t *testing.T) {
	checkLeaks(t)
	st := newStream(t, jetstream.WorkQueuePolicy)
	err := dataflow.Run(withTimeout(t, time.Minute), flowOf(Consume(SourceConfig{URL: srvURL, Stream: st, Consumers: []string{"c"}, Create: true}), dataflow.ToDynamic[Message](&gate{})), dataflow.Options{})
	if err == nil || !strings.Contains(err.Error(), "interest retention") {
		t.Fatalf("run: %v, want a refusal pointing to interest retention", err)
	}
}

// logBuf is a slog handler that keeps the messages it is given, with their levels.
type logBuf struct {
	mu     sync.Mutex
	msgs   []string
	levels []slog.Level
}

func (l *logBuf) Enabled(context.Context, slog.Level) bool { return true }
func (l *logBuf) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	l.msgs = append(l.msgs, r.Message)
	l.levels = append(l.levels, r.Level)
	l.mu.Unlock()
	return nil
}
func (l *logBuf) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *logBuf) WithGroup(string) slog.Handler      { return l }
func (l *logBuf) has(s string) bool                  { return l.hasAt(slog.LevelDebug, s) }

// hasAt tells whether a message containing s was logged at level or above.
func (l *logBuf) hasAt(level slog.Level, s string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i, m := range l.msgs {
		if strings.Contains(m, s) && l.levels[i] >= level {
			return true
		}
	}
	return false
}

// Without SourceConfig.EpochInterval the source sizes AckWait from the run's epoch interval:
// with 20 s epochs a consumer it creates gets four of them (80 s, not the 30 s floor that 1 s
// epochs would give), and an existing consumer with the default 30 s AckWait, which cannot
// hold two such epochs, is warned about at warn level.
func TestAckWaitFollowsTheRunsEpochInterval(t *testing.T) {
	checkLeaks(t)
	const interval = 20 * time.Second
	const holdEpoch = "AckWait cannot hold an epoch"
	created, existing := newStream(t, jetstream.LimitsPolicy), newStream(t, jetstream.InterestPolicy)
	newConsumer(t, existing, "c", 30*time.Second)
	for _, st := range []string{created, existing} {
		publish(t, st, 0, 10)
		logs := &logBuf{}
		g := &gate{}
		err := dataflow.Run(withTimeout(t, time.Minute), flowOf(Consume(SourceConfig{URL: srvURL, Stream: st, Consumers: []string{"c"}, Create: true,
			IdleExit: 300 * time.Millisecond, Logger: slog.New(logs)}), dataflow.ToDynamic[Message](g)), dataflow.Options{EpochInterval: interval})
		if err != nil {
			t.Fatal(err)
		}
		if g.count() != 10 {
			t.Fatalf("stream %s: read %d messages, want 10", st, g.count())
		}
		i := info(t, st, "c")
		switch st {
		case created:
			if i.Config.AckWait != 4*interval {
				t.Fatalf("the created consumer's AckWait is %v, want four run epoch intervals (%v)", i.Config.AckWait, 4*interval)
			}
			if logs.has(holdEpoch) {
				t.Fatalf("a warning that AckWait %v cannot hold an epoch of %v; logs: %q", i.Config.AckWait, interval, logs.msgs)
			}
		case existing:
			if !logs.hasAt(slog.LevelWarn, holdEpoch) {
				t.Fatalf("no warning that AckWait %v cannot hold an epoch of %v; logs: %q", i.Config.AckWait, interval, logs.msgs)
			}
		}
	}
}

// A consumer left at the server's default MaxAckPending (1,000) cannot hold an epoch of more:
// the source says so at start, and again when the server stops delivering at the limit.
func TestWarnsAtMaxAckPending(t *testing.T) {
	checkLeaks(t)
	st := newStream(t, jetstream.InterestPolicy)
	_, js := connect(t)
	if _, err := js.CreateConsumer(withTimeout(t, 10*time.Second), st, jetstream.ConsumerConfig{Durable: "c", AckPolicy: jetstream.AckAllPolicy}); err != nil {
		t.Fatal(err)
	}
	publish(t, st, 0, 1500)
	logs := &logBuf{}
	g := &gate{open: make(chan struct{})}
	stop := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- dataflow.Run(withTimeout(t, time.Minute), flowOf(Consume(SourceConfig{URL: srvURL, Stream: st, Consumers: []string{"c"}, Logger: slog.New(logs)}), dataflow.ToDynamic[Message](g)),
			dataflow.Options{EpochInterval: 20 * time.Millisecond, Stop: stop})
	}()
	eventually(t, 20*time.Second, "1,000 messages pending acknowledgement", func() bool { return info(t, st, "c").NumAckPending == 1000 })
	if !logs.has("MaxAckPending is below SourceConfig.MaxInFlight") {
		t.Fatalf("no warning at start about MaxAckPending; logs: %q", logs.msgs)
	}
	eventually(t, 20*time.Second, "the warning at the limit", func() bool { return logs.has("as many messages as the consumer's MaxAckPending") })
	close(g.open)
	eventually(t, 20*time.Second, "everything acked", func() bool {
		i := info(t, st, "c")
		return i.NumAckPending == 0 && i.NumPending == 0
	})
	close(stop)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// Pending messages of an earlier run that the stream deleted meanwhile never come back; the
// source notices from the server's counts and acknowledges the rest instead of waiting for
// them for good.
func TestPendingMessagesDeletedMeanwhile(t *testing.T) {
	checkLeaks(t)
	st := newStream(t, jetstream.InterestPolicy)
	newConsumer(t, st, "c", time.Second)
	publish(t, st, 0, 10)
	store, err := recovery.OpenSQLite(context.Background(), t.TempDir(), recovery.SQLiteOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	g := &gate{}
	crash := func(point string) bool { return point == "before-commit-record" }
	stop := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- dataflow.Run(withTimeout(t, time.Minute), flowOf(Consume(SourceConfig{URL: srvURL, Stream: st, Consumers: []string{"c"}}), dataflow.ToDynamic[Message](g)),
			dataflow.Options{EpochInterval: time.Hour, Recovery: store, CrashHook: crash, Stop: stop})
	}()
	eventually(t, 20*time.Second, "10 messages", func() bool { return g.count() == 10 })
	close(stop)
	if err := <-done; !errors.Is(err, dataflow.ErrCrashed) {
		t.Fatalf("run: %v, want a crash", err)
	}
	if i := info(t, st, "c"); i.NumAckPending != 10 {
		t.Fatalf("%d pending acks after the crash, want 10", i.NumAckPending)
	}
	_, js := connect(t)
	stream, err := js.Stream(withTimeout(t, 10*time.Second), st)
	if err != nil {
		t.Fatal(err)
	}
	// Run 2 counts 10 pending messages when it starts; 1..5 are deleted right after, before
	// the server redelivers anything (AckWait 1 s after run 1 read them).
	g2 := &gate{}
	src := NewSource[Message](SourceConfig{URL: srvURL, Stream: st, Consumers: []string{"c"}, IdleExit: 500 * time.Millisecond}, nil)
	src.onStart = func(string) {
		for seq := uint64(1); seq <= 5; seq++ {
			if err := stream.DeleteMsg(context.Background(), seq); err != nil {
				t.Error(err)
			}
		}
	}
	err = dataflow.Run(withTimeout(t, time.Minute), flowOf(dataflow.FromPartitioned[Message, QueueState](src), dataflow.ToDynamic[Message](g2)),
		dataflow.Options{EpochInterval: 20 * time.Millisecond, Recovery: store})
	if err != nil {
		t.Fatal(err)
	}
	if got := g2.seqs(); len(got) != 5 {
		t.Fatalf("read %v, want 6..10", got)
	}
	if i := info(t, st, "c"); i.NumAckPending != 0 || i.AckFloor.Stream != 10 {
		t.Fatalf("after the run: %d pending acks, ack floor %d; want 0 and 10", i.NumAckPending, i.AckFloor.Stream)
	}
}
