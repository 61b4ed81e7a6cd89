package main

import (
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// SIGTERM on a run without a recovery store exits 0, and says so: a warning when the stop
// begins that the counts are discarded, and a closing line that says what was and was not
// written (the counts are never written: wordcount emits them at the end of its input).
func TestSIGTERMWithoutAStoreSaysWhatIsLost(t *testing.T) {
	bin := buildBinary(t)
	out := filepath.Join(t.TempDir(), "out.txt")
	cmd := flowCommand(bin, "-output", out)
	stdin, err := cmd.StdinPipe() // stays open: the flow runs until the signal
	if err != nil {
		t.Fatal(err)
	}
	stderr := newWatchWriter("msg=running")
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	io.WriteString(stdin, "a b a\n")
	select {
	case <-stderr.seen:
	case <-time.After(30 * time.Second):
		t.Fatalf("the run did not start within 30 s:\n%s", stderr.String())
	}
	cmd.Process.Signal(syscall.SIGTERM)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("after SIGTERM: %v, want exit 0\n%s", err, stderr.String())
	}
	log := stderr.String()
	for _, want := range []string{
		`level=WARN msg="stopping without a recovery store: the stateful steps' state is discarded`,
		`level=WARN msg="stopped by a signal without a recovery store: the sinks have what was written before the stop, ` +
			`and what the stateful steps held (counts, aggregates not yet emitted) was discarded, not written`,
		"items_written=0",
	} {
		if !strings.Contains(log, want) {
			t.Errorf("stderr lacks %q:\n%s", want, log)
		}
	}
	if b, err := os.ReadFile(out); err != nil || len(b) != 0 {
		t.Errorf("output %q (%v), want the empty file the closing line says", b, err)
	}
}

// A positional argument is an error (exit 2) that names it and the flag that was meant,
// not a run that silently reads standard input.
func TestPositionalArgumentIsAnError(t *testing.T) {
	bin := buildBinary(t)
	cmd := flowCommand(bin, "sample.txt")
	cmd.Stdin = strings.NewReader("a b a\n")
	b, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 2 ||
		!strings.Contains(string(b), `unexpected argument "sample.txt"`) || !strings.Contains(string(b), "-input sample.txt") {
		t.Fatalf("wordcount sample.txt: %v, want exit 2 naming the argument and -input\n%s", err, b)
	}
}
