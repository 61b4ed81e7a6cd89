package dataflow

import (
	"flag"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/creack/pty"
)

// runHeld runs a program whose source reads 700 items and then holds until release, with
// stderr as its standard error, and returns its exit code channel and the release function.
func runHeld(stderr io.Writer, args ...string) (code chan int, release func()) {
	src := &heldSource{n: 700, gate: make(chan struct{}), release: make(chan struct{})}
	close(src.gate)
	code = make(chan int, 1)
	go func() {
		fs := flag.NewFlagSet("test", flag.ContinueOnError)
		code <- mainFunc(fs, append([]string{"-epoch-interval", "10ms"}, args...), io.Discard, stderr,
			func() (*Flow, error) {
				f := New("prog")
				Output("write", Input(f, "read", FromDynamic[int](src)), ToDynamic[int](oneSink{}))
				return f, nil
			})
	}()
	return code, func() { close(src.release) }
}

// waitOutput polls out until cond holds, or fails the test after a minute.
func waitOutput(t *testing.T, out *lockedBuffer, what string, cond func(string) bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond(out.String()) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s; output:\n%q", what, out.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// When standard error is a terminal, the program draws one status line and rewrites it in
// place (a carriage return and an erase, never a new line) about once a second, below the log
// lines, instead of logging progress lines; the line is erased when the run ends.
func TestStatusLineOnTerminal(t *testing.T) {
	ptmx, tty, err := pty.Open()
	if err != nil {
		t.Fatal(err)
	}
	defer ptmx.Close()
	if err := pty.Setsize(ptmx, &pty.Winsize{Rows: 40, Cols: 300}); err != nil {
		t.Fatal(err)
	}
	var out lockedBuffer
	copied := make(chan struct{})
	go func() {
		defer close(copied)
		io.Copy(&out, ptmx) // ends when the terminal is closed
	}()
	code, release := runHeld(tty, "-status-interval", "20ms")
	status := clearLine + "prog: epoch "
	waitOutput(t, &out, "two status lines, the second with every item read", func(s string) bool {
		return strings.Count(s, status) >= 2 && strings.Contains(s[strings.LastIndex(s, status):], "read 700, written 700")
	})
	release()
	if c := <-code; c != 0 {
		t.Fatalf("exit %d; output:\n%q", c, out.String())
	}
	waitOutput(t, &out, "the closing line", func(s string) bool { return strings.Contains(s, "finished: every source ended") })
	tty.Close()
	<-copied
	s := out.String()
	if strings.Contains(s, "msg=progress") {
		t.Errorf("progress lines on a terminal:\n%q", s)
	}
	// Every status line is rewritten in place: what follows it up to the next erase is no new
	// line (a log line comes after an erase of its own).
	draws := strings.Split(s, clearLine)
	n := 0
	for _, d := range draws[1:] {
		if strings.HasPrefix(d, "prog: epoch ") {
			n++
			if strings.ContainsAny(d, "\r\n") {
				t.Errorf("a status line followed by a new line instead of an erase: %q", d)
			}
			for _, part := range []string{" open, ", " committed | in ", "/s, out ", "/s | read ", " | commit ", " | lag "} {
				if !strings.Contains(d, part) {
					t.Errorf("status line %q lacks %q", d, part)
				}
			}
		}
	}
	if n < 2 {
		t.Errorf("%d status lines drawn, want at least 2:\n%q", n, s)
	}
	if !strings.HasSuffix(s, clearLine) {
		t.Errorf("the last status line was not erased at the end:\n%q", s)
	}
}

// When standard error is a pipe, there is no status line: progress lines come every
// -status-interval instead.
func TestNoStatusLineOnPipe(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	var out lockedBuffer
	copied := make(chan struct{})
	go func() {
		defer close(copied)
		io.Copy(&out, r)
	}()
	code, release := runHeld(w, "-status-interval", "20ms")
	waitOutput(t, &out, "progress lines with every item read", func(s string) bool {
		return strings.Count(s, "msg=progress") >= 2 && strings.Contains(s, "items_read=700 items_written=700")
	})
	release()
	if c := <-code; c != 0 {
		t.Fatalf("exit %d; output:\n%s", c, out.String())
	}
	w.Close()
	<-copied
	if s := out.String(); strings.Contains(s, "\x1b[") || strings.Contains(s, "\r") {
		t.Errorf("terminal control characters on a pipe:\n%q", s)
	}
}
