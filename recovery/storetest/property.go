package storetest

import (
	"cmp"
	"context"
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/epochflow/epochflow/recovery"
)

// modelKey is a (step, key) of the model.
type modelKey struct{ step, key string }

// modelSnap is a snapshot the model holds: every one ever committed, none collected.
type modelSnap struct {
	epoch uint64
	state string
	dead  bool
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

// storeMachine runs random commits, refused commits, clock advances, reopens (with another
// backup window) and collections against a store and a plain model, and checks after each
// that the store holds what the model says.
type storeMachine struct {
	h         Harness
	open      Opener
	clk       *clock
	s         recovery.Store
	backup    time.Duration
	execution int

	committed uint64
	snaps     map[modelKey][]modelSnap // per key, ascending epochs
	commits   []modelCommit            // every commit, ascending
	horizon   uint64                   // the newest epoch garbage collection has reached
	collected bool                     // the last action was Collect
}

func (m *storeMachine) start(t *rapid.T) {
	m.backup = rapid.SampledFrom(backups).Draw(t, "backup")
	s, err := m.open(Config{BackupInterval: m.backup, Now: m.clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	m.s = s
	r, err := s.Begin(context.Background(), recovery.Execution{Flow: "prop", Steps: modelSteps, Workers: 1})
	if err != nil {
		t.Fatal(err)
	}
	m.execution++
	if r.Execution != m.execution || r.Committed != m.committed {
		t.Fatalf("Begin = %+v, want execution %d committed %d", r, m.execution, m.committed)
	}
}

// Commit commits a random epoch with random snapshots and tombstones, in Snapshots or in
// packs.
func (m *storeMachine) Commit(t *rapid.T) {
	m.collected = false
	epoch := m.committed + uint64(rapid.IntRange(1, 3).Draw(t, "advance"))
	n := rapid.IntRange(0, 8).Draw(t, "snapshots")
	var snaps []recovery.Snapshot
	type id struct {
		step, key string
		epoch     uint64
	}
	seen := map[id]bool{}
	for range n {
		sn := recovery.Snapshot{
			Step:    rapid.SampledFrom(modelSteps).Draw(t, "step"),
			Key:     rapid.SampledFrom(modelKeys).Draw(t, "key"),
			Epoch:   rapid.Uint64Range(m.committed+1, epoch).Draw(t, "epoch"),
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
	e := recovery.Epoch{Epoch: epoch, Frontiers: []uint64{epoch}}
	if split := rapid.IntRange(0, len(snaps)).Draw(t, "split"); split > 0 && rapid.Bool().Draw(t, "pieces") {
		e.Packs = packs(snaps[:split], snaps[split:])
	} else {
		e.Snapshots = snaps
	}
	if err := m.s.Commit(context.Background(), e); err != nil {
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
	e := recovery.Epoch{Epoch: rapid.Uint64Range(0, m.committed).Draw(t, "epoch"), Frontiers: []uint64{0}}
	if rapid.Bool().Draw(t, "late snapshot") {
		e.Epoch = m.committed + 1
		e.Snapshots = []recovery.Snapshot{snap("a", "k0", rapid.Uint64Range(0, m.committed).Draw(t, "snapshot epoch"), "x")}
	}
	if err := m.s.Commit(context.Background(), e); !errors.Is(err, recovery.ErrEpochOrder) {
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
	m.start(t)
}

// Collect makes the store collect everything it may, if the harness can.
func (m *storeMachine) Collect(t *rapid.T) {
	m.collected = m.h.collect(t, m.s)
}

// Check compares Load, the entries kept and the committed epoch with the model.
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
		if got := loadAll(t, m.s, step); !reflect.DeepEqual(got, want) {
			t.Fatalf("Load(%s) =\n%+v\nwant\n%+v", step, got, want)
		}
	}
	if c, err := m.s.Committed(ctx); err != nil || c.Epoch != m.committed {
		t.Fatalf("Committed() = %+v, %v, want epoch %d", c, err, m.committed)
	}
	if m.h.Verify != nil {
		if err := m.h.Verify(ctx, m.s); err != nil {
			t.Fatalf("Verify(): %v", err)
		}
	}
	if m.h.Entries == nil {
		return
	}
	// Garbage collection keeps every entry after the horizon and, of those at or before it,
	// the newest of each key unless it is a tombstone; it may keep others until a
	// collection (never one the model has not seen), and a collection keeps exactly those.
	want := m.kept()
	got := m.h.entries(t, m.s)
	for _, r := range want {
		if _, ok := slices.BinarySearchFunc(got, r, compareEntries); !ok {
			t.Fatalf("entry %+v was collected (horizon %d); entries\n%+v\nwant at least\n%+v", r, m.horizon, got, want)
		}
	}
	for _, r := range got {
		if !m.committedEntry(r) {
			t.Fatalf("entry %+v was never committed; entries\n%+v", r, got)
		}
	}
	if m.collected && !slices.Equal(got, want) {
		t.Fatalf("entries after a collection (horizon %d) =\n%+v\nwant\n%+v", m.horizon, got, want)
	}
	var ids []string
	for _, r := range got {
		if len(ids) == 0 || ids[len(ids)-1] != r.Step {
			ids = append(ids, r.Step)
		}
	}
	if got, err := m.s.StepIDs(ctx); err != nil || !slices.Equal(got, ids) {
		t.Fatalf("StepIDs() = %q, %v; want %q", got, err, ids)
	}
}

// kept returns the entries garbage collection must keep, in (step, key, epoch) order.
func (m *storeMachine) kept() []Entry {
	var want []Entry
	for k, ss := range m.snaps {
		for i, sn := range ss {
			newestBefore := sn.epoch <= m.horizon && (i == len(ss)-1 || ss[i+1].epoch > m.horizon)
			if sn.epoch > m.horizon || (newestBefore && !sn.dead) {
				want = append(want, Entry{k.step, k.key, sn.epoch, sn.dead})
			}
		}
	}
	slices.SortFunc(want, compareEntries)
	return want
}

// committedEntry tells whether r was committed.
func (m *storeMachine) committedEntry(r Entry) bool {
	for _, sn := range m.snaps[modelKey{r.Step, r.Key}] {
		if sn.epoch == r.Epoch && sn.dead == r.Dead {
			return true
		}
	}
	return false
}

func compareEntries(a, b Entry) int {
	return cmp.Or(strings.Compare(a.Step, b.Step), strings.Compare(a.Key, b.Key), cmp.Compare(a.Epoch, b.Epoch))
}

// properties runs the model test.
func (su suite) properties(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		if su.h.Vary != nil {
			su.h.Vary(rt)
		}
		m := &storeMachine{h: su.h, open: su.h.New(t), clk: newClock(), snaps: map[modelKey][]modelSnap{}}
		m.start(rt)
		defer func() { m.s.Close() }()
		rt.Repeat(rapid.StateMachineActions(m))
	})
}
