package engine

import (
	"sync"
	"sync/atomic"
	"time"
)

// Meter counts what runs of one graph do, for metrics. The engine adds to it from the workers'
// goroutines (per batch, with atomic adds on counters of the worker's own, never a lock on the
// path of the items); anything may read it at any time from another goroutine. One Meter
// serves every run of the same graph with the same number of workers (the restarts of a flow),
// so its counters only grow.
type Meter struct {
	workers []*workerMeter

	// ObserveCommit, if set, is called with the time from the end of each epoch (when the first
	// worker closed it at the sources) to its commit.
	ObserveCommit func(time.Duration)
	// ObserveSnapshot, if set, is called after each epoch recorded in the store, with the time
	// the store took and the bytes of state it recorded.
	ObserveSnapshot func(d time.Duration, bytes int)

	committed atomic.Uint64
	ready     atomic.Bool // a run is running and has committed an epoch
	live      atomic.Pointer[liveRun]

	mu    sync.Mutex
	ended map[uint64]time.Time // epoch -> when it ended, until it is committed
}

// workerMeter is one worker's counters, per step. The padding keeps two workers' counters off
// one cache line.
type workerMeter struct {
	in, out []atomic.Uint64
	open    atomic.Uint64 // the epoch open at the sources
	_       [64]byte
}

// liveRun is what a running run lets a Meter read: its channels.
type liveRun struct {
	p       *plan
	workers []*worker
}

// NewMeter returns a Meter for a graph of steps steps run on workers workers.
func NewMeter(steps, workers int) *Meter {
	m := &Meter{workers: make([]*workerMeter, workers), ended: map[uint64]time.Time{}}
	for i := range m.workers {
		m.workers[i] = &workerMeter{in: make([]atomic.Uint64, steps), out: make([]atomic.Uint64, steps)}
	}
	return m
}

// Items returns the items step took in and put out on worker: for a source, the items it read
// and emitted; for a sink, the items it received and handed to the outside; for any other
// step, the items it received and emitted.
func (m *Meter) Items(step, worker int) (in, out uint64) {
	w := m.workers[worker]
	return w.in[step].Load(), w.out[step].Load()
}

// Workers is the number of workers the Meter counts for.
func (m *Meter) Workers() int { return len(m.workers) }

// OpenEpoch is the newest epoch open at the sources, over the workers.
func (m *Meter) OpenEpoch() uint64 {
	var e uint64
	for _, w := range m.workers {
		e = max(e, w.open.Load())
	}
	return e
}

// Committed is the last committed epoch.
func (m *Meter) Committed() uint64 { return m.committed.Load() }

// Ready tells whether a run is running (its nodes built) and has committed an epoch since it
// started.
func (m *Meter) Ready() bool { return m.ready.Load() }

// QueueDepths calls fn with the messages (batches and markers) waiting on every channel of the
// running run, per edge (the sending and receiving steps' ids) and receiving worker. It calls
// nothing when no run is running.
func (m *Meter) QueueDepths(fn func(from, to string, worker int, depth int)) {
	lr := m.live.Load()
	if lr == nil {
		return
	}
	for eid, e := range lr.p.edges {
		if !e.channel {
			continue
		}
		from, to := lr.p.steps[e.from].ID, lr.p.steps[e.to].ID
		for _, w := range lr.workers {
			n := 0
			for _, mb := range w.inbox[eid] {
				if mb != nil {
					n += int(mb.n.Load())
				}
			}
			fn(from, to, w.index, n)
		}
	}
}

// begin starts a run: not ready until it commits.
func (m *Meter) begin(p *plan, workers []*worker, committed uint64) {
	m.mu.Lock()
	clear(m.ended)
	m.mu.Unlock()
	m.committed.Store(committed)
	for _, w := range m.workers {
		w.open.Store(committed + 1)
	}
	m.live.Store(&liveRun{p: p, workers: workers})
}

// end ends a run.
func (m *Meter) end() {
	m.ready.Store(false)
	m.live.Store(nil)
}

// epochEnded records when epoch ended at the sources of a worker (the first worker's time).
func (m *Meter) epochEnded(epoch uint64, at time.Time) {
	m.mu.Lock()
	if _, ok := m.ended[epoch]; !ok {
		m.ended[epoch] = at
	}
	m.mu.Unlock()
}

// commit records that every epoch up to epoch is committed.
func (m *Meter) commit(epoch uint64) {
	now := time.Now()
	m.mu.Lock()
	for e, at := range m.ended {
		if e <= epoch {
			if m.ObserveCommit != nil {
				m.ObserveCommit(now.Sub(at))
			}
			delete(m.ended, e)
		}
	}
	m.mu.Unlock()
	m.committed.Store(max(epoch, m.committed.Load()))
	m.ready.Store(true)
}
