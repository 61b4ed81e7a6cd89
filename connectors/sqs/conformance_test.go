package sqs_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/epochflow/epochflow/connectors/conformance"
	"github.com/epochflow/epochflow/connectors/sqs"
	"github.com/epochflow/epochflow/dataflow"
)

// emulated is the code of the emulator and of the shared client's idle connections: their
// goroutines outlive the kit's runs.
var emulated = []string{"github.com/Admiral-Piett/goaws", "github.com/epochflow/epochflow/internal/sqstest", "net/http.(*persistConn)", "net/http.(*conn).serve"}

// The source deletes a message only at the Commit of the epoch that read it; a crash leaves
// the epoch's messages in flight until their visibility runs out (at least once). The
// harness lets it run out at the start of every run, as the time a restart takes would.
func TestSourceConformance(t *testing.T) {
	conformance.TestSource(t, conformance.SourceKit[sqs.Message, uint64]{
		Setup: func(t *testing.T) conformance.SourceSystem[sqs.Message, uint64] {
			q := emu.MustQueue(t, "conformance", sqstest30())
			return conformance.SourceSystem[sqs.Message, uint64]{
				New: func() dataflow.PartitionedSource[sqs.Message, uint64] {
					if err := emu.ExpireAll(q); err != nil {
						t.Fatal(err)
					}
					return sqs.NewSource(emu.Client, q, func(m sqs.Message) (sqs.Message, error) { return m, nil },
						sqs.WaitTime(time.Second), sqs.IdleExit(2*time.Second), sqs.Logger(quiet))
				},
				Produce: func(ids []string) {
					if err := emu.SendBodies(context.Background(), q, "", ids...); err != nil {
						t.Fatal(err)
					}
				},
				Remaining: func() int {
					vis, fl, err := emu.Counts(q)
					if err != nil {
						t.Fatal(err)
					}
					return vis + fl
				},
			}
		},
		ID:             func(m sqs.Message) string { return m.Body },
		Guarantee:      conformance.AtLeastOnce,
		SystemPackages: emulated,
	})
}

// The sink sends at once (receivers see a message before its epoch commits) and Snapshot
// waits until SQS accepted all; on a standard queue a replayed epoch is sent again: at least
// once.
func TestSinkConformance(t *testing.T) {
	conformance.TestSink(t, conformance.SinkKit[sqs.Outgoing, sqs.SinkState]{
		Setup: func(t *testing.T) conformance.SinkSystem[sqs.Outgoing, sqs.SinkState] {
			q := emu.MustQueue(t, "conformance-out", sqstest30())
			var mu sync.Mutex
			var seen []string // drained so far: receiving takes messages out of sight
			return conformance.SinkSystem[sqs.Outgoing, sqs.SinkState]{
				New: func() dataflow.PartitionedSink[sqs.Outgoing, sqs.SinkState] {
					return sqs.NewSink(emu.Client, q, sqs.SinkLogger(quiet))
				},
				Item: func(id string) sqs.Outgoing { return sqs.Outgoing{Body: id} },
				Visible: func() []string {
					mu.Lock()
					defer mu.Unlock()
					seen = append(seen, receiveAll(t, q)...)
					return append([]string(nil), seen...)
				},
			}
		},
		Guarantee:      conformance.AtLeastOnce,
		VisibleEarly:   true,
		SystemPackages: emulated,
	})
}

// receiveAll receives and deletes the messages visible in q now.
func receiveAll(t *testing.T, q string) []string {
	t.Helper()
	ctx := context.Background()
	var out []string
	for {
		r, err := emu.Client.ReceiveMessage(ctx, &awssqs.ReceiveMessageInput{QueueUrl: &q, MaxNumberOfMessages: 10})
		if err != nil {
			t.Fatal(err)
		}
		if len(r.Messages) == 0 {
			return out
		}
		in := &awssqs.DeleteMessageBatchInput{QueueUrl: &q}
		for i, m := range r.Messages {
			out = append(out, aws.ToString(m.Body))
			in.Entries = append(in.Entries, types.DeleteMessageBatchRequestEntry{Id: aws.String(string(rune('a' + i))), ReceiptHandle: m.ReceiptHandle})
		}
		if _, err := emu.Client.DeleteMessageBatch(ctx, in); err != nil {
			t.Fatal(err)
		}
	}
}
