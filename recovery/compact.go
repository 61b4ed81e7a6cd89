package recovery

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/epochflow/epochflow/recovery/internal/runfmt"
)

// Compaction is the store's garbage collection: it merges runs of a step into one, dropping
// what runfmt.CollectGroup drops (superseded snapshots, and tombstones with everything older of
// their key, once the horizon has passed them), like the merges of a log-structured merge
// tree. It runs inside the transaction of the Commit that wrote the step's newest run, for
// the steps of that commit, so a crash keeps either the runs before it or the merged run.
//
// Which runs it merges (plan), with the runs of a step oldest first and the oldest called
// the base:
//
//   - all of them, dropping tombstones too, when the others together are at least as big
//     as the base: so the step's runs never hold more than about twice the base, which is
//     the live state plus what the backup window keeps (and after the merge, the base is
//     that again);
//   - else the newest runs, as long as each next older one is less than twice the size of
//     those newer than it, as in a binary counter: a run's entries are rewritten about
//     log2(base / commit size) times before the base takes them, and a step keeps that
//     many runs;
//   - and all runs but the base if the step would still have more than maxRuns runs.
//
// A merge costs what it reads and writes: a commit that starts a full merge pays for the base
// and every run since the last one, which is at most twice what those commits wrote; the
// commits in between pay only for their own run and their small merges.

// maxRuns bounds how many runs a step keeps after a commit (Load merges them all).
const maxRuns = 12

// plan returns the index of the first of the runs that a commit merges, given their sizes
// (oldest first, the newest just written), or len(bytes) if it merges none.
func plan(bytes []int64) int {
	n := len(bytes)
	if n < 2 {
		return n
	}
	var rest int64
	for _, b := range bytes[1:] {
		rest += b
	}
	if rest >= bytes[0] {
		return 0
	}
	j, acc := n-1, bytes[n-1]
	for j > 1 && bytes[j-1] < 2*acc {
		j--
		acc += bytes[j]
	}
	switch {
	case j+1 > maxRuns:
		return 1
	case j == n-1:
		return n
	default:
		return j
	}
}

// statements are the prepared statements of a transaction that writes runs.
type statements struct {
	insert, get, drop *sql.Stmt
}

func prepare(ctx context.Context, tx *sql.Tx) (*statements, error) {
	var st statements
	var err error
	if st.insert, err = tx.PrepareContext(ctx, `INSERT INTO chunks (run, seq, entries, crc, data) VALUES (?, ?, ?, ?, ?)`); err != nil {
		return nil, err
	}
	if st.get, err = tx.PrepareContext(ctx, selectChunkSQL); err != nil {
		st.close()
		return nil, err
	}
	if st.drop, err = tx.PrepareContext(ctx, `DELETE FROM chunks WHERE run = ? AND seq = ?`); err != nil {
		st.close()
		return nil, err
	}
	return &st, nil
}

func (st *statements) close() {
	for _, s := range []*sql.Stmt{st.insert, st.get, st.drop} {
		if s != nil {
			s.Close()
		}
	}
}

// merge merges runs (neighbours, oldest first) of one step into a new run id, inside tx,
// keeping what runfmt.CollectGroup keeps with the horizon (prefix: runs start with the step's
// oldest). It verifies every chunk it reads, as Load does, so that damage is never merged
// into a run whose checksums would bless it, and deletes each chunk once read, so that the
// new run's pages reuse the old ones'. It returns the new run, or false if nothing was kept.
func (s *SQLiteStore) merge(ctx context.Context, tx *sql.Tx, st *statements, runs []runInfo, horizon uint64, prefix bool, id int64) (runInfo, bool, error) {
	return s.mergeWith(ctx, tx, st, runs, nil, horizon, prefix, id)
}

// mergeWith is merge, with the entries es (a commit's, in run order, newer than every run's)
// merged in as if they were the newest run.
func (s *SQLiteStore) mergeWith(ctx context.Context, tx *sql.Tx, st *statements, runs []runInfo, es *entries, horizon uint64, prefix bool, id int64) (runInfo, bool, error) {
	get := stmtGetter(ctx, st.get)
	cursors := make([]runfmt.Source, len(runs), len(runs)+1)
	for i, r := range runs {
		c := newRunCursor(r, get, true, s.path)
		c.done = func(seq int) error {
			_, err := st.drop.ExecContext(ctx, r.id, seq)
			return err
		}
		cursors[i] = c
	}
	if es != nil && es.len() > 0 {
		cursors = append(cursors, memCursor(runs[0].step, es, s.path))
	}
	m, err := runfmt.NewMerger(cursors)
	if err != nil {
		return runInfo{}, false, err
	}
	w := newRunWriter(ctx, tx, st.insert, runs[0].step, id)
	for {
		g, err := m.Next()
		if err != nil {
			return runInfo{}, false, err
		}
		if g == nil {
			break
		}
		kept := runfmt.CollectGroup(g, horizon, prefix)
		for i := range kept {
			if err := w.add(&kept[i]); err != nil {
				return runInfo{}, false, err
			}
		}
	}
	for _, r := range runs {
		if err := deleteRun(ctx, tx, r); err != nil {
			return runInfo{}, false, err
		}
	}
	return w.finish()
}

// compact runs plan on the runs of step (oldest first, the newest just written) and the
// merge it asks for; it returns the runs the step has after it. next allocates run ids.
func (s *SQLiteStore) compact(ctx context.Context, tx *sql.Tx, st *statements, runs []runInfo, horizon uint64, next func() int64) ([]runInfo, error) {
	sizes := make([]int64, len(runs))
	for i, r := range runs {
		sizes[i] = r.bytes
	}
	j := plan(sizes)
	if j >= len(runs) {
		return runs, nil
	}
	merged, ok, err := s.merge(ctx, tx, st, runs[j:], horizon, j == 0, next())
	if err != nil {
		return nil, fmt.Errorf("compaction of %d runs: %w", len(runs)-j, err)
	}
	runs = runs[:j:j]
	if ok {
		runs = append(runs, merged)
	}
	return runs, nil
}
