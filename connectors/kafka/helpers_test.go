package kafka

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/epochflow/epochflow/dataflow"
	"github.com/epochflow/epochflow/recovery"
)

var quiet = slog.New(slog.DiscardHandler)

// cluster starts an in-process Kafka cluster (kfake) with these topics of parts partitions
// each, closed at the end of the test.
func cluster(t *testing.T, parts int32, topics ...string) []string {
	t.Helper()
	return clusterB(t, parts, topics...)
}

func clusterB(t testing.TB, parts int32, topics ...string) []string {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(parts, topics...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c.ListenAddrs()
}

func client(t *testing.T, brokers []string, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(brokers...)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}

// produceNumbers produces "0" .. "n-1" (value and key) to topic, from index from on.
func produceNumbers(t *testing.T, brokers []string, topic string, from, n int) {
	t.Helper()
	produceFrom(t, brokers, topic, from, n)
}

func produceB(t testing.TB, brokers []string, topic string, n int) {
	produceFrom(t, brokers, topic, 0, n)
}

func produceFrom(t testing.TB, brokers []string, topic string, from, n int) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic(topic), kgo.MaxBufferedRecords(1<<20))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	recs := make([]*kgo.Record, 0, n)
	for i := from; i < from+n; i++ {
		s := []byte(strconv.Itoa(i))
		recs = append(recs, &kgo.Record{Key: s, Value: s})
	}
	if err := cl.ProduceSync(context.Background(), recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
}

// readCommitted reads topic with isolation read_committed up to its high watermarks (which it
// must reach within the timeout: an open transaction holds the last stable offset back) and
// returns the values.
func readCommitted(t *testing.T, brokers []string, topic string, timeout time.Duration) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	adm := kadm.NewClient(client(t, brokers))
	ends, err := adm.ListEndOffsets(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	want := map[int32]int64{}
	ends.Each(func(o kadm.ListedOffset) {
		if o.Offset > 0 {
			want[o.Partition] = o.Offset
		}
	})
	cl := client(t, brokers, kgo.ConsumeTopics(topic), kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	var out []string
	stable := map[int32]bool{}
	for len(stable) < len(want) {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("read_committed reading of %s did not reach the high watermarks %v within %v (an open transaction holds the last stable offset back?); read %d values", topic, want, timeout, len(out))
		}
		fs.EachError(func(_ string, _ int32, err error) { t.Fatal(err) })
		fs.EachRecord(func(r *kgo.Record) { out = append(out, string(r.Value)) })
		fs.EachPartition(func(p kgo.FetchTopicPartition) {
			if w, ok := want[p.Partition]; ok && p.LastStableOffset >= w {
				stable[p.Partition] = true
			}
		})
	}
	// Every partition's last stable offset has reached its high watermark: what is left to
	// read is below it, and the client has it or fetches it at once.
	for {
		pctx, pcancel := context.WithTimeout(ctx, 2*time.Second)
		fs := cl.PollFetches(pctx)
		pcancel()
		if fs.NumRecords() == 0 {
			break
		}
		fs.EachRecord(func(r *kgo.Record) { out = append(out, string(r.Value)) })
	}
	return out
}

// openTxns lists the transactions that are neither empty nor complete.
func openTxns(t *testing.T, brokers []string) []string {
	t.Helper()
	adm := kadm.NewClient(client(t, brokers))
	ls, err := adm.ListTransactions(context.Background(), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	var open []string
	for _, tx := range ls.Sorted() {
		switch tx.State {
		case "Empty", "CompleteCommit", "CompleteAbort", "Dead":
		default:
			open = append(open, fmt.Sprintf("%s (%s)", tx.TxnID, tx.State))
		}
	}
	return open
}

// exactlyOnce fails unless values are "0" .. "n-1", each once.
func exactlyOnce(t *testing.T, values []string, n int) {
	t.Helper()
	seen := make([]int, n)
	for _, v := range values {
		i, err := strconv.Atoi(v)
		if err != nil || i < 0 || i >= n {
			t.Fatalf("unexpected value %q", v)
		}
		seen[i]++
	}
	for i, c := range seen {
		if c != 1 {
			t.Fatalf("%d was read %d times (%d values in all, want %d)", i, c, len(values), n)
		}
	}
}

func store(t *testing.T) recovery.Store {
	t.Helper()
	s, err := recovery.OpenSQLite(context.Background(), filepath.Join(t.TempDir(), "store"), recovery.SQLiteOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// killable wraps the source and sink so that a test can drop what a crashed run left open
// (the engine closes nothing on a crash), as the death of the process would.
type killableSource struct {
	*Source
	mu    sync.Mutex
	parts []*consumer
}

func (k *killableSource) Build(ctx context.Context, part string, resume *int64) (dataflow.StatefulSource[Record, int64], error) {
	p, err := k.Source.Build(ctx, part, resume)
	if err == nil {
		k.mu.Lock()
		k.parts = append(k.parts, p.(*consumer))
		k.mu.Unlock()
	}
	return p, err
}

func (k *killableSource) kill() {
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, p := range k.parts {
		p.kill()
	}
	k.parts = nil
}

type killableSink struct {
	*Sink
	mu    sync.Mutex
	parts []*producer
}

func (k *killableSink) Build(ctx context.Context, part string, resume *SinkState) (dataflow.StatefulSink[Record, SinkState], error) {
	p, err := k.Sink.Build(ctx, part, resume)
	if err == nil {
		k.mu.Lock()
		k.parts = append(k.parts, p.(*producer))
		k.mu.Unlock()
	}
	return p, err
}

func (k *killableSink) kill() {
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, p := range k.parts {
		p.kill()
	}
	k.parts = nil
}

func itoa(i int) string { return strconv.Itoa(i) }
