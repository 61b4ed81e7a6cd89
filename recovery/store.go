// Package recovery keeps what a flow needs to resume after a crash or a restart: the
// executions that ran it, the last committed epoch, each worker's frontier, and the state
// snapshots of every stateful step, keyed by (step, key, epoch).
//
// The engine uses a Store like this: at start, Begin records a new execution and returns the
// committed epoch to resume after; Load hands every step its newest committed state per key;
// then, once per committed epoch, Commit writes that epoch's snapshots and frontiers and marks
// the epoch committed, all at once. Snapshots that a newer committed snapshot of the same key
// has replaced are garbage-collected by Commit, once they are older than the backup window.
//
// SQLiteStore (OpenSQLite) is the embedded implementation. The package imports nothing of
// epochflow, so other stores (PostgreSQL) can implement Store alongside it.
package recovery

import (
	"context"
	"errors"
	"time"
)

// SchemaVersion is the version of the store layout this code reads and writes. A store
// recorded with another version is refused by OpenSQLite (see ErrSchemaVersion): this code
// never reads or writes a layout it does not know.
const SchemaVersion = 1

// Errors that the stores return wrapped (test with errors.Is); the wrapping error names the
// store and says what to do.
var (
	// ErrSchemaVersion: the store was written by a newer binary (or by an older one that this
	// binary cannot migrate).
	ErrSchemaVersion = errors.New("unsupported recovery store schema version")
	// ErrNotStore: the file is not an epochflow recovery store, or it is corrupt.
	ErrNotStore = errors.New("not an epochflow recovery store")
	// ErrNoStore: a read-only open found no store.
	ErrNoStore = errors.New("no recovery store")
	// ErrOtherFlow: Begin was called with a flow name other than the one the store belongs to.
	ErrOtherFlow = errors.New("recovery store belongs to another flow")
	// ErrEpochOrder: Commit was given an epoch that is not greater than the committed one, or
	// a snapshot whose epoch is outside (committed epoch, epoch being committed].
	ErrEpochOrder = errors.New("epoch out of order")
	// ErrReadOnly: a write was attempted on a store opened read-only.
	ErrReadOnly = errors.New("recovery store is open read-only")
	// ErrInUse: another store, in this process or another, has the directory open for
	// writing. Two runs on one store would overwrite each other's epochs.
	ErrInUse = errors.New("recovery store is in use")
)

// Store is the recovery store contract, the same for every implementation.
//
// The engine calls Begin once at start, then Load (possibly from several goroutines at once)
// for every stateful step, then Commit from one goroutine, once per committed epoch. The
// inspection methods (Committed, Executions, Steps) may be called at any time, also from a
// process other than the one running the flow.
type Store interface {
	// Begin records a new execution of the flow: its number is the previous execution's
	// plus 1 (1 for a fresh store); its start time, flow name, worker count and step ids are
	// kept. It returns what the engine needs to resume: the committed epoch (0 when the store
	// is fresh) and the previous execution's flow name, worker count and step ids (zero and
	// nil when fresh); the engine resumes at epoch Committed+1.
	//
	// If the store already belongs to a flow with another name, Begin writes nothing and
	// returns an error wrapping ErrOtherFlow that names both flows. Begin does not compare
	// step ids: that is the engine's call. e.Flow must not be empty and e.Workers must be at
	// least 1.
	Begin(ctx context.Context, e Execution) (Resume, error)

	// Commit writes, in one transaction, the snapshots of e, the frontier of every worker of
	// the current execution, and records e.Epoch as the committed epoch with the current
	// time: when Commit returns nil all of it is durable, and after a crash either all of it
	// or none of it is there. Commit must follow Begin; e.Epoch must be greater than the
	// committed epoch and every snapshot's Epoch in (committed epoch, e.Epoch] (else an error
	// wrapping ErrEpochOrder, and nothing is written); e.Frontiers has one entry per worker
	// of the current execution; a (step, key, epoch) may appear once. Epochs are at most
	// math.MaxInt64.
	//
	// Commit also garbage-collects: a snapshot is deleted once a newer snapshot of the same
	// (step, key) exists whose epoch was committed at least the store's backup window ago
	// (for SQLiteStore, SQLiteOptions.BackupInterval; 0 keeps only the newest snapshot of
	// each key), and a tombstone is deleted (with everything older of its key) once its
	// epoch was committed at least the window ago. Nothing Load can return is ever
	// collected. Frontiers are stored as given (math.MaxUint64 included).
	Commit(ctx context.Context, e Epoch) error

	// Load calls fn, in ascending byte order of key, with the newest snapshot of every key of
	// step whose epoch is at or before the committed epoch, skipping keys whose newest such
	// snapshot is a tombstone. state is a fresh slice that fn may keep (it may be empty, never
	// nil). Load stops at the first error fn returns and returns that error unchanged. Load
	// may be called from several goroutines at once.
	Load(ctx context.Context, step string, fn func(key string, epoch uint64, state []byte) error) error

	// Committed returns the committed epoch, the execution that committed it and when (the
	// zero CommitInfo when nothing was ever committed).
	Committed(ctx context.Context) (CommitInfo, error)

	// Executions returns every execution recorded by Begin, oldest first, each with the
	// frontiers its workers last committed.
	Executions(ctx context.Context) ([]ExecutionInfo, error)

	// StepIDs returns the ids of the steps the store keeps snapshots of (tombstones included),
	// in ascending order; the same steps as Steps, but without reading their snapshots, so
	// its cost does not grow with the number of keys.
	StepIDs(ctx context.Context) ([]string, error)

	// Steps returns, for every step that has snapshots, ordered by step id, how many keys
	// Load would return for it and their bytes, and how many snapshot rows (older backups and
	// tombstones included) the store keeps for it. It reads every snapshot row: it is for
	// inspection (about 1.5 s for a million keys), not for a flow's start; see StepIDs.
	Steps(ctx context.Context) ([]StepInfo, error)

	// Close releases the store. A store that is not closed (a crash) loses nothing that
	// Commit had returned for. Close is idempotent.
	Close() error
}

// Execution describes a run of the flow, as given to Begin.
type Execution struct {
	Flow    string   // the flow's name; a store belongs to one flow
	Steps   []string // the ids of the flow's stateful steps (kept for the next execution)
	Workers int      // the number of workers of this execution
}

// Resume is what Begin returns: the execution just recorded and what the previous one left.
type Resume struct {
	Execution int      // the number of the execution just recorded: 1, 2, ...
	Committed uint64   // the committed epoch, 0 when the store is fresh; resume at Committed+1
	Flow      string   // the previous execution's flow name, "" when fresh
	Steps     []string // the previous execution's step ids, nil when fresh
	Workers   int      // the previous execution's worker count, 0 when fresh
}

// Epoch is what Commit writes: the epoch being committed, every worker's frontier and the
// snapshots taken since the previous commit.
type Epoch struct {
	Epoch     uint64     // the epoch being committed; greater than the committed epoch
	Frontiers []uint64   // per worker of the current execution, indexed by worker
	Snapshots []Snapshot // the state snapshots to keep, each of an epoch <= Epoch
}

// Snapshot is the state of one key of one step at the end of an epoch, or its deletion.
type Snapshot struct {
	Step    string // the step id
	Key     string // the state key
	Epoch   uint64 // the epoch at whose end the state was taken
	State   []byte // the state (nil is stored as empty); ignored for a tombstone
	Deleted bool   // a tombstone: the key has no state from this epoch on
}

// CommitInfo describes the committed epoch.
type CommitInfo struct {
	Epoch     uint64    // the committed epoch, 0 when nothing was committed
	Execution int       // the execution that committed it
	At        time.Time // when it was committed
}

// ExecutionInfo describes an execution recorded by Begin.
type ExecutionInfo struct {
	Execution int       // its number, 1 for the first
	Flow      string    // the flow's name
	Steps     []string  // the step ids given to Begin
	Workers   int       // the number of workers
	Started   time.Time // when Begin was called
	Frontiers []uint64  // the frontier of each worker at its last commit; nil if it committed nothing
}

// StepInfo describes the state a step keeps in the store.
type StepInfo struct {
	Step  string // the step id
	Keys  int    // the number of keys Load returns for the step
	Bytes int64  // the total size of the states Load returns
	Rows  int    // the snapshot rows kept, older backups and tombstones included
}
