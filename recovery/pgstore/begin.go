package pgstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/epochflow/epochflow/recovery"
)

// Begin implements recovery.Store. It runs on the writer's connection (connecting again and
// taking the lock again if the connection was lost).
func (s *Store) Begin(ctx context.Context, e recovery.Execution) (recovery.Resume, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.checkWritable("Begin"); err != nil {
		return recovery.Resume{}, err
	}
	if e.Flow == "" {
		return recovery.Resume{}, fmt.Errorf("recovery store %s: Begin: empty flow name", s.name)
	}
	if e.Workers < 1 {
		return recovery.Resume{}, fmt.Errorf("recovery store %s: Begin: %d workers, want at least 1", s.name, e.Workers)
	}
	if err := ctx.Err(); err != nil {
		return recovery.Resume{}, s.opError("Begin", err)
	}
	s.execution = 0 // a new execution replaces the previous one, even if this Begin fails
	tx, err := s.beginTx(ctx, "Begin")
	if err != nil {
		return recovery.Resume{}, err
	}
	defer tx.Rollback(ctx)
	var r recovery.Resume
	err = tx.QueryRow(ctx, `SELECT execution, flow, steps, workers FROM `+s.table("executions")+` ORDER BY execution DESC LIMIT 1`).
		Scan(&r.Execution, &r.Flow, &r.Steps, &r.Workers)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
	case err != nil:
		return recovery.Resume{}, s.opError("Begin", err)
	default:
		if r.Flow != e.Flow {
			return recovery.Resume{}, fmt.Errorf("%w: recovery store %s belongs to flow %q, not %q: use another schema for flow %q",
				recovery.ErrOtherFlow, s.name, r.Flow, e.Flow, e.Flow)
		}
		if r.Steps == nil {
			r.Steps = []string{}
		}
	}
	if err := tx.QueryRow(ctx, `SELECT COALESCE(MAX(epoch), 0) FROM `+s.table("commits")).Scan(&r.Committed); err != nil {
		return recovery.Resume{}, s.opError("Begin", err)
	}
	r.Execution++
	steps := e.Steps
	if steps == nil {
		steps = []string{}
	}
	if _, err := tx.Exec(ctx, `INSERT INTO `+s.table("executions")+` (execution, flow, steps, workers, started_at) VALUES ($1, $2, $3, $4, $5)`,
		r.Execution, e.Flow, steps, e.Workers, s.now().UnixNano()); err != nil {
		return recovery.Resume{}, s.opError("Begin", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return recovery.Resume{}, s.opError("Begin", err)
	}
	s.execution, s.workers = r.Execution, e.Workers
	return r, nil
}

// read runs fn on a read connection, in a read-only transaction of isolation level
// REPEATABLE READ (fn sees one committed state throughout).
func (s *Store) read(ctx context.Context, fn func(tx pgx.Tx) error) error {
	c, reused, err := s.pool.get(ctx)
	if err != nil {
		return err
	}
	defer func() { s.pool.put(c) }()
	tx, err := c.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil && reused && c.IsClosed() && ctx.Err() == nil {
		// An idle connection that the server closed (a restart): once more, with a new one.
		if c, err = pgx.ConnectConfig(ctx, s.pool.cfg.Copy()); err != nil {
			return err
		}
		tx, err = c.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	}
	if err != nil {
		return err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	if err := fn(tx); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

// Committed implements recovery.Store.
func (s *Store) Committed(ctx context.Context) (recovery.CommitInfo, error) {
	var c recovery.CommitInfo
	var at int64
	err := s.read(ctx, func(tx pgx.Tx) error {
		err := tx.QueryRow(ctx, `SELECT epoch, execution, committed_at FROM `+s.table("commits")+` ORDER BY epoch DESC LIMIT 1`).
			Scan(&c.Epoch, &c.Execution, &at)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		return err
	})
	if err != nil {
		return recovery.CommitInfo{}, s.opError("Committed", err)
	}
	if c.Epoch != 0 {
		c.At = time.Unix(0, at).UTC()
	}
	return c, nil
}

// Executions implements recovery.Store.
func (s *Store) Executions(ctx context.Context) ([]recovery.ExecutionInfo, error) {
	var out []recovery.ExecutionInfo
	err := s.read(ctx, func(tx pgx.Tx) error {
		out = nil
		rows, err := tx.Query(ctx, `SELECT execution, flow, steps, workers, started_at FROM `+s.table("executions")+` ORDER BY execution`)
		if err != nil {
			return err
		}
		index := map[int]int{}
		for rows.Next() {
			var x recovery.ExecutionInfo
			var started int64
			if err := rows.Scan(&x.Execution, &x.Flow, &x.Steps, &x.Workers, &started); err != nil {
				rows.Close()
				return err
			}
			if x.Steps == nil {
				x.Steps = []string{}
			}
			x.Started = time.Unix(0, started).UTC()
			index[x.Execution] = len(out)
			out = append(out, x)
		}
		if err := rows.Err(); err != nil {
			return err
		}
		rows, err = tx.Query(ctx, `SELECT execution, worker, frontier FROM `+s.table("frontiers")+` ORDER BY execution, worker`)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var x, w int
			var f int64
			if err := rows.Scan(&x, &w, &f); err != nil {
				return err
			}
			i, ok := index[x]
			if !ok || w < 0 || w >= out[i].Workers {
				return fmt.Errorf("%w: frontier of worker %d of execution %d, which has no such worker", recovery.ErrNotStore, w, x)
			}
			if out[i].Frontiers == nil {
				out[i].Frontiers = make([]uint64, out[i].Workers)
			}
			out[i].Frontiers[w] = uint64(f)
		}
		return rows.Err()
	})
	if err != nil {
		return nil, s.opError("Executions", err)
	}
	return out, nil
}

// StepIDs implements recovery.Store. It reads the steps of the runs table (through its index)
// and those of step_sums, and returns an error wrapping recovery.ErrDamaged if they differ.
func (s *Store) StepIDs(ctx context.Context) ([]string, error) {
	var stored, recorded []string
	err := s.read(ctx, func(tx pgx.Tx) error {
		var err error
		if stored, err = queryStrings(ctx, tx, `SELECT DISTINCT step FROM `+s.table("runs")+` ORDER BY step`); err != nil {
			return err
		}
		recorded, err = queryStrings(ctx, tx, `SELECT step FROM `+s.table("step_sums")+` ORDER BY step`)
		return err
	})
	if err != nil {
		return nil, s.opError("StepIDs", err)
	}
	// Both in PostgreSQL's collation order: sort them by bytes, as Steps and the contract do.
	slices.Sort(stored)
	slices.Sort(recorded)
	if !slices.Equal(stored, recorded) {
		var why []string
		for _, id := range recorded {
			if !slices.Contains(stored, id) {
				why = append(why, fmt.Sprintf("step %q has no snapshots, its commits recorded some", id))
			}
		}
		for _, id := range stored {
			if !slices.Contains(recorded, id) {
				why = append(why, fmt.Sprintf("step %q has snapshots that no commit recorded", id))
			}
		}
		return nil, s.damaged(strings.Join(why, "; "))
	}
	return stored, nil
}

// queryStrings runs a query of one text column and returns its rows.
func queryStrings(ctx context.Context, tx pgx.Tx, query string, args ...any) ([]string, error) {
	rows, err := tx.Query(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}
