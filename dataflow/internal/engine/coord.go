package engine

import (
	"sync"
	"sync/atomic"
)

// coordinator collects every worker's frontier and advances the committed epoch when the
// cluster frontier passes it. Before it publishes a new committed epoch it calls OnCommit
// (where a durable store records the epoch); workers then call Commit on their partitions.
type coordinator struct {
	mu        sync.Mutex
	frontier  []uint64
	done      []bool
	workers   []*worker
	onCommit  func(epoch uint64) error
	fail      func(error)
	committed atomic.Uint64
	finished  atomic.Bool // every worker is done and the last epoch is committed
}

func (c *coordinator) report(w int, frontier uint64, done bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
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
	if low <= c.committed.Load() && !(all && !c.finished.Load()) {
		return
	}
	if low > c.committed.Load() && c.onCommit != nil {
		if err := c.onCommit(low); err != nil {
			c.fail(err)
			return
		}
	}
	c.committed.Store(max(low, c.committed.Load()))
	if all {
		c.finished.Store(true)
	}
	for _, wk := range c.workers {
		wk.wakeUp()
	}
}
