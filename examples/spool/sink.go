package spool

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/epochflow/epochflow/dataflow"
)

// pendingPrefix starts the name of a file whose epoch is not committed yet; readers of the
// directory skip names that start with a dot.
const pendingPrefix = ".pending-"

// Write returns a sink that writes each item, as encode makes it, as a file of dir named
// EPOCH-INDEX (both zero-padded, so that names sort in the order written), visible only once
// its epoch is committed. dir must exist.
func Write[T any](dir string, encode func(T) []byte) dataflow.Sink[T] {
	return dataflow.ToPartitioned[T, uint64](&sink[T]{dir: dir, encode: encode})
}

// sink is the dataflow.PartitionedSink behind Write.
type sink[T any] struct {
	dir    string
	encode func(T) []byte
}

// Parts returns the one partition: the directory's absolute path.
func (s *sink[T]) Parts(context.Context) ([]string, error) {
	abs, err := filepath.Abs(s.dir)
	if err != nil || s.dir == "" {
		return nil, fmt.Errorf("spool sink: directory %q: %v", s.dir, err)
	}
	if fi, err := os.Stat(abs); err != nil || !fi.IsDir() {
		return nil, fmt.Errorf("spool sink: %s is not a directory", abs)
	}
	return []string{abs}, nil
}

// PartFor sends every item to the one partition.
func (s *sink[T]) PartFor(T, int) int { return 0 }

// Build opens the partition. resume is the number of the last epoch the sink wrote in a
// committed epoch. The pending files of the epochs up to it were committed but not yet renamed
// when the last run stopped: they are renamed now. The later ones belong to epochs that were
// never committed, which the flow replays: they are deleted. On a fresh start (no resume), the
// epochs are numbered after the last one in the directory, so that new files never replace
// old ones.
func (s *sink[T]) Build(_ context.Context, part string, resume *uint64) (dataflow.StatefulSink[T, uint64], error) {
	p := &sinkPart[T]{dir: part, encode: s.encode}
	entries, err := os.ReadDir(part)
	if err != nil {
		return nil, fmt.Errorf("spool sink %s: %w", part, err)
	}
	if resume != nil {
		p.epoch = *resume
		if err := p.settle(p.epoch, true); err != nil {
			return nil, err
		}
		return p, nil
	}
	// A fresh start: no pending file was ever committed (settle(0) deletes them all), and
	// the new epochs come after the newest final file.
	for _, e := range entries {
		if epoch, ok := epochOf(e.Name()); ok {
			p.epoch = max(p.epoch, epoch)
		}
	}
	if err := p.settle(0, true); err != nil {
		return nil, err
	}
	return p, nil
}

// sinkPart is the open sink. The engine calls its methods from one goroutine.
type sinkPart[T any] struct {
	dir    string
	encode func(T) []byte
	epoch  uint64 // the epochs snapshotted so far; the open one is epoch+1
	n      int    // files written in the open epoch
}

// name is the final name of the nth file of epoch.
func name(epoch uint64, n int) string { return fmt.Sprintf("%020d-%08d", epoch, n) }

// epochOf returns the epoch of a final file name.
func epochOf(name string) (uint64, bool) {
	e, _, ok := strings.Cut(name, "-")
	if !ok || len(e) != 20 {
		return 0, false
	}
	epoch, err := strconv.ParseUint(e, 10, 64)
	return epoch, err == nil
}

// Write writes each item to a pending file of the open epoch and flushes it to disk, so that
// once Snapshot returns, the epoch's files survive a crash.
func (p *sinkPart[T]) Write(_ context.Context, batch []T) error {
	for _, item := range batch {
		path := filepath.Join(p.dir, pendingPrefix+name(p.epoch+1, p.n))
		f, err := os.Create(path)
		if err != nil {
			return fmt.Errorf("spool sink %s: %w", p.dir, err)
		}
		_, err = f.Write(p.encode(item))
		if err == nil {
			err = f.Sync()
		}
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("spool sink %s: writing %s: %w", p.dir, path, err)
		}
		p.n++
	}
	return nil
}

// Snapshot is the pre-commit: the open epoch's files are on disk (Write flushed each), so it
// closes the epoch and returns its number.
func (p *sinkPart[T]) Snapshot() (uint64, error) {
	p.epoch++
	p.n = 0
	return p.epoch, nil
}

// Commit makes the files of every epoch up to epoch visible, renaming them to their final
// names. It may be called again for an epoch already done: only pending files are renamed.
func (p *sinkPart[T]) Commit(_ context.Context, epoch uint64) error {
	return p.settle(epoch, false)
}

// settle renames the pending files of the epochs up to upTo to their final names and, when
// dropLater is set (at Build), deletes the pending files of later epochs.
func (p *sinkPart[T]) settle(upTo uint64, dropLater bool) error {
	entries, err := os.ReadDir(p.dir)
	if err != nil {
		return fmt.Errorf("spool sink %s: %w", p.dir, err)
	}
	for _, e := range entries {
		final, ok := strings.CutPrefix(e.Name(), pendingPrefix)
		if !ok {
			continue
		}
		epoch, ok := epochOf(final)
		switch {
		case !ok:
			continue
		case epoch <= upTo:
			err = os.Rename(filepath.Join(p.dir, e.Name()), filepath.Join(p.dir, final))
		case dropLater:
			err = os.Remove(filepath.Join(p.dir, e.Name()))
		}
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("spool sink %s: %w", p.dir, err)
		}
	}
	return nil
}

// Close has nothing to release: pending files stay for the next run to settle.
func (p *sinkPart[T]) Close() error { return nil }
