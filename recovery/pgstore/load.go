package pgstore

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"

	"github.com/epochflow/epochflow/internal/storecheck"
	"github.com/epochflow/epochflow/recovery"

	"github.com/epochflow/epochflow/recovery/internal/runfmt"
)

// Load implements recovery.Store. It reads the step's runs in one read-only transaction
// (REPEATABLE READ: one committed state throughout) on a connection of its own, a few chunks
// of each run at a time, merges them and calls fn in the caller's goroutine. It verifies what
// it reads (see the package documentation) unless storecheck is off (benchmarks).
func (s *Store) Load(ctx context.Context, step string, fn func(key string, epoch uint64, state []byte) error) error {
	var fnErr error
	err := s.read(ctx, func(tx pgx.Tx) error {
		return s.scan(ctx, tx, step, storecheck.On(), nil, func(e *item) error {
			if fnErr = fn(e.Key, e.Epoch, e.State); fnErr != nil {
				return fnErr
			}
			return nil
		})
	})
	switch {
	case fnErr != nil:
		return fnErr
	case err == nil:
		return nil
	case isDamaged(err):
		return err // it names the store and the step
	}
	return s.opError(fmt.Sprintf("Load of step %q", step), err)
}

// isDamaged reports whether err wraps recovery.ErrDamaged.
func isDamaged(err error) bool { return errors.Is(err, recovery.ErrDamaged) }

// scan merges the runs of step in tx and calls emit with the newest entry of every key that
// is not a tombstone, in ascending order of key (the entry's key and state are the caller's
// to keep). If verify, it checks the runs against step_sums and their chunk counts first, and
// every chunk as it reads it (runCursor): a difference is an error wrapping ErrDamaged,
// possibly after some calls of emit. onRuns, if not nil, is called with the runs first.
func (s *Store) scan(ctx context.Context, tx pgx.Tx, step string, verify bool, onRuns func([]runInfo), emit func(*item) error) error {
	runs, err := s.readRuns(ctx, tx, step)
	if err != nil {
		return err
	}
	if verify {
		if err := s.checkStep(ctx, tx, step, runs); err != nil {
			return err
		}
	}
	if onRuns != nil {
		onRuns(runs)
	}
	sources := make([]source, len(runs))
	for i, r := range runs {
		sources[i] = s.newRunCursor(ctx, tx, r, verify)
	}
	return runfmt.EachNewest(sources, emit)
}

// Steps implements recovery.Store. It merges every step's runs as Load does, without
// verifying them (Verify does).
func (s *Store) Steps(ctx context.Context) ([]recovery.StepInfo, error) {
	var out []recovery.StepInfo
	err := s.read(ctx, func(tx pgx.Tx) error {
		out = nil
		ids, err := queryStrings(ctx, tx, `SELECT DISTINCT step FROM `+s.table("runs"))
		if err != nil {
			return err
		}
		slices.Sort(ids)
		for _, id := range ids {
			st := recovery.StepInfo{Step: id}
			err := s.scan(ctx, tx, id, false, func(runs []runInfo) {
				st.Rows = int(totals(runs).entries)
			}, func(e *item) error {
				st.Keys++
				st.Bytes += int64(len(e.State))
				return nil
			})
			if err != nil {
				return fmt.Errorf("step %q: %w", id, err)
			}
			out = append(out, st)
		}
		return nil
	})
	if isDamaged(err) {
		return nil, err
	}
	if err != nil {
		return nil, s.opError("Steps", err)
	}
	return out, nil
}

// Verify checks the whole store as a resume would: the steps of the runs against those of the
// commits' sums, and every step's runs and chunks (reading them all, as Load does). It returns
// nil if the store is sound, or an error wrapping recovery.ErrDamaged that says why.
func (s *Store) Verify(ctx context.Context) error {
	ids, err := s.StepIDs(ctx)
	if err != nil {
		return err
	}
	for _, id := range ids {
		err := s.read(ctx, func(tx pgx.Tx) error {
			return s.scan(ctx, tx, id, true, nil, func(*item) error { return nil })
		})
		if isDamaged(err) {
			return err
		}
		if err != nil {
			return s.opError(fmt.Sprintf("Verify of step %q", id), err)
		}
	}
	return nil
}
