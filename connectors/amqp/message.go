package amqp

import (
	"fmt"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"
)

// Message is one message read from a queue: the delivery's body, routing information and
// properties. Delivery tags are not part of it: acknowledgement is the source's business (on
// Commit), and a tag means nothing outside the channel that delivered it.
type Message struct {
	// Queue is the queue the message was read from, Consumer the source partition that read
	// it ("consumer-0", ...).
	Queue    string
	Consumer string

	Body    []byte
	Headers amqp091.Table

	// Exchange and RoutingKey are those the message was published with.
	Exchange   string
	RoutingKey string
	// Redelivered is the broker's redelivered flag: the message was delivered before and not
	// acknowledged, for example to a run that crashed before the message's epoch committed,
	// or on a connection that was lost. Under at-least-once delivery such a message may
	// already have had effects.
	Redelivered bool

	// Properties, as published.
	MessageId       string
	Timestamp       time.Time
	ContentType     string
	ContentEncoding string
	DeliveryMode    uint8 // 1 transient, 2 persistent
	Priority        uint8
	CorrelationId   string
	ReplyTo         string
	Expiration      string
	Type            string
	UserId          string
	AppId           string
	ConsumerTag     string
}

// String names the message for error messages: its queue, id (or routing key) and size.
func (m Message) String() string {
	id := m.MessageId
	if id == "" {
		id = "(no message id)"
	}
	return fmt.Sprintf("message %s of queue %q (routing key %q, %d bytes)", id, m.Queue, m.RoutingKey, len(m.Body))
}

func newMessage(queue, consumer string, d *amqp091.Delivery) Message {
	return Message{
		Queue:           queue,
		Consumer:        consumer,
		Body:            d.Body,
		Headers:         d.Headers,
		Exchange:        d.Exchange,
		RoutingKey:      d.RoutingKey,
		Redelivered:     d.Redelivered,
		MessageId:       d.MessageId,
		Timestamp:       d.Timestamp,
		ContentType:     d.ContentType,
		ContentEncoding: d.ContentEncoding,
		DeliveryMode:    d.DeliveryMode,
		Priority:        d.Priority,
		CorrelationId:   d.CorrelationId,
		ReplyTo:         d.ReplyTo,
		Expiration:      d.Expiration,
		Type:            d.Type,
		UserId:          d.UserId,
		AppId:           d.AppId,
		ConsumerTag:     d.ConsumerTag,
	}
}
