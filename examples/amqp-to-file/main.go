// Command amqp-to-file copies the messages of a RabbitMQ queue to a file, one line per message
// body, exactly once, acknowledging each message only after the epoch that wrote it committed:
//
//	go run ./examples/amqp-to-file -url URL -queue Q -output FILE -recovery DIR [-epoch-interval D] [-idle-exit D]
//
// URL is amqp://USER:PASSWORD@HOST:PORT/VHOST (default amqp://guest:guest@127.0.0.1:5672/, or
// the AMQP_URL environment variable). The queue must exist. With -idle-exit the program
// exits 0 once the queue has been empty for that long; without it, it runs until SIGINT or
// SIGTERM (which finish and commit the current epoch first).
//
// Exactly once: the file sink cuts the file back to its last committed length when a run
// resumes, and messages are acknowledged only after their epoch committed, so nothing is lost.
// A crash between an epoch's commit and the broker's receipt of its acks makes the broker
// deliver that epoch's messages again, so the flow remembers the message ids it wrote (in the
// recovery store) and drops a redelivered message whose id it already wrote. Messages without
// a message id cannot be told apart and are written every time they are delivered. The ids
// remembered grow with the number of messages copied, which suits drains and backfills.
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/epochflow/epochflow/connectors/amqp"
	"github.com/epochflow/epochflow/connectors/file"
	"github.com/epochflow/epochflow/dataflow"
	"github.com/epochflow/epochflow/operators"
)

func main() {
	defURL := amqp.DefaultURL
	if u := os.Getenv("AMQP_URL"); u != "" {
		defURL = u
	}
	url := flag.String("url", defURL, "the broker's AMQP URL, amqp://USER:PASSWORD@HOST:PORT/VHOST (env AMQP_URL)")
	queue := flag.String("queue", "", "the queue to copy (required; it must exist)")
	output := flag.String("output", "", "the file to write, one line per message body (required)")
	idle := flag.Duration("idle-exit", 0, "exit 0 once the queue has been empty this long (0: run until stopped)")
	prefetch := flag.Int("prefetch", 0, fmt.Sprintf("unacknowledged messages per consumer (0: %d)", amqp.DefaultPrefetch))
	dataflow.MainFunc(func() (*dataflow.Flow, error) {
		switch {
		case *queue == "":
			return nil, errors.New("flag -queue is required")
		case *output == "":
			return nil, errors.New("flag -output is required")
		case *idle < 0:
			return nil, fmt.Errorf("invalid value %v for flag -idle-exit: want 0 or a positive duration", *idle)
		}
		return build(amqp.SourceConfig{URL: *url, Queue: *queue, IdleExit: *idle, Prefetch: *prefetch}, *output), nil
	})
}

// line is a message body to write, with the message id it is deduplicated by.
type line struct {
	id   string
	body string
}

// decode takes the body of a message as a line; a body with a line break would not be one line.
func decode(m amqp.Message) (line, error) {
	if strings.ContainsAny(string(m.Body), "\n") {
		return line{}, errors.New("the body contains a line break")
	}
	return line{id: m.MessageId, body: string(m.Body)}, nil
}

// build returns the flow: read, drop ids already written, write.
func build(cfg amqp.SourceConfig, output string) *dataflow.Flow {
	flow := dataflow.New("amqp-to-file")
	msgs := operators.Input(flow, "read", amqp.ConsumeDecoded(cfg, decode))
	// A message whose id was written already is a redelivery of one written in a committed
	// epoch (or in this epoch); messages without an id always pass.
	fresh := operators.Deduplicate("dedup", msgs, func(l line) string { return l.id }, 0)
	operators.Output("write", fresh, file.LinesOut(output, func(l line) string { return l.body }))
	return flow
}
