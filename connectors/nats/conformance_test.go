package nats

import (
	"context"
	"errors"
	"testing"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/epochflow/epochflow/connectors/conformance"
	"github.com/epochflow/epochflow/dataflow"
)

// natsServer is where the embedded server's goroutines run: they outlive the kit's runs.
var natsServer = []string{"github.com/nats-io/nats-server/v2"}

// withJS runs fn with a connection of its own, closed when fn returns (the kit counts the
// goroutines a check leaves, and the harness's connections must not be among them).
func withJS(t *testing.T, fn func(js jetstream.JetStream)) {
	t.Helper()
	nc, err := natsgo.Connect(srvURL)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	fn(js)
}

func publishIDs(t *testing.T, stream string, ids []string) {
	t.Helper()
	withJS(t, func(js jetstream.JetStream) {
		for _, id := range ids {
			if _, err := js.Publish(withTimeout(t, 10*time.Second), stream+".x", []byte(id)); err != nil {
				t.Fatal(err)
			}
		}
	})
}

// Queue mode: one confirmed ack-all per commit; a crash leaves the epoch's messages pending
// (redelivered after AckWait), so at least once.
func TestQueueSourceConformance(t *testing.T) {
	conformance.TestSource(t, conformance.SourceKit[Message, QueueState]{
		Setup: func(t *testing.T) conformance.SourceSystem[Message, QueueState] {
			st := newStream(t, jetstream.InterestPolicy)
			newConsumer(t, st, "c", time.Second)
			return conformance.SourceSystem[Message, QueueState]{
				New: func() dataflow.PartitionedSource[Message, QueueState] {
					return NewSource[Message](SourceConfig{URL: srvURL, Stream: st, Consumers: []string{"c"}, IdleExit: 300 * time.Millisecond}, nil)
				},
				Produce: func(ids []string) { publishIDs(t, st, ids) },
				Remaining: func() int {
					var n int
					withJS(t, func(js jetstream.JetStream) {
						c, err := js.Consumer(withTimeout(t, 10*time.Second), st, "c")
						if err != nil {
							t.Fatal(err)
						}
						i := c.CachedInfo()
						n = int(i.NumPending) + i.NumAckPending
					})
					return n
				},
			}
		},
		ID:             func(m Message) string { return string(m.Data) },
		Guarantee:      conformance.AtLeastOnce,
		SystemPackages: natsServer,
	})
}

// Log mode: the stream sequence is in the snapshot: exactly once, nothing to acknowledge.
func TestLogSourceConformance(t *testing.T) {
	conformance.TestSource(t, conformance.SourceKit[Message, uint64]{
		Setup: func(t *testing.T) conformance.SourceSystem[Message, uint64] {
			st := newStream(t, jetstream.LimitsPolicy)
			return conformance.SourceSystem[Message, uint64]{
				New: func() dataflow.PartitionedSource[Message, uint64] {
					return NewLogSource(LogConfig{URL: srvURL, Stream: st, IdleExit: 300 * time.Millisecond})
				},
				Produce: func(ids []string) { publishIDs(t, st, ids) },
			}
		},
		ID:             func(m Message) string { return string(m.Data) },
		Guarantee:      conformance.ExactlyOnce,
		SystemPackages: natsServer,
	})
}

// The sink publishes at once (readers see a message before its epoch commits) with a
// deterministic Nats-Msg-Id, so the stream drops a replayed epoch's copies: exactly once.
func TestSinkConformance(t *testing.T) {
	conformance.TestSink(t, conformance.SinkKit[OutMessage, SinkState]{
		Setup: func(t *testing.T) conformance.SinkSystem[OutMessage, SinkState] {
			st := newStream(t, jetstream.LimitsPolicy)
			return conformance.SinkSystem[OutMessage, SinkState]{
				New: func() dataflow.PartitionedSink[OutMessage, SinkState] {
					return NewSink(SinkConfig{URL: srvURL, Flow: "conformance"})
				},
				Item:    func(id string) OutMessage { return OutMessage{Subject: st + ".x", Data: []byte(id)} },
				Visible: func() []string { return streamData(t, st) },
			}
		},
		Guarantee:      conformance.ExactlyOnce,
		VisibleEarly:   true,
		SystemPackages: natsServer,
	})
}

// streamData returns the payload of every message in the stream.
func streamData(t *testing.T, stream string) []string {
	t.Helper()
	var out []string
	withJS(t, func(js jetstream.JetStream) {
		s, err := js.Stream(withTimeout(t, 10*time.Second), stream)
		if err != nil {
			t.Fatal(err)
		}
		last := s.CachedInfo().State.LastSeq
		for seq := uint64(1); seq <= last; seq++ {
			m, err := s.GetMsg(context.Background(), seq)
			if errors.Is(err, jetstream.ErrMsgNotFound) {
				continue
			}
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, string(m.Data))
		}
	})
	return out
}
