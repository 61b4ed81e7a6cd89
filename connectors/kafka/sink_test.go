package kafka

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"go.uber.org/goleak"

	"github.com/epochflow/epochflow/dataflow"
)

// stable tells whether the last stable offsets of topic have reached its high watermarks (no
// open transaction holds read_committed readers back).
func stable(t *testing.T, brokers []string, topic string) bool {
	t.Helper()
	adm := kadm.NewClient(client(t, brokers))
	ctx := context.Background()
	ends, err := adm.ListEndOffsets(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	lsos, err := adm.ListCommittedOffsets(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	ok := true
	ends.Each(func(e kadm.ListedOffset) {
		l, found := lsos.Lookup(topic, e.Partition)
		if !found || l.Offset < e.Offset {
			ok = false
		}
	})
	return ok
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

func numberRecords(from, n int) []Record {
	rs := make([]Record, n)
	for i := range rs {
		v := []byte(itoa(from + i))
		rs[i] = Record{Key: v, Value: v}
	}
	return rs
}

// Nothing written is visible to read_committed readers before the epoch's Commit, though
// Snapshot flushed it; after the Commit every record is, once. kfake (the pinned version)
// aborts a transaction left open when its transactional id is initialised again: a second
// Build of the partition, resuming from the first one's snapshot, initialises every id and so
// aborts the first one's unflushed transaction of the next epoch.
func TestSinkInvisibleUntilCommit(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	brokers := cluster(t, 2, "out")
	ctx := context.Background()
	s := NewSink(SinkConfig{Brokers: brokers, Topic: "out", Name: t.Name(), Logger: quiet})
	p, err := s.Build(ctx, "p0", nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.(*producer).kill) // on a failure below too: goleak runs after it
	if err := p.Write(ctx, numberRecords(0, 100)); err != nil {
		t.Fatal(err)
	}
	st, err := p.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Txns) != 1 || st.Txns[0].ID != t.Name()+"-p0-"+itoa(DefaultTransactions-1) || st.Txns[0].ProducerID < 0 {
		t.Fatalf("snapshot %+v: want the epoch's transaction with its id and producer id", st)
	}
	if err := p.Write(ctx, numberRecords(100, 50)); err != nil { // the next epoch, not snapshotted
		t.Fatal(err)
	}
	if stable(t, brokers, "out") {
		t.Fatal("the records are visible to read_committed readers before the epoch committed")
	}
	// The next epoch's records are produced asynchronously: its transaction opens on the
	// broker when the first of them arrives there, so wait for it rather than look once.
	waitFor(t, "the flushed transaction and the one of the next epoch to be open", func() bool { return len(openTxns(t, brokers)) == 2 })
	if open := openTxns(t, brokers); len(open) != 2 {
		t.Fatalf("open transactions before the commit: %v, want the flushed one and the one of the next epoch", open)
	}
	if err := p.Commit(ctx, st); err != nil {
		t.Fatal(err)
	}
	// The second epoch's transaction (open, unflushed) still holds the last stable offset back
	// on the partitions it wrote to; the first one's records become readable.
	p2, err := s.Build(ctx, "p0", &st) // another run takes the ids over: it aborts the open one
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p2.(*producer).kill)
	waitFor(t, "the last stable offsets to reach the high watermarks", func() bool { return stable(t, brokers, "out") })
	exactlyOnce(t, readCommitted(t, brokers, "out", 30*time.Second), 100)
	if open := openTxns(t, brokers); len(open) > 0 {
		t.Fatalf("transactions left open: %v", open)
	}
	p.(*producer).kill()
	if err := p2.Close(); err != nil {
		t.Fatal(err)
	}
}

// Build refuses a transaction timeout too short for the epoch interval, naming the option and
// the flag.
func TestSinkTimeoutCheckedAgainstTheEpochInterval(t *testing.T) {
	brokers := cluster(t, 1, "in", "out")
	src := NewSource(SourceConfig{Brokers: brokers, Topics: []string{"in"}, IdleEOF: 100 * time.Millisecond})
	f := dataflow.New("timeout")
	dataflow.Output("out", dataflow.Input(f, "in", dataflow.FromPartitioned(src)),
		Produce(SinkConfig{Brokers: brokers, Topic: "out", Name: "timeout", TransactionTimeout: time.Minute}))
	err := dataflow.Run(context.Background(), f, dataflow.Options{EpochInterval: 10 * time.Second, Logger: quiet})
	if err == nil {
		t.Fatal("a 1m transaction timeout with 10s epochs was accepted")
	}
	for _, want := range []string{"SinkConfig.TransactionTimeout", "-epoch-interval", "1m20s"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
}

// copyFlow reads "in" and writes each record's key and value to "out", exactly once.
func copyFlow(brokers []string, src dataflow.PartitionedSource[Record, int64], sink dataflow.PartitionedSink[Record, SinkState]) *dataflow.Flow {
	f := dataflow.New("kafka-copy-test")
	in := dataflow.Input(f, "in", dataflow.FromPartitioned(src))
	dataflow.Output("out", in, dataflow.ToPartitioned(sink))
	return f
}

// A crash at each point of the protocol, then a resume: a read_committed reader of the target
// sees every record exactly once, and no transaction is left open. After a crash between the
// store's commit and Commit (or inside it), the prepared transactions of the committed epoch
// are committed from the snapshot.
func TestSinkCrashExactlyOnce(t *testing.T) {
	const n = 3000
	for _, point := range []string{"after-snapshot", "after-commit-record", "before-commit-calls", "inside-commit"} {
		t.Run(point, func(t *testing.T) {
			brokers := cluster(t, 3, "in", "out")
			produceNumbers(t, brokers, "in", 0, n)
			st := store(t)
			scfg := SourceConfig{Brokers: brokers, Topics: []string{"in"}, IdleEOF: 300 * time.Millisecond, MaxBuffered: 200}
			kcfg := SinkConfig{Brokers: brokers, Topic: "out", Name: "copy", Partitions: 2, Logger: quiet}
			var hits atomic.Int32
			hook := func(p string) bool { return p == point && hits.Add(1) == 2 }
			src, sink := &killableSource{Source: NewSource(scfg)}, &killableSink{Sink: NewSink(kcfg)}
			var ended atomic.Int32
			sink.afterEnd = func(Txn, error) { ended.Add(1) }
			opts := dataflow.Options{Workers: 2, EpochInterval: 10 * time.Millisecond, Recovery: st, CrashHook: hook, Logger: quiet}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			err := dataflow.Run(ctx, copyFlow(brokers, src, sink), opts)
			sink.kill()
			src.kill()
			if !errors.Is(err, dataflow.ErrCrashed) {
				t.Fatalf("first run: %v, want a crash", err)
			}
			opts.CrashHook = nil
			if err := dataflow.Run(ctx, copyFlow(brokers, NewSource(scfg), NewSink(kcfg)), opts); err != nil {
				t.Fatal(err)
			}
			exactlyOnce(t, readCommitted(t, brokers, "out", 30*time.Second), n)
			if open := openTxns(t, brokers); len(open) > 0 {
				t.Fatalf("transactions left open: %v", open)
			}
			t.Logf("crash at %s after %d transactions were committed", point, ended.Load())
		})
	}
}

// Every transaction of an id has its own producer epoch, so the recovery's EndTxn of a
// transaction committed long ago (its id reused since) is refused as stale and cannot commit
// the id's later, uncommitted transaction. The stale refusal is taken as done, with a warning
// naming the transactional id, the producer epoch and the id's state now (a broker without
// KIP-890 gives the same refusal for a transaction its timeout aborted).
func TestSinkStaleRecoveryCommitEndsNothing(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	brokers := cluster(t, 1, "out")
	ctx := context.Background()
	p, err := NewSink(SinkConfig{Brokers: brokers, Topic: "out", Name: t.Name(), Logger: quiet}).Build(ctx, "p0", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer p.(*producer).kill()
	if err := p.Write(ctx, numberRecords(0, 10)); err != nil {
		t.Fatal(err)
	}
	st1, err := p.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Commit(ctx, st1); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the first commit", func() bool { return stable(t, brokers, "out") })
	waitFor(t, "the slot to be free", func() bool {
		pr := p.(*producer)
		pr.mu.Lock()
		defer pr.mu.Unlock()
		return len(pr.pending) == 0
	})
	if err := p.Write(ctx, numberRecords(10, 10)); err != nil {
		t.Fatal(err)
	}
	st2, err := p.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	if st2.Txns[0].ID != st1.Txns[0].ID || st2.Txns[0].ProducerEpoch == st1.Txns[0].ProducerEpoch {
		t.Fatalf("first transaction %+v, second %+v: want the same id with another producer epoch", st1.Txns[0], st2.Txns[0])
	}
	cl := client(t, brokers)
	var logs syncBuffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	committed, err := commitPrepared(ctx, cl, st1.Txns[0], log)
	if err != nil || committed {
		t.Fatalf("the stale commit: committed %v, %v; want it taken as done, not committed by the call", committed, err)
	}
	tx := st1.Txns[0]
	for _, want := range []string{"level=WARN", "transactional_id=" + tx.ID, fmt.Sprintf("producer_epoch=%d ", tx.ProducerEpoch),
		fmt.Sprintf("producer_id=%d ", tx.ProducerID), "id_state=Ongoing", fmt.Sprintf("id_producer_epoch=%d", st2.Txns[0].ProducerEpoch)} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("the warning about the stale commit does not contain %q:\n%s", want, logs.String())
		}
	}
	if stable(t, brokers, "out") {
		t.Fatal("the stale EndTxn committed the id's later transaction")
	}
	if committed, err := commitPrepared(ctx, cl, st2.Txns[0], log); err != nil || !committed {
		t.Fatalf("the commit of the open transaction: committed %v, %v", committed, err)
	}
	waitFor(t, "the second commit", func() bool { return stable(t, brokers, "out") })
	exactlyOnce(t, readCommitted(t, brokers, "out", 30*time.Second), 20)
}

// syncBuffer is a bytes.Buffer for a test logger, safe for concurrent use.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
