// Command sqs-to-file copies the messages of an SQS queue to a file, one body per line, with an
// epochflow flow: every message's body ends up in the file exactly once, and a message is
// deleted from the queue only after the epoch that wrote it is committed.
//
//	go run ./examples/sqs-to-file -queue-url URL -output FILE -recovery DIR \
//	    [-endpoint URL] [-epoch-interval D] [-idle-exit D] [-dedup-window D] [-workers N]
//
// It reads the queue with connectors/sqs (delete on commit, visibility extended while an epoch
// is open), drops redeliveries by message ID (sqs.Deduplicate: a crash between a commit and its
// deletes makes SQS deliver those messages again) and writes with file.WriteLines, which makes
// the file exactly the committed epochs' lines after a crash. With -idle-exit D it exits 0 once
// the queue has been empty for D; without it, it runs until SIGINT or SIGTERM (which finish and
// commit the current epoch). Keep -recovery the same across restarts: it holds the committed
// epochs, the file length and the IDs seen.
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
	idleExit := flag.Duration("idle-exit", 0, "exit 0 once the queue has been empty this long (default: run until a signal)")
	window := flag.Duration("dedup-window", time.Hour, "how long a message ID is remembered to drop redeliveries")
	dataflow.MainFunc(func() (*dataflow.Flow, error) {
		switch {
		case *queueURL == "":
			return nil, errors.New("flag -queue-url is required")
		case *output == "":
			return nil, errors.New("flag -output is required")
		case *idleExit < 0:
			return nil, errors.New("flag -idle-exit must not be negative")
		case *window <= 0:
			return nil, errors.New("flag -dedup-window must be positive")
		}
		client, err := sqs.NewClient(context.Background(), *endpoint)
		if err != nil {
			return nil, err
		}
		return build(client, *queueURL, *output, *idleExit, *window), nil
	})
}

// build returns the flow: read the queue, drop redeliveries, write the bodies.
func build(client sqs.API, queueURL, output string, idleExit, window time.Duration) *dataflow.Flow {
	flow := dataflow.New("sqs-to-file")
	var opts []sqs.SourceOption
	if idleExit > 0 {
		opts = append(opts, sqs.IdleExit(idleExit))
	}
	msgs := operators.Input(flow, "read", sqs.Receive(client, queueURL, opts...))
	fresh := sqs.Deduplicate("dedup", msgs, window)
	lines := operators.Map("body", fresh, func(m sqs.Message) string { return m.Body })
	operators.Output("write", lines, file.WriteLines(output))
	return flow
}
