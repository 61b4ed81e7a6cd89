// Package file reads and writes text files line by line, with exactly-once results.
//
// Sources: Lines reads a list of files and Dir the files of a directory that match a pattern.
// Every file is one partition whose resume state is a byte offset, so a resumed flow continues
// at the line after the last committed one. Files are not consumed: Commit does nothing.
//
// Sinks: LinesOut and WriteLines write one file. Every epoch's end flushes and fsyncs the file
// and snapshots its length; a resumed flow truncates the file to the length of the last
// committed snapshot before it writes again, so every item ends up in the file exactly once.
// A fresh run does not destroy a file that holds data it has no state for: it refuses it unless
// told to replace it or append to it (IfExists). A sink locks its file, so a second writer is
// refused.
//
// Partitions are keyed by absolute, cleaned paths (a sink's with symbolic links resolved): a
// flow resumed from another working directory with the same relative paths, or a sink resumed
// through a link that leads to another file now, names other files, and the engine refuses the
// resume (naming the stored and the listed partitions) instead of continuing onto other files.
//
// Exactly once holds within one flow. Two flows reading one queue into one file each, with
// their own recovery stores, do not share their state: a message that one of them wrote and
// that a crash made the broker redeliver may be written again by the other. To scale out, give
// one flow more workers (dataflow.Options.Workers, the -workers flag), not more flows.
//
// A line is what comes before a "\n", without the "\n" and without one "\r" right before it
// (the rule of bufio.ScanLines, so files with Windows line ends read the same). A last line
// without a "\n" is still a line; an empty file has no lines. Lines may be of any length.
package file

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"

	"github.com/epochflow/epochflow/dataflow"
)

// Limits of one batch returned by a source partition's Next: a batch ends after this many lines
// or once it holds this many bytes, whichever comes first (a single longer line is one batch).
const (
	maxBatchLines = 1024
	maxBatchBytes = 256 << 10
	readBufSize   = 64 << 10
)

// Lines returns a source that reads the lines of the given files, one partition per file in the
// order given; the partition key is the file's absolute, cleaned path (filepath.Abs), so that a
// run resumed from another working directory does not take a relative path for another file (a
// file listed twice, under any spelling of its path, is an error when the run starts). Partition i is read by worker i % workers, and the lines of one file
// arrive in file order.
//
// State and resume: each partition's snapshot is the byte offset just after the last line
// returned (an int64); a resumed partition seeks there and continues with the next line. Epochs
// close on the engine's clock; a file that reaches its end returns io.EOF and its partition
// ends, and the source ends when every file has ended. Files are read as they are at that
// moment: growth after the end was reached is not followed. Commit does nothing, since
// files are not consumed.
//
// A path that is missing, unreadable or a directory fails the run at start with an error
// naming the path, and so does, on a resume, a file shorter than its resume offset. Each partition holds its file open from the start of the run until its end
// of file (or the end of the run).
func Lines(paths ...string) dataflow.Source[string] {
	return dataflow.FromPartitioned[string, int64](NewLineSource(paths...))
}

// Dir returns a source that reads the lines of the regular files directly in dir (not in its
// subdirectories) whose names match pattern (path/filepath.Match syntax; "" means "*"), one
// partition per file, keyed by the absolute path of dir joined with the name, and sorted by
// name. The directory is
// listed once, when the run starts; symbolic links to regular files are read. A missing
// directory, a malformed pattern, a matching entry that cannot be examined (a broken link), or
// no matching file at all fails the run at start (an empty match is far more often a mistake
// than an intended empty input). On a resume, a file that appeared since the crash is read from
// its start, and a file that disappeared makes the resume fail (its unread lines would be lost
// silently otherwise). Otherwise it behaves as Lines.
func Dir(dir, pattern string) dataflow.Source[string] {
	return dataflow.FromPartitioned[string, int64](NewDirSource(dir, pattern))
}

// LineSource is the dataflow.PartitionedSource behind Lines and Dir, for tests and for
// composing it with other sources. Its partitions are the files; their state is the byte
// offset after the last line returned.
type LineSource struct {
	paths   []string
	dir     string
	pattern string
	listDir bool
}

// NewLineSource returns the source of Lines.
func NewLineSource(paths ...string) *LineSource {
	return &LineSource{paths: slices.Clone(paths)}
}

// NewDirSource returns the source of Dir.
func NewDirSource(dir, pattern string) *LineSource {
	if pattern == "" {
		pattern = "*"
	}
	return &LineSource{dir: dir, pattern: pattern, listDir: true}
}

// Parts returns the absolute, cleaned paths of the files, in the order of Lines's arguments
// or, for Dir, sorted by name.
func (s *LineSource) Parts(context.Context) ([]string, error) {
	if !s.listDir {
		if len(s.paths) == 0 {
			return nil, errors.New("file.Lines: no path given")
		}
		paths := make([]string, len(s.paths))
		for i, p := range s.paths {
			if p == "" {
				return nil, fmt.Errorf("file.Lines: path %d is empty", i)
			}
			abs, err := filepath.Abs(p)
			if err != nil {
				return nil, fmt.Errorf("file.Lines: %s: %w", p, err)
			}
			paths[i] = abs
		}
		return paths, nil
	}
	if _, err := filepath.Match(s.pattern, ""); err != nil {
		return nil, fmt.Errorf("file.Dir %q: pattern %q: %w", s.dir, s.pattern, err)
	}
	dir, err := filepath.Abs(s.dir)
	if err != nil {
		return nil, fmt.Errorf("file.Dir: %s: %w", s.dir, err)
	}
	entries, err := os.ReadDir(dir) // sorted by name
	if err != nil {
		return nil, fmt.Errorf("file.Dir: %w", err)
	}
	var paths []string
	for _, e := range entries {
		if ok, _ := filepath.Match(s.pattern, e.Name()); !ok {
			continue
		}
		p := filepath.Join(dir, e.Name())
		fi, err := os.Stat(p) // follows symbolic links
		if err != nil {
			return nil, fmt.Errorf("file.Dir: %w", err)
		}
		if fi.Mode().IsRegular() {
			paths = append(paths, p)
		}
	}
	if len(paths) == 0 {
		return nil, fmt.Errorf("file.Dir: no regular file in %q matches %q", s.dir, s.pattern)
	}
	return paths, nil
}

// Build opens the file named part. With resume it checks that the file is at least *resume
// bytes long (else the file changed since the snapshot: an error naming the path and both
// sizes) and continues reading at that offset.
func (s *LineSource) Build(_ context.Context, part string, resume *int64) (dataflow.StatefulSource[string, int64], error) {
	f, err := os.Open(part)
	if err != nil {
		return nil, fmt.Errorf("file source: %w", err)
	}
	fail := func(err error) (dataflow.StatefulSource[string, int64], error) {
		f.Close()
		return nil, err
	}
	fi, err := f.Stat()
	if err != nil {
		return fail(fmt.Errorf("file source: %w", err))
	}
	if fi.IsDir() {
		return fail(fmt.Errorf("file source: %s is a directory (use file.Dir to read the files in it)", part))
	}
	var off int64
	if resume != nil && *resume != 0 {
		off = *resume
		if off < 0 {
			return fail(fmt.Errorf("file source: %s: negative resume offset %d", part, off))
		}
		if fi.Mode().IsRegular() && fi.Size() < off {
			return fail(fmt.Errorf("file source: %s is %d bytes, shorter than the resume offset %d: the file was changed since the snapshot", part, fi.Size(), off))
		}
		if _, err := f.Seek(off, io.SeekStart); err != nil {
			return fail(fmt.Errorf("file source: %s: seek to resume offset %d: %w", part, off, err))
		}
	}
	return &linePart{path: part, f: f, r: bufio.NewReaderSize(f, readBufSize), off: off}, nil
}

// linePart is one open file of a LineSource.
type linePart struct {
	path string
	f    *os.File // nil once the end is reached or the part is closed
	r    *bufio.Reader
	off  int64 // offset after the last line returned
	eof  bool
}

// Next returns up to maxBatchLines lines (or about maxBatchBytes), and io.EOF together with the
// last batch at the end of the file.
func (p *linePart) Next(context.Context) ([]string, error) {
	if p.eof || p.f == nil {
		return nil, io.EOF
	}
	batch := make([]string, 0, 64)
	off, size := p.off, 0
	for len(batch) < maxBatchLines && size < maxBatchBytes {
		line, err := p.r.ReadString('\n')
		if len(line) > 0 {
			off += int64(len(line))
			size += len(line)
			batch = append(batch, trimEOL(line))
		}
		if errors.Is(err, io.EOF) {
			p.off, p.eof = off, true
			p.release()
			return batch, io.EOF
		}
		if err != nil {
			return nil, fmt.Errorf("file source: %s: read after offset %d: %w", p.path, p.off, err)
		}
	}
	p.off = off
	return batch, nil
}

// Snapshot returns the byte offset just after the last line Next returned.
func (p *linePart) Snapshot() int64 { return p.off }

// Commit does nothing: a file is not consumed by reading it.
func (p *linePart) Commit(context.Context, int64) error { return nil }

// Close closes the file if it is still open.
func (p *linePart) Close() error {
	if p.f == nil {
		return nil
	}
	err := p.f.Close()
	p.f, p.r = nil, nil
	if err != nil {
		return fmt.Errorf("file source: %w", err)
	}
	return nil
}

// release closes the file at its end; a close error of a file only read cannot lose data.
func (p *linePart) release() {
	if p.f != nil {
		p.f.Close()
		p.f, p.r = nil, nil
	}
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
