package sqs_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/aws/smithy-go"
	smithyhttp "github.com/aws/smithy-go/transport/http"

	"github.com/epochflow/epochflow/connectors/flowtest"
	"github.com/epochflow/epochflow/connectors/sqs"
	"github.com/epochflow/epochflow/dataflow"
)

// The deletes of committed messages: retried on every kind of failure, never left waiting,
// never run past by the receiver, and a lasting failure stops the flow with the error.

// slowDeletes answers every DeleteMessageBatch call after a delay, as a queue in a far region
// would, so that one partition can receive faster than it deletes.
type slowDeletes struct {
	*awssqs.Client
	delay time.Duration
}

func (s *slowDeletes) DeleteMessageBatch(ctx context.Context, in *awssqs.DeleteMessageBatchInput, opts ...func(*awssqs.Options)) (*awssqs.DeleteMessageBatchOutput, error) {
	select {
	case <-time.After(s.delay):
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return s.Client.DeleteMessageBatch(ctx, in, opts...)
}

// A partition that receives faster than its deletes go out does not run past them: receiving
// waits while the oldest committed message is near its visibility deadline, so every delete
// lands in time and no message is delivered twice. Without the wait, the delete backlog grows
// past the visibility timeout and the messages come again, stale delete after stale delete.
func TestReceivingWaitsForDeletes(t *testing.T) {
	q := emu.MustQueue(t, "slowdel", sqstestQueue{Visibility: 3 * time.Second})
	const n = 3000
	send(t, q, numbered("d", n)...)
	client := &slowDeletes{Client: emu.Client, delay: 100 * time.Millisecond}
	src := sqs.NewSource(client, q, func(m sqs.Message) (sqs.Message, error) { return m, nil },
		sqs.WaitTime(time.Second), sqs.IdleExit(2*time.Second), sqs.Logger(quiet))
	sink := flowtest.NewSink[sqs.Message]()
	if err := runFlow(t, src.Input(), sink, dataflow.Options{EpochInterval: 50 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	st := src.Stats()
	if len(sink.Items()) != n || st.StaleDeletes != 0 || st.Received != n {
		t.Errorf("wrote %d of %d messages; stats %+v: want each received once, no stale delete", len(sink.Items()), n, st)
	}
	if st.DeletePauses == 0 {
		t.Errorf("stats %+v: the receiver never waited for the deletes (the test did not make them fall behind)", st)
	}
	if vis, fl := counts(t, q); vis+fl != 0 {
		t.Errorf("after the run: %d visible, %d in flight", vis, fl)
	}
	t.Logf("stats %+v", st)
}

// entryFault answers the first DeleteMessageBatch call with a per-entry server fault
// (SenderFault=false, as SQS does for an InternalError) for its first entry; the call itself
// succeeds and the other entries are deleted.
type entryFault struct {
	*awssqs.Client
	done atomic.Bool
}

func (c *entryFault) DeleteMessageBatch(ctx context.Context, in *awssqs.DeleteMessageBatchInput, opts ...func(*awssqs.Options)) (*awssqs.DeleteMessageBatchOutput, error) {
	if c.done.Swap(true) || len(in.Entries) == 0 {
		return c.Client.DeleteMessageBatch(ctx, in, opts...)
	}
	first := in.Entries[0]
	rest := *in
	rest.Entries = in.Entries[1:]
	out := &awssqs.DeleteMessageBatchOutput{}
	if len(rest.Entries) > 0 {
		o, err := c.Client.DeleteMessageBatch(ctx, &rest, opts...)
		if err != nil {
			return nil, err
		}
		out.Successful, out.Failed = o.Successful, o.Failed
	}
	out.Failed = append(out.Failed, types.BatchResultErrorEntry{Id: first.Id, Code: aws.String("InternalError"), Message: aws.String("injected"), SenderFault: false})
	return out, nil
}

// A delete entry that fails once (a server fault inside a successful call) is tried again
// after a back-off, and the run ends by IdleExit with the queue empty; the receiver, paused
// while that delete waits near its deadline, does not wait for it forever.
func TestDeleteEntryFaultIsRetried(t *testing.T) {
	q := emu.MustQueue(t, "entryfault", sqstestQueue{Visibility: 2 * time.Second})
	send(t, q, numbered("e", 5)...)
	client := &entryFault{Client: emu.Client}
	src := sqs.NewSource(client, q, func(m sqs.Message) (sqs.Message, error) { return m, nil },
		sqs.WaitTime(time.Second), sqs.IdleExit(3*time.Second), sqs.Logger(quiet))
	sink := flowtest.NewSink[sqs.Message]()
	if err := runFlow(t, src.Input(), sink, dataflow.Options{EpochInterval: 50 * time.Millisecond}); err != nil {
		t.Fatalf("the run did not end by IdleExit: %v; stats %+v", err, src.Stats())
	}
	st := src.Stats()
	if len(sink.Items()) != 5 || st.Deleted != 5 || st.DeleteRetries == 0 || st.StaleDeletes != 0 {
		t.Errorf("wrote %d of 5; stats %+v: want all deleted, one retry, no stale delete", len(sink.Items()), st)
	}
	if vis, fl := counts(t, q); vis+fl != 0 {
		t.Errorf("after the run: %d visible, %d in flight", vis, fl)
	}
}

type dlqFailOnce struct {
	*awssqs.Client
	dlq  string
	done atomic.Bool
}

func (c *dlqFailOnce) SendMessage(ctx context.Context, in *awssqs.SendMessageInput, opts ...func(*awssqs.Options)) (*awssqs.SendMessageOutput, error) {
	if aws.ToString(in.QueueUrl) == c.dlq && !c.done.Swap(true) {
		return nil, errors.New("injected transient send failure")
	}
	return c.Client.SendMessage(ctx, in, opts...)
}

// A rejected message whose dead-letter send succeeds only when tried again, after its epoch
// committed, is deleted from the source queue then, without waiting for anything else to wake
// the source, and the run ends by IdleExit.
func TestDeadLetterAfterCommitIsDeleted(t *testing.T) {
	q := emu.MustQueue(t, "dlqlate-src", sqstestQueue{Visibility: 2 * time.Second})
	dlq := emu.MustQueue(t, "dlqlate-dlq", sqstest30())
	send(t, q, "bad")
	client := &dlqFailOnce{Client: emu.Client, dlq: dlq}
	decode := func(m sqs.Message) (sqs.Message, error) {
		_, err := strconv.Atoi(m.Body)
		return m, err
	}
	src := sqs.NewSource(client, q, decode, sqs.DeadLetter(dlq), sqs.WaitTime(time.Second), sqs.IdleExit(3*time.Second), sqs.Logger(quiet))
	sink := flowtest.NewSink[sqs.Message]()
	if err := runFlow(t, src.Input(), sink, dataflow.Options{EpochInterval: 50 * time.Millisecond}); err != nil {
		t.Fatalf("the run did not end by IdleExit: %v; stats %+v", err, src.Stats())
	}
	if st := src.Stats(); st.DeadLettered != 1 || st.Deleted != 1 {
		t.Errorf("stats %+v: want the message dead-lettered and deleted", st)
	}
	if vis, fl := counts(t, q); vis+fl != 0 {
		t.Errorf("source queue after the run: %d visible, %d in flight", vis, fl)
	}
	if vis, _ := counts(t, dlq); vis != 1 {
		t.Errorf("the dead-letter queue holds %d messages, want 1", vis)
	}
}

// failingDeletes fails every DeleteMessageBatch call with err.
type failingDeletes struct {
	*awssqs.Client
	err error
}

func (c *failingDeletes) DeleteMessageBatch(context.Context, *awssqs.DeleteMessageBatchInput, ...func(*awssqs.Options)) (*awssqs.DeleteMessageBatchOutput, error) {
	return nil, c.err
}

// Deletes that keep failing stop the flow with an error that says so: a refusal (403) at once,
// any other failure after 8 in a row. The messages stay in the queue (they come again).
func TestFailingDeletesStopTheFlow(t *testing.T) {
	denied := &awshttp.ResponseError{ResponseError: &smithyhttp.ResponseError{
		Response: &smithyhttp.Response{Response: &http.Response{StatusCode: 403}},
		Err:      &smithy.GenericAPIError{Code: "AccessDenied", Message: "not allowed (test)"}}}
	for _, c := range []struct {
		name string
		err  error
		want string
	}{
		{"refused", denied, "failed (1 in a row"},
		{"unreachable", errors.New("connection refused (test)"), "failed (8 in a row"},
	} {
		t.Run(c.name, func(t *testing.T) {
			q := emu.MustQueue(t, "denied", sqstestQueue{Visibility: 30 * time.Second})
			send(t, q, numbered("x", 300)...)
			src := sqs.NewSource(&failingDeletes{emu.Client, c.err}, q, func(m sqs.Message) (sqs.Message, error) { return m, nil },
				sqs.WaitTime(time.Second), sqs.IdleExit(3*time.Second), sqs.Logger(quiet))
			sink := flowtest.NewSink[sqs.Message]()
			err := runFlow(t, src.Input(), sink, dataflow.Options{EpochInterval: 50 * time.Millisecond})
			if err == nil || !strings.Contains(err.Error(), "deleting messages of committed epochs "+c.want) ||
				!strings.Contains(err.Error(), "(test)") {
				t.Fatalf("run: %v; want the delete error, %q", err, c.want)
			}
			if st := src.Stats(); st.Deleted != 0 {
				t.Errorf("stats %+v: nothing can have been deleted", st)
			}
		})
	}
}

// One DeleteMessageBatch call in five fails (as under throttling).
type oneInFive struct {
	*awssqs.Client
	n atomic.Int64
}

func (c *oneInFive) DeleteMessageBatch(ctx context.Context, in *awssqs.DeleteMessageBatchInput, opts ...func(*awssqs.Options)) (*awssqs.DeleteMessageBatchOutput, error) {
	if c.n.Add(1)%5 == 0 {
		return nil, errors.New("Throttling (injected)")
	}
	return c.Client.DeleteMessageBatch(ctx, in, opts...)
}

// Occasional failed delete calls (one in five, as under throttling) are retried and do not
// add up to a fatal error while other calls get through: every message is read once and
// deleted.
func TestSomeDeleteCallsFail(t *testing.T) {
	q := emu.MustQueue(t, "oneinfive", sqstest30())
	const n = 3000
	send(t, q, numbered("f", n)...)
	src := sqs.NewSource(&oneInFive{Client: emu.Client}, q, func(m sqs.Message) (sqs.Message, error) { return m, nil },
		sqs.WaitTime(time.Second), sqs.IdleExit(2*time.Second), sqs.Logger(quiet))
	sink := flowtest.NewSink[sqs.Message]()
	if err := runFlow(t, src.Input(), sink, dataflow.Options{EpochInterval: 200 * time.Millisecond}); err != nil {
		t.Fatalf("run: %v; stats %+v", err, src.Stats())
	}
	if st := src.Stats(); len(sink.Items()) != n || st.Deleted != n || st.DeleteRetries == 0 {
		t.Errorf("wrote %d of %d; stats %+v: want all deleted, with retries", len(sink.Items()), n, st)
	}
	if vis, fl := counts(t, q); vis+fl != 0 {
		t.Errorf("after the run: %d visible, %d in flight", vis, fl)
	}
}

func buildPartition(t *testing.T, ctx context.Context, src *sqs.Source[sqs.Message]) dataflow.StatefulSource[sqs.Message, uint64] {
	t.Helper()
	parts, err := src.Parts(ctx)
	if err != nil {
		t.Fatal(err)
	}
	p, err := src.Build(ctx, parts[0], nil)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// readN calls Next until n messages in all (emitted or rejected) were handed out.
func readN(t *testing.T, p dataflow.StatefulSource[sqs.Message, uint64], src *sqs.Source[sqs.Message], n int64) {
	t.Helper()
	waitFor(t, 15*time.Second, fmt.Sprintf("%d messages read", n), func() bool {
		if _, err := p.Next(context.Background()); err != nil {
			t.Fatal(err)
		}
		st := src.Stats()
		return st.Emitted+st.Rejected >= n
	})
}

// hangDeletes: every DeleteMessageBatch call waits for its context (a stalled connection).
type hangDeletes struct {
	*awssqs.Client
	entered chan struct{}
	once    sync.Once
}

func (c *hangDeletes) DeleteMessageBatch(ctx context.Context, _ *awssqs.DeleteMessageBatchInput, _ ...func(*awssqs.Options)) (*awssqs.DeleteMessageBatchOutput, error) {
	c.once.Do(func() { close(c.entered) })
	<-ctx.Done()
	return nil, ctx.Err()
}

// Close returns within its 20 s budget even when a delete call of the manager's round never
// answers (the SDK's HTTP client has no overall timeout), with an error that says what was
// not deleted.
func TestCloseReturnsWhileADeleteHangs(t *testing.T) {
	q := emu.MustQueue(t, "rv-hang", sqstest30())
	send(t, q, "1")
	client := &hangDeletes{Client: emu.Client, entered: make(chan struct{})}
	src := sqs.NewSource(client, q, func(m sqs.Message) (sqs.Message, error) { return m, nil },
		sqs.Consumers(1), sqs.WaitTime(time.Second), sqs.Logger(quiet))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	p := buildPartition(t, ctx, src)
	readN(t, p, src, 1)
	if err := p.Commit(ctx, p.Snapshot()); err != nil {
		t.Fatal(err)
	}
	<-client.entered
	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- p.Close() }()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "could not be deleted before Close") || strings.Contains(err.Error(), "<nil>") {
			t.Errorf("Close after %v: %v; want the undeleted messages and why", time.Since(start), err)
		}
	case <-time.After(25 * time.Second):
		cancel() // let the goroutines go
		<-done
		t.Fatal("Close still blocked after 25 s (its budget is 20 s)")
	}
}

// deleteFailSecond: the first DeleteMessageBatch call is slow (the manager is busy), the
// second fails (transient), the others go through.
type deleteFailSecond struct {
	*awssqs.Client
	n atomic.Int64
}

func (c *deleteFailSecond) DeleteMessageBatch(ctx context.Context, in *awssqs.DeleteMessageBatchInput, opts ...func(*awssqs.Options)) (*awssqs.DeleteMessageBatchOutput, error) {
	switch c.n.Add(1) {
	case 1:
		time.Sleep(2 * time.Second)
	case 2:
		return nil, errors.New("transient (injected)")
	}
	return c.Client.DeleteMessageBatch(ctx, in, opts...)
}

// A dead-letter send due in the same manager round as a delete call that fails still goes out,
// and the rejected message is then deleted.
func TestDeadLetterSurvivesAFailedDelete(t *testing.T) {
	q := emu.MustQueue(t, "rv-drop-src", sqstest30())
	dlq := emu.MustQueue(t, "rv-drop-dlq", sqstest30())
	client := &deleteFailSecond{Client: emu.Client}
	decode := func(m sqs.Message) (sqs.Message, error) {
		_, err := strconv.Atoi(m.Body)
		return m, err
	}
	src := sqs.NewSource(client, q, decode, sqs.Consumers(1), sqs.DeadLetter(dlq), sqs.WaitTime(time.Second), sqs.Logger(quiet))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	p := buildPartition(t, ctx, src)
	defer p.Close()
	send(t, q, "1")
	readN(t, p, src, 1)
	if err := p.Commit(ctx, p.Snapshot()); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "the first (slow) delete call", func() bool { return client.n.Load() >= 1 })
	// While the manager is in that call: a good message and a rejected one, both committed.
	send(t, q, "2", "bad")
	readN(t, p, src, 3)
	if err := p.Commit(ctx, p.Snapshot()); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the rejected message sent to the dead-letter queue and deleted", func() bool {
		st := src.Stats()
		return st.DeadLettered == 1 && st.Deleted == 3
	})
	if vis, _ := counts(t, dlq); vis != 1 {
		t.Errorf("the dead-letter queue holds %d messages, want 1", vis)
	}
}
