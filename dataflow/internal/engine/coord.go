package engine

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
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
	pending   []*Pack  // handed over by workers, not yet written, as reported
	fl        inFlight // what pending and the writer hold (with a store)
	requested uint64   // the newest epoch the cluster frontier has passed
	allDone   bool     // every worker is done; requested is the final epoch
	onCommit  func(epoch uint64) error
	store     Store
	crash     func(point string) bool
	ctx       context.Context
	fail      func(error)
	meter     *Meter // nil without one
	// transport, in a cluster: a process that does not lead sends its workers' frontiers to
	// the leader (process 0), which announces the epochs it commits.
	transport Transport
	leader    bool

	// free holds packs that workers filled and the store is done with (reset): a worker's
	// next epoch appends into one (Env.Save, Env.Reserve) instead of allocating it. At most
	// len(workers) are kept. Guarded by mu.
	free []*Pack

	wakeWriter chan struct{}
	committed  atomic.Uint64
	finished   atomic.Bool // every worker is done and the last epoch is committed
}

// report records a worker's frontier (the last epoch all its steps closed) and the snapshots it
// took since its last report.
func (c *coordinator) report(w int, frontier uint64, done bool, pack *Pack) {
	if c.transport != nil && !c.leader {
		// The leader writes the store: the snapshots go with the frontier, in order, so
		// that it has them all before the frontier lets it commit their epoch.
		var data []byte
		if pack != nil && pack.Len() > 0 {
			data, _ = pack.AppendBinary(nil) // never fails
			c.recycle([]*Pack{pack})
		}
		c.transport.SendReport(w, frontier, done, data)
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if pack != nil && pack.Len() > 0 {
		c.pending = append(c.pending, pack)
		if c.store != nil {
			c.fl.add(pack, c.committed.Load())
		}
	}
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
	c.pending = nil
	c.publish(c.requested, all)
}

// publish makes epoch the committed one and wakes the workers to call Commit.
func (c *coordinator) publish(epoch uint64, final bool) {
	if c.transport != nil && c.leader {
		c.transport.SendCommit(epoch, final)
	}
	c.committed.Store(max(epoch, c.committed.Load()))
	if c.meter != nil {
		c.meter.commit(c.committed.Load())
	}
	if final {
		c.finished.Store(true)
	}
	for _, wk := range c.workers {
		wk.wakeUp()
	}
}

// recycle puts the packs the workers filled on the free list once the store is done with them
// (or they were copied out), for the workers' next epochs (no allocation and no garbage of a
// pack per worker and epoch).
func (c *coordinator) recycle(spent []*Pack) {
	if len(spent) == 0 {
		return
	}
	for _, p := range spent {
		p.Reset()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, p := range spent {
		if len(c.free) < len(c.workers) {
			c.free = append(c.free, p)
			continue
		}
		// Full: keep the biggest.
		j := 0
		for i := range c.free {
			if c.free[i].Cap() < c.free[j].Cap() {
				j = i
			}
		}
		if p.Cap() > c.free[j].Cap() {
			c.free[j] = p
		}
	}
}

// reuse returns the biggest free pack, or a new one if there is none.
func (c *coordinator) reuse() *Pack {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.free) == 0 {
		return &Pack{}
	}
	j := 0
	for i := range c.free {
		if c.free[i].Cap() > c.free[j].Cap() {
			j = i
		}
	}
	p := c.free[j]
	last := len(c.free) - 1
	c.free[j] = c.free[last]
	c.free[last] = nil
	c.free = c.free[:last]
	return p
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
// were passed while it was writing (a commit is subsuming): such a transaction gets the
// snapshots of all of them, and the store keeps the newest of each key. While it writes, the workers run the next
// epochs; they pause their sources when too many epochs or snapshot bytes wait (see
// worker.canRead), so that a store that falls behind slows the flow instead of filling memory.
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
		var packs, spent []*Pack
		packs, spent, c.pending = takeUpTo(c.pending, epoch)
		var taken int64
		for _, p := range packs {
			taken += snapshotBytes(p)
		}
		frontiers := append([]uint64(nil), c.frontier...)
		c.mu.Unlock()
		c.recycle(spent)

		if epoch > c.committed.Load() {
			if c.hit("before-commit-record") {
				return
			}
			bytes := 0
			for _, p := range packs {
				bytes += p.Size()
			}
			began := time.Now()
			err := c.store.Commit(c.ctx, epoch, frontiers, packs)
			c.recycle(packs)
			if err != nil {
				c.fail(fmt.Errorf("recording epoch %d as committed: %w", epoch, err))
				return
			}
			if c.meter != nil && c.meter.ObserveSnapshot != nil {
				c.meter.ObserveSnapshot(time.Since(began), bytes)
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
		c.mu.Lock()
		c.fl.done(taken, epoch)
		c.mu.Unlock()
		c.publish(epoch, final)
	}
}
