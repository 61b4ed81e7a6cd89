package file

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"

	"github.com/epochflow/epochflow/dataflow"
)

const writeBufSize = 64 << 10

// ErrNotEmpty is what the error of a fresh run wraps when its output file already holds data
// that the run has no recovery state for (see IfExists).
var ErrNotEmpty = errors.New("file sink: the output file is not empty")

// ErrInUse is what the error of a sink wraps when another sink (of this flow or another, in
// this process or another) is writing its file.
var ErrInUse = errors.New("file sink: the output file is in use")

// IfExists says what a fresh run of a file sink, one without recovery state for its file, does
// when the file exists and is not empty. A missing or empty file is written from its start
// whatever the choice. IfExists implements flag.Value (the values "refuse", "replace" and
// "append"), so that a command can take it as a flag.
type IfExists int

const (
	// Refuse, the default, fails the run when it starts, before any epoch (so no source has
	// acknowledged or deleted anything), with an error wrapping ErrNotEmpty that names the file
	// and the choices: resume with the recovery store of the run that wrote it, remove it, or
	// choose Replace or Append. Without this check, a second run on the same output without
	// the first run's recovery store would destroy output whose input is already consumed.
	Refuse IfExists = iota
	// Replace truncates the file to zero bytes: what it held is lost.
	Replace
	// Append keeps what the file holds and writes after it. Exactly once still holds for what
	// the run writes: the run starts at the file's length, and a resume cuts the file back to
	// a committed length, which is never below that start. A file whose last byte is not a
	// line end is refused (its last line would be joined to the run's first).
	Append
)

// String returns "refuse", "replace" or "append".
func (m IfExists) String() string {
	switch m {
	case Refuse:
		return "refuse"
	case Replace:
		return "replace"
	case Append:
		return "append"
	}
	return fmt.Sprintf("IfExists(%d)", int(m))
}

// Set parses "refuse", "replace" or "append" (flag.Value).
func (m *IfExists) Set(s string) error {
	for _, v := range []IfExists{Refuse, Replace, Append} {
		if s == v.String() {
			*m = v
			return nil
		}
	}
	return fmt.Errorf("want refuse, replace or append, got %q", s)
}

// SinkOption configures LinesOut, WriteLines and NewLineSink.
type SinkOption func(*sinkConfig)

type sinkConfig struct {
	ifExists IfExists
	flag     string // the command-line flag that sets ifExists, named in the refusal's error
	err      error
}

// OnExisting chooses what a fresh run does with a file that is not empty (default Refuse).
func OnExisting(m IfExists) SinkOption {
	return func(c *sinkConfig) {
		if m < Refuse || m > Append {
			c.err = fmt.Errorf("file sink: OnExisting: unknown choice %d", int(m))
		}
		c.ifExists = m
	}
}

// ExistsFlag names the command-line flag of a program that sets OnExisting (such as
// "-output-exists"), so that the error of a refused run tells the program's user that flag
// ("-output-exists append") instead of the Go option.
func ExistsFlag(name string) SinkOption {
	return func(c *sinkConfig) { c.flag = name }
}

// choice says how the user picks m, in the words of the refusal's error.
func (c *sinkConfig) choice(m IfExists) string {
	if c.flag != "" {
		return c.flag + " " + m.String()
	}
	name := map[IfExists]string{Replace: "Replace", Append: "Append"}[m]
	return "file.OnExisting(file." + name + ")"
}

// LinesOut returns a sink that writes every item to the file at path as format(item) followed by
// "\n" (format nil means fmt.Sprint(item); for dataflow.KV items pass a format of your own). The
// sink has one partition, keyed by the file's absolute, cleaned path with symbolic links
// resolved (so that a run resumed from another working directory, or through a link that leads
// elsewhere now, does not take the same path for the file it wrote), and
// every item goes to it: the file is written by a single worker (worker 0), in the order that
// worker receives the items.
//
// Exactly once: at the end of every epoch Snapshot flushes the buffered lines, fsyncs the file
// (and, once, its directory) and returns the file's length, an int64. A resumed run truncates
// the file to the length of the last committed snapshot and writes on from there: whatever was
// written after that snapshot (the output of epochs that were never committed) is cut away, and
// the replay of those epochs writes it again. So Commit has nothing to do: the committed data is
// already in place and durable. If the file is shorter than the snapshot on resume, it was
// changed behind the flow's back, and the run fails with an error naming the path and both
// sizes.
//
// A fresh run (no resume state for the file) writes a missing or empty file from its start; a
// file that holds data is refused, replaced or appended to, as OnExisting says (see IfExists;
// the default refuses). Until its first epoch is committed, a fresh run keeps a start marker
// next to the file (its path followed by ".epochflow-start", holding the offset the run
// started at and the file's identity): if the run dies before that commit, the file holds
// output of epochs never committed and no recovery state describes it, and the next fresh run
// on the file cuts it back to the marker's offset instead of refusing it or appending to it.
// The marker is removed at the first commit.
//
// One writer per file: the sink holds an exclusive lock (flock) on the file from Build to
// Close, and a second sink on the same file, in this process or another, fails with an error
// wrapping ErrInUse that names the file (on systems without flock there is no lock). The lock
// goes with the process, however it ends; a partition abandoned by a simulated crash
// (dataflow.Options.CrashHook) gives it up to the next run in the same process.
//
// Readers of the file while the flow runs may see lines of epochs that are not committed yet
// (and that a crash followed by a resume would rewrite); once the run ends, the file holds every
// item exactly once. Close flushes what is buffered.
//
// If a flush or fsync at the end of an epoch fails, Snapshot cannot report it (its signature
// has no error), so the error is kept and returned by the next Write, Commit or Close, which
// fails the run.
func LinesOut[T any](path string, format func(T) string, opts ...SinkOption) dataflow.Sink[T] {
	return dataflow.ToPartitioned[T, int64](NewLineSink(path, format, opts...))
}

// WriteLines returns a sink that writes every string to the file at path as a line (the string
// followed by "\n"). It is LinesOut with the identity as format; everything said there holds.
func WriteLines(path string, opts ...SinkOption) dataflow.Sink[string] {
	return LinesOut(path, func(s string) string { return s }, opts...)
}

// LineSink is the dataflow.PartitionedSink behind LinesOut and WriteLines, for tests and for
// composing it with other sinks. It has one partition, the file's absolute path; its state is
// the file's length after the last snapshot.
type LineSink[T any] struct {
	path   string
	format func(T) string
	cfg    sinkConfig
}

// NewLineSink returns the sink of LinesOut.
func NewLineSink[T any](path string, format func(T) string, opts ...SinkOption) *LineSink[T] {
	if format == nil {
		format = func(item T) string { return fmt.Sprint(item) }
	}
	s := &LineSink[T]{path: path, format: format}
	for _, o := range opts {
		o(&s.cfg)
	}
	return s
}

// Parts returns the one partition: the file's absolute, cleaned path, symbolic links resolved.
func (s *LineSink[T]) Parts(context.Context) ([]string, error) {
	if s.cfg.err != nil {
		return nil, s.cfg.err
	}
	if s.path == "" {
		return nil, errors.New("file.LinesOut: empty path")
	}
	abs, err := realPath(s.path)
	if err != nil {
		return nil, fmt.Errorf("file.LinesOut: %s: %w", s.path, err)
	}
	return []string{abs}, nil
}

// realPath returns the absolute, cleaned path of the file at path with its symbolic links
// resolved (those of its directory only, when the file does not exist yet), so that a resume
// through a link that leads elsewhere now names another partition, which the engine refuses.
func realPath(path string) (string, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return "", err
	}
	if _, err := os.Lstat(abs); err == nil {
		return filepath.EvalSymlinks(abs) // a link to a missing file fails here
	}
	if dir, err := filepath.EvalSymlinks(filepath.Dir(abs)); err == nil {
		return filepath.Join(dir, filepath.Base(abs)), nil
	}
	return abs, nil // a missing directory: Build says so
}

// PartFor returns 0: every item goes to the one partition.
func (s *LineSink[T]) PartFor(T, int) int { return 0 }

// Build opens the file named part for writing, without O_APPEND, and locks it (ErrInUse if
// another sink holds it). With resume it truncates the file to *resume bytes, after checking
// that the file is at least that long. Without resume (a fresh run) it starts at 0 on a missing
// or empty file, cuts back the uncommitted output of an earlier fresh run that its start
// marker describes, and otherwise does what OnExisting says (ErrNotEmpty by default).
func (s *LineSink[T]) Build(ctx context.Context, part string, resume *int64) (dataflow.StatefulSink[T, int64], error) {
	if s.cfg.err != nil {
		return nil, s.cfg.err
	}
	f, err := os.OpenFile(part, os.O_WRONLY|os.O_CREATE, 0o666)
	if err != nil {
		return nil, fmt.Errorf("file sink: %w", err)
	}
	if err := lock(ctx, part, f); err != nil {
		f.Close()
		return nil, err
	}
	fail := func(err error) (dataflow.StatefulSink[T, int64], error) {
		unlock(part, f)
		f.Close()
		return nil, err
	}
	fi, err := f.Stat()
	if err != nil {
		return fail(fmt.Errorf("file sink: %w", err))
	}
	var off int64
	marker := ""
	if resume != nil {
		off = *resume
		if off < 0 {
			return fail(fmt.Errorf("file sink: %s: negative resume offset %d", part, off))
		}
		if fi.Size() < off {
			return fail(fmt.Errorf("file sink: %s is %d bytes, shorter than the snapshot's %d: the file was changed behind the flow's back", part, fi.Size(), off))
		}
		// A marker left by a fresh run that died before committing describes output that this
		// resume cuts away (or overwrites): it must not make a later fresh run cut this one's.
		if err := os.Remove(markerPath(part)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fail(fmt.Errorf("file sink: %s: removing the stale start marker: %w", part, err))
		}
	} else {
		if off, err = s.freshStart(ctx, part, fi); err != nil {
			return fail(err)
		}
		marker = markerPath(part)
	}
	if err := f.Truncate(off); err != nil {
		return fail(fmt.Errorf("file sink: %w", err))
	}
	if _, err := f.Seek(off, 0); err != nil {
		return fail(fmt.Errorf("file sink: %s: seek to %d: %w", part, off, err))
	}
	return &lineSinkPart[T]{
		path: part, format: s.format, f: f, w: bufio.NewWriterSize(f, writeBufSize), off: off,
		marker: marker,
		dirty:  true, syncDir: true, // the truncation and the file's creation must be durable too
	}, nil
}

// freshStart returns the offset a fresh run starts writing the file at, and writes the start
// marker that says so before anything is written.
func (s *LineSink[T]) freshStart(ctx context.Context, part string, fi os.FileInfo) (int64, error) {
	size := fi.Size()
	start, found := readMarker(part, fi)
	if found && start > size {
		found = false // the file was cut below the marker's offset behind the flow's back
	}
	mode := s.cfg.ifExists
	var off int64
	switch {
	case found && mode == Replace:
		off = 0
	case found && (start == 0 || mode == Append):
		off = start
		if size > start {
			dataflow.Logger(ctx).Info("file sink: cutting away the output of an earlier run that ended before its first commit",
				"file", part, "from", start, "bytes", size-start)
		}
	case found:
		return 0, fmt.Errorf("%w: %s holds %d bytes from before an earlier run appended to it (and ended before its first commit), and this run has no recovery state for it: "+
			"pass %s to append to those bytes again, %s to replace them, or remove the file", ErrNotEmpty, part, start, s.cfg.choice(Append), s.cfg.choice(Replace))
	case size == 0 || mode == Replace:
		off = 0
	case mode == Append:
		last, err := lastByte(part, size)
		if err != nil {
			return 0, fmt.Errorf("file sink: %s: %w", part, err)
		}
		if last != '\n' {
			return 0, fmt.Errorf("file sink: %s does not end with a line end, so appending to it would join its last line with the first one written: end it with a line end, or pass %s", part, s.cfg.choice(Replace))
		}
		off = size
	default:
		return 0, fmt.Errorf("%w: %s holds %d bytes, and this run has no recovery state for it: "+
			"to resume the run that wrote it, give this run that run's recovery directory; otherwise remove the file, or pass %s to replace it, "+
			"or %s to append to it (only when its content is final: if a run with a recovery store was killed while writing it, "+
			"the lines that run wrote after its last commit would stay, and be written again by whoever replays them)",
			ErrNotEmpty, part, size, s.cfg.choice(Replace), s.cfg.choice(Append))
	}
	if !found || off != start {
		if err := writeMarker(part, fi, off); errors.Is(err, fs.ErrPermission) && !found {
			// Without a marker the run is still exactly once; only a crash before its first
			// commit makes the next fresh run refuse the file instead of cutting it back.
			dataflow.Logger(ctx).Warn("file sink: cannot write the start marker next to the file (the directory is not writable): "+
				"if this run ends before its first commit, the next run without its recovery state refuses the file instead of cutting it back",
				"file", part, "marker", markerPath(part), "error", err)
		} else if err != nil {
			return 0, fmt.Errorf("file sink: %s: writing the start marker: %w", part, err)
		}
	}
	return off, nil
}

// markerSuffix ends the name of a fresh run's start marker, next to its file.
const markerSuffix = ".epochflow-start"

func markerPath(part string) string { return part + markerSuffix }

// writeMarker durably records that a fresh run starts writing the file of fi at off.
func writeMarker(part string, fi os.FileInfo, off int64) error {
	text := fmt.Sprintf("An epochflow file sink started writing %s at byte %d and has not committed an epoch yet.\n"+
		"A fresh run on that file cuts it back to that length; the first commit removes this file.\n"+
		"file-id %s\nstart %d\n", part, off, fileID(part, fi), off)
	f, err := os.OpenFile(markerPath(part), os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o666)
	if err != nil {
		return err
	}
	_, err = f.WriteString(text)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	return syncDir(filepath.Dir(part))
}

// readMarker returns the offset of the start marker of the file of fi, if there is a complete
// one for that very file (a marker of a file that was replaced since is not).
func readMarker(part string, fi os.FileInfo) (int64, bool) {
	b, err := os.ReadFile(markerPath(part))
	if err != nil {
		return 0, false
	}
	var id string
	var start int64 = -1
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "file-id "); ok {
			id = v
		} else if v, ok := strings.CutPrefix(l, "start "); ok {
			if n, err := strconv.ParseInt(v, 10, 64); err == nil && n >= 0 {
				start = n
			}
		}
	}
	if start < 0 || id != fileID(part, fi) {
		return 0, false
	}
	return start, true
}

// lastByte returns the byte at size-1 of the file.
func lastByte(path string, size int64) (byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	b := make([]byte, 1)
	if _, err := f.ReadAt(b, size-1); err != nil {
		return 0, err
	}
	return b[0], nil
}

// errWouldBlock is what flock returns when another open file description holds the lock.
var errWouldBlock = errors.New("locked elsewhere")

// holders are the files this process's sinks hold locked, by path, with the context of the run
// that built them: a partition abandoned by a simulated crash (its run's context ended with
// dataflow.ErrCrashed, and nothing was closed) gives its lock up to the next sink, as the
// kernel does for a process that died.
var holders = struct {
	sync.Mutex
	m map[string]holder
}{m: map[string]holder{}}

type holder struct {
	ctx context.Context
	f   *os.File
}

// lock takes the exclusive lock of the file part, open as f.
func lock(ctx context.Context, part string, f *os.File) error {
	holders.Lock()
	defer holders.Unlock()
	err := flock(f)
	if errors.Is(err, errWouldBlock) {
		if h, ok := holders.m[part]; ok && errors.Is(context.Cause(h.ctx), dataflow.ErrCrashed) {
			funlock(h.f)
			delete(holders.m, part)
			err = flock(f)
		}
	}
	if errors.Is(err, errWouldBlock) {
		return fmt.Errorf("%w: %s is being written by another file sink (of this flow or another, in this process or another): "+
			"two writers of one file lose each other's lines; stop the other run, or write another file", ErrInUse, part)
	}
	if err != nil {
		return fmt.Errorf("file sink: %s: locking: %w", part, err)
	}
	holders.m[part] = holder{ctx: ctx, f: f}
	return nil
}

// unlock forgets the lock of f (closing f releases it).
func unlock(part string, f *os.File) {
	holders.Lock()
	defer holders.Unlock()
	if h, ok := holders.m[part]; ok && h.f == f {
		delete(holders.m, part)
	}
}

// lineSinkPart is the open file of a LineSink.
type lineSinkPart[T any] struct {
	path    string
	format  func(T) string
	f       *os.File // nil once closed
	w       *bufio.Writer
	off     int64  // bytes handed to w so far: the file's length once w is flushed
	marker  string // the start marker of a fresh run, removed at the first commit; "" after
	dirty   bool   // written or truncated since the last fsync
	syncDir bool   // the directory entry is not fsynced yet
	err     error  // the first failure, returned by the calls after it
	told    bool   // err was returned to the engine at least once
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

// Commit reports an earlier failure and, at a fresh run's first commit, removes its start
// marker (the committed length is in the recovery store now, or, without a store, the data is
// committed output that no later run may cut). Otherwise it has nothing to do: Snapshot already
// made the data durable, and a resume cuts away what came after the committed snapshot.
func (p *lineSinkPart[T]) Commit(context.Context, int64) error {
	if err := p.failed(); err != nil {
		return err
	}
	if p.marker != "" {
		err := os.Remove(p.marker)
		if err == nil || errors.Is(err, fs.ErrNotExist) {
			err = syncDir(filepath.Dir(p.marker))
		}
		if err != nil {
			p.err = fmt.Errorf("file sink: %s: removing the start marker after the first commit: %w", p.path, err)
			return p.failed()
		}
		p.marker = ""
	}
	return nil
}

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
	unlock(p.path, p.f)
	if err := p.f.Close(); err != nil { // releases the lock
		errs = append(errs, fmt.Errorf("file sink: %w", err))
	}
	p.f, p.w = nil, nil
	return errors.Join(errs...)
}
