package pgstore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/epochflow/epochflow/recovery"
)

// damageStore fills a store of two steps: "big" (2,000 keys over two commits, runs of
// many chunks) and "small", and closes it; it returns its schema.
func damageStore(t *testing.T) string {
	t.Helper()
	defer func(n int) { chunkTarget = n }(chunkTarget)
	chunkTarget = 1 << 10
	ctx := context.Background()
	schema := newSchema()
	s := open(t, schema, Options{})
	if _, err := s.Begin(ctx, recovery.Execution{Flow: "damage", Steps: []string{"big", "small"}, Workers: 1}); err != nil {
		t.Fatal(err)
	}
	for e := uint64(1); e <= 2; e++ {
		var snaps []recovery.Snapshot
		for k := range 2000 {
			if e == 1 || k%7 == 0 {
				snaps = append(snaps, recovery.Snapshot{Step: "big", Key: fmt.Sprintf("k%05d", k), Epoch: e, State: []byte(fmt.Sprint(k, e))})
			}
		}
		snaps = append(snaps, recovery.Snapshot{Step: "small", Key: "s", Epoch: e, State: []byte("x")})
		if err := s.Commit(ctx, recovery.Epoch{Epoch: e, Frontiers: []uint64{e}, Snapshots: snaps}); err != nil {
			t.Fatal(err)
		}
	}
	s.Close()
	return schema
}

// Damage to a chunk row, a run row or a step's sums, made with SQL behind the store's back, is
// found by Load (and by the next Commit of the step, which would otherwise merge it), with an
// error wrapping ErrDamaged that names the store and the step; the other step still loads.
func TestDamageIsFound(t *testing.T) {
	ctx := context.Background()
	firstRun := `(SELECT min(id) FROM SCHEMA.runs WHERE step = 'big')`
	cases := []struct {
		name string
		edit string
		msg  string
		// found by a Commit of the step that does not merge the damaged run: damage to
		// the rows' counts and sums (a commit checks them, not the chunks it does not read)
		commit bool
	}{
		{"a byte of a chunk", `UPDATE SCHEMA.chunks SET data = set_byte(data, 100, get_byte(data, 100) # 1) WHERE run = ` + firstRun + ` AND seq = 3`,
			"chunk 3 has checksum", false},
		{"a chunk's entry count", `UPDATE SCHEMA.chunks SET entries = entries + 1 WHERE run = ` + firstRun + ` AND seq = 0`, "chunk 0 holds", false},
		{"a chunk lost", `DELETE FROM SCHEMA.chunks WHERE run = ` + firstRun + ` AND seq = 2`, "has 20 chunks, its commit recorded 21", true},
		{"chunks swapped", `UPDATE SCHEMA.chunks SET seq = -1 WHERE run = ` + firstRun + ` AND seq = 1;
			UPDATE SCHEMA.chunks SET seq = 1 WHERE run = ` + firstRun + ` AND seq = 2;
			UPDATE SCHEMA.chunks SET seq = 2 WHERE run = ` + firstRun + ` AND seq = -1`, "checksum", false},
		{"a run lost", `DELETE FROM SCHEMA.runs WHERE id = ` + firstRun, `step "big" has`, true},
		{"a step's sums changed", `UPDATE SCHEMA.step_sums SET sum = sum + 1 WHERE step = 'big'`, "their checksum differs", true},
		{"a chunk truncated", `UPDATE SCHEMA.chunks SET data = substring(data from 1 for 50) WHERE run = ` + firstRun + ` AND seq = 1`, "chunk 1", false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			schema := damageStore(t)
			var chunks int
			s := open(t, schema, Options{ReadOnly: true})
			if err := s.read(ctx, func(tx pgx.Tx) error {
				return tx.QueryRow(ctx, `SELECT chunks FROM `+s.table("runs")+` WHERE id = `+strings.ReplaceAll(firstRun, "SCHEMA.", schema+".")).Scan(&chunks)
			}); err != nil || chunks != 21 {
				t.Fatalf("the first run has %d chunks (%v), want 21: the cases' expectations assume 8", chunks, err)
			}
			exec(t, strings.ReplaceAll(c.edit, "SCHEMA.", schema+"."))
			check := func(what string, err error) {
				t.Helper()
				if !errors.Is(err, recovery.ErrDamaged) || !strings.Contains(err.Error(), c.msg) || !strings.Contains(err.Error(), `step "big"`) ||
					!strings.Contains(err.Error(), s.Name()) || !strings.Contains(err.Error(), "start over with a new schema") {
					t.Errorf("%s: %v\nwant ErrDamaged naming the store, step \"big\" and containing %q", what, err, c.msg)
				}
			}
			check("Load", s.Load(ctx, "big", func(string, uint64, []byte) error { return nil }))
			check("Verify", s.Verify(ctx))
			if got := s.Load(ctx, "small", func(string, uint64, []byte) error { return nil }); got != nil {
				t.Errorf("Load of the undamaged step: %v", got)
			}
			// A commit of one key checks the step's counts and sums; one of every key
			// merges the step's runs, reading every chunk.
			w := open(t, schema, Options{})
			if _, err := w.Begin(ctx, recovery.Execution{Flow: "damage", Workers: 1}); err != nil {
				t.Fatal(err)
			}
			one := []recovery.Snapshot{{Step: "big", Key: "k00000", Epoch: 3, State: []byte("3")}}
			if c.commit {
				check("Commit of one key", w.Commit(ctx, recovery.Epoch{Epoch: 3, Frontiers: []uint64{3}, Snapshots: one}))
			}
			var all []recovery.Snapshot
			for k := range 2000 {
				all = append(all, recovery.Snapshot{Step: "big", Key: fmt.Sprintf("k%05d", k), Epoch: 3, State: []byte("3")})
			}
			check("Commit of every key", w.Commit(ctx, recovery.Epoch{Epoch: 3, Frontiers: []uint64{3}, Snapshots: all}))
			if c, err := w.Committed(ctx); err != nil || c.Epoch != 2 {
				t.Errorf("after the refused commit: Committed() = %+v, %v; want epoch 2", c, err)
			}
		})
	}

	// Snapshots of a step that no commit recorded, or a recorded step without them.
	schema := damageStore(t)
	exec(t, `DELETE FROM `+schema+`.step_sums WHERE step = 'small'`)
	s := open(t, schema, Options{ReadOnly: true})
	if _, err := s.StepIDs(ctx); !errors.Is(err, recovery.ErrDamaged) || !strings.Contains(err.Error(), `step "small" has snapshots that no commit recorded`) {
		t.Errorf("StepIDs: %v", err)
	}
}
