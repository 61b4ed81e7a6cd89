// Package sqstest runs the goaws SQS emulator (github.com/Admiral-Piett/goaws, v0.5.4) inside a
// test binary, for the tests of connectors/sqs and of the examples that use it.
//
// goaws keeps its queues in package-level variables, so there is one emulator per test binary:
// Start it once in TestMain (see Main) and give every test queues of its own (NewQueue).
//
// The emulator's gaps against real SQS (seen with v0.5.4): no ChangeMessageVisibilityBatch
// (it answers a plain-text 400), ApproximateReceiveCount stays 1, deleting with a stale receipt
// handle fails with a wrong code, and visibility timeouts are checked once a second.
//
// The client it returns is connectors/sqs.NewClient's for an endpoint, which hides the request
// body's io.WriterTo from the HTTP transport: on loopback goaws can answer before the request
// is fully written, and without the wrapper aws-sdk-go-v2 takes the early answer as a failed
// write and silently retries ReceiveMessage, whose first messages then come back after their
// visibility timeout, like a consumer bug.
//
// goaws reads its queue table without its lock in most actions; the emulator serves
// CreateQueue and DeleteQueue alone and waits out ReceiveMessage's long polls itself, so that
// the race detector sees no race inside goaws (see guard).
package sqstest

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/Admiral-Piett/goaws/app/gosqs"
	"github.com/Admiral-Piett/goaws/app/models"
	"github.com/Admiral-Piett/goaws/app/router"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/sirupsen/logrus"
	"go.uber.org/goleak"

	epsqs "github.com/epochflow/epochflow/connectors/sqs"
)

// Region is the region the emulator and its clients use.
const Region = "us-east-1"

// Emulator is a running goaws.
type Emulator struct {
	// URL is the endpoint, such as http://127.0.0.1:41234.
	URL string
	// Client is an SQS client of the emulator (see the package doc for its transport).
	Client *sqs.Client

	srv  *httptest.Server
	quit chan bool
	done chan struct{}
}

var (
	mu      sync.Mutex
	running *Emulator
	queues  atomic.Int64
)

// Start starts goaws on a loopback port with its visibility-expiry task (once a second) and
// returns it. Only one emulator may run at a time in a process: Start fails while another runs.
func Start() (*Emulator, error) {
	mu.Lock()
	defer mu.Unlock()
	if running != nil {
		return nil, fmt.Errorf("sqstest: an emulator is already running at %s (goaws state is per process)", running.URL)
	}
	logrus.SetOutput(io.Discard)
	logrus.SetLevel(logrus.PanicLevel)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("sqstest: listen: %w", err)
	}
	port := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
	models.CurrentEnvironment = models.Environment{
		Host: "127.0.0.1", Port: port, Region: Region, AccountID: "100010001000",
		EnableDuplicates: true,
		QueueAttributeDefaults: models.EnvQueueAttributes{
			VisibilityTimeout: 30, MaximumMessageSize: 262144,
		},
	}
	models.SyncQueues.Lock()
	models.SyncQueues.Queues = make(map[string]*models.Queue)
	models.SyncQueues.Unlock()
	srv := httptest.NewUnstartedServer(&guard{next: router.New()})
	srv.Listener.Close()
	srv.Listener = ln
	srv.Start()
	e := &Emulator{URL: srv.URL, srv: srv, quit: make(chan bool), done: make(chan struct{})}
	go func() {
		defer close(e.done)
		gosqs.PeriodicTasks(time.Second, e.quit)
	}()
	e.Client = NewClient(srv.URL)
	running = e
	return e, nil
}

// Close stops the emulator and drops its queues.
func (e *Emulator) Close() {
	mu.Lock()
	defer mu.Unlock()
	close(e.quit)
	<-e.done
	e.srv.CloseClientConnections()
	e.srv.Close()
	e.Client.Options().HTTPClient.(*http.Client).CloseIdleConnections()
	if running == e {
		running = nil
	}
}

// NewClient returns the client connectors/sqs.NewClient makes for the endpoint (with its
// transport that hides request bodies' io.WriterTo, see the package doc), in Region, with
// dummy credentials. It panics if the client cannot be made (a broken AWS configuration in the
// environment).
func NewClient(endpoint string) *sqs.Client {
	c, err := epsqs.NewClient(context.Background(), endpoint, config.WithRegion(Region),
		config.WithCredentialsProvider(credentials.NewStaticCredentialsProvider("x", "x", "")))
	if err != nil {
		panic(fmt.Sprintf("sqstest: %v", err))
	}
	return c
}

// QueueOptions says how NewQueue creates a queue.
type QueueOptions struct {
	// Visibility is the queue's visibility timeout; 0 means 30 s.
	Visibility time.Duration
	// FIFO makes a FIFO queue (its name ends in .fifo).
	FIFO bool
}

// NewQueue creates a queue with a name unique in the process (prefix plus a counter) and returns
// its URL.
func (e *Emulator) NewQueue(ctx context.Context, prefix string, opts QueueOptions) (string, error) {
	name := fmt.Sprintf("%s-%d", prefix, queues.Add(1))
	if opts.FIFO {
		name += ".fifo"
	}
	vis := opts.Visibility
	if vis == 0 {
		vis = 30 * time.Second
	}
	attrs := map[string]string{"VisibilityTimeout": strconv.Itoa(int(vis / time.Second))}
	if opts.FIFO {
		attrs["FifoQueue"] = "true"
	}
	out, err := e.Client.CreateQueue(ctx, &sqs.CreateQueueInput{QueueName: aws.String(name), Attributes: attrs})
	if err != nil {
		return "", fmt.Errorf("sqstest: create queue %s: %w", name, err)
	}
	return aws.ToString(out.QueueUrl), nil
}

// MustQueue is NewQueue for tests: it fails tb on error.
func (e *Emulator) MustQueue(tb testing.TB, prefix string, opts QueueOptions) string {
	tb.Helper()
	u, err := e.NewQueue(context.Background(), prefix, opts)
	if err != nil {
		tb.Fatal(err)
	}
	return u
}

// Counts returns how many messages the queue holds: visible ones and in-flight (received, not
// deleted) ones, read from the emulator's state directly (exact, unlike the approximate queue
// attributes of real SQS).
func (e *Emulator) Counts(queueURL string) (visible, inFlight int, err error) {
	models.SyncQueues.RLock()
	defer models.SyncQueues.RUnlock()
	for _, q := range models.SyncQueues.Queues {
		if q.URL != queueURL {
			continue
		}
		for _, m := range q.Messages {
			if m.ReceiptHandle != "" {
				inFlight++
			} else {
				visible++
			}
		}
		return visible, inFlight, nil
	}
	return 0, 0, fmt.Errorf("sqstest: no queue %s", queueURL)
}

// ExpireAll makes every in-flight message of the queue visible again at the emulator's next
// expiry check (within a second), as if the visibility timeout of a crashed consumer had run out.
func (e *Emulator) ExpireAll(queueURL string) error {
	models.SyncQueues.Lock()
	defer models.SyncQueues.Unlock()
	for _, q := range models.SyncQueues.Queues {
		if q.URL != queueURL {
			continue
		}
		past := time.Now().Add(-time.Second)
		for i := range q.Messages {
			if q.Messages[i].ReceiptHandle != "" {
				q.Messages[i].VisibilityTimeout = past
			}
		}
		return nil
	}
	return fmt.Errorf("sqstest: no queue %s", queueURL)
}

// SendBodies sends the bodies with SendMessageBatch, 10 per call, failing on any error; on a
// FIFO queue every message gets group group and a deduplication id of its body.
func (e *Emulator) SendBodies(ctx context.Context, queueURL, group string, bodies ...string) error {
	fifo := len(queueURL) > 5 && queueURL[len(queueURL)-5:] == ".fifo"
	for len(bodies) > 0 {
		n := min(10, len(bodies))
		var entries []types.SendMessageBatchRequestEntry
		for i, b := range bodies[:n] {
			en := types.SendMessageBatchRequestEntry{Id: aws.String(strconv.Itoa(i)), MessageBody: aws.String(b)}
			if fifo {
				en.MessageGroupId = aws.String(group)
				en.MessageDeduplicationId = aws.String(b)
			}
			entries = append(entries, en)
		}
		out, err := e.Client.SendMessageBatch(ctx, &sqs.SendMessageBatchInput{QueueUrl: aws.String(queueURL), Entries: entries})
		if err != nil {
			return fmt.Errorf("sqstest: send to %s: %w", queueURL, err)
		}
		if len(out.Failed) > 0 {
			return fmt.Errorf("sqstest: send to %s: %d entries failed: %s", queueURL, len(out.Failed), aws.ToString(out.Failed[0].Message))
		}
		bodies = bodies[n:]
	}
	return nil
}

// Main runs a test binary's tests with an emulator: it starts one, sets *e to it, runs m, stops
// it, then checks that no goroutine is left over (go.uber.org/goleak), and exits. Use it as
// TestMain's body. A failure to start the emulator fails the binary (it never skips).
func Main(m *testing.M, e **Emulator) {
	em, err := Start()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	*e = em
	code := m.Run()
	em.Close()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: goroutines left over after the tests: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}
