package storetest

import (
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/epochflow/epochflow/recovery"
)

// garbageCollection: without a backup window only each key's newest snapshot stays, and no
// tombstone; with one, replaced snapshots and tombstones stay until the window has passed
// since a newer one (the tombstone) was committed. A store may keep collectable entries
// until a collection (Harness.Collect), never drop one that must stay.
func (su suite) garbageCollection(t *testing.T) {
	type step struct {
		advance time.Duration // before the commit
		epoch   uint64
		snaps   []recovery.Snapshot
		entries []Entry // after the commit
	}
	live := func(k string, e uint64) Entry { return Entry{"s", k, e, false} }
	dead := func(k string, e uint64) Entry { return Entry{"s", k, e, true} }
	cases := []struct {
		name   string
		backup time.Duration
		steps  []step
	}{
		{"no window keeps the newest", 0, []step{
			{0, 1, []recovery.Snapshot{snap("s", "k", 1, "a"), snap("s", "j", 1, "a")}, []Entry{live("j", 1), live("k", 1)}},
			{0, 2, []recovery.Snapshot{snap("s", "k", 2, "b")}, []Entry{live("j", 1), live("k", 2)}},
			{0, 5, []recovery.Snapshot{snap("s", "k", 3, "c"), snap("s", "k", 5, "d")}, []Entry{live("j", 1), live("k", 5)}},
		}},
		{"no window drops tombstones", 0, []step{
			{0, 1, []recovery.Snapshot{snap("s", "k", 1, "a")}, []Entry{live("k", 1)}},
			{0, 2, []recovery.Snapshot{tomb("s", "k", 2)}, nil},
			{0, 3, []recovery.Snapshot{tomb("s", "k", 3)}, nil},
			{0, 5, []recovery.Snapshot{snap("s", "k", 4, "b"), tomb("s", "k", 5)}, nil},
			{0, 7, []recovery.Snapshot{tomb("s", "k", 6), snap("s", "k", 7, "c")}, []Entry{live("k", 7)}},
		}},
		{"window keeps replaced snapshots until it passes", 10 * time.Second, []step{
			{0, 1, []recovery.Snapshot{snap("s", "k", 1, "a")}, []Entry{live("k", 1)}},
			{time.Second, 2, []recovery.Snapshot{snap("s", "k", 2, "b")}, []Entry{live("k", 1), live("k", 2)}},
			{5 * time.Second, 3, []recovery.Snapshot{snap("s", "k", 3, "c")}, []Entry{live("k", 1), live("k", 2), live("k", 3)}},
			// t=11s: epoch 2 (committed at 1s) is older than the window.
			{5 * time.Second, 4, nil, []Entry{live("k", 2), live("k", 3)}},
			{4 * time.Second, 5, nil, []Entry{live("k", 2), live("k", 3)}}, // t=15s: epoch 3 (6s) is not
			{time.Second, 6, nil, []Entry{live("k", 3)}},                   // t=16s: it is
			{time.Hour, 7, nil, []Entry{live("k", 3)}},
		}},
		{"window keeps tombstones until it passes", 10 * time.Second, []step{
			{0, 1, []recovery.Snapshot{snap("s", "k", 1, "a")}, []Entry{live("k", 1)}},
			{time.Second, 2, []recovery.Snapshot{tomb("s", "k", 2)}, []Entry{live("k", 1), dead("k", 2)}},
			{9 * time.Second, 3, nil, []Entry{live("k", 1), dead("k", 2)}},
			{time.Second, 4, nil, nil},
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			clk := newClock()
			s := mustOpen(t, su.h.New(t), Config{BackupInterval: c.backup, Now: clk.Now})
			begin(t, s, "f", 1)
			for _, st := range c.steps {
				clk.Advance(st.advance)
				commit(t, s, 1, st.epoch, st.snaps...)
				// What Load returns is the newest entry of each key unless it is a tombstone.
				want := map[string]entry{}
				for _, e := range st.entries {
					if !e.Dead {
						want[e.Key] = entry{Epoch: e.Epoch}
					} else {
						delete(want, e.Key)
					}
				}
				got := loadAll(t, s, "s")
				for k, g := range got {
					got[k] = entry{Epoch: g.Epoch}
				}
				if !reflect.DeepEqual(got, want) {
					t.Fatalf("after commit %d: Load = %v, want %v", st.epoch, got, want)
				}
				if su.h.Entries == nil {
					continue
				}
				// The commit may leave collectable entries to a later collection, never
				// collect one that must stay; a collection collects exactly what may go.
				es := su.h.entries(t, s)
				for _, e := range st.entries {
					if !slices.Contains(es, e) {
						t.Fatalf("after commit %d: entries %v, want at least %v", st.epoch, es, st.entries)
					}
				}
				if su.h.collect(t, s) {
					if es := su.h.entries(t, s); !slices.Equal(es, st.entries) {
						t.Fatalf("after commit %d and a collection: entries %v, want %v", st.epoch, es, st.entries)
					}
				}
			}
		})
	}
}
