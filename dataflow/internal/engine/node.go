package engine

import (
	"context"
	"log/slog"
	"time"
)

// Env is what a node gets from the worker that runs it.
type Env struct {
	Ctx     context.Context
	StepID  string
	Worker  int // global worker index
	Workers int // total workers in the cluster
	Logger  *slog.Logger
	// Recovery tells whether snapshots are kept; without it stateful nodes need not track
	// changed keys.
	Recovery bool
	// StartEpoch is the first epoch of the run: the committed epoch it resumes from, plus one.
	StartEpoch uint64

	w        *worker
	step     int
	reusable []bool
}

// Reusable tells whether a batch emitted on port is free again once Emit returns: every
// consumer either copies it (an exchange) or keeps nothing of it (a Consumer). A node may then
// reuse the batch's memory for its next output.
func (e *Env) Reusable(port int) bool { return e.reusable[port] }

// Save records a piece of the step's state at the end of epoch (called from OnClose): key is a
// state key or a partition key; deleted marks a key whose state was discarded.
func (e *Env) Save(epoch uint64, key string, state []byte, deleted bool) {
	e.w.snaps = append(e.w.snaps, Snapshot{Step: e.StepID, Key: key, Epoch: epoch, State: state, Deleted: deleted})
}

// Restored returns the state the step had at the committed epoch the run resumes from: every
// key of the step, on every worker (a node keeps the keys it owns).
func (e *Env) Restored() []Restored { return e.w.r.cfg.Restored[e.StepID] }

// Emit passes a batch of items of epoch to every consumer of output port. The batch is handed
// over: the caller must not modify it afterwards, and consumers must not modify it either.
func (e *Env) Emit(port int, epoch uint64, batch any) error {
	return e.w.emit(e.step, port, epoch, batch)
}

// Snapshot is one piece of state saved at the end of an epoch.
type Snapshot struct {
	Step, Key string
	Epoch     uint64
	State     []byte
	Deleted   bool
}

// Restored is one key's state loaded from the recovery store.
type Restored struct {
	Key   string
	State []byte
}

// Store is where committed epochs are recorded. Commit must be durable when it returns: it
// records every snapshot given and marks epoch as committed, atomically.
type Store interface {
	Commit(ctx context.Context, epoch uint64, frontiers []uint64, snaps []Snapshot) error
}

// Node is the per-worker instance of a step. The worker calls its methods from one goroutine.
type Node interface {
	// OnBatch handles a batch of items of epoch arriving on input port.
	OnBatch(port int, epoch uint64, batch any) error
	// OnEOF is called once, when every input of the step has ended. Items emitted in it belong
	// to epoch.
	OnEOF(epoch uint64) error
	// OnClose is called when epoch has ended on every input (and for a source, on this worker's
	// clock). It must not emit. It is where snapshots are taken.
	OnClose(epoch uint64) error
	// Close releases the node's resources. It is called once, last.
	Close() error
}

// SourceNode is the node of a step that reads from outside.
type SourceNode interface {
	Node
	// Poll reads what is available now and emits it with epoch. It reports whether it emitted
	// anything and whether every partition of this worker has ended.
	Poll(epoch uint64) (progress, eof bool, err error)
	// Awake tells when to poll again if nothing is available: a time (zero for none) and
	// channels that become ready when data arrives.
	Awake() (time.Time, []<-chan struct{})
}

// Consumer is implemented by nodes that never keep a batch (nor hand it on) after OnBatch
// returns, so that the engine may reuse its memory.
type Consumer interface {
	ConsumesBatches()
}

// EpochEnder is implemented by nodes that emit what they hold when an epoch ends (a combiner
// that merges items within an epoch): OnEpochEnd is called, before OnClose and before the
// epoch's barrier is sent on, at the end of every epoch and before a graceful stop; what it
// emits belongs to epoch.
type EpochEnder interface {
	OnEpochEnd(epoch uint64) error
}

// Timed is implemented by nodes that ask to be woken at a time.
type Timed interface {
	// NextTime is the earliest time the node wants OnTime called; zero for none.
	NextTime() time.Time
	// OnTime is called once now has reached NextTime; items it emits belong to epoch.
	OnTime(now time.Time, epoch uint64) error
}

// Committer is implemented by nodes that hold source or sink partitions.
type Committer interface {
	// Commit is called on the node's worker when every epoch up to epoch is committed.
	Commit(ctx context.Context, epoch uint64) error
}
