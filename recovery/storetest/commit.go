package storetest

import (
	"context"
	"errors"
	"math"
	"reflect"
	"strings"
	"testing"

	"github.com/epochflow/epochflow/recovery"
)

// contents is what a test compares before and after a refused write: the entries the store
// keeps if the harness can list them, and what Load returns for every step.
type contents struct {
	entries []Entry
	loaded  map[string]map[string]entry
}

func (h Harness) contents(t tb, s recovery.Store) contents {
	t.Helper()
	return contents{h.entries(t, s), loadEverything(t, s)}
}

// commitErrors: Commit before Begin, of an epoch out of order, of a snapshot outside
// (committed, epoch], with the wrong number of frontiers, of a (step, key, epoch) twice, or
// with a cancelled context, is refused with an error naming the store, and writes nothing.
func (su suite) commitErrors(t *testing.T) {
	ctx := context.Background()
	s := mustOpen(t, su.h.New(t), Config{})
	if err := s.Commit(ctx, recovery.Epoch{Epoch: 1}); err == nil || !strings.Contains(err.Error(), "before Begin") {
		t.Errorf("Commit before Begin: %v", err)
	}
	begin(t, s, "f", 2)
	commit(t, s, 2, 5, snap("s", "k", 5, "five"))
	want := su.h.contents(t, s)

	cases := []struct {
		name string
		e    recovery.Epoch
		is   error  // nil: any error
		msg  string // a substring of the error
	}{
		{"epoch 0", recovery.Epoch{Epoch: 0, Frontiers: []uint64{0, 0}}, recovery.ErrEpochOrder, "not in [1, 2^63-1]"},
		{"epoch beyond int64", recovery.Epoch{Epoch: math.MaxInt64 + 1, Frontiers: []uint64{0, 0}}, recovery.ErrEpochOrder, "not in"},
		{"same epoch", recovery.Epoch{Epoch: 5, Frontiers: []uint64{5, 5}}, recovery.ErrEpochOrder, "already committed"},
		{"older epoch", recovery.Epoch{Epoch: 4, Frontiers: []uint64{5, 5}}, recovery.ErrEpochOrder, "already committed"},
		{"snapshot after epoch", recovery.Epoch{Epoch: 6, Frontiers: []uint64{6, 6}, Snapshots: []recovery.Snapshot{snap("s", "k", 7, "x")}}, recovery.ErrEpochOrder, `key "k" has epoch 7`},
		{"snapshot at committed epoch", recovery.Epoch{Epoch: 6, Frontiers: []uint64{6, 6}, Snapshots: []recovery.Snapshot{snap("s", "j", 6, "x"), snap("s", "k", 5, "x")}}, recovery.ErrEpochOrder, "at or before the committed epoch 5"},
		{"snapshot in a piece at committed epoch", recovery.Epoch{Epoch: 6, Frontiers: []uint64{6, 6}, Packs: packs([]recovery.Snapshot{snap("s", "j", 6, "x")}, []recovery.Snapshot{snap("s", "k", 5, "x")})}, recovery.ErrEpochOrder, "at or before the committed epoch 5"},
		{"snapshot epoch 0", recovery.Epoch{Epoch: 6, Frontiers: []uint64{6, 6}, Snapshots: []recovery.Snapshot{snap("s", "k", 0, "x")}}, recovery.ErrEpochOrder, "has epoch 0"},
		{"too few frontiers", recovery.Epoch{Epoch: 6, Frontiers: []uint64{6}}, nil, "1 frontiers for 2 workers"},
		{"duplicate snapshot", recovery.Epoch{Epoch: 6, Frontiers: []uint64{6, 6}, Snapshots: []recovery.Snapshot{snap("s", "a", 6, "x"), snap("s", "k", 6, "x"), tomb("s", "k", 6)}}, nil, `key "k" epoch 6 appears twice`},
		{"duplicate snapshot across pieces", recovery.Epoch{Epoch: 6, Frontiers: []uint64{6, 6}, Snapshots: []recovery.Snapshot{snap("s", "k", 6, "x")}, Packs: packs([]recovery.Snapshot{snap("s", "k", 6, "y")})}, nil, `key "k" epoch 6 appears twice`},
		{"canceled", recovery.Epoch{Epoch: 6, Frontiers: []uint64{6, 6}}, context.Canceled, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ctx := ctx
			if c.is == context.Canceled {
				var cancel context.CancelFunc
				ctx, cancel = context.WithCancel(ctx)
				cancel()
			}
			err := s.Commit(ctx, c.e)
			if err == nil || (c.is != nil && !errors.Is(err, c.is)) || !strings.Contains(err.Error(), c.msg) {
				t.Fatalf("Commit(%+v) = %v; want an error wrapping %v containing %q", c.e, err, c.is, c.msg)
			}
			if !strings.Contains(err.Error(), su.h.Name(s)) {
				t.Errorf("error %q does not name the store %s", err, su.h.Name(s))
			}
			if ci, err := s.Committed(context.Background()); err != nil || ci.Epoch != 5 {
				t.Errorf("Committed() after a refused Commit = %+v, %v; want epoch 5", ci, err)
			}
			if got := su.h.contents(t, s); !reflect.DeepEqual(got, want) {
				t.Errorf("store after a refused Commit = %+v, want %+v", got, want)
			}
		})
	}
	// The store is still usable.
	commit(t, s, 2, 6, snap("s", "k", 6, "six"))
	if got := loadAll(t, s, "s"); !reflect.DeepEqual(got, map[string]entry{"k": {6, "six"}}) {
		t.Errorf("Load = %v", got)
	}
}

// commitPieces: a commit's snapshots are those of Snapshots and of every pack of Packs
// (empty packs included), of several steps, in any order.
func (su suite) commitPieces(t *testing.T) {
	ctx := context.Background()
	s := mustOpen(t, su.h.New(t), Config{})
	begin(t, s, "f", 3)
	e := recovery.Epoch{Epoch: 2, Frontiers: []uint64{2, 2, 2},
		Snapshots: []recovery.Snapshot{snap("b", "z", 1, "bz1")},
		Packs: packs(
			[]recovery.Snapshot{snap("a", "y", 2, "ay2"), snap("b", "a", 2, "ba2"), snap("a", "x", 1, "ax1")},
			nil,
			[]recovery.Snapshot{tomb("a", "y", 1), snap("a", "x", 2, "ax2"), snap("b", "z", 2, "bz2"), tomb("b", "gone", 2)},
		)}
	if err := s.Commit(ctx, e); err != nil {
		t.Fatal(err)
	}
	if got, want := loadAll(t, s, "a"), map[string]entry{"x": {2, "ax2"}, "y": {2, "ay2"}}; !reflect.DeepEqual(got, want) {
		t.Errorf("Load(a) = %v, want %v", got, want)
	}
	if got, want := loadAll(t, s, "b"), map[string]entry{"a": {2, "ba2"}, "z": {2, "bz2"}}; !reflect.DeepEqual(got, want) {
		t.Errorf("Load(b) = %v, want %v", got, want)
	}
	if ids, err := s.StepIDs(ctx); err != nil || !reflect.DeepEqual(ids, []string{"a", "b"}) {
		t.Errorf("StepIDs() = %q, %v", ids, err)
	}
}

// epochLimits: epochs up to math.MaxInt64 commit and load; frontiers are kept as given.
func (su suite) epochLimits(t *testing.T) {
	ctx := context.Background()
	open := su.h.New(t)
	s := mustOpen(t, open, Config{})
	begin(t, s, "f", 2)
	const last = math.MaxInt64
	if err := s.Commit(ctx, recovery.Epoch{Epoch: last - 1, Frontiers: []uint64{0, math.MaxUint64},
		Snapshots: []recovery.Snapshot{snap("s", "k", 1, "one"), snap("s", "j", last-1, "j")}}); err != nil {
		t.Fatal(err)
	}
	if err := s.Commit(ctx, recovery.Epoch{Epoch: last, Frontiers: []uint64{math.MaxUint64, last},
		Snapshots: []recovery.Snapshot{snap("s", "k", last, "max")}}); err != nil {
		t.Fatal(err)
	}
	s.Close()
	s = mustOpen(t, open, Config{})
	if r := begin(t, s, "f", 1); r.Committed != last {
		t.Errorf("Begin after a commit of epoch 2^63-1 = %+v", r)
	}
	if got, want := loadAll(t, s, "s"), map[string]entry{"j": {last - 1, "j"}, "k": {last, "max"}}; !reflect.DeepEqual(got, want) {
		t.Errorf("Load = %v, want %v", got, want)
	}
	xs, err := s.Executions(ctx)
	if err != nil || len(xs) != 2 || !reflect.DeepEqual(xs[0].Frontiers, []uint64{math.MaxUint64, last}) {
		t.Errorf("Executions() = %+v, %v; want the first with frontiers [2^64-1 2^63-1]", xs, err)
	}
	if err := s.Commit(ctx, recovery.Epoch{Epoch: last, Frontiers: []uint64{0}}); !errors.Is(err, recovery.ErrEpochOrder) {
		t.Errorf("Commit after epoch 2^63-1: %v, want ErrEpochOrder", err)
	}
}
