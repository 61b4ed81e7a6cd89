package sqs

import (
	"strconv"

	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
)

// Message is a message received from an SQS queue, as the source hands it to the flow.
type Message struct {
	// Queue is the URL of the queue it came from.
	Queue string
	// ID is the message id SQS gave it; it stays the same when the message is delivered again.
	ID string
	// Body is the message body.
	Body string
	// Attributes are the message attributes the sender set (all of them are requested).
	Attributes map[string]types.MessageAttributeValue
	// SystemAttributes are the attributes SQS keeps (all of them are requested), such as
	// SentTimestamp, ApproximateReceiveCount, MessageGroupId and MessageDeduplicationId.
	SystemAttributes map[string]string
	// ReceiveCount is ApproximateReceiveCount: how many times the message was received, this
	// time included (1 on a first delivery; 0 if SQS did not say).
	ReceiveCount int
	// GroupID is the message group of a FIFO queue ("" on a standard queue).
	GroupID string
	// Raw is the message as ReceiveMessage returned it, receipt handle included. The source
	// deletes the message and extends its visibility itself: do not use the receipt handle.
	Raw types.Message
}

func newMessage(queue string, m types.Message) Message {
	out := Message{Queue: queue, Raw: m, Attributes: m.MessageAttributes}
	if m.MessageId != nil {
		out.ID = *m.MessageId
	}
	if m.Body != nil {
		out.Body = *m.Body
	}
	if len(m.Attributes) > 0 {
		out.SystemAttributes = make(map[string]string, len(m.Attributes))
		for k, v := range m.Attributes {
			out.SystemAttributes[k] = v
		}
		out.ReceiveCount, _ = strconv.Atoi(m.Attributes[string(types.MessageSystemAttributeNameApproximateReceiveCount)])
		out.GroupID = m.Attributes[string(types.MessageSystemAttributeNameMessageGroupId)]
	}
	return out
}

// Outgoing is a message for the sink to send.
type Outgoing struct {
	// Body is the message body (required: SQS refuses an empty body).
	Body string
	// Attributes are message attributes to set (at most 10).
	Attributes map[string]types.MessageAttributeValue
	// GroupID is the message group; required on a FIFO queue, not allowed on a standard one.
	GroupID string
	// DeduplicationID, on a FIFO queue, replaces the deterministic id the sink makes up.
	DeduplicationID string
	// DelaySeconds delays the message's delivery (standard queues only; 0..900).
	DelaySeconds int32
}
