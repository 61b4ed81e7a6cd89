// Command nats-to-file copies the messages of a JetStream consumer to a file, one line per
// message payload, exactly once, acknowledging the messages only after the epoch that wrote
// them committed (one ack-all per commit):
//
//	go run ./examples/nats-to-file -url URL -stream S -consumer C -output FILE -recovery DIR [-epoch-interval D] [-idle-exit D] [-create] [-dead-letter SUBJECT]
//
// URL is the server's URL (default nats://127.0.0.1:4222, or the NATS_URL environment
// variable). The stream must have interest (or limits) retention and the consumer must be a
// durable pull consumer with AckPolicy all (-create creates a missing one). With -idle-exit
// the program exits 0 once the consumer has had nothing for that long; without it, it runs
// until SIGINT or SIGTERM (which finish and commit the current epoch first).
//
// Exactly once: the file sink cuts the file back to its last committed length when a run
// resumes, and messages are acknowledged only after their epoch committed, so nothing is lost.
// A crash between an epoch's commit and the server's receipt of its ack-all makes the server
// deliver that epoch's messages again, so the flow remembers the stream sequences it wrote (in
// the recovery store) and drops a redelivered message whose sequence it already wrote. The
// sequences remembered grow with the number of messages copied, which suits drains and
// backfills.
//
// A payload with a line break cannot be one line of the file. With -dead-letter SUBJECT the
// message is published to SUBJECT, which must belong to a JetStream stream other than the one
// read, with its payload and headers plus Epochflow-Stream, Epochflow-Subject and
// Epochflow-Sequence (where it was read) and Epochflow-Error (why), and it is acknowledged
// with its epoch once that publish is confirmed; the copy goes on. Its Nats-Msg-Id is made of
// the stream, the consumer and the sequence, so that the dead-letter stream drops the copy
// that a crash's replay publishes again within its duplicate window (2 minutes by default).
// Without -dead-letter the message stops the program with an error naming it, its stream and
// the consumer, and every run stops on it again. Deleting the message from the stream is no
// way out: the server treats the deletion of a delivered, unacknowledged message as its
// acknowledgement, and with AckPolicy all that acknowledges every message before it too, so
// the messages of the epoch that the stop did not commit would be lost. Pass -dead-letter
// instead.
//
// JetStream has no dead-letter of its own, and the source of connectors/nats has none: the
// dead-lettering is this program's flow, which routes the messages it cannot write to a sink
// of its own (deadLetterSink).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/epochflow/epochflow/connectors/file"
	"github.com/epochflow/epochflow/connectors/nats"
	"github.com/epochflow/epochflow/dataflow"
	"github.com/epochflow/epochflow/operators"
)

func main() {
	defURL := natsgo.DefaultURL
	if u := os.Getenv("NATS_URL"); u != "" {
		defURL = u
	}
	url := flag.String("url", defURL, "the server's URL, nats://HOST:PORT (env NATS_URL)")
	stream := flag.String("stream", "", "the stream to read (required; interest or limits retention)")
	consumer := flag.String("consumer", "", "the durable pull consumer to read, with AckPolicy all (required)")
	output := flag.String("output", "", "the file to write, one line per message payload (required)")
	idle := flag.Duration("idle-exit", 0, "exit 0 once the consumer has had nothing for this long (0: run until stopped)")
	create := flag.Bool("create", false, "create the consumer if it does not exist")
	deadLetter := flag.String("dead-letter", "", "a subject of another JetStream stream to publish the messages that cannot be written to "+
		"(a payload with a line break); without it such a message stops the program")
	dataflow.Usage("nats-to-file copies the messages of a JetStream consumer to a file, one line per message payload, exactly once.",
		"nats-to-file -stream ORDERS -consumer copy -create -output orders.txt -recovery state")
	dataflow.MainFunc(func() (*dataflow.Flow, error) {
		graph := dataflow.GraphOnly() // -graph: no flag is required
		switch {
		case *stream == "" && !graph:
			return nil, errors.New("flag -stream is required")
		case *consumer == "" && !graph:
			return nil, errors.New("flag -consumer is required")
		case *output == "" && !graph:
			return nil, errors.New("flag -output is required")
		case *idle < 0:
			return nil, fmt.Errorf("invalid value %v for flag -idle-exit: want 0 or a positive duration", *idle)
		case strings.ContainsAny(*deadLetter, " \t\r\n*>"):
			return nil, fmt.Errorf("invalid value %q for flag -dead-letter: want a subject, without spaces or wildcards", *deadLetter)
		}
		return build(nats.SourceConfig{URL: *url, Stream: *stream, Consumers: []string{*consumer}, Create: *create, IdleExit: *idle}, *output, *deadLetter), nil
	})
}

// line is a message payload to write, with the stream sequence it is deduplicated by, or (with
// -dead-letter) a message that cannot be a line, to dead-letter.
type line struct {
	seq  uint64
	body string
	dead *nats.Message // the message to dead-letter; nil for a line to write
}

// errLineBreak is why a message cannot be written.
var errLineBreak = errors.New("the payload contains a line break, so it cannot be one line of -output")

// decoder returns the function that takes the payload of a message as a line. A payload with a
// line break would not be one line: with dead-lettering it becomes a line to dead-letter,
// without it an error that says what to do (the source adds the message's sequence, its stream
// and the consumer).
func decoder(deadLetter bool) func(nats.Message) (line, error) {
	return func(m nats.Message) (line, error) {
		switch {
		case !strings.ContainsAny(string(m.Data), "\n"):
			return line{seq: m.Sequence, body: string(m.Data)}, nil
		case deadLetter:
			return line{seq: m.Sequence, dead: &m}, nil
		}
		return line{}, fmt.Errorf("%w; pass -dead-letter SUBJECT (a subject of another stream) to publish such messages there "+
			"and go on. Deleting the message from stream %q instead would lose the unacknowledged messages before it: "+
			"the server acknowledges them with a deleted one (AckPolicy all)", errLineBreak, m.Stream)
	}
}

// build returns the flow: read, drop sequences already written, write, and publish the
// messages that cannot be written to deadLetter (unless it is empty).
func build(cfg nats.SourceConfig, output, deadLetter string) *dataflow.Flow {
	flow := dataflow.New("nats-to-file")
	msgs := operators.Input(flow, "read", nats.ConsumeDecoded(cfg, decoder(deadLetter != "")))
	// A message whose stream sequence was written already is a redelivery of one written (or
	// dead-lettered) in a committed epoch.
	fresh := operators.Deduplicate("dedup", msgs, func(l line) string { return strconv.FormatUint(l.seq, 10) }, 0)
	lines := fresh
	if deadLetter != "" {
		var dead dataflow.Stream[line]
		dead, lines = operators.Branch("rejected", fresh, func(l line) bool { return l.dead != nil })
		operators.Output("dead-letter", dead, dataflow.ToPartitioned[line, uint64](
			&deadLetterSink{url: cfg.URL, options: cfg.Options, subject: deadLetter, stream: cfg.Stream}))
	}
	operators.Output("write", lines, file.LinesOut(output, func(l line) string { return l.body }))
	return flow
}

// Headers of a dead-lettered message, besides its own.
const (
	// headerError is the reason the message was not written.
	headerError = "Epochflow-Error"
	// headerStream, headerSubject and headerSequence say where it was read from.
	headerStream   = "Epochflow-Stream"
	headerSubject  = "Epochflow-Subject"
	headerSequence = "Epochflow-Sequence"
)

// deadLetterTimeout bounds the wait for one dead-letter publish acknowledgement.
const deadLetterTimeout = 30 * time.Second

// deadLetterSink publishes the messages the program cannot write to a subject of a JetStream
// stream (-dead-letter), every publish acknowledged by that stream before the epoch's Snapshot
// returns, so before the message is acknowledged to the stream it was read from. One
// partition: dead letters are rare. Its state counts the messages it published.
type deadLetterSink struct {
	url     string
	options []natsgo.Option
	subject string
	stream  string // the stream read: the subject must not belong to it
}

// Parts checks that the subject belongs to a stream, and not to the one read (its dead
// letters would be read again), and returns the one partition.
func (s *deadLetterSink) Parts(ctx context.Context) ([]string, error) {
	nc, js, err := s.connect()
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(ctx, deadLetterTimeout)
	defer cancel()
	name, err := js.StreamNameBySubject(ctx, s.subject)
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		return nil, fmt.Errorf("-dead-letter %s: no stream holds this subject: create one (nats stream add) or give a subject of one", s.subject)
	case err != nil:
		return nil, fmt.Errorf("-dead-letter %s: looking up its stream: %w", s.subject, err)
	case name == s.stream:
		return nil, fmt.Errorf("-dead-letter %s: the subject belongs to stream %q, which this program reads (-stream): give a subject of another stream", s.subject, name)
	}
	return []string{"dead-letter"}, nil
}

func (s *deadLetterSink) connect() (*natsgo.Conn, jetstream.JetStream, error) {
	nc, err := natsgo.Connect(s.url, append([]natsgo.Option{natsgo.Name("nats-to-file dead-letter"), natsgo.MaxReconnects(-1)}, s.options...)...)
	if err != nil {
		return nil, nil, fmt.Errorf("-dead-letter %s: connecting to the server (-url): %w", s.subject, err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, fmt.Errorf("-dead-letter %s: %w", s.subject, err)
	}
	return nc, js, nil
}

// PartFor sends every dead letter to the one partition.
func (s *deadLetterSink) PartFor(line, int) int { return 0 }

// Build connects the partition.
func (s *deadLetterSink) Build(ctx context.Context, _ string, resume *uint64) (dataflow.StatefulSink[line, uint64], error) {
	nc, js, err := s.connect()
	if err != nil {
		return nil, err
	}
	p := &deadLetterPart{s: s, nc: nc, js: js}
	if resume != nil {
		p.count = *resume
	}
	return p, nil
}

type deadLetterPart struct {
	s     *deadLetterSink
	nc    *natsgo.Conn
	js    jetstream.JetStream
	count uint64 // messages published, by this run and the runs it resumes
	sent  []sentLetter
}

type sentLetter struct {
	msg *natsgo.Msg
	f   jetstream.PubAckFuture
}

// Write publishes the messages asynchronously; Snapshot waits for their acknowledgements. The
// Nats-Msg-Id of a message is its stream, consumer and sequence, the same in every replay.
func (p *deadLetterPart) Write(_ context.Context, batch []line) error {
	for _, l := range batch {
		m := l.dead
		msg := &natsgo.Msg{Subject: p.s.subject, Data: m.Data, Header: natsgo.Header{}}
		for k, v := range m.Header {
			msg.Header[k] = append([]string(nil), v...)
		}
		msg.Header.Set(natsgo.MsgIdHdr, fmt.Sprintf("nats-to-file/%s/%s/%d", m.Stream, m.Consumer, m.Sequence))
		msg.Header.Set(headerError, errLineBreak.Error())
		msg.Header.Set(headerStream, m.Stream)
		msg.Header.Set(headerSubject, m.Subject)
		msg.Header.Set(headerSequence, strconv.FormatUint(m.Sequence, 10))
		f, err := p.js.PublishMsgAsync(msg)
		if errors.Is(err, jetstream.ErrTooManyStalledMsgs) {
			select {
			case <-p.js.PublishAsyncComplete():
			case <-time.After(deadLetterTimeout):
			}
			f, err = p.js.PublishMsgAsync(msg)
		}
		if err != nil {
			return fmt.Errorf("-dead-letter %s: publishing %s: %w", p.s.subject, m, err)
		}
		p.sent = append(p.sent, sentLetter{msg: msg, f: f})
	}
	return nil
}

// Snapshot waits until the dead-letter stream has acknowledged every message published in the
// epoch (one that failed is published again, with the same id, once); an error stops the flow
// before the epoch commits, so the message is not acknowledged where it was read.
func (p *deadLetterPart) Snapshot() (uint64, error) {
	for _, s := range p.sent {
		err := awaitAck(s.f)
		if err != nil {
			ctx, cancel := context.WithTimeout(context.Background(), deadLetterTimeout)
			_, err = p.js.PublishMsg(ctx, s.msg)
			cancel()
		}
		if err != nil {
			return p.count, fmt.Errorf("-dead-letter %s: message %s of stream %q was not acknowledged by the dead-letter stream, nor when published again: %w",
				p.s.subject, s.msg.Header.Get(headerSequence), s.msg.Header.Get(headerStream), err)
		}
		p.count++
	}
	clear(p.sent)
	p.sent = p.sent[:0]
	return p.count, nil
}

func awaitAck(f jetstream.PubAckFuture) error {
	t := time.NewTimer(deadLetterTimeout)
	defer t.Stop()
	select {
	case <-f.Ok():
		return nil
	case err := <-f.Err():
		return err
	case <-t.C:
		return fmt.Errorf("no acknowledgement within %v", deadLetterTimeout)
	}
}

// Commit has nothing to do: the messages were stored at Snapshot.
func (p *deadLetterPart) Commit(context.Context, uint64) error { return nil }

// Close closes the connection.
func (p *deadLetterPart) Close() error {
	p.nc.Close()
	return nil
}
