// Package sqstest runs the goaws SQS emulator (github.com/Admiral-Piett/goaws, v0.5.4) for the
// tests of connectors/sqs and of the examples that use it.
//
// The emulator is a process of its own (internal/sqstest/sqsemu, built with go build, without
// the race detector, when Start is called): goaws scans a whole queue on every call, and served
// from a test binary built with -race it was the slowest part of the SQS tests. It serves on a
// loopback port for as long as the test process lives (it ends when its standard input does);
// Restart, Counts and ExpireAll reach it through a control endpoint of its own
// (internal/sqstest/emulator). Start it once in TestMain (see Main) and give every test queues of
// its own (NewQueue).
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
package sqstest

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"go.uber.org/goleak"

	epsqs "github.com/epochflow/epochflow/connectors/sqs"
	"github.com/epochflow/epochflow/internal/sqstest/emulator"
)

// Region is the region the emulator and its clients use.
const Region = emulator.Region

// emulatorPackage is the command that Start builds and runs.
const emulatorPackage = "github.com/epochflow/epochflow/internal/sqstest/sqsemu"

// Emulator is a running goaws process.
type Emulator struct {
	// URL is the endpoint, such as http://127.0.0.1:41234.
	URL string
	// Client is an SQS client of the emulator (see the package doc for its transport).
	Client *sqs.Client

	// In this process (StartInProcess):
	srv *emulator.Server

	// In a process of its own (Start):
	control string       // base URL of the control endpoint
	http    *http.Client // for the control endpoint
	cmd     *exec.Cmd
	stdin   *os.File // the emulator ends when this is closed
	exited  chan error
	dir     string // holds the binary
}

var queues atomic.Int64

// Start builds the emulator (go build, so it needs the go command and this module's source,
// as go test does) and starts it on a loopback port with its visibility-expiry task (once a
// second). Each call starts a process of its own, with queues of its own.
func Start() (*Emulator, error) {
	dir, err := os.MkdirTemp("", "sqstest-")
	if err != nil {
		return nil, fmt.Errorf("sqstest: temporary directory for the emulator: %w", err)
	}
	e, err := start(dir)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return e, nil
}

// StartInProcess serves goaws from this process instead (internal/sqstest/emulator), as this
// package did before the emulator had a process of its own: under go test -race, goaws is then
// instrumented too, and much slower. Only one such emulator may run at a time in a process.
func StartInProcess() (*Emulator, error) {
	srv, err := emulator.Start("127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("sqstest: %w", err)
	}
	return &Emulator{URL: srv.URL, Client: NewClient(srv.URL), srv: srv}, nil
}

func start(dir string) (*Emulator, error) {
	bin := filepath.Join(dir, "sqsemu")
	if out, err := exec.Command("go", "build", "-o", bin, emulatorPackage).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("sqstest: go build %s: %w\n%s", emulatorPackage, err, out)
	}
	inR, inW, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("sqstest: pipe for the emulator's stdin: %w", err)
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		inR.Close()
		inW.Close()
		return nil, fmt.Errorf("sqstest: pipe for the emulator's stdout: %w", err)
	}
	cmd := exec.Command(bin)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = inR, outW, os.Stderr
	err = cmd.Start()
	inR.Close()
	outW.Close()
	if err != nil {
		inW.Close()
		outR.Close()
		return nil, fmt.Errorf("sqstest: start the emulator: %w", err)
	}
	e := &Emulator{http: &http.Client{}, cmd: cmd, stdin: inW, exited: make(chan error, 1), dir: dir}
	go func() { e.exited <- cmd.Wait() }()

	// The emulator writes its addresses in one line once it serves; the rest of its output (none
	// is expected) goes to the test's stderr until it ends.
	line := make(chan string, 1)
	stderr := os.Stderr // read here: testing.M.Run may set os.Stderr while the goroutine runs
	go func() {
		defer outR.Close()
		r := bufio.NewReader(outR)
		l, _ := r.ReadString('\n')
		line <- l
		_, _ = io.Copy(stderr, r)
	}()
	var l string
	select {
	case l = <-line:
	case <-time.After(time.Minute):
		e.kill()
		return nil, errors.New("sqstest: the emulator did not say where it serves within a minute")
	}
	for _, f := range strings.Fields(l) {
		k, v, _ := strings.Cut(f, "=")
		switch k {
		case "sqs":
			e.URL = v
		case "control":
			e.control = v
		}
	}
	if e.URL == "" || e.control == "" {
		err := e.kill()
		return nil, fmt.Errorf("sqstest: the emulator's first line is %q, want sqs=URL control=URL (exit: %v)", l, err)
	}
	e.Client = NewClient(e.URL)
	return e, nil
}

// kill ends the emulator at once and returns how it exited.
func (e *Emulator) kill() error {
	e.stdin.Close()
	e.cmd.Process.Kill()
	return <-e.exited
}

// Restart closes the emulator's HTTP listener and every connection to it, waits down, and
// serves again on the same port, as a restarted SQS endpoint would: the queues and their
// messages stay as they were, and the visibility timeouts go on running meanwhile. Requests
// during the gap fail to connect. It returns once the endpoint serves again.
func (e *Emulator) Restart(down time.Duration) error {
	if e.srv != nil {
		return e.srv.Restart(down)
	}
	ctx, cancel := context.WithTimeout(context.Background(), down+time.Minute)
	defer cancel()
	_, err := e.call(ctx, http.MethodPost, "/restart?down="+url.QueryEscape(down.String()))
	return err
}

// Close stops the emulator (its queues end with it) and removes its binary.
func (e *Emulator) Close() {
	e.Client.Options().HTTPClient.(*http.Client).CloseIdleConnections()
	if e.srv != nil {
		e.srv.Close()
		return
	}
	e.http.CloseIdleConnections()
	e.stdin.Close()
	select {
	case <-e.exited:
	case <-time.After(10 * time.Second):
		e.cmd.Process.Kill()
		<-e.exited
	}
	os.RemoveAll(e.dir)
}

// call sends a request to the control endpoint and returns the body of its answer, or an
// error with the body of a failure.
func (e *Emulator) call(ctx context.Context, method, path string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, method, e.control+path, nil)
	if err != nil {
		return nil, fmt.Errorf("sqstest: %s %s: %w", method, path, err)
	}
	resp, err := e.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("sqstest: %s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("sqstest: %s %s: read the answer: %w", method, path, err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("sqstest: %s %s: %s: %s", method, path, resp.Status, strings.TrimSpace(string(body)))
	}
	return body, nil
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
	if e.srv != nil {
		return e.srv.Counts(queueURL)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	body, err := e.call(ctx, http.MethodGet, "/counts?queue="+url.QueryEscape(queueURL))
	if err != nil {
		return 0, 0, err
	}
	var c emulator.CountsReply
	if err := json.Unmarshal(body, &c); err != nil {
		return 0, 0, fmt.Errorf("sqstest: counts of %s: %w", queueURL, err)
	}
	return c.Visible, c.InFlight, nil
}

// ExpireAll makes every in-flight message of the queue visible again at the emulator's next
// expiry check (within a second), as if the visibility timeout of a crashed consumer had run out.
func (e *Emulator) ExpireAll(queueURL string) error {
	if e.srv != nil {
		return e.srv.ExpireAll(queueURL)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err := e.call(ctx, http.MethodPost, "/expire?queue="+url.QueryEscape(queueURL))
	return err
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

// Main runs a test binary's tests with an emulator (Start): it starts one, sets *e to it, runs
// m, stops it, runs the cleanups, then checks that no goroutine is left over
// (go.uber.org/goleak), and exits. Use it as TestMain's body. A failure to start the emulator
// fails the binary (it never skips).
func Main(m *testing.M, e **Emulator, cleanups ...func()) {
	mainWith(Start, m, e, cleanups)
}

// MainInProcess is Main with an emulator served from the test process (StartInProcess).
func MainInProcess(m *testing.M, e **Emulator, cleanups ...func()) {
	mainWith(StartInProcess, m, e, cleanups)
}

func mainWith(start func() (*Emulator, error), m *testing.M, e **Emulator, cleanups []func()) {
	em, err := start()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	*e = em
	code := m.Run()
	em.Close()
	for _, c := range cleanups {
		c()
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: goroutines left over after the tests: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}
