package dataflow

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/epochflow/epochflow/dataflow/internal/engine"
	"github.com/epochflow/epochflow/recovery"
)

// storeAdapter writes the engine's committed epochs to a recovery.Store.
type storeAdapter struct{ store recovery.Store }

// The engine's snapshots are recovery.Pack values (engine.Pack is an alias): they are handed
// to the store as the workers filled them, without a copy.
func (a storeAdapter) Commit(ctx context.Context, epoch uint64, frontiers []uint64, packs []*engine.Pack) error {
	return a.store.Commit(ctx, recovery.Epoch{Epoch: epoch, Frontiers: frontiers, Packs: packs})
}

// resume checks that store can serve this flow, records the new execution and loads the state
// every step resumes from. A store that holds state of steps this flow does not have is
// refused before anything is written to it. total is the number of workers of the cluster
// (cfg.Workers on one process). It returns the number of the execution it began.
func (f *Flow) resume(ctx context.Context, store recovery.Store, cfg *engine.Config, total int) (int, error) {
	execs, err := store.Executions(ctx)
	if err != nil {
		return 0, fmt.Errorf("reading the recovery store: %w", err)
	}
	if n := len(execs); n > 0 && execs[n-1].Flow != f.name {
		return 0, fmt.Errorf("%w: the recovery store was written by flow %q, not %q; "+
			"run %q with a new recovery directory (with a PostgreSQL store, another ?schema=)", recovery.ErrOtherFlow, execs[n-1].Flow, f.name, f.name)
	}
	stored, err := store.StepIDs(ctx)
	if err != nil {
		return 0, fmt.Errorf("reading the recovery store: %w", err)
	}
	ids := f.StepIDs()
	var unknown []string
	for _, s := range stored {
		if !slices.Contains(ids, s) {
			unknown = append(unknown, fmt.Sprintf("%q", s))
		}
	}
	if len(unknown) > 0 {
		return 0, fmt.Errorf("the recovery store holds the state of step %s, which flow %q does not have: "+
			"it was written by another flow or by another version of this one; "+
			"run with a new recovery directory (with a PostgreSQL store, another ?schema=), or with the flow that wrote it",
			strings.Join(unknown, ", "), f.name)
	}
	res, err := store.Begin(ctx, recovery.Execution{Flow: f.name, Steps: ids, Workers: total})
	if err != nil {
		return 0, err
	}
	cfg.StartEpoch = res.Committed + 1
	cfg.Recovery = true
	cfg.Store = storeAdapter{store}
	cfg.Restored = map[string][]engine.Restored{}
	for _, s := range stored {
		var rs []engine.Restored
		err := store.Load(ctx, s, func(key string, _ uint64, state []byte) error {
			rs = append(rs, engine.Restored{Key: key, State: state})
			return nil
		})
		if err != nil {
			return 0, fmt.Errorf("loading the state of step %q: %w", s, err)
		}
		if len(rs) > 0 {
			cfg.Restored[s] = rs
		}
	}
	if res.Committed > 0 {
		cfg.Logger.Info("resuming from the recovery store", "flow", f.name, "execution", res.Execution,
			"committed_epoch", res.Committed, "previous_workers", res.Workers, "workers", total)
	}
	return res.Execution, nil
}
