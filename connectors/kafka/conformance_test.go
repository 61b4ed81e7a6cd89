package kafka

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/epochflow/epochflow/connectors/conformance"
	"github.com/epochflow/epochflow/dataflow"
)

// The source keeps its offsets in the snapshot: exactly once, nothing to acknowledge (the
// consumer group's offsets are for lag tools only).
func TestSourceConformance(t *testing.T) {
	conformance.TestSource(t, conformance.SourceKit[Record, int64]{
		Setup: func(t *testing.T) conformance.SourceSystem[Record, int64] {
			brokers := cluster(t, 2, "in")
			return conformance.SourceSystem[Record, int64]{
				New: func() dataflow.PartitionedSource[Record, int64] {
					return NewSource(SourceConfig{Brokers: brokers, Topics: []string{"in"}, IdleEOF: 300 * time.Millisecond, Logger: quiet})
				},
				Produce: func(ids []string) { produceValues(t, brokers, "in", ids) },
			}
		},
		ID:             func(r Record) string { return string(r.Value) },
		Guarantee:      conformance.ExactlyOnce,
		SystemPackages: []string{"github.com/twmb/franz-go/pkg/kfake"},
	})
}

// The sink's transactions are visible to read_committed readers only after Commit, and each
// epoch's once.
func TestSinkConformance(t *testing.T) {
	conformance.TestSink(t, conformance.SinkKit[Record, SinkState]{
		Setup: func(t *testing.T) conformance.SinkSystem[Record, SinkState] {
			brokers := cluster(t, 2, "out")
			name := strings.NewReplacer("/", "-", "#", "-").Replace(t.Name())
			return conformance.SinkSystem[Record, SinkState]{
				New: func() dataflow.PartitionedSink[Record, SinkState] {
					return NewSink(SinkConfig{Brokers: brokers, Topic: "out", Name: name, Logger: quiet})
				},
				Item:    func(id string) Record { return Record{Key: []byte(id), Value: []byte(id)} },
				Visible: func() []string { return visibleNow(t, brokers, "out") },
			}
		},
		Guarantee:      conformance.ExactlyOnce,
		SystemPackages: []string{"github.com/twmb/franz-go/pkg/kfake"},
	})
}

func produceValues(t *testing.T, brokers []string, topic string, values []string) {
	t.Helper()
	if len(values) == 0 {
		return
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic(topic))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	recs := make([]*kgo.Record, len(values))
	for i, v := range values {
		recs[i] = &kgo.Record{Key: []byte(v), Value: []byte(v)}
	}
	if err := cl.ProduceSync(context.Background(), recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
}

// visibleNow returns the values a read_committed reader of topic sees now: it reads from
// the start until no record has come for half a second (an open transaction may hold the
// last stable offset back: what is behind it is not visible, and not waited for).
func visibleNow(t *testing.T, brokers []string, topic string) []string {
	t.Helper()
	acl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	lsos, err := kadm.NewClient(acl).ListCommittedOffsets(context.Background(), topic)
	acl.Close()
	if err != nil {
		t.Fatal(err)
	}
	any := false
	lsos.Each(func(o kadm.ListedOffset) { any = any || o.Offset > 0 })
	if !any {
		return nil
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(topic),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	var out []string
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		fs := cl.PollFetches(ctx)
		cancel()
		if fs.NumRecords() == 0 {
			return out
		}
		fs.EachRecord(func(r *kgo.Record) { out = append(out, string(r.Value)) })
	}
}
