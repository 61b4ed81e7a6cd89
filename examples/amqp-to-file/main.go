// Command amqp-to-file copies the messages of a RabbitMQ queue to a file, one line per message
// body, exactly once, acknowledging each message only after the epoch that wrote it committed:
//
//	go run ./examples/amqp-to-file -url URL -queue Q -output FILE -recovery DIR [-epoch-interval D] [-idle-exit D] \
//	    [-prefetch N] [-dead-letter] [-reconnect-min D] [-reconnect-max D]
//
// URL is amqp://USER:PASSWORD@HOST:PORT/VHOST (default amqp://guest:guest@127.0.0.1:5672/, or
// the AMQP_URL environment variable). The queue must exist. With -idle-exit the program
// exits 0 once the queue has been empty for that long; without it, it runs until SIGINT or
// SIGTERM (which finish and commit the current epoch first).
//
// A message whose body holds a line break cannot be one line: it stops the program with an
// error naming it, and stays in the queue (so a restart stops on it again). With -dead-letter,
// for a queue that has a dead-letter exchange (an x-dead-letter-exchange argument or policy),
// such a message is rejected to that exchange when its epoch commits, and the copy goes on.
// Without a dead-letter exchange the broker would drop a rejected message: set -dead-letter
// only for a queue that has one.
//
// When the connection to the broker is lost (a broker restart, a network cut) the program does
// not exit: it reconnects, waiting -reconnect-min after the first failed attempt and doubling
// the wait up to -reconnect-max, which is also the longest it lags behind a broker that came
// back; the broker requeues the unacknowledged messages, which come again and are dropped as
// redeliveries if they were written.
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
	var exists file.IfExists
	flag.Var(&exists, "output-exists", "what a run without recovery state for the -output file does when that file holds data: refuse (the default), replace it, or append to it")
	idle := flag.Duration("idle-exit", 0, "exit 0 once the queue has been empty this long (0: run until stopped)")
	prefetch := flag.Int("prefetch", 0, fmt.Sprintf("unacknowledged messages per consumer (0: %d)", amqp.DefaultPrefetch))
	deadLetter := flag.Bool("dead-letter", false, "the queue has a dead-letter exchange (x-dead-letter-exchange argument or policy): a message that cannot be written (a body with a line break) is rejected to it when its epoch commits, instead of stopping the flow; without a dead-letter exchange the broker would drop it")
	reconnectMin := flag.Duration("reconnect-min", amqp.DefaultReconnectMin, "first wait before reconnecting to the broker after a lost connection; the wait doubles after each failed attempt")
	reconnectMax := flag.Duration("reconnect-max", amqp.DefaultReconnectMax, "longest wait between reconnection attempts (and so the longest delay between the broker's return and the reconnection)")
	dataflow.Usage("amqp-to-file copies the messages of a RabbitMQ queue to a file, one line per message body, exactly once.",
		"amqp-to-file -queue orders -output orders.txt -recovery state -idle-exit 10s")
	dataflow.MainFunc(func() (*dataflow.Flow, error) {
		graph := dataflow.GraphOnly() // -graph: no flag is required
		switch {
		case *queue == "" && !graph:
			return nil, errors.New("flag -queue is required")
		case *output == "" && !graph:
			return nil, errors.New("flag -output is required")
		case *idle < 0:
			return nil, fmt.Errorf("invalid value %v for flag -idle-exit: want 0 or a positive duration", *idle)
		case *reconnectMin <= 0:
			return nil, fmt.Errorf("invalid value %v for flag -reconnect-min: want a positive duration", *reconnectMin)
		case *reconnectMax < *reconnectMin:
			return nil, fmt.Errorf("invalid value %v for flag -reconnect-max: want at least -reconnect-min (%v)", *reconnectMax, *reconnectMin)
		}
		cfg := amqp.SourceConfig{URL: *url, Queue: *queue, IdleExit: *idle, Prefetch: *prefetch, DeadLetter: *deadLetter,
			ReconnectMin: *reconnectMin, ReconnectMax: *reconnectMax, FieldNames: flagNames}
		return build(cfg, *output, exists), nil
	})
}

// flagNames names this command's flags in the source's errors and logs instead of the fields of
// amqp.SourceConfig; "" marks a field it offers no flag for.
var flagNames = map[string]string{
	"URL": "flag -url", "Queue": "flag -queue", "Prefetch": "flag -prefetch", "IdleExit": "flag -idle-exit",
	"DeadLetter": "flag -dead-letter", "ReconnectMin": "flag -reconnect-min", "ReconnectMax": "flag -reconnect-max",
	"Consumers": "flag -workers", "Declare": "",
}

// line is a message body to write, with the message id it is deduplicated by. Its fields are
// exported: on a cluster (-addresses) lines cross processes, encoded with the default codec.
type line struct {
	ID   string
	Body string
}

// decode takes the body of a message as a line; a body with a line break would not be one line.
func decode(m amqp.Message) (line, error) {
	if strings.ContainsAny(string(m.Body), "\n") {
		return line{}, errors.New("the body contains a line break")
	}
	return line{ID: m.MessageId, Body: string(m.Body)}, nil
}

// build returns the flow: read, drop ids already written, write.
func build(cfg amqp.SourceConfig, output string, exists file.IfExists) *dataflow.Flow {
	flow := dataflow.New("amqp-to-file")
	msgs := operators.Input(flow, "read", amqp.ConsumeDecoded(cfg, decode))
	// A message whose id was written already is a redelivery of one written in a committed
	// epoch (or in this epoch); messages without an id always pass.
	fresh := operators.Deduplicate("dedup", msgs, func(l line) string { return l.ID }, 0)
	operators.Output("write", fresh, file.LinesOut(output, func(l line) string { return l.Body },
		file.OnExisting(exists), file.ExistsFlag("-output-exists")))
	return flow
}
