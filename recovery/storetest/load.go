package storetest

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/epochflow/epochflow/recovery"
)

// load: Load returns the newest snapshot of every key unless it is a tombstone, whatever the
// keys' bytes, states nil or empty as empty, several epochs of a key in one commit in any
// order; fn's error stops it and comes back unchanged; a cancelled context stops it; the
// states handed to fn are fn's.
func (su suite) load(t *testing.T) {
	ctx := context.Background()
	s := mustOpen(t, su.h.New(t), Config{BackupInterval: time.Hour})
	begin(t, s, "f", 1)
	weird := []string{"", "\x00", "a\x00b", "\xff\xfe", "é", strings.Repeat("k", 10000)}
	var ws []recovery.Snapshot
	for i, k := range weird {
		ws = append(ws, snap("weird", k, 1, fmt.Sprint(i)))
	}
	commit(t, s, 1, 1, append(ws,
		snap("s", "gone", 1, "x"),
		snap("s", "back", 1, "old"),
		snap("s", "kept", 1, "k1"),
		recovery.Snapshot{Step: "s", Key: "nil", Epoch: 1},
		recovery.Snapshot{Step: "s", Key: "empty", Epoch: 1, State: []byte{}},
		tomb("s", "never", 1),
		snap("t", "other", 1, "t"),
	)...)
	commit(t, s, 1, 4,
		tomb("s", "gone", 2),
		tomb("s", "back", 2), snap("s", "back", 3, "new"),
		snap("s", "multi", 2, "m2"), snap("s", "multi", 4, "m4"), snap("s", "multi", 3, "m3"),
		recovery.Snapshot{Step: "s", Key: "dead-state", Epoch: 4, State: []byte("ignored"), Deleted: true},
	)
	want := map[string]entry{
		"back": {3, "new"}, "kept": {1, "k1"}, "nil": {1, ""}, "empty": {1, ""}, "multi": {4, "m4"},
	}
	if got := loadAll(t, s, "s"); !reflect.DeepEqual(got, want) {
		t.Errorf("Load(s) =\n%v\nwant\n%v", got, want)
	}
	gotWeird := loadAll(t, s, "weird")
	for i, k := range weird {
		if g := gotWeird[k]; g != (entry{1, fmt.Sprint(i)}) {
			t.Errorf("Load(weird)[%q] = %v", k, g)
		}
	}
	if got := loadAll(t, s, "nope"); len(got) != 0 {
		t.Errorf("Load of an unknown step = %v", got)
	}

	// fn's error stops Load and comes back unchanged.
	stop := errors.New("stop")
	calls := 0
	err := s.Load(ctx, "weird", func(string, uint64, []byte) error { calls++; return stop })
	if err != stop || calls != 1 {
		t.Errorf("Load with failing fn = %v after %d calls, want stop after 1", err, calls)
	}
	canceled, cancel := context.WithCancel(ctx)
	cancel()
	if err := s.Load(canceled, "s", func(string, uint64, []byte) error { return nil }); !errors.Is(err, context.Canceled) {
		t.Errorf("Load with a canceled context = %v", err)
	}

	// States handed to fn are its own.
	var kept [][]byte
	if err := s.Load(ctx, "s", func(_ string, _ uint64, state []byte) error { kept = append(kept, state); return nil }); err != nil {
		t.Fatal(err)
	}
	if got := loadAll(t, s, "s"); !reflect.DeepEqual(got, want) {
		t.Errorf("second Load(s) = %v", got)
	}
	for _, b := range kept {
		for i := range b {
			b[i] = '!'
		}
	}
	if got := loadAll(t, s, "s"); !reflect.DeepEqual(got, want) {
		t.Errorf("Load(s) after fn changed its states = %v", got)
	}
}

// loadMany: Loads of several steps of thousands of keys, from several goroutines at once,
// each return every key's newest state; StepIDs and Steps describe them.
func (su suite) loadMany(t *testing.T) {
	ctx := context.Background()
	s := mustOpen(t, su.h.New(t), Config{})
	begin(t, s, "f", 1)
	const keys = 5000
	steps := []string{"a", "b", "c"}
	state := func(step string, k int, e uint64) string { return fmt.Sprintf("%s-%d-%d", step, k, e) }
	for e := uint64(1); e <= 2; e++ {
		var snaps []recovery.Snapshot
		for _, st := range steps {
			for k := range keys {
				if k%3 == 0 && e == 2 {
					snaps = append(snaps, tomb(st, fmt.Sprintf("k%05d", k), e))
				} else if k%2 == 0 || e == 1 {
					snaps = append(snaps, snap(st, fmt.Sprintf("k%05d", k), e, state(st, k, e)))
				}
			}
		}
		commit(t, s, 1, e, snaps...)
	}
	type live struct {
		k int
		e uint64
	}
	want := map[string]live{}
	for k := range keys {
		switch {
		case k%3 == 0:
		case k%2 == 0:
			want[fmt.Sprintf("k%05d", k)] = live{k, 2}
		default:
			want[fmt.Sprintf("k%05d", k)] = live{k, 1}
		}
	}
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			st := steps[i%len(steps)]
			n := 0
			prev := ""
			err := s.Load(ctx, st, func(key string, epoch uint64, got []byte) error {
				n++
				w, ok := want[key]
				if !ok || epoch != w.e || string(got) != state(st, w.k, w.e) {
					return fmt.Errorf("key %q: epoch %d state %q, want %v", key, epoch, got, w)
				}
				if n > 1 && key <= prev {
					return fmt.Errorf("key %q after %q", key, prev)
				}
				prev = key
				return nil
			})
			if err == nil && n != len(want) {
				err = fmt.Errorf("%d keys, want %d", n, len(want))
			}
			if err != nil {
				t.Errorf("Load(%s): %v", st, err)
			}
		}()
	}
	wg.Wait()

	if ids, err := s.StepIDs(ctx); err != nil || !reflect.DeepEqual(ids, steps) {
		t.Errorf("StepIDs() = %q, %v; want %q", ids, err, steps)
	}
	var bytes int64
	for _, w := range want {
		bytes += int64(len(state("a", w.k, w.e)))
	}
	check := func(when string) {
		t.Helper()
		infos, err := s.Steps(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(infos) != len(steps) {
			t.Fatalf("%s: Steps() = %+v", when, infos)
		}
		perStep := map[string]int{}
		for _, e := range su.h.entries(t, s) {
			perStep[e.Step]++
		}
		for i, st := range steps {
			in := infos[i]
			if in.Step != st || in.Keys != len(want) || in.Bytes != bytes || in.Rows < len(want) || in.Rows > keys+2*keys/3 {
				t.Errorf("%s: Steps()[%d] = %+v, want step %s, %d keys of %d bytes, %d to %d rows", when, i, in, st, len(want), bytes, len(want), keys+2*keys/3)
			}
			if su.h.Entries != nil && in.Rows != perStep[st] {
				t.Errorf("%s: Steps()[%d].Rows = %d, the store keeps %d entries of the step", when, i, in.Rows, perStep[st])
			}
		}
	}
	check("before a collection")
	// With BackupInterval 0, a collection leaves only the live keys' newest snapshots.
	if su.h.collect(t, s) {
		check("after a collection")
		infos, err := s.Steps(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for i, in := range infos {
			if in.Rows != len(want) {
				t.Errorf("after a collection, Steps()[%d].Rows = %d, want %d", i, in.Rows, len(want))
			}
		}
	}
}
