package file

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"

	"github.com/epochflow/epochflow/dataflow"
)

const writeBufSize = 64 << 10

// LinesOut returns a sink that writes every item to the file at path as format(item) followed by
// "\n" (format nil means fmt.Sprint(item); for dataflow.KV items pass a format of your own). The
// sink has one partition, keyed by path, and every item goes to it: the file is written by a
// single worker (worker 0), in the order that worker receives the items.
//
// Exactly once: a fresh run (no resume state) creates the file or truncates it to zero. At the
// end of every epoch Snapshot flushes the buffered lines, fsyncs the file (and, once, its
// directory) and returns the file's length, an int64. A resumed run truncates the file to the
// length of the last committed snapshot and writes on from there: whatever was written after
// that snapshot (the output of epochs that were never committed) is cut away, and the replay of
// those epochs writes it again. So Commit has nothing to do: the committed data is already in
// place and durable. If the file is shorter than the snapshot on resume, it was changed behind
// the flow's back, and the run fails with an error naming the path and both sizes.
//
// Readers of the file while the flow runs may see lines of epochs that are not committed yet
// (and that a crash followed by a resume would rewrite); once the run ends, the file holds every
// item exactly once. Close flushes what is buffered. Two sinks must not write the same file.
//
// If a flush or fsync at the end of an epoch fails, Snapshot cannot report it (its signature
// has no error), so the error is kept and returned by the next Write, Commit or Close, which
// fails the run.
func LinesOut[T any](path string, format func(T) string) dataflow.Sink[T] {
	return dataflow.ToPartitioned[T, int64](NewLineSink(path, format))
}

// WriteLines returns a sink that writes every string to the file at path as a line (the string
// followed by "\n"). It is LinesOut with the identity as format; everything said there holds.
func WriteLines(path string) dataflow.Sink[string] {
	return LinesOut(path, func(s string) string { return s })
}

// LineSink is the dataflow.PartitionedSink behind LinesOut and WriteLines, for tests and for
// composing it with other sinks. It has one partition, the file; its state is the file's length
// after the last snapshot.
type LineSink[T any] struct {
	path   string
	format func(T) string
}

// NewLineSink returns the sink of LinesOut.
func NewLineSink[T any](path string, format func(T) string) *LineSink[T] {
	if format == nil {
		format = func(item T) string { return fmt.Sprint(item) }
	}
	return &LineSink[T]{path: path, format: format}
}

// Parts returns the one partition, the path.
func (s *LineSink[T]) Parts(context.Context) ([]string, error) {
	if s.path == "" {
		return nil, errors.New("file.LinesOut: empty path")
	}
	return []string{s.path}, nil
}

// PartFor returns 0: every item goes to the one partition.
func (s *LineSink[T]) PartFor(T, int) int { return 0 }

// Build opens the file named part for writing, without O_APPEND. Without resume (or with a
// resume offset of 0) it truncates the file to zero bytes; with resume it truncates the file to
// *resume bytes, after checking that the file is at least that long.
func (s *LineSink[T]) Build(_ context.Context, part string, resume *int64) (dataflow.StatefulSink[T, int64], error) {
	f, err := os.OpenFile(part, os.O_WRONLY|os.O_CREATE, 0o666)
	if err != nil {
		return nil, fmt.Errorf("file sink: %w", err)
	}
	fail := func(err error) (dataflow.StatefulSink[T, int64], error) {
		f.Close()
		return nil, err
	}
	var off int64
	if resume != nil {
		off = *resume
		if off < 0 {
			return fail(fmt.Errorf("file sink: %s: negative resume offset %d", part, off))
		}
		fi, err := f.Stat()
		if err != nil {
			return fail(fmt.Errorf("file sink: %w", err))
		}
		if fi.Size() < off {
			return fail(fmt.Errorf("file sink: %s is %d bytes, shorter than the snapshot's %d: the file was changed behind the flow's back", part, fi.Size(), off))
		}
	}
	if err := f.Truncate(off); err != nil {
		return fail(fmt.Errorf("file sink: %w", err))
	}
	if _, err := f.Seek(off, 0); err != nil {
		return fail(fmt.Errorf("file sink: %s: seek to %d: %w", part, off, err))
	}
	return &lineSinkPart[T]{
		path: part, format: s.format, f: f, w: bufio.NewWriterSize(f, writeBufSize), off: off,
		dirty: true, syncDir: true, // the truncation and the file's creation must be durable too
	}, nil
}

// lineSinkPart is the open file of a LineSink.
type lineSinkPart[T any] struct {
	path    string
	format  func(T) string
	f       *os.File // nil once closed
	w       *bufio.Writer
	off     int64 // bytes handed to w so far: the file's length once w is flushed
	dirty   bool  // written or truncated since the last fsync
	syncDir bool  // the directory entry is not fsynced yet
	err     error // the first failure, returned by the calls after it
	told    bool  // err was returned to the engine at least once
}

// failed returns the first failure and remembers that the engine saw it.
func (p *lineSinkPart[T]) failed() error {
	if p.err != nil {
		p.told = true
	}
	return p.err
}

// Write appends format(item)+"\n" for every item to the file's buffer.
func (p *lineSinkPart[T]) Write(_ context.Context, batch []T) error {
	if p.err != nil {
		return p.failed()
	}
	if p.f == nil {
		return fmt.Errorf("file sink: %s: write after close", p.path)
	}
	if len(batch) == 0 {
		return nil
	}
	p.dirty = true
	err := dataflow.ForEach(batch, func(item T) error {
		s := p.format(item)
		if _, err := p.w.WriteString(s); err != nil {
			return err
		}
		if err := p.w.WriteByte('\n'); err != nil {
			return err
		}
		p.off += int64(len(s)) + 1
		return nil
	})
	if err != nil {
		p.err = fmt.Errorf("file sink: %s: write: %w", p.path, err)
		return p.failed()
	}
	return nil
}

// Snapshot flushes and fsyncs the file and returns its length. A failure fails the epoch (it
// is never committed) and is returned again by any later Write, Commit or Close.
func (p *lineSinkPart[T]) Snapshot() (int64, error) {
	if p.err != nil {
		return p.off, p.err
	}
	if p.f != nil {
		if err := p.sync(); err != nil {
			p.err = fmt.Errorf("file sink: %s: snapshot at offset %d: %w", p.path, p.off, err)
			return p.off, p.err
		}
	}
	return p.off, nil
}

func (p *lineSinkPart[T]) sync() error {
	if !p.dirty {
		return nil
	}
	if err := p.w.Flush(); err != nil {
		return err
	}
	if err := p.f.Sync(); err != nil {
		return err
	}
	p.dirty = false
	if p.syncDir {
		if err := syncDir(filepath.Dir(p.path)); err != nil {
			return err
		}
		p.syncDir = false
	}
	return nil
}

// syncDir makes a file's creation durable by fsyncing its directory (not possible on Windows,
// where it is not needed either).
func syncDir(dir string) error {
	if runtime.GOOS == "windows" {
		return nil
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}

// Commit does nothing but report an earlier failure: Snapshot already made the data durable,
// and a resume cuts away what came after the committed snapshot.
func (p *lineSinkPart[T]) Commit(context.Context, int64) error { return p.failed() }

// Close flushes the buffer and closes the file, and returns a failure the engine has not seen
// yet. It does not fsync: what matters after a crash is durable since the last Snapshot, and
// the rest is cut away on resume.
func (p *lineSinkPart[T]) Close() error {
	if p.f == nil {
		return nil
	}
	var errs []error
	if !p.told {
		errs = append(errs, p.err)
	}
	if p.err == nil {
		if err := p.w.Flush(); err != nil {
			errs = append(errs, fmt.Errorf("file sink: %s: flush: %w", p.path, err))
		}
	}
	if err := p.f.Close(); err != nil {
		errs = append(errs, fmt.Errorf("file sink: %w", err))
	}
	p.f, p.w = nil, nil
	return errors.Join(errs...)
}
