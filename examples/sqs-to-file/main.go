// Command sqs-to-file copies the messages of an SQS queue to a file, one body per line, with an
// epochflow flow: every message's body ends up in the file exactly once, and a message is
// deleted from the queue only after the epoch that wrote it is committed.
//
//	go run ./examples/sqs-to-file -queue-url URL -output FILE -recovery DIR \
//	    [-endpoint URL] [-epoch-interval D] [-idle-exit D] [-dedup-window D] [-workers N] \
//	    [-visibility D] [-max-in-flight N] [-dead-letter-queue URL]
//
// It reads the queue with connectors/sqs (delete on commit, visibility extended while an epoch
// is open), drops redeliveries by message ID (sqs.Deduplicate: a crash between a commit and its
// deletes makes SQS deliver those messages again) and writes with file.WriteLines, which makes
// the file exactly the committed epochs' lines after a crash. With -idle-exit D it exits 0 once
// the queue has been empty for D; without it, it runs until SIGINT or SIGTERM (which finish and
// commit the current epoch). Keep -recovery the same across restarts: it holds the committed
// epochs, the file length and the IDs seen.
//
// A message whose body holds a line break cannot be one line: it stops the program with an
// error naming it (the message stays in the queue, so a restart stops on it again), or, with
// -dead-letter-queue URL, it is sent to that queue (with its attributes and the error) and
// deleted from the source queue once its epoch commits, and the copy goes on.
//
// -visibility is the visibility timeout asked for on every receive and extension (default:
// the queue's own); messages stay invisible beyond it while their epoch is open, by
// extensions. -max-in-flight caps the messages received and not yet deleted per worker; below
// it the source keeps a cap of its own that follows what the extensions keep up with.
//
// When the run ends, however it ends, the program logs the source's counters (sqs.Stats) in a
// line "sqs source: counters at the end of the run", before the closing line: messages
// received (redeliveries included: more than the queue held means some came again), deleted,
// stale deletes, failed calls and retries, visibility extensions, lost visibility and pauses.
// Stale deletes and lost visibility show extensions that could not keep the messages of the
// epochs invisible; failed calls and retries show an endpoint that was unreachable for a while.
//
// Against real AWS: leave out -endpoint; credentials and region come the standard AWS way
// (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY/AWS_SESSION_TOKEN, AWS_PROFILE with ~/.aws/config and
// ~/.aws/credentials, SSO, or an instance/task/pod role) and AWS_REGION, and -queue-url is the
// queue's URL (https://sqs.REGION.amazonaws.com/ACCOUNT/NAME). The identity needs
// sqs:ReceiveMessage, sqs:DeleteMessage, sqs:ChangeMessageVisibility and
// sqs:GetQueueAttributes on the queue. With -endpoint (an emulator such as goaws), set
// AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY to any value. See README.md.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/epochflow/epochflow/connectors/file"
	"github.com/epochflow/epochflow/connectors/sqs"
	"github.com/epochflow/epochflow/dataflow"
	"github.com/epochflow/epochflow/operators"
)

func main() {
	endpoint := flag.String("endpoint", "", "SQS endpoint URL of an emulator such as goaws (default: the AWS endpoint of the configured region)")
	queueURL := flag.String("queue-url", "", "URL of the queue to read (required)")
	output := flag.String("output", "", "file to write the message bodies to, one per line (required)")
	var exists file.IfExists
	flag.Var(&exists, "output-exists", "what a run without recovery state for the -output file does when that file holds data: refuse (the default), replace it, or append to it")
	idleExit := flag.Duration("idle-exit", 0, "exit 0 once the queue has been empty this long (default: run until a signal)")
	window := flag.Duration("dedup-window", time.Hour, "how long a message ID is remembered to drop redeliveries")
	visibility := flag.Duration("visibility", 0, "visibility timeout asked for on every receive and extension, whole seconds from 1s to 12h (default: the queue's own)")
	maxInFlight := flag.Int("max-in-flight", sqs.DefaultMaxInFlight, "most messages received and not yet deleted, per worker (SQS allows about 120,000 per standard queue, 20,000 per FIFO queue)")
	deadLetter := flag.String("dead-letter-queue", "", "URL of a queue for the messages that cannot be written (a body with a line break); without it such a message stops the program")
	dataflow.Usage("sqs-to-file copies the messages of an SQS queue to a file, one body per line, exactly once.",
		"sqs-to-file -queue-url https://sqs.us-east-1.amazonaws.com/123456789012/orders -output orders.txt -recovery state")
	dataflow.MainFunc(func() (*dataflow.Flow, error) {
		graph := dataflow.GraphOnly() // -graph: no flag is required
		switch {
		case *queueURL == "" && !graph:
			return nil, errors.New("flag -queue-url is required")
		case *output == "" && !graph:
			return nil, errors.New("flag -output is required")
		case *idleExit < 0:
			return nil, errors.New("flag -idle-exit must not be negative")
		case *window <= 0:
			return nil, errors.New("flag -dedup-window must be positive")
		case *visibility != 0 && (*visibility < time.Second || *visibility > sqs.MaxVisibility || *visibility%time.Second != 0):
			return nil, fmt.Errorf("invalid value %v for flag -visibility: want whole seconds from 1s to 12h", *visibility)
		case *maxInFlight < 1:
			return nil, fmt.Errorf("invalid value %d for flag -max-in-flight: want at least 1", *maxInFlight)
		}
		opts := []sqs.SourceOption{sqs.MaxInFlight(*maxInFlight)}
		if *visibility > 0 {
			opts = append(opts, sqs.Visibility(*visibility))
		}
		reject := errors.New("the body contains a line break (pass -dead-letter-queue URL to send such messages to a queue of their own)")
		if *deadLetter != "" {
			opts = append(opts, sqs.DeadLetter(*deadLetter))
			reject = errLineBreak
		}
		var client sqs.API // none for -graph: it needs no region or credentials
		if !graph {
			c, err := sqs.NewClient(context.Background(), *endpoint)
			if err != nil {
				return nil, err
			}
			client = c
		}
		return build(client, *queueURL, *output, exists, *idleExit, *window, reject, opts), nil
	})
}

// errLineBreak is why a message is rejected: a body with a line break would not be one line.
var errLineBreak = errors.New("the body contains a line break")

// build returns the flow: read the queue, drop redeliveries, write the bodies.
// A message whose body has a line break is rejected with the error reject.
func build(client sqs.API, queueURL, output string, exists file.IfExists, idleExit, window time.Duration, reject error, opts []sqs.SourceOption) *dataflow.Flow {
	flow := dataflow.New("sqs-to-file")
	if idleExit > 0 {
		opts = append(opts, sqs.IdleExit(idleExit))
	}
	decode := func(m sqs.Message) (sqs.Message, error) {
		if strings.Contains(m.Body, "\n") {
			return sqs.Message{}, reject
		}
		return m, nil
	}
	src := &countedSource{Source: sqs.NewSource(client, queueURL, decode, opts...)}
	msgs := operators.Input(flow, "read", dataflow.FromPartitioned[sqs.Message, uint64](src))
	fresh := sqs.Deduplicate("dedup", msgs, window)
	lines := operators.Map("body", fresh, func(m sqs.Message) string { return m.Body })
	operators.Output("write", lines, file.WriteLines(output, file.OnExisting(exists), file.ExistsFlag("-output-exists")))
	return flow
}

// countedSource is the SQS source that logs its counters (sqs.Stats) when the run closes its
// last partition: at the end of the run, or of an attempt that the engine restarts.
type countedSource struct {
	*sqs.Source[sqs.Message]
	open atomic.Int64 // partitions built and not closed
}

// Build opens the partition and counts it open.
func (s *countedSource) Build(ctx context.Context, part string, resume *uint64) (dataflow.StatefulSource[sqs.Message, uint64], error) {
	p, err := s.Source.Build(ctx, part, resume)
	if err != nil {
		return nil, err
	}
	s.open.Add(1)
	c := countedPart{StatefulSource: p, src: s, ctx: ctx}
	if w, ok := p.(dataflow.Waiter); ok {
		return waitingPart{countedPart: c, waiter: w}, nil
	}
	return c, nil
}

// countedPart is a partition of countedSource.
type countedPart struct {
	dataflow.StatefulSource[sqs.Message, uint64]
	src *countedSource
	ctx context.Context // Build's: its logger is the run's
}

// Close closes the partition; the last one to close logs the source's counters.
func (p countedPart) Close() error {
	err := p.StatefulSource.Close()
	if p.src.open.Add(-1) == 0 {
		st := p.src.Stats()
		dataflow.Logger(p.ctx).Info("sqs source: counters at the end of the run",
			"received", st.Received, "emitted", st.Emitted,
			"rejected", st.Rejected, "dead_lettered", st.DeadLettered, "deleted", st.Deleted,
			"stale_deletes", st.StaleDeletes, "delete_retries", st.DeleteRetries, "receive_errors", st.ReceiveErrors,
			"extended", st.Extended, "extend_retries", st.ExtendRetries, "visibility_lost", st.VisibilityLost,
			"released", st.Released, "delete_pauses", st.DeletePauses, "extension_pauses", st.ExtensionPauses,
			"limit_cuts", st.LimitCuts)
	}
	return err
}

// waitingPart is a countedPart whose partition wakes its worker when messages arrive
// (dataflow.Waiter), as the SQS source's partitions do.
type waitingPart struct {
	countedPart
	waiter dataflow.Waiter
}

// Wait returns the partition's wake-up channel.
func (p waitingPart) Wait() <-chan struct{} { return p.waiter.Wait() }
