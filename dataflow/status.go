package dataflow

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// statusRefresh is how often the live status line is rewritten.
const statusRefresh = time.Second

// terminal returns w as a terminal's file, or nil when w is not a terminal.
func terminal(w io.Writer) *os.File {
	f, ok := w.(*os.File)
	if !ok {
		return nil
	}
	if _, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS); err != nil {
		return nil
	}
	return f
}

// statusLine is the last line of a terminal, rewritten in place: the log lines written through
// it (Write) go above it, and it is drawn again below them.
type statusLine struct {
	mu   sync.Mutex
	tty  *os.File
	line string // what is drawn now ("" for nothing)
}

// clearLine is a carriage return and an erase to the end of the line.
const clearLine = "\r\x1b[K"

// Write writes p (whole log lines) above the status line.
func (s *statusLine) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.line != "" {
		io.WriteString(s.tty, clearLine)
	}
	n, err := s.tty.Write(p)
	if s.line != "" {
		io.WriteString(s.tty, s.line)
	}
	return n, err
}

// set draws line in place of the one drawn before, cut to the terminal's width so that it
// never wraps (a wrapped line could not be rewritten in place).
func (s *statusLine) set(line string) {
	if ws, err := unix.IoctlGetWinsize(int(s.tty.Fd()), unix.TIOCGWINSZ); err == nil && ws.Col > 1 {
		if r := []rune(line); len(r) > int(ws.Col)-1 {
			line = string(r[:ws.Col-1])
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	io.WriteString(s.tty, clearLine+line)
	s.line = line
}

// clear erases the status line.
func (s *statusLine) clear() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.line != "" {
		io.WriteString(s.tty, clearLine)
		s.line = ""
	}
}

// statusText is the live status line of a run: its epochs, its rates in and out over the last
// interval, the last commit's latency, and the sources' lag when a connector reports it.
func statusText(flow string, p, last progress, secs float64) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s: epoch %d open, %d committed | in %.0f/s, out %.0f/s | read %d, written %d | commit %v",
		flow, p.open, p.committed, float64(p.read-last.read)/secs, float64(p.written-last.written)/secs,
		p.read, p.written, p.lastCommit.Round(time.Millisecond))
	if p.lagKnown {
		fmt.Fprintf(&b, " | lag %.0f", p.lag)
	}
	return b.String()
}

// liveStatus rewrites the status line of s every statusRefresh with the run's progress, until
// stop is called; stop erases the line and returns once its goroutine has.
func liveStatus(s *statusLine, flow string, m *Monitor) (stop func()) {
	stopTicks := everyTick(m, statusRefresh, func(p, last progress, secs float64) {
		s.set(statusText(flow, p, last, secs))
	})
	return func() {
		stopTicks()
		s.clear()
	}
}
