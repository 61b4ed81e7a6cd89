package recovery

import (
	"cmp"
	"context"
	"errors"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"pgregory.net/rapid"
)

// modelKey is a (step, key) of the model.
type modelKey struct{ step, key string }

// modelSnap is a snapshot the model holds: every one ever committed, none collected.
type modelSnap struct {
	epoch uint64
	state string
	dead  bool
}

// storeMachine runs random commits, clock advances and reopens against a SQLiteStore and a
// plain model, and checks after each that the store holds exactly what the model says.
type storeMachine struct {
	t         *rapid.T
	dir       string
	clk       *clock
	s         *SQLiteStore
	backup    time.Duration
	execution int

	committed uint64
	snaps     map[modelKey][]modelSnap // per key, ascending epochs
	commits   []modelCommit            // every commit, ascending
	horizon   uint64                   // the newest epoch garbage collection has reached
	compacted bool                     // the last action was Compact
}

type modelCommit struct {
	epoch uint64
	at    time.Time
}

var (
	modelSteps = []string{"a", "b"}
	modelKeys  = []string{"k0", "k1", "k2", "", "\x00z", "é"}
	backups    = []time.Duration{0, time.Second, 2 * time.Second, 5 * time.Second}
)

func (m *storeMachine) open(t *rapid.T) {
	m.backup = rapid.SampledFrom(backups).Draw(t, "backup")
	s, err := OpenSQLite(context.Background(), m.dir, SQLiteOptions{BackupInterval: m.backup, Now: m.clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	m.s = s
	r, err := s.Begin(context.Background(), Execution{Flow: "prop", Steps: modelSteps, Workers: 1})
	if err != nil {
		t.Fatal(err)
	}
	m.execution++
	if r.Execution != m.execution || r.Committed != m.committed {
		t.Fatalf("Begin = %+v, want execution %d committed %d", r, m.execution, m.committed)
	}
}

// Commit commits a random epoch with random snapshots and tombstones.
func (m *storeMachine) Commit(t *rapid.T) {
	m.compacted = false
	epoch := m.committed + uint64(rapid.IntRange(1, 3).Draw(t, "advance"))
	n := rapid.IntRange(0, 8).Draw(t, "snapshots")
	var snaps []Snapshot
	type id struct {
		step, key string
		epoch     uint64
	}
	seen := map[id]bool{}
	for range n {
		sn := Snapshot{
			Step:    rapid.SampledFrom(modelSteps).Draw(t, "step"),
			Key:     rapid.SampledFrom(modelKeys).Draw(t, "key"),
			Epoch:   uint64(rapid.Uint64Range(m.committed+1, epoch).Draw(t, "epoch")),
			Deleted: rapid.IntRange(0, 3).Draw(t, "kind") == 0,
		}
		if seen[id{sn.Step, sn.Key, sn.Epoch}] {
			continue // a (step, key, epoch) may appear once
		}
		seen[id{sn.Step, sn.Key, sn.Epoch}] = true
		if !sn.Deleted {
			sn.State = rapid.SliceOfN(rapid.Byte(), 0, 4).Draw(t, "state")
		}
		snaps = append(snaps, sn)
	}
	err := m.s.Commit(context.Background(), Epoch{Epoch: epoch, Frontiers: []uint64{epoch}, Snapshots: snaps})
	if err != nil {
		t.Fatalf("Commit(%d): %v", epoch, err)
	}
	m.committed = epoch
	for _, sn := range snaps {
		k := modelKey{sn.Step, sn.Key}
		m.snaps[k] = append(m.snaps[k], modelSnap{sn.Epoch, string(sn.State), sn.Deleted})
		slices.SortFunc(m.snaps[k], func(a, b modelSnap) int { return cmp.Compare(a.epoch, b.epoch) })
	}
	now := m.clk.Now()
	m.commits = append(m.commits, modelCommit{epoch, now})
	for _, c := range m.commits {
		if !c.at.After(now.Add(-m.backup)) {
			m.horizon = max(m.horizon, c.epoch)
		}
	}
}

// BadCommit tries a commit that must be refused and change nothing.
func (m *storeMachine) BadCommit(t *rapid.T) {
	if m.committed == 0 {
		return // every epoch is valid
	}
	e := Epoch{Epoch: rapid.Uint64Range(0, m.committed).Draw(t, "epoch"), Frontiers: []uint64{0}}
	if rapid.Bool().Draw(t, "late snapshot") {
		e.Epoch = m.committed + 1
		e.Snapshots = []Snapshot{snap("a", "k0", rapid.Uint64Range(0, m.committed).Draw(t, "snapshot epoch"), "x")}
	}
	if err := m.s.Commit(context.Background(), e); !errors.Is(err, ErrEpochOrder) {
		t.Fatalf("Commit(%+v) = %v, want ErrEpochOrder", e, err)
	}
}

// Advance moves the clock.
func (m *storeMachine) Advance(t *rapid.T) {
	m.clk.Advance(time.Duration(rapid.IntRange(0, 3).Draw(t, "seconds")) * time.Second)
}

// Reopen closes the store and opens it again, with another backup window.
func (m *storeMachine) Reopen(t *rapid.T) {
	if err := m.s.Close(); err != nil {
		t.Fatal(err)
	}
	m.open(t)
}

// Check compares Load, the stored rows and the committed epoch with the model.
func (m *storeMachine) Check(t *rapid.T) {
	ctx := context.Background()
	for _, step := range modelSteps {
		want := map[string]entry{}
		for k, ss := range m.snaps {
			if k.step != step {
				continue
			}
			if last := ss[len(ss)-1]; !last.dead {
				want[k.key] = entry{last.epoch, last.state}
			}
		}
		got := map[string]entry{}
		var order []string
		err := m.s.Load(ctx, step, func(key string, epoch uint64, state []byte) error {
			got[key] = entry{epoch, string(state)}
			order = append(order, key)
			return nil
		})
		if err != nil {
			t.Fatalf("Load(%s): %v", step, err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("Load(%s) =\n%+v\nwant\n%+v", step, got, want)
		}
		if !slices.IsSorted(order) {
			t.Fatalf("Load(%s) order %q", step, order)
		}
	}

	// Garbage collection keeps every entry after the horizon and, of those at or before it,
	// the newest of each key unless it is a tombstone; it may keep others until a
	// compaction (never one the model has not seen), and a compaction of everything
	// (Compact) keeps exactly those.
	want := m.kept()
	got := rows(t, m.s)
	for _, r := range want {
		if _, ok := slices.BinarySearchFunc(got, r, compareRows); !ok {
			t.Fatalf("entry %+v was collected (horizon %d); entries\n%+v\nwant at least\n%+v", r, m.horizon, got, want)
		}
	}
	for _, r := range got {
		if !m.committedEntry(r) {
			t.Fatalf("entry %+v was never committed; entries\n%+v", r, got)
		}
	}
	if m.compacted && !reflect.DeepEqual(got, want) {
		t.Fatalf("entries after a compaction (horizon %d) =\n%+v\nwant\n%+v", m.horizon, got, want)
	}
	var ids []string
	for _, r := range got {
		if len(ids) == 0 || ids[len(ids)-1] != r.Step {
			ids = append(ids, r.Step)
		}
	}
	if got, err := m.s.StepIDs(ctx); err != nil || !reflect.DeepEqual(got, ids) {
		t.Fatalf("StepIDs() = %q, %v; want %q", got, err, ids)
	}
	if c, err := m.s.Committed(ctx); err != nil || c.Epoch != m.committed {
		t.Fatalf("Committed() = %+v, %v, want epoch %d", c, err, m.committed)
	}
	// Commits keep the row counts and checksums exact through garbage collection.
	if err := m.s.Verify(ctx); err != nil {
		t.Fatalf("Verify(): %v", err)
	}
}

// kept returns the entries garbage collection must keep, in (step, key, epoch) order: those
// after the horizon and, of those at or before it, the newest of each key unless it is a
// tombstone.
func (m *storeMachine) kept() []row {
	var want []row
	for k, ss := range m.snaps {
		for i, sn := range ss {
			newestBefore := sn.epoch <= m.horizon && (i == len(ss)-1 || ss[i+1].epoch > m.horizon)
			if sn.epoch > m.horizon || (newestBefore && !sn.dead) {
				want = append(want, row{k.step, k.key, sn.epoch, sn.dead})
			}
		}
	}
	slices.SortFunc(want, compareRows)
	return want
}

// committedEntry tells whether r was committed.
func (m *storeMachine) committedEntry(r row) bool {
	for _, sn := range m.snaps[modelKey{r.Step, r.Key}] {
		if sn.epoch == r.Epoch && sn.dead == r.Dead {
			return true
		}
	}
	return false
}

// Compact merges every step's runs into one, collecting what the horizon lets go.
func (m *storeMachine) Compact(t *rapid.T) {
	compactAll(t, m.s)
	m.compacted = true
}

func compareRows(a, b row) int {
	return cmp.Or(strings.Compare(a.Step, b.Step), strings.Compare(a.Key, b.Key), cmp.Compare(a.Epoch, b.Epoch))
}

func TestStoreProperties(t *testing.T) {
	base := t.TempDir()
	defer func(n int) { chunkTarget = n }(chunkTarget)
	rapid.Check(t, func(t *rapid.T) {
		// Runs of one chunk, or of a chunk per entry or two.
		chunkTarget = rapid.SampledFrom([]int{1, 8, 256 << 10}).Draw(t, "chunk size")
		dir, err := os.MkdirTemp(base, "")
		if err != nil {
			t.Fatal(err)
		}
		m := &storeMachine{t: t, dir: dir, clk: newClock(), snaps: map[modelKey][]modelSnap{}}
		m.open(t)
		defer func() { m.s.Close() }()
		t.Repeat(rapid.StateMachineActions(m))
	})
}
