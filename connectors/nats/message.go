package nats

import (
	"fmt"
	"time"

	natsgo "github.com/nats-io/nats.go"
)

// Message is one JetStream message as a source emits it. Its fields are copies: the message
// may be kept after the epoch that read it.
type Message struct {
	// Stream and Consumer name where it was read from (Consumer is empty in log mode).
	Stream, Consumer string
	// Subject is the subject it was published on.
	Subject string
	// Data is the payload.
	Data []byte
	// Header holds the message's headers (nil when it has none).
	Header natsgo.Header
	// Sequence is the message's stream sequence: unique and stable within the stream, so a
	// flow that must not see a message twice deduplicates on it.
	Sequence uint64
	// NumDelivered is how many times the server has delivered it, this time included: more
	// than 1 for a redelivery.
	NumDelivered uint64
	// Timestamp is when the stream stored it.
	Timestamp time.Time
}

// MsgID returns the message's Nats-Msg-Id header, or "" when it has none.
func (m Message) MsgID() string {
	if m.Header == nil {
		return ""
	}
	return m.Header.Get(natsgo.MsgIdHdr)
}

// String names the message for errors and logs, without its payload.
func (m Message) String() string {
	return fmt.Sprintf("message %d of stream %q (subject %q)", m.Sequence, m.Stream, m.Subject)
}
