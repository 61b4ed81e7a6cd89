package sqs_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/epochflow/epochflow/connectors/flowtest"
	"github.com/epochflow/epochflow/connectors/sqs"
	"github.com/epochflow/epochflow/dataflow"
	"github.com/epochflow/epochflow/operators"
	"github.com/epochflow/epochflow/recovery"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func numbered(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = prefix + strconv.Itoa(i)
	}
	return out
}

func send(t *testing.T, q string, bodies ...string) {
	t.Helper()
	if err := emu.SendBodies(context.Background(), q, "g", bodies...); err != nil {
		t.Fatal(err)
	}
}

func counts(t *testing.T, q string) (visible, inFlight int) {
	t.Helper()
	v, f, err := emu.Counts(q)
	if err != nil {
		t.Fatal(err)
	}
	return v, f
}

// waitFor polls cond (test code only) until it holds or the deadline passes.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	end := time.Now().Add(d)
	for !cond() {
		if time.Now().After(end) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func bodies(ms []sqs.Message) []string {
	out := make([]string, len(ms))
	for i, m := range ms {
		out[i] = m.Body
	}
	slices.Sort(out)
	return out
}

func runFlow(t *testing.T, src dataflow.Source[sqs.Message], sink *flowtest.Sink[sqs.Message], opts dataflow.Options) error {
	t.Helper()
	flow := dataflow.New("sqs-test")
	in := operators.Input(flow, "read", src)
	operators.Output("write", in, sink.Output())
	if opts.Logger == nil {
		opts.Logger = quiet
	}
	if opts.Recovery == nil {
		store, err := recovery.OpenSQLite(context.Background(), filepath.Join(t.TempDir(), "store"), recovery.SQLiteOptions{})
		if err != nil {
			t.Fatal(err)
		}
		defer store.Close()
		opts.Recovery = store
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	return dataflow.Run(ctx, flow, opts)
}

// During an epoch the messages read are invisible but still in the queue (and never more than
// MaxInFlight of them); once their epoch commits they are deleted.
func TestDeletesOnlyAfterCommit(t *testing.T) {
	q := emu.MustQueue(t, "commit", sqstest30())
	const n = 40
	send(t, q, numbered("m", n)...)
	sink := flowtest.NewSink[sqs.Message]()
	var mu sync.Mutex
	checked := 0
	hook := func(point string) bool {
		if point != "before-commit-record" {
			return false
		}
		mu.Lock()
		defer mu.Unlock()
		got := len(sink.Items())
		vis, fl := counts(t, q)
		if checked == 0 && got > 0 {
			// Nothing was committed yet: every message is still in the queue, and those the
			// flow has read are invisible.
			if vis+fl != n {
				t.Errorf("before the first commit: %d visible + %d in flight, want %d in the queue", vis, fl, n)
			}
			if fl < got {
				t.Errorf("before the first commit: %d messages read but only %d in flight", got, fl)
			}
			checked++
		}
		if fl > 15 {
			t.Errorf("%d messages in flight, over MaxInFlight 15", fl)
		}
		return false
	}
	src := sqs.NewSource(emu.Client, q, func(m sqs.Message) (sqs.Message, error) { return m, nil },
		sqs.IdleExit(2*time.Second), sqs.MaxInFlight(15), sqs.WaitTime(time.Second), sqs.Logger(quiet))
	if err := runFlow(t, src.Input(), sink, dataflow.Options{EpochInterval: 200 * time.Millisecond, CrashHook: hook}); err != nil {
		t.Fatal(err)
	}
	if checked == 0 {
		t.Fatal("the hook never saw an epoch with messages before its commit")
	}
	if got, want := bodies(sink.Items()), numbered("m", n); !slices.Equal(got, slices.Sorted(slices.Values(want))) {
		t.Fatalf("read %v, want %v", got, want)
	}
	if vis, fl := counts(t, q); vis+fl != 0 {
		t.Fatalf("after the run: %d visible, %d in flight; want an empty queue", vis, fl)
	}
	st := src.Stats()
	if st.Deleted != n || st.Received != n || st.StaleDeletes != 0 {
		t.Fatalf("stats %+v: want %d received and deleted, no stale deletes", st, n)
	}
}

func sqstest30() sqstestQueue { return sqstestQueue{Visibility: 30 * time.Second} }

// A run that crashes before its epoch is recorded as committed deletes nothing; once the
// visibility runs out the messages come back, and a resumed run reads and deletes them all.
func TestCrashBeforeCommitDeletesNothing(t *testing.T) {
	q := emu.MustQueue(t, "crash", sqstest30())
	const n = 30
	send(t, q, numbered("c", n)...)
	dir := t.TempDir()
	ctx := context.Background()
	store, err := recovery.OpenSQLite(ctx, filepath.Join(dir, "store"), recovery.SQLiteOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	sink := flowtest.NewSink[sqs.Message]()
	var crashed atomic.Bool
	hook := func(point string) bool {
		if point == "before-commit-record" && len(sink.Items()) > 0 {
			crashed.Store(true)
			return true
		}
		return false
	}
	src := sqs.NewSource(emu.Client, q, func(m sqs.Message) (sqs.Message, error) { return m, nil },
		sqs.WaitTime(time.Second), sqs.Logger(quiet))
	err = runFlow(t, src.Input(), sink, dataflow.Options{EpochInterval: 200 * time.Millisecond, CrashHook: hook, Recovery: store})
	if !errors.Is(err, dataflow.ErrCrashed) {
		t.Fatalf("run: %v, want a crash", err)
	}
	read := len(sink.Items())
	vis, fl := counts(t, q)
	if vis+fl != n || fl < read {
		t.Fatalf("after the crash: %d visible, %d in flight, %d read; want all %d still in the queue, the read ones in flight", vis, fl, read, n)
	}
	if st := src.Stats(); st.Deleted != 0 {
		t.Fatalf("%d messages deleted by a run that never committed", st.Deleted)
	}
	// The crashed consumer's messages come back when their visibility runs out.
	if err := emu.ExpireAll(q); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the messages to come back", func() bool { v, _ := counts(t, q); return v == n })

	sink2 := flowtest.NewSink[sqs.Message]()
	src2 := sqs.NewSource(emu.Client, q, func(m sqs.Message) (sqs.Message, error) { return m, nil },
		sqs.WaitTime(time.Second), sqs.IdleExit(2*time.Second), sqs.Logger(quiet))
	// Two workers now: two consumers of the queue (a resume may add partitions).
	if err := runFlow(t, src2.Input(), sink2, dataflow.Options{EpochInterval: 200 * time.Millisecond, Recovery: store, Workers: 2}); err != nil {
		t.Fatal(err)
	}
	if got, want := bodies(sink2.Items()), slices.Sorted(slices.Values(numbered("c", n))); !slices.Equal(got, want) {
		t.Fatalf("resumed run read %v, want %v", got, want)
	}
	if vis, fl := counts(t, q); vis+fl != 0 {
		t.Fatalf("after the resumed run: %d visible, %d in flight; want an empty queue", vis, fl)
	}
}

// extensionRun reads n messages from a queue whose visibility (2 s) is much shorter than the
// epoch (6 s): the source must extend their visibility, or goaws (which checks expiry every
// second) hands them out again.
func extensionRun(t *testing.T, client sqs.API, q string, n int) (*sqs.Source[sqs.Message], []sqs.Message) {
	t.Helper()
	send(t, q, numbered("v", n)...)
	sink := flowtest.NewSink[sqs.Message]()
	src := sqs.NewSource(client, q, func(m sqs.Message) (sqs.Message, error) { return m, nil },
		sqs.WaitTime(time.Second), sqs.IdleExit(5*time.Second), sqs.Logger(quiet))
	if err := runFlow(t, src.Input(), sink, dataflow.Options{EpochInterval: 8 * time.Second}); err != nil {
		t.Fatal(err)
	}
	items := sink.Items()
	seen := map[string]int{}
	for _, m := range items {
		seen[m.ID]++
		if seen[m.ID] > 1 {
			t.Errorf("message %s (%s) delivered twice", m.ID, m.Body)
		}
	}
	if got, want := bodies(items), slices.Sorted(slices.Values(numbered("v", n))); !slices.Equal(slices.Compact(got), want) {
		t.Fatalf("read %d messages, want the %d sent", len(items), n)
	}
	if vis, fl := counts(t, q); vis+fl != 0 {
		t.Fatalf("after the run: %d visible, %d in flight; want an empty queue; stats %+v", vis, fl, src.Stats())
	}
	return src, items
}

// With a visibility timeout shorter than the epoch, no message is delivered twice: the source
// extends the visibility of the messages in flight. goaws has no ChangeMessageVisibilityBatch,
// so this is the fallback to single ChangeMessageVisibility calls.
func TestVisibilityExtendedSingleCalls(t *testing.T) {
	q := emu.MustQueue(t, "extend", sqstestQueue{Visibility: 3 * time.Second})
	src, _ := extensionRun(t, emu.Client, q, 30)
	st := src.Stats()
	if !st.SingleVisibilityCalls {
		t.Error("the source did not fall back to single ChangeMessageVisibility calls")
	}
	if st.Extended < 30 || st.VisibilityLost != 0 {
		t.Errorf("stats %+v: want every message extended, none lost", st)
	}
}

// batchVisibility adds ChangeMessageVisibilityBatch to goaws as real SQS has it (one
// ChangeMessageVisibility per entry), and fails every fifth entry once with a server fault so that
// the retry path runs too.
type batchVisibility struct {
	*awssqs.Client
	calls, failed atomic.Int64
}

func (b *batchVisibility) ChangeMessageVisibilityBatch(ctx context.Context, in *awssqs.ChangeMessageVisibilityBatchInput, _ ...func(*awssqs.Options)) (*awssqs.ChangeMessageVisibilityBatchOutput, error) {
	n := b.calls.Add(1)
	out := &awssqs.ChangeMessageVisibilityBatchOutput{}
	for i, e := range in.Entries {
		if (n+int64(i))%5 == 0 && e.VisibilityTimeout > 0 {
			b.failed.Add(1)
			out.Failed = append(out.Failed, types.BatchResultErrorEntry{Id: e.Id, Code: aws.String("InternalError"), Message: aws.String("test fault")})
			continue
		}
		_, err := b.Client.ChangeMessageVisibility(ctx, &awssqs.ChangeMessageVisibilityInput{QueueUrl: in.QueueUrl, ReceiptHandle: e.ReceiptHandle, VisibilityTimeout: e.VisibilityTimeout})
		if err != nil {
			out.Failed = append(out.Failed, types.BatchResultErrorEntry{Id: e.Id, Code: aws.String("MessageNotInFlight"), Message: aws.String(err.Error()), SenderFault: true})
			continue
		}
		out.Successful = append(out.Successful, types.ChangeMessageVisibilityBatchResultEntry{Id: e.Id})
	}
	return out, nil
}

// The same through ChangeMessageVisibilityBatch (a stub over goaws), with failed entries retried.
func TestVisibilityExtendedBatch(t *testing.T) {
	q := emu.MustQueue(t, "extend-batch", sqstestQueue{Visibility: 3 * time.Second})
	stub := &batchVisibility{Client: emu.Client}
	src, _ := extensionRun(t, stub, q, 30)
	st := src.Stats()
	if st.SingleVisibilityCalls {
		t.Error("the source fell back to single calls though the batch call works")
	}
	if stub.calls.Load() == 0 || stub.failed.Load() == 0 || st.ExtendRetries == 0 {
		t.Errorf("batch calls %d, failed entries %d, retries %d: want all > 0", stub.calls.Load(), stub.failed.Load(), st.ExtendRetries)
	}
	if st.VisibilityLost != 0 {
		t.Errorf("stats %+v: want no message lost", st)
	}
}

// A message whose visibility ran out during its epoch comes again (at-least-once); the delete
// of its stale receipt handle is counted, not fatal, and the queue ends empty.
func TestStaleReceiptHandle(t *testing.T) {
	q := emu.MustQueue(t, "stale", sqstest30())
	const n = 10
	send(t, q, numbered("s", n)...)
	sink := flowtest.NewSink[sqs.Message]()
	var once sync.Once
	hook := func(point string) bool {
		if point == "after-snapshot" && len(sink.Items()) > 0 {
			once.Do(func() {
				if err := emu.ExpireAll(q); err != nil {
					t.Error(err)
				}
				// goaws makes them visible at its next once-a-second check.
				time.Sleep(1500 * time.Millisecond)
			})
		}
		return false
	}
	src := sqs.NewSource(emu.Client, q, func(m sqs.Message) (sqs.Message, error) { return m, nil },
		sqs.WaitTime(time.Second), sqs.IdleExit(3*time.Second), sqs.Logger(quiet))
	if err := runFlow(t, src.Input(), sink, dataflow.Options{EpochInterval: 300 * time.Millisecond, CrashHook: hook}); err != nil {
		t.Fatal(err)
	}
	st := src.Stats()
	if st.StaleDeletes == 0 {
		t.Errorf("stats %+v: want stale deletes counted", st)
	}
	if got := slices.Compact(bodies(sink.Items())); !slices.Equal(got, slices.Sorted(slices.Values(numbered("s", n)))) {
		t.Errorf("read %v, want every message at least once", got)
	}
	if vis, fl := counts(t, q); vis+fl != 0 {
		t.Fatalf("after the run: %d visible, %d in flight; want an empty queue", vis, fl)
	}
}

// A message the decode function rejects stops the flow, without a dead-letter queue, with an
// error naming the queue and the message id; the message stays in the queue.
func TestPoisonWithoutDeadLetter(t *testing.T) {
	q := emu.MustQueue(t, "poison", sqstest30())
	send(t, q, "ok1", "bad", "ok2")
	decode := func(m sqs.Message) (string, error) {
		if m.Body == "bad" {
			return "", errors.New("not a number")
		}
		return m.Body, nil
	}
	src := sqs.NewSource(emu.Client, q, decode, sqs.WaitTime(time.Second), sqs.IdleExit(2*time.Second), sqs.Logger(quiet))
	flow := dataflow.New("poison")
	operators.Output("write", operators.Input(flow, "read", src.Input()), flowtest.NewSink[string]().Output())
	err := dataflow.Run(context.Background(), flow, dataflow.Options{EpochInterval: 100 * time.Millisecond, Logger: quiet})
	if err == nil {
		t.Fatal("the flow ran through a rejected message")
	}
	for _, want := range []string{q, "not a number", "dead-letter"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %q", err, want)
		}
	}
	if !regexpMessageID(err.Error()) {
		t.Errorf("error %q names no message id", err)
	}
	if !dataflow.IsPermanent(err) {
		t.Errorf("error %q is not marked permanent: a restart would read the message and fail again", err)
	}
	waitFor(t, 5*time.Second, "the rejected message to be in the queue", func() bool {
		v, f := counts(t, q)
		return v+f >= 1
	})
}

func regexpMessageID(s string) bool {
	return strings.Contains(s, "message ") && strings.Count(s, "-") >= 4
}

// With a dead-letter queue, a rejected message goes there with its attributes and the error,
// and is deleted from the source queue once its epoch commits; the others flow on.
func TestPoisonToDeadLetter(t *testing.T) {
	q := emu.MustQueue(t, "poison-src", sqstest30())
	dlq := emu.MustQueue(t, "poison-dlq", sqstest30())
	ctx := context.Background()
	if _, err := emu.Client.SendMessage(ctx, &awssqs.SendMessageInput{QueueUrl: &q, MessageBody: aws.String("bad"),
		MessageAttributes: map[string]types.MessageAttributeValue{"origin": {DataType: aws.String("String"), StringValue: aws.String("test")}}}); err != nil {
		t.Fatal(err)
	}
	send(t, q, "1", "2", "3")
	decode := func(m sqs.Message) (int, error) { return strconv.Atoi(m.Body) }
	src := sqs.NewSource(emu.Client, q, decode, sqs.DeadLetter(dlq), sqs.WaitTime(time.Second), sqs.IdleExit(2*time.Second), sqs.Logger(quiet))
	sink := flowtest.NewSink[int]()
	flow := dataflow.New("poison-dlq")
	operators.Output("write", operators.Input(flow, "read", src.Input()), sink.Output())
	if err := dataflow.Run(ctx, flow, dataflow.Options{EpochInterval: 100 * time.Millisecond, Logger: quiet}); err != nil {
		t.Fatal(err)
	}
	if got := slices.Sorted(slices.Values(sink.Items())); !slices.Equal(got, []int{1, 2, 3}) {
		t.Errorf("flow got %v, want [1 2 3]", got)
	}
	if v, f := counts(t, q); v+f != 0 {
		t.Errorf("source queue holds %d+%d messages, want none", v, f)
	}
	out, err := emu.Client.ReceiveMessage(ctx, &awssqs.ReceiveMessageInput{QueueUrl: &dlq, MaxNumberOfMessages: 10, WaitTimeSeconds: 1, MessageAttributeNames: []string{"All"}})
	if err != nil {
		t.Fatal(err)
	}
	if len(out.Messages) != 1 || aws.ToString(out.Messages[0].Body) != "bad" {
		t.Fatalf("dead-letter queue holds %d messages, want the one rejected", len(out.Messages))
	}
	attrs := out.Messages[0].MessageAttributes
	if aws.ToString(attrs["origin"].StringValue) != "test" || !strings.Contains(aws.ToString(attrs[sqs.ErrorAttribute].StringValue), "invalid syntax") {
		t.Errorf("dead-letter attributes %v: want origin=test and the error", attrs)
	}
	if st := src.Stats(); st.Rejected != 1 || st.DeadLettered != 1 || st.Deleted != 4 {
		t.Errorf("stats %+v: want 1 rejected, 1 dead-lettered, 4 deleted", st)
	}
}

// The flow sees the message attributes, the receive count and the raw message, not just the body.
func TestMessageFields(t *testing.T) {
	q := emu.MustQueue(t, "fields", sqstest30())
	ctx := context.Background()
	if _, err := emu.Client.SendMessage(ctx, &awssqs.SendMessageInput{QueueUrl: &q, MessageBody: aws.String("hello"),
		MessageAttributes: map[string]types.MessageAttributeValue{"k": {DataType: aws.String("String"), StringValue: aws.String("v")}}}); err != nil {
		t.Fatal(err)
	}
	sink := flowtest.NewSink[sqs.Message]()
	if err := runFlow(t, sqs.Receive(emu.Client, q, sqs.WaitTime(time.Second), sqs.IdleExit(time.Second), sqs.Logger(quiet)), sink,
		dataflow.Options{EpochInterval: 100 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	items := sink.Items()
	if len(items) != 1 {
		t.Fatalf("got %d messages, want 1", len(items))
	}
	m := items[0]
	if m.Body != "hello" || m.ID == "" || m.ID != aws.ToString(m.Raw.MessageId) || m.Queue != q {
		t.Errorf("message %+v", m)
	}
	if aws.ToString(m.Attributes["k"].StringValue) != "v" {
		t.Errorf("attributes %v, want k=v", m.Attributes)
	}
	if m.ReceiveCount != 1 || m.SystemAttributes["SentTimestamp"] == "" {
		t.Errorf("receive count %d, system attributes %v", m.ReceiveCount, m.SystemAttributes)
	}
}

// On a FIFO queue the order of every message group is kept (within a worker: goaws does not lock
// a group while its messages are in flight, as SQS does, so two consumers could share a group).
func TestFIFOOrder(t *testing.T) {
	q := emu.MustQueue(t, "order", sqstestQueue{Visibility: 30 * time.Second, FIFO: true})
	ctx := context.Background()
	const groups, per = 3, 30
	for g := range groups {
		var bs []string
		for i := range per {
			bs = append(bs, fmt.Sprintf("g%d-%03d", g, i))
		}
		if err := emu.SendBodies(ctx, q, "g"+strconv.Itoa(g), bs...); err != nil {
			t.Fatal(err)
		}
	}
	sink := flowtest.NewSink[sqs.Message]()
	if err := runFlow(t, sqs.Receive(emu.Client, q, sqs.WaitTime(time.Second), sqs.IdleExit(2*time.Second), sqs.Logger(quiet)), sink,
		dataflow.Options{EpochInterval: 100 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	last := map[string]string{}
	for _, m := range sink.Items() {
		g, _, _ := strings.Cut(m.Body, "-") // goaws does not return the MessageGroupId attribute
		if m.Body <= last[g] {
			t.Fatalf("group %s: %s after %s", g, m.Body, last[g])
		}
		last[g] = m.Body
	}
	if len(sink.Items()) != groups*per {
		t.Fatalf("read %d messages, want %d", len(sink.Items()), groups*per)
	}
}

// Bad configuration fails at start, naming the queue.
func TestBadConfig(t *testing.T) {
	for name, src := range map[string]dataflow.Source[sqs.Message]{
		"missing queue": sqs.Receive(emu.Client, emu.URL+"/100010001000/no-such-queue"),
		"bad option":    sqs.Receive(emu.Client, "q", sqs.MaxInFlight(0)),
		"bad dlq":       sqs.Receive(emu.Client, emu.MustQueue(t, "cfg", sqstest30()), sqs.DeadLetter(emu.URL+"/100010001000/no-dlq")),
	} {
		err := runFlow(t, src, flowtest.NewSink[sqs.Message](), dataflow.Options{})
		if err == nil {
			t.Errorf("%s: the flow started", name)
			continue
		}
		t.Logf("%s: %v", name, err)
	}
}

// countingReceives counts ReceiveMessage calls.
type countingReceives struct {
	*awssqs.Client
	n atomic.Int64
}

func (c *countingReceives) ReceiveMessage(ctx context.Context, in *awssqs.ReceiveMessageInput, opts ...func(*awssqs.Options)) (*awssqs.ReceiveMessageOutput, error) {
	c.n.Add(1)
	return c.Client.ReceiveMessage(ctx, in, opts...)
}

// On an empty queue the source long-polls: one receive per wait time, no polling loop; and a
// message that arrives is read at once.
func TestIdleLongPolls(t *testing.T) {
	q := emu.MustQueue(t, "idle", sqstest30())
	client := &countingReceives{Client: emu.Client}
	sink := flowtest.NewSink[sqs.Message]()
	stop := make(chan struct{})
	go func() {
		defer close(stop)
		time.Sleep(3 * time.Second)
		if err := emu.SendBodies(context.Background(), q, "", "late"); err != nil {
			t.Error(err)
			return
		}
		for end := time.Now().Add(10 * time.Second); len(sink.Items()) == 0 && time.Now().Before(end); {
			time.Sleep(10 * time.Millisecond)
		}
	}()
	if err := runFlow(t, sqs.Receive(client, q, sqs.WaitTime(time.Second), sqs.Logger(quiet)), sink,
		dataflow.Options{EpochInterval: 100 * time.Millisecond, Stop: stop}); err != nil {
		t.Fatal(err)
	}
	if len(sink.Items()) != 1 {
		t.Fatalf("read %d messages, want the late one", len(sink.Items()))
	}
	// About 3 s idle with 1 s long polls: 3 or 4 receives, and a few for the message.
	if n := client.n.Load(); n > 10 {
		t.Errorf("%d receives in about 3 s of idleness with 1 s long polls", n)
	}
	if vis, fl := counts(t, q); vis+fl != 0 {
		t.Errorf("after the stop: %d visible, %d in flight", vis, fl)
	}
}
