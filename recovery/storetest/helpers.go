package storetest

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/epochflow/epochflow/recovery"
)

// clock is a settable clock for Config.Now.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *clock { return &clock{t: time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// tb is what the helpers need of a *testing.T or a *rapid.T.
type tb interface {
	Helper()
	Fatalf(format string, args ...any)
	Errorf(format string, args ...any)
}

// mustOpen opens a store with open and c (with a clock if c has none), and closes it when
// the test ends.
func mustOpen(t *testing.T, open Opener, c Config) recovery.Store {
	t.Helper()
	if c.Now == nil {
		c.Now = time.Now
	}
	s, err := open(c)
	if err != nil {
		t.Fatalf("opening the store: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// begin calls Begin and fails the test on error.
func begin(t tb, s recovery.Store, flow string, workers int, steps ...string) recovery.Resume {
	t.Helper()
	r, err := s.Begin(context.Background(), recovery.Execution{Flow: flow, Steps: steps, Workers: workers})
	if err != nil {
		t.Fatalf("Begin: %v", err)
	}
	return r
}

// commit commits epoch with the given snapshots and frontiers all equal to epoch.
func commit(t tb, s recovery.Store, workers int, epoch uint64, snaps ...recovery.Snapshot) {
	t.Helper()
	fr := make([]uint64, workers)
	for i := range fr {
		fr[i] = epoch
	}
	if err := s.Commit(context.Background(), recovery.Epoch{Epoch: epoch, Frontiers: fr, Snapshots: snaps}); err != nil {
		t.Fatalf("Commit(%d): %v", epoch, err)
	}
}

// entry is one key as Load returned it.
type entry struct {
	Epoch uint64
	State string
}

// loadAll returns what Load returns for step, checking that keys come in ascending order,
// once each, and that no state is nil.
func loadAll(t tb, s recovery.Store, step string) map[string]entry {
	t.Helper()
	out := map[string]entry{}
	var keys []string
	err := s.Load(context.Background(), step, func(key string, epoch uint64, state []byte) error {
		if state == nil {
			t.Errorf("Load(%q): key %q: nil state", step, key)
		}
		keys = append(keys, key)
		out[key] = entry{epoch, string(state)}
		return nil
	})
	if err != nil {
		t.Fatalf("Load(%q): %v", step, err)
	}
	if !slices.IsSorted(keys) || len(keys) != len(out) {
		t.Fatalf("Load(%q): keys not ascending and unique: %q", step, keys)
	}
	return out
}

func snap(step, key string, epoch uint64, state string) recovery.Snapshot {
	return recovery.Snapshot{Step: step, Key: key, Epoch: epoch, State: []byte(state)}
}

func tomb(step, key string, epoch uint64) recovery.Snapshot {
	return recovery.Snapshot{Step: step, Key: key, Epoch: epoch, Deleted: true}
}

// packs returns the snapshots of each piece as a recovery.Pack, as the engine hands a
// worker's snapshots to Commit (recovery.Epoch.Packs).
func packs(pieces ...[]recovery.Snapshot) []*recovery.Pack {
	out := make([]*recovery.Pack, len(pieces))
	for i, piece := range pieces {
		out[i] = new(recovery.Pack)
		for j := range piece {
			out[i].AddSnapshot(&piece[j])
		}
	}
	return out
}

// entries returns h.Entries(s), failing the test on error; nil without h.Entries.
func (h Harness) entries(t tb, s recovery.Store) []Entry {
	t.Helper()
	if h.Entries == nil {
		return nil
	}
	es, err := h.Entries(s)
	if err != nil {
		t.Fatalf("Entries: %v", err)
	}
	return es
}

// collect runs h.Collect(s), failing the test on error; it reports whether h has Collect.
func (h Harness) collect(t tb, s recovery.Store) bool {
	t.Helper()
	if h.Collect == nil {
		return false
	}
	if err := h.Collect(s); err != nil {
		t.Fatalf("Collect: %v", err)
	}
	return true
}

// loadEverything returns what Load returns for every step of StepIDs.
func loadEverything(t tb, s recovery.Store) map[string]map[string]entry {
	t.Helper()
	ids, err := s.StepIDs(context.Background())
	if err != nil {
		t.Fatalf("StepIDs: %v", err)
	}
	out := map[string]map[string]entry{}
	for _, id := range ids {
		out[id] = loadAll(t, s, id)
	}
	return out
}
