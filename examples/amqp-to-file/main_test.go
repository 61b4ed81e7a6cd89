package main

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"
)

// The test needs a RabbitMQ: EPOCHFLOW_AMQP_URL, or guest on 127.0.0.1:5672 (as
// scripts/services/rabbitmq starts it). Without one it fails.
func brokerURL() string {
	if u := os.Getenv("EPOCHFLOW_AMQP_URL"); u != "" {
		return u
	}
	return "amqp://guest:guest@127.0.0.1:5672/"
}

func channel(t *testing.T) (*amqp091.Connection, *amqp091.Channel) {
	t.Helper()
	conn, err := amqp091.Dial(brokerURL())
	if err != nil {
		t.Fatalf("RabbitMQ is needed (start it with scripts/services/rabbitmq): %v", err)
	}
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	return conn, ch
}

// newQueue declares a queue unique to this test, deleted at the end.
func newQueue(t *testing.T) string {
	t.Helper()
	name := fmt.Sprintf("epochflow-test-amqp-to-file-%d", rand.Uint32())
	conn, ch := channel(t)
	defer conn.Close()
	if _, err := ch.QueueDeclare(name, false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn, ch := channel(t)
		defer conn.Close()
		ch.QueueDelete(name, false, false, false)
	})
	return name
}

// publishNumbers publishes "0" .. "n-1", each with its number as message id, with confirms.
// Transient: the broker is not restarted in these tests, and persistence only adds the
// broker's disk writes, which is not what is tested here.
func publishNumbers(t *testing.T, queue string, n int) {
	t.Helper()
	conn, ch := channel(t)
	defer conn.Close()
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	var pending []*amqp091.DeferredConfirmation
	flush := func(keep int) {
		for len(pending) > keep {
			if !pending[0].Wait() {
				t.Fatal("publish nacked")
			}
			pending = pending[1:]
		}
	}
	for i := 0; i < n; i++ {
		s := strconv.Itoa(i)
		dc, err := ch.PublishWithDeferredConfirm("", queue, true, false, amqp091.Publishing{Body: []byte(s), MessageId: s})
		if err != nil {
			t.Fatal(err)
		}
		pending = append(pending, dc)
		if len(pending) >= 4096 {
			flush(2048)
		}
	}
	flush(0)
}

func queueReady(t *testing.T, queue string) int {
	t.Helper()
	conn, ch := channel(t)
	defer conn.Close()
	q, err := ch.QueueDeclarePassive(queue, false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	return q.Messages
}

// checkOutput reads the output and fails unless it holds "0" .. "n-1" exactly once each.
func checkOutput(t *testing.T, path string, n int) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	seen := make([]int, n)
	lines := strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
	for _, l := range lines {
		i, err := strconv.Atoi(l)
		if err != nil || i < 0 || i >= n {
			t.Fatalf("unexpected line %q", l)
		}
		seen[i]++
	}
	for i, c := range seen {
		if c != 1 {
			t.Fatalf("%d is in the output %d times (%d lines in all)", i, c, len(lines))
		}
	}
}

// Copying 100,000 numbered messages while the program is killed with SIGKILL at 20 random
// moments and restarted each time on the same recovery store, with one or two workers: in the
// end every number is in the file exactly once, and the queue is empty.
func TestCopySurvivesKill9(t *testing.T) {
	// Alongside TestBrokerRestartedTwice (after the other tests): a queue of its own.
	t.Parallel()
	const n = 100_000
	bin := buildBinary(t)
	q := newQueue(t)
	start := time.Now()
	publishNumbers(t, q, n)
	t.Logf("published %d messages in %v", n, time.Since(start))
	dir := t.TempDir()
	out, rec := filepath.Join(dir, "out.txt"), filepath.Join(dir, "store")
	var logs bytes.Buffer
	r := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 5))
	run := func() *exec.Cmd {
		// One or two workers (consumers), changing from run to run.
		cmd := flowCommand(bin, "-url", brokerURL(), "-queue", q, "-output", out, "-recovery", rec,
			"-workers", strconv.Itoa(1+r.IntN(2)), "-epoch-interval", "50ms", "-idle-exit", "1s", "-log-level", "warn")
		cmd.Stderr = &logs
		return cmd
	}
	defer func() {
		if t.Failed() {
			t.Logf("program output:\n%s", logs.String())
		}
	}()
	kills, finished, busyKills := 0, 0, 0
	start = time.Now()
	for kills < 20 {
		cmd := run()
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		wait := make(chan error, 1)
		go func() { wait <- cmd.Wait() }()
		select {
		case err := <-wait:
			if err != nil {
				t.Fatalf("run %d: %v", kills+finished, err)
			}
			finished++
		case <-time.After(time.Duration(100+r.IntN(600)) * time.Millisecond):
			if queueReady(t, q) > 0 {
				busyKills++
			}
			cmd.Process.Signal(syscall.SIGKILL)
			<-wait
			kills++
		}
	}
	if err := run().Run(); err != nil {
		t.Fatalf("last run: %v", err)
	}
	t.Logf("%d kills (%d while messages were waiting in the queue), %d runs finished on their own, %v",
		kills, busyKills, finished, time.Since(start))
	checkOutput(t, out, n)
	if r := queueReady(t, q); r != 0 {
		t.Fatalf("%d messages left in the queue", r)
	}
}

// With two workers (two consumers) the copy is complete; messages without a message id are
// written too; the program exits 0 once the queue is idle.
func TestCopyTwoWorkers(t *testing.T) {
	bin := buildBinary(t)
	q := newQueue(t)
	publishNumbers(t, q, 5000)
	conn, ch := channel(t)
	if err := ch.Publish("", q, true, false, amqp091.Publishing{Body: []byte("5000")}); err != nil { // no message id
		t.Fatal(err)
	}
	conn.Close()
	out := filepath.Join(t.TempDir(), "out.txt")
	cmd := flowCommand(bin, "-url", brokerURL(), "-queue", q, "-output", out, "-recovery", filepath.Join(t.TempDir(), "store"),
		"-workers", "2", "-epoch-interval", "20ms", "-idle-exit", "1s", "-log-level", "warn")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%v\n%s", err, b)
	}
	checkOutput(t, out, 5001)
	if r := queueReady(t, q); r != 0 {
		t.Fatalf("%d messages left in the queue", r)
	}
}

// A body with a line break stops the program with an error naming the queue and the message;
// the message stays in the queue.
func TestLineBreakFails(t *testing.T) {
	bin := buildBinary(t)
	q := newQueue(t)
	conn, ch := channel(t)
	if err := ch.Publish("", q, true, false, amqp091.Publishing{Body: []byte("a\nb"), MessageId: "m-1"}); err != nil {
		t.Fatal(err)
	}
	conn.Close()
	out := filepath.Join(t.TempDir(), "out.txt")
	cmd := flowCommand(bin, "-url", brokerURL(), "-queue", q, "-output", out, "-idle-exit", "1s", "-log-level", "warn")
	b, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("exit 0 on a body with a line break:\n%s", b)
	}
	for _, want := range []string{q, "message m-1", "line break"} {
		if !strings.Contains(string(b), want) {
			t.Errorf("output does not mention %q:\n%s", want, b)
		}
	}
	for deadline := time.Now().Add(20 * time.Second); queueReady(t, q) != 1; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d messages in the queue, want the 1 back", queueReady(t, q))
		}
	}
}

// flowCommand is exec.Command for a run of the example that is killed if it has not ended
// after 3 minutes: a run that hangs fails its test, with the error of the killed run, instead
// of stalling the package until the test binary's own timeout.
func flowCommand(bin string, args ...string) *exec.Cmd {
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(3*time.Minute, cancel)
	return exec.CommandContext(ctx, bin, args...)
}
