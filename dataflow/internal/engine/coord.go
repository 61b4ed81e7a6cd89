package engine

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
)

// ErrCrashed is the cause of a run stopped by its crash hook.
var ErrCrashed = errors.New("crashed by the crash hook")

// coordinator collects every worker's frontier and advances the committed epoch when the
// cluster frontier passes it. With a store, a writer goroutine first records the epoch and its
// snapshots durably; only then is the epoch published as committed, and workers call Commit on
// their partitions.
type coordinator struct {
	mu        sync.Mutex
	frontier  []uint64
	done      []bool
	workers   []*worker
	pending   []Snapshot // handed over by workers, not yet written
	requested uint64     // the newest epoch the cluster frontier has passed
	allDone   bool       // every worker is done; requested is the final epoch
	onCommit  func(epoch uint64) error
	store     Store
	crash     func(point string) bool
	ctx       context.Context
	fail      func(error)

	wakeWriter chan struct{}
	committed  atomic.Uint64
	finished   atomic.Bool // every worker is done and the last epoch is committed
}

// report records a worker's frontier (the last epoch all its steps closed) and the snapshots it
// took since its last report.
func (c *coordinator) report(w int, frontier uint64, done bool, snaps []Snapshot) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.pending = append(c.pending, snaps...)
	c.frontier[w], c.done[w] = frontier, done
	low, all, final := uint64(eofEpoch), true, uint64(0)
	for i, f := range c.frontier {
		if c.done[i] {
			final = max(final, f)
			continue
		}
		all = false
		low = min(low, f)
	}
	if all {
		low = final
	}
	if low <= c.requested && (!all || c.allDone) {
		return
	}
	c.requested = max(c.requested, low)
	c.allDone = all
	if c.store != nil {
		select {
		case c.wakeWriter <- struct{}{}:
		default:
		}
		return
	}
	if low > c.committed.Load() && c.onCommit != nil {
		if err := c.onCommit(low); err != nil {
			c.fail(err)
			return
		}
	}
	c.pending = c.pending[:0]
	c.publish(c.requested, all)
}

// publish makes epoch the committed one and wakes the workers to call Commit.
func (c *coordinator) publish(epoch uint64, final bool) {
	c.committed.Store(max(epoch, c.committed.Load()))
	if final {
		c.finished.Store(true)
	}
	for _, wk := range c.workers {
		wk.wakeUp()
	}
}

// hit calls the crash hook at a named point; it reports true when the run must stop there as
// if it crashed.
func (c *coordinator) hit(point string) bool {
	if c.crash != nil && c.crash(point) {
		c.fail(fmt.Errorf("%w at %s", ErrCrashed, point))
		return true
	}
	return false
}

// writer records requested epochs in the store, one transaction each, coalescing epochs that
// were passed while it was writing (a commit is subsuming).
func (c *coordinator) writer() {
	for {
		select {
		case <-c.wakeWriter:
		case <-c.ctx.Done():
			return
		}
		c.mu.Lock()
		epoch, final := c.requested, c.allDone
		if epoch <= c.committed.Load() && !final {
			c.mu.Unlock()
			continue
		}
		var snaps, keep []Snapshot
		for _, s := range c.pending {
			if s.Epoch <= epoch {
				snaps = append(snaps, s)
			} else {
				keep = append(keep, s)
			}
		}
		c.pending = keep
		frontiers := append([]uint64(nil), c.frontier...)
		c.mu.Unlock()

		if epoch > c.committed.Load() {
			if c.hit("before-commit-record") {
				return
			}
			if err := c.store.Commit(c.ctx, epoch, frontiers, snaps); err != nil {
				c.fail(fmt.Errorf("recording epoch %d as committed: %w", epoch, err))
				return
			}
			if c.hit("after-commit-record") {
				return
			}
			if c.onCommit != nil {
				if err := c.onCommit(epoch); err != nil {
					c.fail(err)
					return
				}
			}
		}
		c.publish(epoch, final)
	}
}
