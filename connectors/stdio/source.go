// Package stdio reads lines from standard input and prints items to standard output.
//
// Neither side can be replayed or rolled back, so neither keeps state: Lines is a
// dataflow.DynamicSource (what was read before a crash is not read again) and Print a
// dataflow.DynamicSink (what was printed before a crash stays printed, and a replay prints it
// again). For exactly-once output to a file, use the file package.
package stdio

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"github.com/epochflow/epochflow/dataflow"
)

// Limits of the reading goroutine's buffer and of one batch.
const (
	maxBatchLines    = 1024    // lines per batch returned by Next
	maxBufferedLines = 4096    // the reader stops reading when it holds this many lines ...
	maxBufferedBytes = 1 << 20 // ... or this many bytes (it always takes at least one line)
	readBufSize      = 64 << 10
	closeWait        = time.Second // how long Close waits for an interrupted Read to return
)

// Lines returns a source that reads os.Stdin line by line. A line is what comes before a "\n",
// without the "\n" and without one "\r" right before it (the rule of bufio.ScanLines); a last
// line without "\n" is still a line, and lines may be of any length.
//
// Worker 0 reads; every other worker's share ends at once. The source has no partitions and no
// state (a dataflow.DynamicSource): standard input cannot be replayed, so what was read before a
// crash is not read again after a resume, and lines whose epoch was not committed are lost.
// Epochs close on the engine's clock; the source ends (io.EOF) when standard input ends, and a
// read error ends the run with an error naming "stdin".
//
// Reading happens on a goroutine that fills a bounded buffer (4096 lines or 1 MiB) and wakes
// the worker through Wait, so an idle standard input parks the worker and costs no CPU, and a
// line that arrives is processed at once. When the run ends (Close), the goroutine stops: at
// once if it is waiting for buffer space or standard input has ended; otherwise it is inside a
// Read of os.Stdin, which Go cannot interrupt when standard input is a terminal or a blocking
// pipe, and it stops as soon as that Read returns (the next input or the end of input), dropping
// what it read then. So a process should read standard input in one run only; tests should use
// LinesFrom.
func Lines() dataflow.Source[string] {
	return dataflow.FromDynamic[string](&lineSource{name: "stdin"})
}

// LinesFrom returns a source that reads r line by line, as Lines reads os.Stdin. The goroutine
// reading r stops when r ends or fails, or when the run ends (Close); in the last case, when
// it is blocked inside r.Read and r has a SetReadDeadline method (an *os.File of a pipe, a
// net.Conn), Close sets a deadline in the past to interrupt that Read, waits (at most a
// second) for the goroutine to return, and then clears the deadline again; when r cannot be
// interrupted, the goroutine returns once that Read returns. Whatever the goroutine had read
// but the flow had not is lost. Using the source in a second run reads on from where the first
// run's goroutine stopped.
func LinesFrom(r io.Reader) dataflow.Source[string] {
	return dataflow.FromDynamic[string](&lineSource{name: "stdio.LinesFrom reader", r: r})
}

// lineSource is the DynamicSource of Lines and LinesFrom.
type lineSource struct {
	name string
	r    io.Reader // nil: os.Stdin, looked up when the run starts
}

func (s *lineSource) Build(_ context.Context, w dataflow.Worker) (dataflow.WorkerSource[string], error) {
	if w.Index != 0 {
		return ended{}, nil
	}
	r := s.r
	if r == nil {
		r = os.Stdin
	}
	lr := &lineReader{
		name:   s.name,
		r:      r,
		wake:   make(chan struct{}, 1),
		space:  make(chan struct{}, 1),
		done:   make(chan struct{}),
		exited: make(chan struct{}),
	}
	go lr.run()
	return lr, nil
}

// ended is the share of a worker other than 0: nothing.
type ended struct{}

func (ended) Next(context.Context) ([]string, error) { return nil, io.EOF }
func (ended) Close() error                           { return nil }

// lineReader reads lines on its own goroutine into a bounded buffer that Next empties.
type lineReader struct {
	name   string
	r      io.Reader
	wake   chan struct{} // a token when lines arrive or the input ends
	space  chan struct{} // a token when Next made room in the buffer
	done   chan struct{} // closed by Close
	exited chan struct{} // closed when the goroutine returns

	mu     sync.Mutex
	buf    []string
	bytes  int
	end    bool  // the goroutine has read its last line
	err    error // why it ended, nil for io.EOF
	closed bool
	once   sync.Once
}

// Wait returns the channel that becomes ready when lines arrive or the input ends.
func (lr *lineReader) Wait() <-chan struct{} { return lr.wake }

func (lr *lineReader) signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// run is the reading goroutine.
func (lr *lineReader) run() {
	defer close(lr.exited)
	br := bufio.NewReaderSize(lr.r, readBufSize)
	for {
		line, err := br.ReadString('\n')
		if len(line) > 0 && !lr.put(trimEOL(line)) {
			return
		}
		if err != nil {
			lr.mu.Lock()
			lr.end = true
			if err != io.EOF {
				lr.err = err
			}
			lr.mu.Unlock()
			lr.signal(lr.wake)
			return
		}
	}
}

// put adds a line to the buffer, waiting for room; false means the source was closed.
func (lr *lineReader) put(line string) bool {
	for {
		lr.mu.Lock()
		if lr.closed {
			lr.mu.Unlock()
			return false
		}
		if len(lr.buf) == 0 || len(lr.buf) < maxBufferedLines && lr.bytes < maxBufferedBytes {
			wasEmpty := len(lr.buf) == 0
			lr.buf = append(lr.buf, line)
			lr.bytes += len(line)
			lr.mu.Unlock()
			if wasEmpty {
				lr.signal(lr.wake)
			}
			return true
		}
		lr.mu.Unlock()
		select {
		case <-lr.space:
		case <-lr.done:
			return false
		}
	}
}

// Next returns the buffered lines (at most maxBatchLines) without waiting; an empty batch when
// there are none yet, io.EOF when the input has ended and everything was returned.
func (lr *lineReader) Next(context.Context) ([]string, error) {
	lr.mu.Lock()
	defer lr.mu.Unlock()
	if len(lr.buf) == 0 {
		if !lr.end {
			return nil, nil
		}
		if lr.err != nil {
			return nil, fmt.Errorf("%s: read: %w", lr.name, lr.err)
		}
		return nil, io.EOF
	}
	n := min(len(lr.buf), maxBatchLines)
	batch := lr.buf[:n:n]
	if n == len(lr.buf) {
		lr.buf, lr.bytes = nil, 0
	} else {
		lr.buf = lr.buf[n:]
		for _, l := range batch {
			lr.bytes -= len(l)
		}
	}
	lr.signal(lr.space)
	return batch, nil
}

// Close stops the reading goroutine as described on Lines and LinesFrom.
func (lr *lineReader) Close() error {
	lr.once.Do(func() {
		lr.mu.Lock()
		lr.closed = true
		lr.buf = nil
		lr.mu.Unlock()
		close(lr.done)
		select {
		case <-lr.exited:
			return
		default:
		}
		d, ok := lr.r.(interface{ SetReadDeadline(time.Time) error })
		if !ok || d.SetReadDeadline(time.Unix(1, 0)) != nil {
			return // blocked in a Read nobody can interrupt: it returns when the Read does
		}
		t := time.NewTimer(closeWait)
		defer t.Stop()
		select {
		case <-lr.exited:
			d.SetReadDeadline(time.Time{})
		case <-t.C:
		}
	})
	return nil
}

// trimEOL removes one trailing "\n" and then one trailing "\r", as bufio.ScanLines does.
func trimEOL(s string) string {
	if n := len(s); n > 0 && s[n-1] == '\n' {
		s = s[:n-1]
	}
	if n := len(s); n > 0 && s[n-1] == '\r' {
		s = s[:n-1]
	}
	return s
}
