package pgstore

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/epochflow/epochflow/recovery"

	"github.com/epochflow/epochflow/recovery/internal/runfmt"
)

// Commit implements recovery.Store. It sorts the commit's snapshots of each step into a run,
// writes it as chunk rows with COPY, merges the step's newest runs into one when they have
// grown as big as the run before them (collecting what the backup window lets go), and
// upserts the frontiers: all in one transaction on the writer's connection, which holds the
// lock. It reads the snapshots through e.All only (whatever holds them), and uses their keys
// and states only until it returns.
func (s *Store) Commit(ctx context.Context, e recovery.Epoch) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.checkWritable("Commit"); err != nil {
		return err
	}
	if s.execution == 0 {
		return fmt.Errorf("recovery store %s: Commit of epoch %d before Begin", s.name, e.Epoch)
	}
	if e.Epoch == 0 || e.Epoch > math.MaxInt64 {
		return fmt.Errorf("%w: recovery store %s: Commit: epoch %d is not in [1, 2^63-1]", recovery.ErrEpochOrder, s.name, e.Epoch)
	}
	if len(e.Frontiers) != s.workers {
		return fmt.Errorf("recovery store %s: Commit of epoch %d: %d frontiers for %d workers", s.name, e.Epoch, len(e.Frontiers), s.workers)
	}
	// The oldest snapshot (epochs start at 1): a copy, as the Snapshot that All yields is
	// valid until the next one.
	var oldest recovery.Snapshot
	for sn := range e.All() {
		if sn.Epoch == 0 || sn.Epoch > e.Epoch {
			return fmt.Errorf("%w: recovery store %s: Commit of epoch %d: snapshot of step %q key %q has epoch %d",
				recovery.ErrEpochOrder, s.name, e.Epoch, sn.Step, sn.Key, sn.Epoch)
		}
		if oldest.Epoch == 0 || sn.Epoch < oldest.Epoch {
			oldest = *sn
		}
	}
	steps, err := sortCommit(&e)
	if err != nil {
		return fmt.Errorf("recovery store %s: Commit of epoch %d: %w", s.name, e.Epoch, err)
	}
	op := fmt.Sprintf("Commit of epoch %d", e.Epoch)
	if err := ctx.Err(); err != nil {
		return s.opError(op, err)
	}
	tx, err := s.beginTx(ctx, op)
	if err != nil {
		return err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	var committed uint64
	if err := tx.QueryRow(ctx, `SELECT COALESCE(MAX(epoch), 0) FROM `+s.table("commits")).Scan(&committed); err != nil {
		return s.commitError(op, err, false)
	}
	if e.Epoch <= committed {
		return fmt.Errorf("%w: recovery store %s: Commit of epoch %d: epoch %d is already committed", recovery.ErrEpochOrder, s.name, e.Epoch, committed)
	}
	if oldest.Epoch != 0 && oldest.Epoch <= committed {
		return fmt.Errorf("%w: recovery store %s: Commit of epoch %d: snapshot of step %q key %q has epoch %d, at or before the committed epoch %d",
			recovery.ErrEpochOrder, s.name, e.Epoch, oldest.Step, oldest.Key, oldest.Epoch, committed)
	}
	now := s.now()
	if _, err := tx.Exec(ctx, `INSERT INTO `+s.table("commits")+` (epoch, execution, committed_at) VALUES ($1, $2, $3)`,
		int64(e.Epoch), s.execution, now.UnixNano()); err != nil {
		return s.commitError(op, err, false)
	}
	horizon, err := s.advanceHorizon(ctx, tx, now)
	if err != nil {
		return s.commitError(op, err, false)
	}
	if len(steps) > 0 {
		var id int64
		if err := tx.QueryRow(ctx, `SELECT COALESCE(MAX(id), 0) FROM `+s.table("runs")).Scan(&id); err != nil {
			return s.commitError(op, err, false)
		}
		for _, st := range steps {
			if err := s.writeStep(ctx, tx, st, e.Epoch, horizon, &id); err != nil {
				return s.commitError(op, err, false)
			}
		}
	}
	workers := make([]int32, len(e.Frontiers))
	frontiers := make([]int64, len(e.Frontiers))
	for w, f := range e.Frontiers {
		workers[w], frontiers[w] = int32(w), int64(f)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO `+s.table("frontiers")+` (execution, worker, frontier)
		SELECT $1, w, f FROM unnest($2::integer[], $3::bigint[]) AS u(w, f)
		ON CONFLICT (execution, worker) DO UPDATE SET frontier = excluded.frontier`, s.execution, workers, frontiers); err != nil {
		return s.commitError(op, err, false)
	}
	if err := tx.Commit(ctx); err != nil {
		return s.commitError(op, err, true)
	}
	return nil
}

// commitError wraps an error of a Commit. An error of the COMMIT itself on a connection that
// is gone leaves the outcome unknown, and the error says so; before it, nothing was written.
func (s *Store) commitError(op string, err error, atCommit bool) error {
	if recoveryErr(err) {
		return err // ErrDamaged, which names the store and the step
	}
	if s.writer == nil || !s.writer.IsClosed() {
		return s.opError(op, err)
	}
	if atCommit {
		return fmt.Errorf("recovery store %s: %s: the connection was lost while PostgreSQL committed: the epoch is committed "+
			"entirely or not at all, and the next Begin (which connects again) tells which: %w", s.name, op, err)
	}
	return fmt.Errorf("recovery store %s: %s: the connection was lost, and nothing of the epoch was committed "+
		"(the next Begin or Commit connects again): %w", s.name, op, err)
}

// recoveryErr reports whether err is one of the store's own errors that name the store.
func recoveryErr(err error) bool {
	return isDamaged(err)
}

// stepEntries are a commit's snapshots of one step, in run order.
type stepEntries struct {
	step    string
	entries []item
}

// sortCommit groups the commit's snapshots by step (ascending) and sorts each step's into run
// order: a radix sort of the keys' first sixteen bytes, then a sort by the whole key and epoch
// of the keys that share them. A (step, key, epoch) that appears twice is an error.
func sortCommit(e *recovery.Epoch) ([]stepEntries, error) {
	n := e.Len()
	if n == 0 {
		return nil, nil
	}
	if n > math.MaxInt32 {
		return nil, fmt.Errorf("%d snapshots: more than a commit can hold", n)
	}
	items := make([]item, 0, n)
	stepOf := make([]int32, 0, n)
	index := map[string]int32{}
	var names []string
	var counts []int
	last := int32(-1)
	for sn := range e.All() {
		j := last
		if j < 0 || names[j] != sn.Step {
			var ok bool
			if j, ok = index[sn.Step]; !ok {
				j = int32(len(names))
				index[sn.Step] = j
				names = append(names, sn.Step)
				counts = append(counts, 0)
			}
			last = j
		}
		it := item{Key: sn.Key, Epoch: sn.Epoch, Dead: sn.Deleted}
		if !sn.Deleted {
			it.State = sn.State
			if it.State == nil {
				it.State = []byte{}
			}
		}
		items = append(items, it)
		stepOf = append(stepOf, j)
		counts[j]++
	}
	out := make([]stepEntries, len(names))
	// The sort keys (runfmt.SortKey: no pointers, so the garbage collector does not scan a
	// million of them) refer to items by index.
	keys, tmp := make([]runfmt.SortKey, 0, n), make([]runfmt.SortKey, n)
	for j := range names {
		keys = keys[:0]
		for i := range items {
			if len(names) == 1 || stepOf[i] == int32(j) {
				keys = append(keys, runfmt.MakeSortKey(items[i].Key, uint64(i)))
			}
		}
		ks := runfmt.RadixSort(keys, tmp[:len(keys)])
		// Keys with the same sixteen first bytes are ordered by the whole key, then epoch.
		for lo := 0; lo < len(ks); {
			hi := lo + 1
			for hi < len(ks) && ks[hi].SamePrefix(&ks[lo]) {
				hi++
			}
			if hi-lo > 1 {
				slices.SortFunc(ks[lo:hi], func(a, b runfmt.SortKey) int { return items[a.Ref].Compare(&items[b.Ref]) })
			}
			lo = hi
		}
		es := make([]item, len(ks))
		for i, k := range ks {
			es[i] = items[k.Ref]
			if i > 0 && es[i-1].Epoch == es[i].Epoch && es[i-1].Key == es[i].Key {
				return nil, fmt.Errorf("snapshot of step %q key %q epoch %d appears twice", names[j], es[i].Key, es[i].Epoch)
			}
		}
		out[j] = stepEntries{names[j], es}
	}
	slices.SortFunc(out, func(a, b stepEntries) int { return strings.Compare(a.step, b.step) })
	return out, nil
}

// advanceHorizon computes the garbage collection horizon at commit time now, inside the
// commit's transaction (its commit already inserted): the newest epoch committed at or before
// now-BackupInterval, or the store's previous horizon if that is newer (the window may have
// grown since). Every epoch at or before it was committed at least the window ago. It records
// the horizon (meta gc_horizon) and deletes the commits before it, which no later horizon
// needs.
func (s *Store) advanceHorizon(ctx context.Context, tx pgx.Tx, now time.Time) (uint64, error) {
	var horizon, done int64
	if err := tx.QueryRow(ctx, `SELECT COALESCE(MAX(epoch), 0) FROM `+s.table("commits")+` WHERE committed_at <= $1`,
		now.Add(-s.backup).UnixNano()).Scan(&horizon); err != nil {
		return 0, err
	}
	if err := tx.QueryRow(ctx, `SELECT value FROM `+s.table("meta")+` WHERE name = 'gc_horizon'`).Scan(&done); err != nil {
		return 0, err
	}
	if horizon <= done {
		return uint64(done), nil
	}
	if _, err := tx.Exec(ctx, `DELETE FROM `+s.table("commits")+` WHERE epoch < $1`, horizon); err != nil {
		return 0, err
	}
	if _, err := tx.Exec(ctx, `UPDATE `+s.table("meta")+` SET value = $1 WHERE name = 'gc_horizon'`, horizon); err != nil {
		return 0, err
	}
	return uint64(horizon), nil
}

// plan returns where the merge of a step's runs (sizes, oldest first, the commit's new run
// last) starts: the oldest run that weighs no more than the runs after it together, so that
// every run stays heavier than all newer ones (a step has about log2(state / commit) runs,
// and each entry is rewritten that many times at most). len(sizes)-1 means no merge: the new
// run is written alone. A merge from 0 includes the oldest run, and collects tombstones.
func plan(sizes []int64) int {
	var after int64
	start := len(sizes) - 1
	for i := len(sizes) - 1; i >= 0; i-- {
		if i < len(sizes)-1 && sizes[i] <= after {
			start = i
		}
		after += sizes[i]
	}
	return start
}

// writeStep writes, inside the commit's transaction, the commit's entries of one step as a
// run, or merges them with the step's newest runs (plan) into one, and records the step's new
// sums. It first checks the step's runs against its sums (else ErrDamaged); a merge verifies
// every chunk it reads.
func (s *Store) writeStep(ctx context.Context, tx pgx.Tx, st stepEntries, epoch, horizon uint64, id *int64) error {
	runs, err := s.readRuns(ctx, tx, st.step)
	if err != nil {
		return fmt.Errorf("step %q: reading its runs: %w", st.step, err)
	}
	if err := s.checkStep(ctx, tx, st.step, runs); err != nil {
		return err
	}
	sizes := make([]int64, len(runs), len(runs)+1)
	for i, r := range runs {
		sizes[i] = r.bytes
	}
	var own int64
	prev := ""
	eachKept(st.entries, horizon, len(runs) == 0, func(e *item) error {
		own += size(prev, e)
		prev = e.Key
		return nil
	})
	start := plan(append(sizes, own))
	*id++
	var r runInfo
	var ok bool
	if start < len(runs) {
		r, ok, err = s.mergeRuns(ctx, tx, st.step, runs[start:], st.entries, start == 0, epoch, horizon, *id)
		runs = runs[:start]
	} else {
		w := s.newRunWriter(ctx, tx, st.step, *id, epoch)
		if err := eachKept(st.entries, horizon, len(runs) == 0, w.add); err != nil {
			return err
		}
		r, ok, err = w.finish()
	}
	if err != nil {
		return err
	}
	if ok {
		runs = append(runs, r)
	}
	return s.writeStepSum(ctx, tx, st.step, runs, epoch)
}

// mergeRuns merges the runs merged of step and the commit's entries own (in run order, newer
// than the runs) into run id, keeping what garbage collection at horizon leaves of each key
// (runfmt.CollectGroup; prefix: merged starts with the step's oldest run), and deletes the merged
// runs. It verifies every chunk it reads. It returns false if nothing is left (no run was
// written).
func (s *Store) mergeRuns(ctx context.Context, tx pgx.Tx, step string, merged []runInfo, own []item, prefix bool, epoch, horizon uint64, id int64) (runInfo, bool, error) {
	w := s.newRunWriter(ctx, tx, step, id, epoch)
	sources := make([]source, 0, len(merged)+1)
	for _, r := range merged {
		sources = append(sources, s.newRunCursor(ctx, tx, r, true))
	}
	sources = append(sources, &memSource{s: s, step: step, items: own})
	m, err := runfmt.NewMerger(sources)
	if err != nil {
		return runInfo{}, false, err
	}
	for {
		g, err := m.Next()
		if err != nil {
			return runInfo{}, false, err
		}
		if g == nil {
			break
		}
		for _, e := range runfmt.CollectGroup(g, horizon, prefix) {
			if err := w.add(&e); err != nil {
				return runInfo{}, false, err
			}
		}
	}
	ids := make([]int64, len(merged))
	for i, r := range merged {
		ids[i] = r.id
	}
	if _, err := tx.Exec(ctx, `DELETE FROM `+s.table("chunks")+` WHERE run = ANY($1)`, ids); err != nil {
		return runInfo{}, false, fmt.Errorf("step %q: deleting merged runs: %w", step, err)
	}
	if _, err := tx.Exec(ctx, `DELETE FROM `+s.table("runs")+` WHERE id = ANY($1)`, ids); err != nil {
		return runInfo{}, false, fmt.Errorf("step %q: deleting merged runs: %w", step, err)
	}
	return w.finish()
}

// writeStepSum records the totals of runs, the step's runs after the commit of epoch, as the
// step's sums.
func (s *Store) writeStepSum(ctx context.Context, tx pgx.Tx, step string, runs []runInfo, epoch uint64) error {
	t := totals(runs)
	var err error
	if t.entries == 0 {
		_, err = tx.Exec(ctx, `DELETE FROM `+s.table("step_sums")+` WHERE step = $1`, step)
	} else {
		_, err = tx.Exec(ctx, `INSERT INTO `+s.table("step_sums")+` (step, entries, sum, epoch) VALUES ($1, $2, $3, $4)
			ON CONFLICT (step) DO UPDATE SET entries = excluded.entries, sum = excluded.sum, epoch = excluded.epoch`,
			step, t.entries, int64(t.sum), int64(epoch))
	}
	if err != nil {
		return fmt.Errorf("step %q: writing its sums: %w", step, err)
	}
	return nil
}

// eachKept calls fn with what runfmt.CollectGroup keeps of each key's entries of es (in run order).
func eachKept(es []item, horizon uint64, prefix bool, fn func(*item) error) error {
	for i := 0; i < len(es); {
		j := i + 1
		for j < len(es) && es[j].Key == es[i].Key {
			j++
		}
		kept := runfmt.CollectGroup(es[i:j], horizon, prefix)
		for k := range kept {
			if err := fn(&kept[k]); err != nil {
				return err
			}
		}
		i = j
	}
	return nil
}
