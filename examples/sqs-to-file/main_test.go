package main

import (
	"bufio"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/epochflow/epochflow/internal/sqstest"
)

// emu is the goaws emulator (a process of its own, see internal/sqstest) that the tests share;
// a test that restarts its emulator starts one of its own.
var emu *sqstest.Emulator

// The example runs as a subprocess against the emulator's URL. The tests run in parallel: each
// has queues, files and runs of its own.
func TestMain(m *testing.M) { sqstest.Main(m, &emu, removeBinary) }

func command(bin, queue, out, rec string, idle time.Duration) *exec.Cmd {
	return commandOn(emu, bin, queue, out, rec, idle)
}

// commandOn is command against emulator e.
func commandOn(e *sqstest.Emulator, bin, queue, out, rec string, idle time.Duration) *exec.Cmd {
	cmd := flowCommand(bin, "-endpoint", e.URL, "-queue-url", queue, "-output", out, "-recovery", rec,
		"-epoch-interval", "100ms", "-idle-exit", idle.String(), "-log-level", "error")
	cmd.Env = append(os.Environ(), "AWS_ACCESS_KEY_ID=x", "AWS_SECRET_ACCESS_KEY=x", "AWS_REGION=us-east-1",
		"AWS_EC2_METADATA_DISABLED=true", "AWS_CONFIG_FILE=/dev/null", "AWS_SHARED_CREDENTIALS_FILE=/dev/null")
	cmd.Stderr = os.Stderr
	return cmd
}

func sendNumbered(t *testing.T, queue string, n int) []string {
	t.Helper()
	return sendNumberedTo(t, emu, queue, n)
}

// sendNumberedTo is sendNumbered to emulator e.
func sendNumberedTo(t *testing.T, e *sqstest.Emulator, queue string, n int) []string {
	t.Helper()
	bodies := make([]string, n)
	for i := range bodies {
		bodies[i] = fmt.Sprintf("n%05d", i)
	}
	if err := e.SendBodies(context.Background(), queue, "g", bodies...); err != nil {
		t.Fatal(err)
	}
	return bodies
}

// checkOutput fails unless the file holds every body exactly once, and the queue is empty.
func checkOutput(t *testing.T, out, queue string, want []string) {
	t.Helper()
	checkOutputOn(t, emu, out, queue, want)
}

// checkOutputOn is checkOutput for a queue of emulator e.
func checkOutputOn(t *testing.T, e *sqstest.Emulator, out, queue string, want []string) {
	t.Helper()
	f, err := os.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	seen := make(map[string]int, len(want))
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		seen[sc.Text()]++
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	var missing, doubled []string
	for _, b := range want {
		switch seen[b] {
		case 0:
			missing = append(missing, b)
		case 1:
		default:
			doubled = append(doubled, fmt.Sprintf("%s×%d", b, seen[b]))
		}
		delete(seen, b)
	}
	if len(missing) > 0 || len(doubled) > 0 || len(seen) > 0 {
		t.Errorf("output: %d missing (%s), %d more than once (%s), %d unexpected lines",
			len(missing), head(missing), len(doubled), head(doubled), len(seen))
	}
	vis, inFlight, err := e.Counts(queue)
	if err != nil {
		t.Fatal(err)
	}
	if vis+inFlight != 0 {
		t.Errorf("the queue still holds %d visible and %d in-flight messages", vis, inFlight)
	}
}

func head(s []string) string {
	if len(s) > 5 {
		return strings.Join(s[:5], " ") + " ..."
	}
	return strings.Join(s, " ")
}

// A clean run copies every message once, deletes them all and exits 0 once the queue is idle.
func TestCopiesQueue(t *testing.T) {
	t.Parallel()
	bin := buildBinary(t)
	queue := emu.MustQueue(t, "copy", sqstest.QueueOptions{Visibility: 30 * time.Second})
	want := sendNumbered(t, queue, 500)
	dir := t.TempDir()
	out := filepath.Join(dir, "out.txt")
	if err := command(bin, queue, out, filepath.Join(dir, "rec"), 2*time.Second).Run(); err != nil {
		t.Fatal(err)
	}
	checkOutput(t, out, queue, want)
}

// Killed with SIGKILL at 20 random moments and restarted each time with the same recovery store,
// the example still copies each of 20,000 messages exactly once and leaves the queue empty: the
// messages of uncommitted epochs come back after their visibility timeout (3 s), and those of
// committed epochs whose deletes the kill cut off are dropped as redeliveries.
func TestSurvivesKill9(t *testing.T) {
	t.Parallel()
	bin := buildBinary(t)
	queue := emu.MustQueue(t, "kill9", sqstest.QueueOptions{Visibility: 3 * time.Second})
	const n = 20_000
	want := sendNumbered(t, queue, n)
	dir := t.TempDir()
	out := filepath.Join(dir, "out.txt")
	rec := filepath.Join(dir, "rec")
	r := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 9))
	start := time.Now()
	for kill := range 20 {
		// Long enough an idle exit that no run ends by itself before its kill.
		cmd := command(bin, queue, out, rec, 8*time.Second)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		wait := make(chan error, 1)
		go func() { wait <- cmd.Wait() }()
		at := time.Duration(r.Int64N(int64(1200 * time.Millisecond)))
		select {
		case err := <-wait:
			t.Fatalf("run %d ended before its kill at %v: %v", kill, at, err)
		case <-time.After(at):
			cmd.Process.Signal(syscall.SIGKILL)
			<-wait
		}
	}
	vis, inFlight, _ := emu.Counts(queue)
	t.Logf("20 kills in %v; %d messages visible, %d in flight", time.Since(start), vis, inFlight)
	final := command(bin, queue, out, rec, 6*time.Second)
	done := make(chan error, 1)
	if err := final.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { done <- final.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("final run: %v", err)
		}
	case <-time.After(90 * time.Second):
		final.Process.Signal(syscall.SIGKILL)
		<-done
		t.Fatal("the final run did not exit within 90 s")
	}
	checkOutput(t, out, queue, want)
	t.Logf("whole test: %v", time.Since(start))
}

// flowCommand is exec.Command for a run of the example that is killed if it has not ended
// after 3 minutes: a run that hangs fails its test, with the error of the killed run, instead
// of stalling the package until the test binary's own timeout.
func flowCommand(bin string, args ...string) *exec.Cmd {
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(3*time.Minute, cancel)
	return exec.CommandContext(ctx, bin, args...)
}
