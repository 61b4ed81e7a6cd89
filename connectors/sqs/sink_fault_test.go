package sqs_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/epochflow/epochflow/connectors/file"
	"github.com/epochflow/epochflow/connectors/sqs"
	"github.com/epochflow/epochflow/dataflow"
	"github.com/epochflow/epochflow/internal/sqstest"
	"github.com/epochflow/epochflow/operators"
)

// Acceptance fault test of the sink (issue 9): a flow writes 50,000 items to a FIFO queue
// while the SQS endpoint (goaws) is restarted twice, a second down each time, once a quarter
// and once half of the items are in the queue. The flow keeps running: the sink retries the
// calls that failed (the connection cut under a call in flight, then refused), and logs a
// warning for each, at least one after each restart began. In the end the queue holds every
// item exactly once.
//
// What the sink promises (see the package doc): every message accepted before its epoch's
// Snapshot returns, at-least-once delivery, and on a FIFO queue a deterministic deduplication
// id per message, so that SQS drops a message sent again within its 5-minute window. A restart
// sends messages again: a SendMessageBatch whose answer the cut connection lost was stored by
// goaws and is sent again, with the same entries and ids. So the test uses a FIFO queue and
// asserts exactly once; on a standard queue the sink promises at least once, and such a resend
// would be a duplicate. goaws drops a FIFO duplicate only while the first copy is in the queue
// (a delete forgets its id), which holds here: nothing reads the queue until the flow ended.
// Each item is its own message group, so that the check at the end can receive every message
// without deleting any (goaws holds back a group while a message of it is in flight).
//
// The restart is of goaws's endpoint, not of its process (sqstest.Emulator.Restart closes the
// listener and every connection, and serves again on the same port): the queue survives
// because the emulator's process keeps running. goaws v0.5.4 keeps its queues in memory only,
// so a restarted process would come back without the queue and the messages already sent,
// which no restart of SQS does; what a client sees of a restarted SQS endpoint is connections
// cut, then refused, then accepted again by a service whose queues are unchanged, which is
// what Restart does. A process restart that kept the queue would need the emulator to save
// goaws's in-memory state and load it in the new process: the sink would see nothing
// different, and the test would exercise that copy rather than the sink.
//
// The emulator is a process of this test's own (sqstest.Start, not the package's shared one):
// the other tests must not see its restarts, and goaws, which scans a queue on some calls, is
// not instrumented by the race detector there.
func TestSinkEndpointRestartedTwice(t *testing.T) {
	const n = 50_000
	own, err := sqstest.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(own.Close)
	q := own.MustQueue(t, "sink-restart", sqstestQueue{Visibility: 30 * time.Second, FIFO: true})
	want := numbered("m", n)
	path := writeLines(t, want)

	warnings := &retryWarnings{}
	flow := dataflow.New("to-sqs-restarted")
	lines := operators.Input(flow, "read", file.Lines(path))
	msgs := operators.Map("msg", lines, func(l string) sqs.Outgoing { return sqs.Outgoing{Body: l, GroupID: l} })
	operators.Output("send", msgs, sqs.Send(own.Client, q, sqs.SinkLogger(slog.New(warnings))))
	done := make(chan error, 1)
	start := time.Now()
	go func() {
		done <- dataflow.Run(context.Background(), flow, dataflow.Options{Workers: 2, EpochInterval: 100 * time.Millisecond, Logger: quiet})
	}()

	// seen[i] is the count of retry warnings when restart i began; the last is at the end.
	var seen [3]int64
	for restart := range 2 {
		at := (restart + 1) * n / 4
		for deadline := time.Now().Add(3 * time.Minute); ; time.Sleep(20 * time.Millisecond) {
			vis, _, err := own.Counts(q)
			if err != nil {
				t.Fatal(err)
			}
			if vis >= at {
				break
			}
			select {
			case err := <-done:
				t.Fatalf("the flow ended (%v) before restart %d, with %d messages in the queue", err, restart+1, vis)
			default:
			}
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %d messages in the queue before restart %d (%d there)", at, restart+1, vis)
			}
		}
		seen[restart] = warnings.count()
		if err := own.Restart(time.Second); err != nil {
			t.Fatal(err)
		}
		t.Logf("restart %d at %d messages in the queue, %v after the start", restart+1, at, time.Since(start).Round(time.Millisecond))
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("the flow failed after the restarts: %v", err)
		}
	case <-time.After(5 * time.Minute):
		t.Fatal("the flow did not end within 5 minutes of the second restart")
	}
	seen[2] = warnings.count() // Run returned: every send, and so every warning, is done
	t.Logf("sent %d items with two endpoint restarts in %v; retry warnings: %d before restart 1, %d before restart 2, %d in all (first: %s)",
		n, time.Since(start).Round(time.Millisecond), seen[0], seen[1], seen[2], warnings.firstError())
	for i := range 2 {
		if seen[i+1] == seen[i] {
			t.Errorf("no retry warning of the sink between restart %d and %s: the restart went unnoticed",
				i+1, []string{"restart 2", "the end of the run"}[i])
		}
	}

	got := peekAll(t, own, q)
	var missing, doubled []string
	for _, b := range want {
		switch got[b] {
		case 0:
			missing = append(missing, b)
		case 1:
		default:
			doubled = append(doubled, fmt.Sprintf("%s×%d", b, got[b]))
		}
		delete(got, b)
	}
	if len(missing) > 0 || len(doubled) > 0 || len(got) > 0 {
		t.Fatalf("the queue holds %d of the items not at all (%s), %d more than once (%s), and %d other messages",
			len(missing), firstFew(missing), len(doubled), firstFew(doubled), len(got))
	}
}

// peekAll receives every message of queue q of emulator e without deleting any (each stays
// in flight for an hour) and returns how many times each body came.
func peekAll(t *testing.T, e *sqstest.Emulator, q string) map[string]int {
	t.Helper()
	got := map[string]int{}
	for {
		r, err := e.Client.ReceiveMessage(context.Background(), &awssqs.ReceiveMessageInput{QueueUrl: aws.String(q),
			MaxNumberOfMessages: 10, VisibilityTimeout: 3600})
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range r.Messages {
			got[aws.ToString(m.Body)]++
		}
		if len(r.Messages) > 0 {
			continue
		}
		vis, _, err := e.Counts(q)
		if err != nil {
			t.Fatal(err)
		}
		if vis == 0 {
			return got
		}
	}
}

func firstFew(s []string) string {
	if len(s) > 5 {
		return strings.Join(s[:5], " ") + " ..."
	}
	return strings.Join(s, " ")
}

// retryWarnings is a slog.Handler that counts the warnings of retried calls ("... retrying")
// and keeps the error of the first; it writes nothing.
type retryWarnings struct {
	n     atomic.Int64
	mu    sync.Mutex
	first string
}

func (h *retryWarnings) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }

func (h *retryWarnings) Handle(_ context.Context, r slog.Record) error {
	if !strings.Contains(r.Message, "retrying") {
		return nil
	}
	if h.n.Add(1) == 1 {
		r.Attrs(func(a slog.Attr) bool {
			if a.Key == "error" {
				h.mu.Lock()
				h.first = a.Value.String()
				h.mu.Unlock()
				return false
			}
			return true
		})
	}
	return nil
}

func (h *retryWarnings) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *retryWarnings) WithGroup(string) slog.Handler      { return h }

func (h *retryWarnings) count() int64 { return h.n.Load() }

func (h *retryWarnings) firstError() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.first
}
