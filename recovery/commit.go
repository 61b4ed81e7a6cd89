package recovery

import (
	"context"
	"database/sql"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/epochflow/epochflow/recovery/internal/runfmt"
)

// Commit implements Store. It sorts the snapshots of each step into a run (runs.go), drops
// those of a key that a newer one of the same commit supersedes once the horizon passes it,
// writes the run as chunk rows, and compacts the step's runs (compact.go) if they have grown:
// all in one transaction, with one fsync of the WAL at its end.
func (s *SQLiteStore) Commit(ctx context.Context, e Epoch) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.checkWritable("Commit"); err != nil {
		return err
	}
	if s.execution == 0 {
		return fmt.Errorf("recovery store %s: Commit of epoch %d before Begin", s.path, e.Epoch)
	}
	if e.Epoch == 0 || e.Epoch > math.MaxInt64 {
		return fmt.Errorf("%w: recovery store %s: Commit: epoch %d is not in [1, 2^63-1]", ErrEpochOrder, s.path, e.Epoch)
	}
	if len(e.Frontiers) != s.workers {
		return fmt.Errorf("recovery store %s: Commit of epoch %d: %d frontiers for %d workers", s.path, e.Epoch, len(e.Frontiers), s.workers)
	}
	packs := e.Packs
	if len(e.Snapshots) > 0 {
		p := &s.scratch.own
		p.Reset()
		for i := range e.Snapshots {
			p.AddSnapshot(&e.Snapshots[i])
		}
		packs = append([]*Pack{p}, e.Packs...)
	}
	// The epochs of the snapshots, from each pack's range (no pass over the snapshots); the
	// oldest (epochs start at 1) is checked against the committed epoch once the transaction
	// has read it. Only an error looks for the snapshot to name.
	var oldest uint64
	for _, p := range packs {
		if p.Len() == 0 {
			continue
		}
		lo, hi := p.Epochs()
		if lo == 0 || hi > e.Epoch {
			sn := find(packs, func(sn *Snapshot) bool { return sn.Epoch == 0 || sn.Epoch > e.Epoch })
			return fmt.Errorf("%w: recovery store %s: Commit of epoch %d: snapshot of step %q key %q has epoch %d",
				ErrEpochOrder, s.path, e.Epoch, sn.Step, sn.Key, sn.Epoch)
		}
		if oldest == 0 || lo < oldest {
			oldest = lo
		}
	}
	steps, err := sortPacks(packs, &s.scratch)
	if err != nil {
		return fmt.Errorf("recovery store %s: Commit of epoch %d: %w", s.path, e.Epoch, err)
	}

	fail := func(err error) error {
		return s.opError(fmt.Sprintf("Commit of epoch %d", e.Epoch), err)
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fail(err)
	}
	defer tx.Rollback()
	committed, err := committedEpoch(ctx, tx)
	if err != nil {
		return fail(err)
	}
	if e.Epoch <= committed {
		return fmt.Errorf("%w: recovery store %s: Commit of epoch %d: epoch %d is already committed", ErrEpochOrder, s.path, e.Epoch, committed)
	}
	if oldest != 0 && oldest <= committed {
		sn := find(packs, func(sn *Snapshot) bool { return sn.Epoch == oldest })
		return fmt.Errorf("%w: recovery store %s: Commit of epoch %d: snapshot of step %q key %q has epoch %d, at or before the committed epoch %d",
			ErrEpochOrder, s.path, e.Epoch, sn.Step, sn.Key, sn.Epoch, committed)
	}
	now := s.now()
	if _, err := tx.ExecContext(ctx, `INSERT INTO commits (epoch, execution, committed_at) VALUES (?, ?, ?)`,
		int64(e.Epoch), s.execution, now.UnixNano()); err != nil {
		return fail(err)
	}
	horizon, err := s.advanceHorizon(ctx, tx, now)
	if err != nil {
		return fail(err)
	}
	if len(steps) > 0 {
		if err := s.writeRuns(ctx, tx, e.Epoch, horizon, steps); err != nil {
			return fail(err)
		}
	}
	for w, f := range e.Frontiers {
		if _, err := tx.ExecContext(ctx, `INSERT INTO frontiers (execution, worker, frontier) VALUES (?, ?, ?)
			ON CONFLICT (execution, worker) DO UPDATE SET frontier = excluded.frontier`,
			s.execution, w, int64(f)); err != nil {
			return fail(err)
		}
	}
	if err := tx.Commit(); err != nil {
		return fail(err)
	}
	return nil
}

// advanceHorizon computes the garbage collection horizon at commit time now, inside the
// commit's transaction (its commit already inserted): the newest epoch committed at or before
// now-BackupInterval, or the store's previous horizon if that is newer (the window may have
// grown since). Every snapshot epoch at or before it was committed at least the window ago.
// It records the horizon (meta gc_horizon) and deletes the commits before it, which no later
// horizon needs.
func (s *SQLiteStore) advanceHorizon(ctx context.Context, tx *sql.Tx, now time.Time) (uint64, error) {
	cutoff := now.Add(-s.backup).UnixNano()
	var horizon sql.NullInt64
	if err := tx.QueryRowContext(ctx, `SELECT MAX(epoch) FROM commits WHERE committed_at <= ?`, cutoff).Scan(&horizon); err != nil {
		return 0, err
	}
	var done int64
	if err := tx.QueryRowContext(ctx, `SELECT value FROM meta WHERE name = 'gc_horizon'`).Scan(&done); err != nil {
		return 0, err
	}
	if horizon.Int64 <= done {
		return uint64(done), nil
	}
	if _, err := tx.ExecContext(ctx, `DELETE FROM commits WHERE epoch < ?`, horizon.Int64); err != nil {
		return 0, err
	}
	if _, err := tx.ExecContext(ctx, `UPDATE meta SET value = ? WHERE name = 'gc_horizon'`, horizon.Int64); err != nil {
		return 0, err
	}
	return uint64(horizon.Int64), nil
}

// writeRuns writes, inside the commit's transaction, a run per step of steps and compacts the
// step's runs, keeping step_sums equal to the sums of each step's runs. It first checks that
// they are (else the step's runs were changed behind the store's back: ErrDamaged).
func (s *SQLiteStore) writeRuns(ctx context.Context, tx *sql.Tx, epoch, horizon uint64, steps []stepEntries) error {
	st, err := prepare(ctx, tx)
	if err != nil {
		return err
	}
	defer st.close()
	var id int64
	if err := tx.QueryRowContext(ctx, `SELECT IFNULL(MAX(id), 0) FROM runs`).Scan(&id); err != nil {
		return err
	}
	next := func() int64 { id++; return id }
	for _, se := range steps {
		runs, err := readRuns(ctx, tx, se.step)
		if err != nil {
			return fmt.Errorf("step %q: reading its runs: %w", se.step, err)
		}
		recorded, last, err := readStepSum(ctx, tx, se.step)
		if err != nil {
			return fmt.Errorf("step %q: reading its sums: %w", se.step, err)
		}
		if found := totals(runs); found != recorded {
			return stepDamaged(s.path, se.step, last, recorded, found)
		}
		// The commit's own snapshots of a key that a newer one of it supersedes, once the
		// horizon passes that one (always so without a backup window), are not written;
		// nor its tombstones at or before the horizon if the step has no older runs. If the
		// run they make would start a merge of all the step's runs, they go into that merge
		// instead of being written as a run and read back.
		es, prefix := &se.entries, len(runs) == 0
		sizes := make([]int64, len(runs), len(runs)+1)
		for i, r := range runs {
			sizes[i] = r.bytes
		}
		if len(runs) > 0 && plan(append(sizes, encodedSize(es, horizon, prefix))) == 0 {
			merged, ok, err := s.mergeWith(ctx, tx, st, runs, es, horizon, true, next())
			if err != nil {
				return fmt.Errorf("step %q: compaction of %d runs and the commit's snapshots: %w", se.step, len(runs), err)
			}
			runs = runs[:0]
			if ok {
				runs = append(runs, merged)
			}
		} else {
			w := newRunWriter(ctx, tx, st.insert, se.step, next())
			err := eachKept(es, horizon, prefix, w.add)
			if err != nil {
				return err
			}
			r, ok, err := w.finish()
			if err != nil {
				return err
			}
			if ok {
				runs = append(runs, r)
				if runs, err = s.compact(ctx, tx, st, runs, horizon, next); err != nil {
					return fmt.Errorf("step %q: %w", se.step, err)
				}
			}
		}
		if err := writeStepSum(ctx, tx, se.step, epoch, totals(runs)); err != nil {
			return err
		}
	}
	return nil
}

// eachKept calls fn with what runfmt.CollectGroup keeps of each key's entries of es (in run order).
func eachKept(es *entries, horizon uint64, prefix bool, fn func(*item) error) error {
	var group []item
	flush := func() error {
		kept := runfmt.CollectGroup(group, horizon, prefix)
		for k := range kept {
			if err := fn(&kept[k]); err != nil {
				return err
			}
		}
		group = group[:0]
		return nil
	}
	for j := range es.len() {
		e := es.item(j)
		if !e.Same && len(group) > 0 {
			if err := flush(); err != nil {
				return err
			}
		}
		group = append(group, e)
	}
	if len(group) > 0 {
		return flush()
	}
	return nil
}

// encodedSize returns about how many bytes the run of what eachKept keeps of es takes (the
// entries' encoding, as if in one chunk), without reading the states.
func encodedSize(es *entries, horizon uint64, prefix bool) int64 {
	var n int64
	prev := ""
	eachKept(es, horizon, prefix, func(e *item) error {
		shared, m := 0, min(len(prev), len(e.Key))
		for shared < m && prev[shared] == e.Key[shared] {
			shared++
		}
		n += int64(uvarintLen(uint64(shared)) + uvarintLen(uint64(len(e.Key)-shared)) + len(e.Key) - shared + uvarintLen(e.Epoch))
		if e.Dead {
			n++
		} else {
			n += int64(uvarintLen(uint64(len(e.State))+1) + len(e.State))
		}
		prev = e.Key
		return nil
	})
	return n
}

// uvarintLen is the length of binary.AppendUvarint(nil, x).
func uvarintLen(x uint64) int {
	n := 1
	for x >= 0x80 {
		x >>= 7
		n++
	}
	return n
}

// writeStepSum records t as the sums of step, changed by the commit of epoch.
func writeStepSum(ctx context.Context, tx *sql.Tx, step string, epoch uint64, t stepSum) error {
	var err error
	if t.rows == 0 {
		_, err = tx.ExecContext(ctx, `DELETE FROM step_sums WHERE step = ?`, step)
	} else {
		_, err = tx.ExecContext(ctx, `INSERT INTO step_sums (step, rows, sum, epoch) VALUES (?1, ?2, ?3, ?4)
			ON CONFLICT (step) DO UPDATE SET rows = ?2, sum = ?3, epoch = ?4`, step, t.rows, int64(t.sum), int64(epoch))
	}
	if err != nil {
		return fmt.Errorf("step %q: writing its sums: %w", step, err)
	}
	return nil
}

// find returns a copy of the first snapshot of packs for which ok holds (the zero Snapshot if
// none does), for an error message.
func find(packs []*Pack, ok func(*Snapshot) bool) Snapshot {
	for _, p := range packs {
		for sn := range p.All() {
			if ok(sn) {
				return Snapshot{Step: sn.Step, Key: strings.Clone(sn.Key), Epoch: sn.Epoch}
			}
		}
	}
	return Snapshot{}
}
