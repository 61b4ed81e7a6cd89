package dataflow

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/epochflow/epochflow/dataflow/internal/engine"
	"github.com/epochflow/epochflow/recovery"
)

// ErrCrashed is what Run's error wraps when a CrashHook stopped the run.
var ErrCrashed = engine.ErrCrashed

// DefaultEpochInterval is how often a worker closes its epoch when Options.EpochInterval is
// zero. Shorter epochs commit (and so acknowledge) sooner; longer ones snapshot less often.
const DefaultEpochInterval = time.Second

// DefaultMaxEpochsInFlight is how many epochs may be open or uncommitted before sources pause.
const DefaultMaxEpochsInFlight = 4

// Options says how Run executes a flow. The zero value runs one worker with the defaults.
type Options struct {
	// Workers is the number of workers (goroutines) in this process; 0 means 1.
	Workers int
	// EpochInterval is how often each worker closes its epoch; 0 means DefaultEpochInterval.
	EpochInterval time.Duration
	// MaxEpochsInFlight bounds the epochs closed but not yet committed: when that many wait for
	// their commit (a slow store, a lagging worker), a worker's sources stop reading until a
	// commit comes, which bounds memory (and connectors' in-flight lists) whatever the input
	// rate. 0 means DefaultMaxEpochsInFlight.
	MaxEpochsInFlight int
	// Logger receives the run's logs; nil means slog.Default().
	Logger *slog.Logger
	// Recovery is the store that makes the run durable: each committed epoch is recorded in
	// it with the snapshots of every stateful step, source and sink, and a run that starts on a
	// store that has committed epochs resumes after the last one. nil runs without
	// durability: a crash loses the state, and the sources start from the beginning.
	Recovery recovery.Store
	// CrashHook, if set, is called at named points of the commit protocol: "after-snapshot"
	// (a worker handed its snapshots over), "before-commit-record", "after-commit-record" (the
	// store has recorded the epoch), "before-commit-calls" (a worker is about to call Commit)
	// and "inside-commit" (after each Commit call of a step, before the next step's). When it
	// returns true the run stops there at once, as a crash would: nothing more is committed
	// and nothing is closed, and Run returns an error wrapping ErrCrashed. It is called from
	// several goroutines at once. It exists for tests of recovery.
	CrashHook func(point string) bool
	// Stop, when closed, stops the flow gracefully: sources stop reading, the open epoch is
	// closed and committed, the last Commits are called, and Run returns nil. Steps do not see
	// an end of input (Reduce and the like emit nothing), so a run that resumes from the
	// recovery store carries on where this one stopped.
	Stop <-chan struct{}
}

// Run executes the flow and returns when every source has ended and the last epoch is
// committed (nil), when ctx is done (ctx's error), or when a step fails (an error naming the
// step, the worker and, for a user function, the item). No goroutine it starts outlives it.
func Run(ctx context.Context, f *Flow, opts Options) error {
	if f == nil {
		return errors.New("dataflow: Run with a nil flow")
	}
	if f.err != nil {
		return fmt.Errorf("flow %q: %w", f.name, f.err)
	}
	if len(f.graph.Steps) == 0 {
		return fmt.Errorf("flow %q has no steps", f.name)
	}
	cfg, err := opts.config()
	if err != nil {
		return fmt.Errorf("flow %q: %w", f.name, err)
	}
	ctx = context.WithValue(ctx, loggerKey{}, cfg.Logger)
	if opts.Recovery != nil {
		if err := f.resume(ctx, opts.Recovery, &cfg); err != nil {
			return fmt.Errorf("flow %q: %w", f.name, err)
		}
	}
	if err := engine.Run(ctx, &f.graph, cfg); err != nil {
		return fmt.Errorf("flow %q: %w", f.name, err)
	}
	return nil
}

func (o Options) config() (engine.Config, error) {
	cfg := engine.Config{
		Workers:           o.Workers,
		EpochInterval:     o.EpochInterval,
		MaxEpochsInFlight: o.MaxEpochsInFlight,
		BatchSize:         exchangeBatch,
		Logger:            o.Logger,
		Stop:              o.Stop,
		Crash:             o.CrashHook,
	}
	if cfg.Workers == 0 {
		cfg.Workers = 1
	}
	if cfg.Workers < 0 {
		return cfg, fmt.Errorf("workers must be at least 1, got %d", o.Workers)
	}
	if cfg.EpochInterval == 0 {
		cfg.EpochInterval = DefaultEpochInterval
	}
	if cfg.EpochInterval < 0 {
		return cfg, fmt.Errorf("epoch interval must be positive, got %v", o.EpochInterval)
	}
	if cfg.MaxEpochsInFlight == 0 {
		cfg.MaxEpochsInFlight = DefaultMaxEpochsInFlight
	}
	if cfg.MaxEpochsInFlight < 0 {
		return cfg, fmt.Errorf("max epochs in flight must be at least 1, got %d", o.MaxEpochsInFlight)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return cfg, nil
}
