package sqs_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/epochflow/epochflow/connectors/file"
	"github.com/epochflow/epochflow/connectors/sqs"
	"github.com/epochflow/epochflow/dataflow"
	"github.com/epochflow/epochflow/operators"
	"github.com/epochflow/epochflow/recovery"
)

// drain receives and deletes every visible message of q and returns the bodies, sorted.
func drain(t *testing.T, q string) []string {
	t.Helper()
	ctx := context.Background()
	var out []string
	for {
		r, err := emu.Client.ReceiveMessage(ctx, &awssqs.ReceiveMessageInput{QueueUrl: &q, MaxNumberOfMessages: 10, WaitTimeSeconds: 1})
		if err != nil {
			t.Fatal(err)
		}
		if len(r.Messages) == 0 {
			break
		}
		in := &awssqs.DeleteMessageBatchInput{QueueUrl: &q}
		for i, m := range r.Messages {
			out = append(out, aws.ToString(m.Body))
			in.Entries = append(in.Entries, types.DeleteMessageBatchRequestEntry{Id: aws.String(fmt.Sprint(i)), ReceiptHandle: m.ReceiptHandle})
		}
		if _, err := emu.Client.DeleteMessageBatch(ctx, in); err != nil {
			t.Fatal(err)
		}
	}
	slices.Sort(out)
	return out
}

func writeLines(t *testing.T, lines []string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "in.txt")
	if err := os.WriteFile(path, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func sinkFlow(path string, sink dataflow.Sink[sqs.Outgoing]) *dataflow.Flow {
	flow := dataflow.New("to-sqs")
	lines := operators.Input(flow, "read", file.Lines(path))
	out := operators.Map("msg", lines, func(l string) sqs.Outgoing {
		return sqs.Outgoing{Body: l, GroupID: "g" + l[len(l)-1:]}
	})
	operators.Output("send", out, sink)
	return flow
}

// Every line becomes one message, with two workers and two partitions.
func TestSinkSendsAll(t *testing.T) {
	q := emu.MustQueue(t, "sink", sqstest30())
	want := numbered("line", 1000)
	path := writeLines(t, want)
	if err := dataflow.Run(context.Background(), sinkFlow(path, sqs.Send(emu.Client, q, sqs.SinkLogger(quiet))),
		dataflow.Options{Workers: 2, EpochInterval: 20 * time.Millisecond, Logger: quiet}); err != nil {
		t.Fatal(err)
	}
	if got := drain(t, q); !slices.Equal(got, slices.Sorted(slices.Values(want))) {
		t.Fatalf("queue holds %d messages, want the %d lines", len(got), len(want))
	}
}

// On a FIFO queue an epoch replayed after a crash gets the deduplication ids of its first try,
// so SQS (here goaws, within its deduplication window) drops the second copies. The crash comes
// before the first commit, so the ids rest on DedupScope (see its doc).
func TestSinkFIFOReplayDeduplicated(t *testing.T) {
	q := emu.MustQueue(t, "sink", sqstestQueue{Visibility: 30 * time.Second, FIFO: true})
	want := numbered("line", 300)
	path := writeLines(t, want)
	ctx := context.Background()
	store, err := recovery.OpenSQLite(ctx, filepath.Join(t.TempDir(), "store"), recovery.SQLiteOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	var crashes atomic.Int32
	hook := func(point string) bool {
		if point != "before-commit-record" {
			return false
		}
		v, _, _ := emu.Counts(q)
		return v > 0 && crashes.Add(1) == 1
	}
	opts := dataflow.Options{EpochInterval: 50 * time.Millisecond, Logger: quiet, Recovery: store, CrashHook: hook}
	sink := func() dataflow.Sink[sqs.Outgoing] {
		return sqs.Send(emu.Client, q, sqs.SinkLogger(quiet), sqs.DedupScope(t.Name()+q))
	}
	err = dataflow.Run(ctx, sinkFlow(path, sink()), opts)
	if !errors.Is(err, dataflow.ErrCrashed) {
		t.Fatalf("run: %v, want a crash", err)
	}
	sent, _, _ := emu.Counts(q)
	opts.CrashHook = nil
	if err := dataflow.Run(ctx, sinkFlow(path, sink()), opts); err != nil {
		t.Fatal(err)
	}
	got := drain(t, q)
	if !slices.Equal(got, slices.Sorted(slices.Values(want))) {
		t.Fatalf("queue holds %d messages (%d sent before the crash), want each of the %d lines once", len(got), sent, len(want))
	}
	t.Logf("%d messages sent before the crash, replayed and dropped as duplicates", sent)
}

// failingSends fails some entries of SendMessageBatch: retriable ones once each, and a body
// "poison" always, as the sender's fault.
type failingSends struct {
	*awssqs.Client
	seen    map[string]bool
	retried atomic.Int64
}

func (f *failingSends) SendMessageBatch(ctx context.Context, in *awssqs.SendMessageBatchInput, opts ...func(*awssqs.Options)) (*awssqs.SendMessageBatchOutput, error) {
	var pass []types.SendMessageBatchRequestEntry
	var failed []types.BatchResultErrorEntry
	for _, e := range in.Entries {
		b := aws.ToString(e.MessageBody)
		switch {
		case b == "poison":
			failed = append(failed, types.BatchResultErrorEntry{Id: e.Id, Code: aws.String("InvalidMessageContents"), Message: aws.String("test"), SenderFault: true})
		case strings.HasSuffix(b, "3") && !f.seen[b]:
			f.seen[b] = true
			f.retried.Add(1)
			failed = append(failed, types.BatchResultErrorEntry{Id: e.Id, Code: aws.String("InternalError"), Message: aws.String("test")})
		default:
			pass = append(pass, e)
		}
	}
	out := &awssqs.SendMessageBatchOutput{Failed: failed}
	if len(pass) > 0 {
		r, err := f.Client.SendMessageBatch(ctx, &awssqs.SendMessageBatchInput{QueueUrl: in.QueueUrl, Entries: pass}, opts...)
		if err != nil {
			return nil, err
		}
		out.Successful = r.Successful
		out.Failed = append(out.Failed, r.Failed...)
	}
	return out, nil
}

// Entries that fail for a reason of SQS's are retried until sent; an entry refused as the
// sender's fault fails the epoch's pre-commit, naming the message.
func TestSinkPartialFailures(t *testing.T) {
	q := emu.MustQueue(t, "sink", sqstest30())
	want := numbered("line", 100)
	stub := &failingSends{Client: emu.Client, seen: map[string]bool{}}
	if err := dataflow.Run(context.Background(), sinkFlow(writeLines(t, want), sqs.Send(stub, q, sqs.SendConcurrency(1), sqs.SinkLogger(quiet))),
		dataflow.Options{Logger: quiet}); err != nil {
		t.Fatal(err)
	}
	if got := drain(t, q); !slices.Equal(got, slices.Sorted(slices.Values(want))) || stub.retried.Load() == 0 {
		t.Fatalf("queue holds %d messages after %d retried entries, want the %d lines", len(got), stub.retried.Load(), len(want))
	}

	err := dataflow.Run(context.Background(), sinkFlow(writeLines(t, []string{"a1", "poison", "b2"}), sqs.Send(stub, q, sqs.SinkLogger(quiet))),
		dataflow.Options{Logger: quiet})
	if err == nil || !strings.Contains(err.Error(), "poison") || !strings.Contains(err.Error(), q) {
		t.Fatalf("run: %v; want an error naming the refused message and the queue", err)
	}
	drain(t, q)
}

// A FIFO queue needs a group: a message without one is an error naming it.
func TestSinkFIFONeedsGroup(t *testing.T) {
	q := emu.MustQueue(t, "sink", sqstestQueue{Visibility: 30 * time.Second, FIFO: true})
	flow := dataflow.New("no-group")
	lines := operators.Input(flow, "read", file.Lines(writeLines(t, []string{"x"})))
	operators.Output("send", operators.Map("msg", lines, func(l string) sqs.Outgoing { return sqs.Outgoing{Body: l} }), sqs.Send(emu.Client, q))
	err := dataflow.Run(context.Background(), flow, dataflow.Options{Logger: quiet})
	if err == nil || !strings.Contains(err.Error(), "GroupID") {
		t.Fatalf("run: %v; want an error about the missing GroupID", err)
	}
}
