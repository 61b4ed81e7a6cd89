package sqs

import (
	"time"

	"github.com/epochflow/epochflow/dataflow"
	"github.com/epochflow/epochflow/operators"
)

// Deduplicate adds operators.Deduplicate keyed by message ID: steps that drop a message whose ID was
// already seen within window: the redeliveries SQS makes when a delete is lost (a crash between
// an epoch's commit and its DeleteMessageBatch, a stale receipt handle, a lost ReceiveMessage
// answer). With a recovery store the IDs seen are part of the flow's committed state, so a flow
// that writes to an exactly-once sink (file.WriteLines, a two-phase sink) after Deduplicate
// writes every message once, as long as its redelivery comes within window of its first
// delivery. SQS keeps an undeleted message up to its retention period (4 days by default), so
// pick window longer than the longest a delete may stay lost: the visibility timeout plus the
// time to restart the flow is the usual bound.
//
// State: one key per message ID, dropped window after the first delivery (a timer). Items are
// exchanged by ID, so the messages of one FIFO group may be spread over workers: use one worker
// when the order of a group matters downstream. Epochs: a message's output carries its epoch.
// EOF: nothing more is emitted.
func Deduplicate(name string, in dataflow.Stream[Message], window time.Duration) dataflow.Stream[Message] {
	return operators.Deduplicate(name, in, func(m Message) string { return m.ID }, window)
}
