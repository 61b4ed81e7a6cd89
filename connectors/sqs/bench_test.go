package sqs_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/epochflow/epochflow/connectors/sqs"
	"github.com/epochflow/epochflow/dataflow"
	"github.com/epochflow/epochflow/operators"
)

type discard[T any] struct{}

func (discard[T]) Build(context.Context, dataflow.Worker) (dataflow.WorkerSink[T], error) {
	return discard[T]{}, nil
}
func (discard[T]) Write(context.Context, []T) error { return nil }
func (discard[T]) Close() error                     { return nil }

func fill(b *testing.B, q string, n int) {
	b.Helper()
	bodies := make([]string, n)
	for i := range bodies {
		bodies[i] = fmt.Sprintf("message %06d", i)
	}
	if err := emu.SendBodies(context.Background(), q, "g", bodies...); err != nil {
		b.Fatal(err)
	}
}

// plainLoop receives and deletes (DeleteMessageBatch) n messages in one goroutine: the
// baseline, with no flow, no epochs and no delete-after-commit.
func plainLoop(b *testing.B, q string, n int) time.Duration {
	ctx := context.Background()
	start := time.Now()
	for done := 0; done < n; {
		out, err := emu.Client.ReceiveMessage(ctx, &awssqs.ReceiveMessageInput{QueueUrl: &q, MaxNumberOfMessages: 10, WaitTimeSeconds: 1,
			MessageAttributeNames: []string{"All"}, MessageSystemAttributeNames: []types.MessageSystemAttributeName{types.MessageSystemAttributeNameAll}})
		if err != nil {
			b.Fatal(err)
		}
		if len(out.Messages) == 0 {
			continue
		}
		in := &awssqs.DeleteMessageBatchInput{QueueUrl: &q}
		for i, m := range out.Messages {
			in.Entries = append(in.Entries, types.DeleteMessageBatchRequestEntry{Id: aws.String(fmt.Sprint(i)), ReceiptHandle: m.ReceiptHandle})
		}
		d, err := emu.Client.DeleteMessageBatch(ctx, in)
		if err != nil || len(d.Failed) > 0 {
			b.Fatalf("delete: %v %v", err, d)
		}
		done += len(out.Messages)
	}
	return time.Since(start)
}

// flowRun reads n messages with the SQS source into a discarding sink (deleting each epoch's
// messages once it commits, 100 ms epochs) and returns the time until the last one was deleted:
// that includes the wait for the last epoch to end and commit.
func flowRun(b *testing.B, q string, n int) time.Duration {
	src := sqs.NewSource(emu.Client, q, func(m sqs.Message) (sqs.Message, error) { return m, nil }, sqs.Logger(quiet))
	flow := dataflow.New("bench")
	operators.Output("discard", operators.Input(flow, "read", src.Input()), dataflow.ToDynamic[sqs.Message](discard[sqs.Message]{}))
	stop := make(chan struct{})
	var took time.Duration
	start := time.Now()
	go func() {
		for src.Stats().Deleted < int64(n) {
			time.Sleep(2 * time.Millisecond)
		}
		took = time.Since(start)
		close(stop)
	}()
	if err := dataflow.Run(context.Background(), flow, dataflow.Options{Stop: stop, Logger: quiet, EpochInterval: 100 * time.Millisecond}); err != nil {
		b.Fatal(err)
	}
	return took
}

// The SQS source in a flow (receive, hand over, delete each epoch's messages on commit) against
// a plain receive + DeleteMessageBatch loop, over the same 20,000 queued messages in goaws
// (in this process: it shares the cores with both). Three rounds, alternating which goes
// first; reports the median rates and flow/plain (above 1: the flow is faster).
func BenchmarkSourceVsPlainLoop(b *testing.B) {
	const n, rounds = 20_000, 3
	var plain, flow []float64
	for i := 0; i < b.N; i++ {
		for r := 0; r < rounds; r++ {
			runPlain := func() {
				q := emu.MustQueue(b, fmt.Sprintf("bench-plain-%d-%d", i, r), sqstest30())
				fill(b, q, n)
				plain = append(plain, n/plainLoop(b, q, n).Seconds())
			}
			runFlow := func() {
				q := emu.MustQueue(b, fmt.Sprintf("bench-flow-%d-%d", i, r), sqstest30())
				fill(b, q, n)
				flow = append(flow, n/flowRun(b, q, n).Seconds())
			}
			if r%2 == 0 {
				runPlain()
				runFlow()
			} else {
				runFlow()
				runPlain()
			}
		}
	}
	b.Logf("plain per round: %.0f msg/s; flow per round: %.0f msg/s", plain, flow)
	plainRate, flowRate := medianOf(plain), medianOf(flow)
	b.ReportMetric(plainRate, "plain-msg/s")
	b.ReportMetric(flowRate, "flow-msg/s")
	b.ReportMetric(flowRate/plainRate, "flow/plain")
}

func medianOf(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}
