// Package recovery keeps what a flow needs to resume after a crash or a restart: the
// executions that ran it, the last committed epoch, each worker's frontier, and the state
// snapshots of every stateful step, keyed by (step, key, epoch).
//
// The engine uses a Store like this: at start, Begin records a new execution and returns the
// committed epoch to resume after; Load hands every step its newest committed state per key;
// then, once per committed epoch, Commit writes that epoch's snapshots and frontiers and marks
// the epoch committed, all at once. Snapshots that a newer committed snapshot of the same key
// has replaced are garbage-collected, once they are older than the backup window.
//
// # What the file holds
//
// SQLiteStore (OpenSQLite) is the embedded implementation: one SQLite file in WAL mode,
// FileName in the recovery directory (with its -wal and -shm files while a flow has it open).
// Besides small tables (executions, frontiers, the commits inside the backup window), it holds
// the snapshots as runs, as in a log-structured merge tree: each commit writes, per step it
// has snapshots of, one run, its snapshots sorted by key and encoded compactly (keys
// prefix-compressed) into chunks of about 256 KiB, each chunk one row with its entry count and
// a CRC-32C checksum. A commit of a million changed keys is some forty rows, not a million.
// Load merges a step's runs and returns each key's newest snapshot.
//
// Garbage collection is compaction: inside a Commit's transaction, the step's runs are merged
// into one, dropping the snapshots that a newer one replaced and the tombstones, once those
// are older than the backup window, when the newer runs together weigh as much as the
// oldest (the base), which is then the live state plus the window's backups again; smaller
// runs are merged with their neighbours as they accumulate, so a step has at most a dozen
// runs. So the file holds at most about twice the live state plus what the backup window
// keeps (the encoding is smaller than the keys and states themselves: 10 to 15 bytes per
// snapshot of a short key with a counter for state), and the -wal file up to one commit's
// writes (about the size of the base when a commit merges it) or 4 MiB, whichever is more.
// SQLite reuses freed pages; the file does not shrink.
//
// `epochflow recovery inspect DIR` shows, per step, the keys Load returns and their bytes, and
// ROWS: the snapshot entries the store keeps for it (backups, tombstones and replaced ones that
// no compaction has dropped yet included); it verifies the whole store as a resume would.
//
// # Verification
//
// A store verifies itself before the engine trusts it: a damaged one (SQLite's check of the
// file fails, a chunk's checksum or entry count differs from its row's, or a step's runs are
// not the ones its commits recorded in their per-step entry counts and checksum sums) is
// refused with an error wrapping ErrDamaged that names the file and the step, and Load never
// returns nil after handing out part of a step's state. Compaction verifies what it merges.
//
// The package imports nothing of epochflow but internal/storecheck (the switch with which
// benchmarks turn verification off, which imports nothing), so other stores (PostgreSQL) can
// implement Store alongside it.
package recovery

import (
	"context"
	"errors"
	"iter"
	"time"
)

// SchemaVersion is the version of the store layout this code reads and writes. A store
// recorded with another version is refused by OpenSQLite (see ErrSchemaVersion): this code
// never reads or writes a layout it does not know.
//
// Version 2 added the per-step row counts and checksums that Load verifies (table
// step_sums); OpenSQLite migrates a version 1 store to it, after SQLite's check of the whole
// file, computing them from the rows as they are. Version 3 stores the snapshots as sorted
// runs of chunks (a few large rows per commit) instead of a row per (step, key, epoch);
// OpenSQLite migrates a version 2 store (and a version 1 store through version 2) to it,
// after checking its rows against their sums, writing each step's rows as one run.
const SchemaVersion = 3

// Errors that the stores return wrapped (test with errors.Is); the wrapping error names the
// store and says what to do.
var (
	// ErrSchemaVersion: the store was written by a newer binary (or by an older one that this
	// binary cannot migrate).
	ErrSchemaVersion = errors.New("unsupported recovery store schema version")
	// ErrNotStore: the file is not an epochflow recovery store: not an SQLite database, or one
	// without epochflow's tables.
	ErrNotStore = errors.New("not an epochflow recovery store")
	// ErrDamaged: the store's file is damaged: SQLite's check of the file failed, or a step's
	// snapshots are not those its commits recorded (a chunk's checksum or entry count, or
	// the step's totals, differ).
	// The flow must not resume from it: the error names the file, the step where the damage
	// is attributable to one, and the ways out (restore a backup of the directory, or start
	// over with a new recovery directory, which replays the flow from its sources).
	ErrDamaged = errors.New("recovery store is damaged")
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
	// Commit also garbage-collects: a snapshot may be deleted once a newer snapshot of the
	// same (step, key) exists whose epoch was committed at least the store's backup window
	// ago (for SQLiteStore, SQLiteOptions.BackupInterval; 0 keeps only the newest snapshot of
	// each key), and a tombstone (with everything older of its key) once its epoch was
	// committed at least the window ago; nothing else is ever deleted, so nothing Load can
	// return, and no backup inside the window. A store may delete them later than that (for
	// SQLiteStore, when a compaction merges the step's runs), but keeps its size
	// proportional to the live state plus the window's backups. Snapshots of one Commit may
	// hold several epochs of a key, in any order. Frontiers are stored as given
	// (math.MaxUint64 included).
	Commit(ctx context.Context, e Epoch) error

	// Load calls fn, in ascending byte order of key, with the newest snapshot of every key of
	// step whose epoch is at or before the committed epoch, skipping keys whose newest such
	// snapshot is a tombstone. state is a fresh slice that fn may keep (it may be empty, never
	// nil). Load stops at the first error fn returns and returns that error unchanged. Load
	// may be called from several goroutines at once.
	//
	// Load verifies what it read: if the step's snapshots are not those its commits recorded, or
	// the store's file is damaged, it returns an error wrapping ErrDamaged, possibly after
	// fn was called for some keys. Only a nil return says that fn received all of the step's
	// state: after an error the caller discards what fn received, and does not resume.
	Load(ctx context.Context, step string, fn func(key string, epoch uint64, state []byte) error) error

	// Committed returns the committed epoch, the execution that committed it and when (the
	// zero CommitInfo when nothing was ever committed).
	Committed(ctx context.Context) (CommitInfo, error)

	// Executions returns every execution recorded by Begin, oldest first, each with the
	// frontiers its workers last committed.
	Executions(ctx context.Context) ([]ExecutionInfo, error)

	// StepIDs returns the ids of the steps the store keeps snapshots of (tombstones included),
	// in ascending order; the same steps as Steps, but without reading their snapshots, so
	// its cost does not grow with the number of keys. A step whose snapshots are gone, or
	// snapshots of a step that no commit recorded, make it return an error wrapping ErrDamaged.
	StepIDs(ctx context.Context) ([]string, error)

	// Steps returns, for every step that has snapshots, ordered by step id, how many keys
	// Load would return for it and their bytes, and how many snapshots (older backups,
	// tombstones and replaced ones not yet collected included) the store keeps for it. It
	// reads every snapshot, without verifying them (Verify does): it is for inspection
	// (about 0.4 s for a million keys), not for a flow's start; see StepIDs.
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
	// Packs holds more snapshots of the commit, encoded compactly: the engine hands over
	// each worker's Pack as the worker filled it. The keys and states that All yields of a
	// pack point into the pack's memory, which the caller reuses once Commit has returned: a
	// store that keeps one longer copies it.
	Packs []*Pack
}

// All visits every snapshot of the commit: those of Snapshots, then those of each of Packs.
// The Snapshot a pack yields is valid until the next one (see Pack.All).
func (e *Epoch) All() iter.Seq[*Snapshot] {
	return func(yield func(*Snapshot) bool) {
		for i := range e.Snapshots {
			if !yield(&e.Snapshots[i]) {
				return
			}
		}
		for _, p := range e.Packs {
			for s := range p.All() {
				if !yield(s) {
					return
				}
			}
		}
	}
}

// Len is the number of snapshots of the commit (of Snapshots and of every pack of Packs).
func (e *Epoch) Len() int {
	n := len(e.Snapshots)
	for _, p := range e.Packs {
		n += p.Len()
	}
	return n
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
	Rows  int    // the snapshots kept: older backups, tombstones and replaced ones not yet collected included
}
