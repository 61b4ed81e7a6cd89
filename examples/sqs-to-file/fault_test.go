package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/epochflow/epochflow/internal/sqstest"
)

// lineCount counts the lines of a file (0 if it does not exist yet).
func lineCount(path string) int {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	return bytes.Count(b, []byte("\n"))
}

// Acceptance fault test: the SQS endpoint (goaws, an emulator of this test's own) is restarted
// twice, its listener closed and every connection cut, for a second each time, while
// sqs-to-file copies 50,000 messages; its state stays, as real SQS's would. The program keeps
// running (failed receives and deletes are retried with back-off), and in the end every message
// is in the file exactly once and the queue is empty. That the program noticed each restart is
// shown by its own words: at least one warning of a failed call that it retries (a receive, a
// delete, an extension) comes after each restart began and before the next one (or the end),
// and the counters line at the end counts failed calls.
//
// The restart is of goaws's endpoint, not of its process (see sqstest.Emulator.Restart): the
// sqsemu process keeps running, and the queue survives because it does. goaws v0.5.4 keeps its
// queues in memory only, so a restarted process would come back without the queue and its
// messages, which no SQS restart does; what a client sees of a restarted SQS endpoint is
// connections cut, then refused, then accepted again by a service whose queues are unchanged,
// and that is what Restart does. A process restart that kept the queue would need the
// emulator to save goaws's in-memory state and load it in the new process: the program would
// see nothing different, and the test would exercise that copy rather than the program.
//
// goaws scans its whole queue on every call, so the copy takes a minute or more on a loaded
// machine: this run is not bound by the examples' 3-minute limit but by the test's own
// deadlines, and is killed when the test ends.
func TestEndpointRestartedTwice(t *testing.T) {
	t.Parallel()
	const n = 50_000
	bin := buildBinary(t)
	// An emulator of its own: the other tests, running alongside, must not see its restarts.
	own, err := sqstest.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(own.Close)
	queue := own.MustQueue(t, "restart", sqstest.QueueOptions{Visibility: 5 * time.Second})
	start := time.Now()
	want := sendNumberedTo(t, own, queue, n)
	t.Logf("sent %d messages in %v", n, time.Since(start))
	dir := t.TempDir()
	out := filepath.Join(dir, "out.txt")
	limited := commandOn(own, bin, queue, out, filepath.Join(dir, "rec"), 8*time.Second)
	cmd := exec.Command(limited.Path, limited.Args[1:]...)
	setFlag(cmd, "-log-level", "info") // the retry warnings and the counters line
	logs := &programLog{}
	cmd.Env, cmd.Stderr = limited.Env, logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill() })
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	defer func() {
		if t.Failed() {
			t.Logf("the program's last lines:\n%s", logs.Tail())
		}
	}()
	start = time.Now()
	// retries[i] is the count of retry warnings when restart i began; the last is at the end.
	var retries [3]int
	for restart := range 2 {
		at := (restart + 1) * n / 4
		for deadline := time.Now().Add(4 * time.Minute); lineCount(out) < at; time.Sleep(20 * time.Millisecond) {
			select {
			case err := <-done:
				t.Fatalf("the program ended (%v) before restart %d, at %d lines", err, restart+1, lineCount(out))
			default:
			}
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %d lines before restart %d", at, restart+1)
			}
		}
		retries[restart] = logs.Retries()
		if err := own.Restart(time.Second); err != nil {
			t.Fatal(err)
		}
		t.Logf("restart %d at %d lines", restart+1, at)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("the program failed after the restarts: %v", err)
		}
	case <-time.After(5 * time.Minute):
		t.Fatalf("the program did not exit within 5 minutes of the second restart; %d lines", lineCount(out))
	}
	retries[2] = logs.Retries() // Wait returned: everything the program wrote is counted
	t.Logf("copied %d messages with two endpoint restarts in %v", n, time.Since(start))
	checkOutputOn(t, own, out, queue, want)
	for i := range 2 {
		if retries[i+1] == retries[i] {
			t.Errorf("no warning of a failed call between restart %d and %s: the program did not notice the restart",
				i+1, []string{"restart 2", "the end"}[i])
		}
	}
	c := logs.Counters(t)
	failed := c["receive_errors"] + c["delete_retries"] + c["extend_retries"]
	t.Logf("retry warnings: %d before restart 1, %d before restart 2, %d in all; counters: %d receive errors, %d delete retries, %d extension retries, %d received, %d stale deletes",
		retries[0], retries[1], retries[2], c["receive_errors"], c["delete_retries"], c["extend_retries"], c["received"], c["stale_deletes"])
	if failed < 2 {
		t.Errorf("the counters line counts %d failed calls (receive_errors + delete_retries + extend_retries), want at least one per restart", failed)
	}
}
