package kafka

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/epochflow/epochflow/dataflow"
)

// benchRecords is how many records each side of BenchmarkCopy copies: a million, so that the
// rates are those of the copying. With 200,000 a copy took about 0.3 s, and the fixed part of
// each side (clients and producer ids set up, the 100 ms without a record that ends it, the
// last commit) made a third of it: flow/plain was 0.70 at 200,000 and 1.08 at 1,000,000 in
// runs a minute apart.
const benchRecords = 1_000_000

// BenchmarkCopy copies benchRecords (1,000,000) records from one topic of an in-process cluster (kfake) to
// another with transactions, both ways ending after 100 ms without a record: a flow (source,
// transactional sink, 100 ms epochs, one transaction per epoch) and a plain franz-go loop that
// consumes and produces in a transaction it commits every 100 ms. It reports each one's rate
// and flow/plain, the ratio of the rates.
func BenchmarkCopy(b *testing.B) {
	var flowTime, plainTime time.Duration
	for i := 0; i < b.N; i++ {
		brokers := clusterB(b, 4, "in", "flow-out", "plain-out")
		produceB(b, brokers, "in", benchRecords)
		b.ResetTimer()
		start := time.Now()
		f := dataflow.New("bench")
		in := dataflow.Input(f, "in", Consume(SourceConfig{Brokers: brokers, Topics: []string{"in"}, IdleEOF: 100 * time.Millisecond}))
		dataflow.Output("out", in, Produce(SinkConfig{Brokers: brokers, Topic: "flow-out", Name: "bench"}))
		if err := dataflow.Run(context.Background(), f, dataflow.Options{EpochInterval: 100 * time.Millisecond, Logger: quiet}); err != nil {
			b.Fatal(err)
		}
		flowTime += time.Since(start)
		start = time.Now()
		if err := plainCopy(brokers, "in", "plain-out", benchRecords); err != nil {
			b.Fatal(err)
		}
		plainTime += time.Since(start)
		b.StopTimer()
	}
	flowRate := float64(b.N*benchRecords) / flowTime.Seconds()
	plainRate := float64(b.N*benchRecords) / plainTime.Seconds()
	b.ReportMetric(flowRate, "flow-records/s")
	b.ReportMetric(plainRate, "plain-records/s")
	b.ReportMetric(flowRate/plainRate, "flow/plain")
}

// plainCopy is the baseline: one consumer, one transactional producer, a commit every 100 ms,
// done after 100 ms without a record once n were copied.
func plainCopy(brokers []string, from, to string, n int) error {
	cons, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(from),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		return err
	}
	defer cons.Close()
	prod, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic(to),
		kgo.TransactionalID("plain-copy"), kgo.TransactionTimeout(time.Minute))
	if err != nil {
		return err
	}
	defer prod.Close()
	ctx := context.Background()
	copied, inTxn := 0, false
	last, lastCommit := time.Now(), time.Now()
	commit := func() error {
		if !inTxn {
			return nil
		}
		inTxn = false
		if err := prod.Flush(ctx); err != nil {
			return err
		}
		return prod.EndTransaction(ctx, kgo.TryCommit)
	}
	for {
		pctx, cancel := context.WithTimeout(ctx, 10*time.Millisecond)
		fs := cons.PollRecords(pctx, 4096)
		cancel()
		recs := fs.Records()
		if len(recs) > 0 {
			if !inTxn {
				if err := prod.BeginTransaction(); err != nil {
					return err
				}
				inTxn = true
			}
			for _, r := range recs {
				prod.Produce(ctx, &kgo.Record{Key: r.Key, Value: r.Value, Headers: r.Headers, Timestamp: r.Timestamp}, nil)
			}
			copied += len(recs)
			last = time.Now()
		}
		if time.Since(lastCommit) >= 100*time.Millisecond {
			if err := commit(); err != nil {
				return err
			}
			lastCommit = time.Now()
		}
		if copied >= n && time.Since(last) >= 100*time.Millisecond {
			return commit()
		}
	}
}
