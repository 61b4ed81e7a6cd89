package recovery

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/epochflow/epochflow/internal/storecheck"

	"github.com/epochflow/epochflow/recovery/internal/runfmt"
)

// loadBatch is how many keys Load's reader hands to fn's goroutine at once.
const loadBatch = 1024

// loaded is a key Load passes to fn.
type loaded struct {
	key   string
	epoch uint64
	state []byte
}

// Load implements Store. One goroutine reads and merges the step's runs while the caller's
// runs fn, so that decoding the states, which fn may do, overlaps with the store's work.
func (s *SQLiteStore) Load(ctx context.Context, step string, fn func(key string, epoch uint64, state []byte) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	batches := make(chan []loaded, 2)
	errc := make(chan error, 1)
	go func() {
		defer close(batches)
		batch := make([]loaded, 0, loadBatch)
		send := func() error {
			select {
			case batches <- batch:
				batch = make([]loaded, 0, loadBatch)
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		err := s.scan(ctx, step, storecheck.On(), nil, func(e *item) error {
			if batch = append(batch, loaded{e.Key, e.Epoch, e.State}); len(batch) == loadBatch {
				return send()
			}
			return nil
		})
		if err == nil && len(batch) > 0 {
			err = send()
		}
		errc <- err
	}()
	var fnErr error
	for batch := range batches {
		if fnErr != nil {
			continue // draining after fn failed
		}
		for _, r := range batch {
			if fnErr = fn(r.key, r.epoch, r.state); fnErr != nil {
				cancel()
				break
			}
		}
	}
	err := <-errc
	if fnErr != nil {
		return fnErr
	}
	if errors.Is(err, ErrDamaged) {
		return err // it names the file, and the step if the damage is the step's
	}
	if err != nil {
		return s.opError(fmt.Sprintf("Load of step %q", step), err)
	}
	return nil
}

// scan merges the runs of step in one read transaction and calls emit with the newest entry
// of every key that is not a tombstone, in ascending order of key (the entry's key and state
// are the caller's to keep; the entry itself is valid during the call). If verify, it checks
// the runs' totals against step_sums and every chunk's checksum, and every run's entries
// against its row (see runCursor): a difference is an error wrapping ErrDamaged, possibly
// after some calls of emit. onRuns, if not nil, is called with the runs before the first
// entry.
func (s *SQLiteStore) scan(ctx context.Context, step string, verify bool, onRuns func([]runInfo), emit func(*item) error) error {
	// A read-only transaction is a deferred BEGIN: it takes no write lock, and sees one
	// commit's state throughout.
	tx, err := s.db.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return err
	}
	defer tx.Rollback()
	runs, err := readRuns(ctx, tx, step)
	if err != nil {
		return err
	}
	if verify {
		recorded, last, err := readStepSum(ctx, tx, step)
		if err != nil {
			return err
		}
		if found := totals(runs); found != recorded {
			return stepDamaged(s.path, step, last, recorded, found)
		}
	}
	if onRuns != nil {
		onRuns(runs)
	}
	if len(runs) == 0 {
		return nil
	}
	get, err := tx.PrepareContext(ctx, selectChunkSQL)
	if err != nil {
		return err
	}
	defer get.Close()
	cursors := make([]*runCursor, len(runs))
	for i, r := range runs {
		cursors[i] = newRunCursor(r, stmtGetter(ctx, get), verify, s.path)
		if verify {
			// The cursor reads chunks 0 to r.chunks-1: one more would go unseen.
			var n int
			if err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM chunks WHERE run = ?`, r.id).Scan(&n); err != nil {
				return err
			}
			if n != r.chunks {
				return cursors[i].Damaged("it has %d chunks, its commit recorded %d", n, r.chunks)
			}
		}
	}
	if len(cursors) == 1 {
		return scanRun(cursors[0], emit)
	}
	sources := make([]runfmt.Source, len(cursors))
	for i, c := range cursors {
		sources[i] = c
	}
	return runfmt.EachNewest(sources, emit)
}

// scanRun is scan of a step with one run, without a merge: of each key's entries (adjacent,
// ascending by epoch) it emits the last, unless it is a tombstone.
func scanRun(c *runCursor, emit func(*item) error) error {
	var pend item // the last entry of the previous chunk, whose key may go on in this one
	have := false
	for {
		es, err := c.chunk()
		if err != nil {
			return err
		}
		if es == nil {
			break
		}
		if have && es[0].Key != pend.Key && !pend.Dead {
			if err := emit(&pend); err != nil {
				return err
			}
		}
		for i := range len(es) - 1 {
			if e := &es[i]; e.Key != es[i+1].Key && !e.Dead {
				if err := emit(e); err != nil {
					return err
				}
			}
		}
		pend, have = es[len(es)-1], true
	}
	if have && !pend.Dead {
		return emit(&pend)
	}
	return nil
}
