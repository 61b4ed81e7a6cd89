package main

import (
	"bytes"
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

// publishRange publishes "from" .. "to-1", each with its number as message id.
func publishRange(t *testing.T, queue string, from, to int) {
	t.Helper()
	conn, ch := channel(t)
	defer conn.Close()
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	for i := from; i < to; i++ {
		s := strconv.Itoa(i)
		dc, err := ch.PublishWithDeferredConfirm("", queue, true, false, amqp091.Publishing{Body: []byte(s), MessageId: s})
		if err != nil {
			t.Fatal(err)
		}
		if !dc.Wait() {
			t.Fatal("publish nacked")
		}
	}
}

// waitQueue waits up to 30 s for the queue to hold want ready messages.
func waitQueue(t *testing.T, queue string, want int) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		got := queueReady(t, queue)
		if got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d messages ready in the queue, want %d", got, want)
		}
	}
}

// A second run without -recovery on the output of a first one is refused (exit 1) before any
// message is acknowledged: the error names the file and -output-exists, the file keeps the first
// run's 100 lines, and the queue still holds the 100 messages published for the second run.
// With -output-exists append, a third run adds them: 200 lines, each once.
func TestFreshRunKeepsEarlierOutput(t *testing.T) {
	bin := buildBinary(t)
	q := newQueue(t)
	out := filepath.Join(t.TempDir(), "out.txt")
	args := []string{"-url", brokerURL(), "-queue", q, "-output", out, "-epoch-interval", "50ms", "-idle-exit", "1s", "-log-level", "warn"}
	publishRange(t, q, 0, 100)
	if b, err := flowCommand(bin, args...).CombinedOutput(); err != nil {
		t.Fatalf("first run: %v\n%s", err, b)
	}
	checkOutput(t, out, 100)
	first, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}

	publishRange(t, q, 100, 200)
	b, err := flowCommand(bin, args...).CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 {
		t.Fatalf("second run on the first one's output: %v, want exit 1\n%s", err, b)
	}
	for _, want := range []string{out, "no recovery state", "recovery directory", "-output-exists replace", "-output-exists append"} {
		if !strings.Contains(string(b), want) {
			t.Errorf("the refusal does not say %q:\n%s", want, b)
		}
	}
	if strings.Contains(string(b), "OnExisting") {
		t.Errorf("the refusal names the Go option, not the flag:\n%s", b)
	}
	if now, err := os.ReadFile(out); err != nil || !bytes.Equal(now, first) {
		t.Fatalf("the refused run changed the output (%d bytes, were %d): %v", len(now), len(first), err)
	}
	waitQueue(t, q, 100) // nothing acknowledged: the second run's consumer gave them back

	if b, err := flowCommand(bin, append(args, "-output-exists", "append")...).CombinedOutput(); err != nil {
		t.Fatalf("run with -output-exists append: %v\n%s", err, b)
	}
	checkOutput(t, out, 200)
	if r := queueReady(t, q); r != 0 {
		t.Fatalf("%d messages left in the queue", r)
	}
	if b, err := flowCommand(bin, append(args, "-output-exists", "overwrite")...).CombinedOutput(); err == nil || !strings.Contains(string(b), "-output-exists") {
		t.Fatalf("-output-exists overwrite: %v\n%s", err, b)
	}
}

// Two amqp-to-file on one output file, each with its own recovery directory: the second is
// refused (exit 1) with an error naming the file while the first runs, and the first copies
// every message exactly once.
func TestSecondFlowOnTheSameOutputIsRefused(t *testing.T) {
	const n = 2000
	bin := buildBinary(t)
	q := newQueue(t)
	dir := t.TempDir()
	out := filepath.Join(dir, "out.txt")
	cmd := func(rec string, extra ...string) *exec.Cmd {
		return flowCommand(bin, append([]string{"-url", brokerURL(), "-queue", q, "-output", out, "-recovery", filepath.Join(dir, rec),
			"-epoch-interval", "50ms", "-log-level", "warn"}, extra...)...)
	}
	first := cmd("store1")
	var firstErr bytes.Buffer
	first.Stderr = &firstErr
	if err := first.Start(); err != nil {
		t.Fatal(err)
	}
	defer first.Process.Kill()
	wait := make(chan error, 1)
	go func() { wait <- first.Wait() }()
	// The first run holds the file once it has written to it.
	publishRange(t, q, 0, 1)
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if b, _ := os.ReadFile(out); string(b) == "0\n" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the first run wrote nothing within 60 s")
		}
	}
	// The second may replace the file, if it could: what refuses it is the lock.
	b, err := cmd("store2", "-idle-exit", "2s", "-output-exists", "replace").CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 || !strings.Contains(string(b), "in use") || !strings.Contains(string(b), out) {
		t.Fatalf("second flow on the same output: %v, want exit 1 with an error naming %s as in use\n%s", err, out, b)
	}
	publishRange(t, q, 1, n)
	for deadline := time.Now().Add(120 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		b, _ := os.ReadFile(out)
		if bytes.Count(b, []byte("\n")) >= n && queueReady(t, q) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the first run copied %d of %d lines within 120 s", bytes.Count(b, []byte("\n")), n)
		}
	}
	first.Process.Signal(syscall.SIGTERM)
	if err := <-wait; err != nil {
		t.Fatalf("first run: %v\n%s", err, firstErr.String())
	}
	checkOutput(t, out, n)
}
