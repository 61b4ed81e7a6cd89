package main

import (
	"bytes"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// countersLine is the message of the program's line with the source's counters (sqs.Stats).
const countersLine = "sqs source: counters at the end of the run"

// retryLines are the messages of the source's warnings for a failed call that it retries
// (connectors/sqs): a receive, a delete call or entry, a visibility extension.
var retryLines = []string{
	`msg="receive failed; retrying"`,
	`msg="DeleteMessageBatch failed; retrying"`,
	`msg="delete failed; retrying"`,
	`msg="extending visibility failed; retrying"`,
}

// programLog is the standard error of a run of the program, as cmd.Stderr: it counts the
// retry warnings as they come, keeps the counters line and the last lines for a failure's
// report. exec.Cmd.Wait returns only once everything the program wrote has been written here.
type programLog struct {
	mu       sync.Mutex
	partial  []byte
	retries  int
	counters string
	tail     []string // the last tailLines lines
}

const tailLines = 40

func (l *programLog) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.partial = append(l.partial, b...)
	for {
		i := bytes.IndexByte(l.partial, '\n')
		if i < 0 {
			break
		}
		l.line(string(l.partial[:i]))
		l.partial = l.partial[i+1:]
	}
	return len(b), nil
}

func (l *programLog) line(s string) {
	for _, r := range retryLines {
		if strings.Contains(s, r) {
			l.retries++
			break
		}
	}
	if strings.Contains(s, countersLine) {
		l.counters = s
	}
	l.tail = append(l.tail, s)
	if len(l.tail) > tailLines {
		l.tail = l.tail[len(l.tail)-tailLines:]
	}
}

// Retries returns how many retry warnings the program has written so far.
func (l *programLog) Retries() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.retries
}

// Counters returns the values of the counters line (sqs.Stats, by their keys in the line), and
// fails t if the program wrote none.
func (l *programLog) Counters(t *testing.T) map[string]int64 {
	t.Helper()
	l.mu.Lock()
	line := l.counters
	l.mu.Unlock()
	if line == "" {
		t.Fatalf("the program logged no %q line; its last lines:\n%s", countersLine, l.Tail())
	}
	out := map[string]int64{}
	for _, f := range strings.Fields(line) {
		k, v, ok := strings.Cut(f, "=")
		if !ok {
			continue
		}
		if n, err := strconv.ParseInt(v, 10, 64); err == nil {
			out[k] = n
		}
	}
	return out
}

// Tail returns the last lines the program wrote.
func (l *programLog) Tail() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(append(l.tail, string(l.partial)), "\n")
}

// setFlag sets the value of flag name in cmd's arguments, or adds the flag.
func setFlag(cmd *exec.Cmd, name, value string) {
	for i, a := range cmd.Args {
		if a == name && i+1 < len(cmd.Args) {
			cmd.Args[i+1] = value
			return
		}
	}
	cmd.Args = append(cmd.Args, name, value)
}
