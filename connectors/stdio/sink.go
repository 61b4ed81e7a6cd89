package stdio

import (
	"context"
	"fmt"
	"io"
	"os"
	"sync"

	"github.com/epochflow/epochflow/dataflow"
)

// maxKeptBuffer is the largest formatting buffer a worker keeps between batches.
const maxKeptBuffer = 1 << 20

// stdoutMu serialises the writes of every Print sink of the process.
var stdoutMu sync.Mutex

// Print returns a sink that writes every item to os.Stdout as fmt.Sprint(item) followed by
// "\n". os.Stdout is looked up when the run starts.
//
// It is a dataflow.DynamicSink: every worker prints the items it holds, so with several
// workers lines of different workers mix in no particular order, but each batch is written
// whole, with a single Write under a lock shared by all Print sinks, so lines never interleave
// mid-line. Write returns once the batch is written, which is when its epoch may count as
// finished. There is no state and nothing to commit: after a crash and a resume, lines of
// epochs that were not committed are printed again (at-least-once).
func Print[T any]() dataflow.Sink[T] {
	return dataflow.ToDynamic[T](&printer[T]{name: "stdout", stdout: true, mu: &stdoutMu})
}

// PrintTo returns a sink that writes every item to w as format(item) followed by "\n" (format
// nil means fmt.Sprint(item)). As with Print, each worker writes each batch whole with one
// w.Write call under a lock that the workers of this sink share, so lines never interleave
// mid-line. Several sinks writing to one w are serialised only by w itself (an *os.File is).
// A failed or short write fails the run, and so does a nil w, when the run starts.
func PrintTo[T any](w io.Writer, format func(T) string) dataflow.Sink[T] {
	return dataflow.ToDynamic[T](&printer[T]{name: fmt.Sprintf("stdio.PrintTo %T", w), w: w, format: format, mu: new(sync.Mutex)})
}

// printer is the DynamicSink of Print and PrintTo.
type printer[T any] struct {
	name   string
	stdout bool      // write to os.Stdout, looked up in Build
	w      io.Writer // else write here
	format func(T) string
	mu     *sync.Mutex
}

func (p *printer[T]) Build(context.Context, dataflow.Worker) (dataflow.WorkerSink[T], error) {
	w := p.w
	if p.stdout {
		w = os.Stdout
	}
	if w == nil {
		return nil, fmt.Errorf("%s: nil writer", p.name)
	}
	format := p.format
	if format == nil {
		format = func(item T) string { return fmt.Sprint(item) }
	}
	return &printWorker[T]{name: p.name, w: w, format: format, mu: p.mu}, nil
}

// printWorker is one worker's share of a printer.
type printWorker[T any] struct {
	name   string
	w      io.Writer
	format func(T) string
	mu     *sync.Mutex
	buf    []byte
}

// Write formats the whole batch into one buffer and writes it with one Write call.
func (p *printWorker[T]) Write(_ context.Context, batch []T) error {
	if len(batch) == 0 {
		return nil
	}
	buf := p.buf[:0]
	err := dataflow.ForEach(batch, func(item T) error {
		buf = append(buf, p.format(item)...)
		buf = append(buf, '\n')
		return nil
	})
	if err != nil {
		return fmt.Errorf("%s: format: %w", p.name, err)
	}
	p.mu.Lock()
	n, err := p.w.Write(buf)
	p.mu.Unlock()
	if err == nil && n < len(buf) {
		err = io.ErrShortWrite
	}
	if cap(buf) <= maxKeptBuffer {
		p.buf = buf
	} else {
		p.buf = nil
	}
	if err != nil {
		return fmt.Errorf("%s: write: %w", p.name, err)
	}
	return nil
}

// Close does nothing: every Write has already written its batch, and w is not ours to close.
func (p *printWorker[T]) Close() error { return nil }
