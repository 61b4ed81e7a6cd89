// Package storetest is the contract test of recovery.Store: Run checks, against any
// implementation, what recovery/store.go promises (Begin and resuming, the refusals of Begin
// and Commit, Load's order, tombstones, several epochs of a key in one commit, concurrent
// Loads, frontiers up to math.MaxUint64, the garbage-collection promise with a backup window,
// read-only stores, a second writer) and a random model test (pgregory.net/rapid) of
// commits, refused commits, clock advances and reopens against a plain model.
//
// An implementation's tests call Run with a Harness that opens its store; what an
// implementation cannot show (the entries it keeps, a forced compaction, read-only opens,
// writer exclusion) is left out of the checks when the Harness does not provide it.
package storetest

import (
	"context"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/epochflow/epochflow/recovery"
)

// Config is how a test wants a store opened: the options every implementation has.
type Config struct {
	BackupInterval time.Duration    // as recovery.SQLiteOptions.BackupInterval
	Now            func() time.Time // the store's clock (never nil when the suite opens a store)
	ReadOnly       bool             // open for inspection only
}

// Opener opens one store (the same store each time it is called) with c. The suite closes
// every store it opens.
type Opener func(c Config) (recovery.Store, error)

// Entry is a snapshot entry as a store keeps it: one (step, key, epoch), a state or a
// tombstone.
type Entry struct {
	Step, Key string
	Epoch     uint64
	Dead      bool
}

// Harness describes an implementation to Run. New and Name are required; the other fields,
// when nil or false, leave out the checks that need them.
type Harness struct {
	// New returns the opener of a new, empty store (a new directory, database or schema).
	// It may call t.Cleanup to remove it. The suite calls it once per test, and many times
	// in the random model test.
	New func(t *testing.T) Opener
	// Name returns what the errors of s name it by (its file, its DSN without password):
	// the suite checks that refusals mention it.
	Name func(s recovery.Store) string
	// Entries returns every snapshot entry s keeps (backups, tombstones and replaced
	// snapshots not collected yet included), in (step, key, epoch) order. Without it, the
	// suite cannot check what garbage collection keeps.
	Entries func(s recovery.Store) ([]Entry, error)
	// Collect makes s drop everything that it may (for a store that collects in
	// compactions: a compaction of everything), so that the suite can check that exactly
	// that is gone. Without it, the suite checks only that nothing that must stay is gone.
	Collect func(s recovery.Store) error
	// Verify checks the whole store (as recovery.SQLiteStore.Verify), if the store can.
	Verify func(ctx context.Context, s recovery.Store) error
	// ReadOnly: the store can be opened read-only (Config.ReadOnly) while a writer has it
	// open, and sees the writer's commits.
	ReadOnly bool
	// Exclusive: a second read-write open of a store that is open for writing is refused
	// with an error wrapping recovery.ErrInUse, and works once the first is closed.
	Exclusive bool
	// Vary, if set, is called at the start of each case of the random model test, before
	// the case's store is opened, to draw the implementation's own settings (the SQLite
	// store's test draws its chunk size), so that rapid shrinks and replays them too.
	Vary func(t *rapid.T)
	// SkipProperties leaves out the random model test (it takes a minute under the race
	// detector).
	SkipProperties bool
}

// Run runs the contract tests of the implementation h describes, each as a subtest of t.
func Run(t *testing.T, h Harness) {
	if h.New == nil || h.Name == nil {
		t.Fatal("storetest.Run: Harness.New and Harness.Name are required")
	}
	s := suite{h}
	t.Run("BeginResume", s.beginResume)
	t.Run("BeginErrors", s.beginErrors)
	t.Run("CommitErrors", s.commitErrors)
	t.Run("CommitPieces", s.commitPieces)
	t.Run("EpochLimits", s.epochLimits)
	t.Run("Load", s.load)
	t.Run("LoadMany", s.loadMany)
	t.Run("GarbageCollection", s.garbageCollection)
	t.Run("Close", s.close)
	if h.ReadOnly {
		t.Run("ReadOnly", s.readOnly)
	}
	if h.Exclusive {
		t.Run("SecondWriter", s.secondWriter)
	}
	if !h.SkipProperties {
		t.Run("Properties", s.properties)
	}
}

// suite holds the harness the tests run against.
type suite struct{ h Harness }
