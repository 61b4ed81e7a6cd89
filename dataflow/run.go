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

// DefaultMaxSnapshotBytesInFlight is the memory the snapshots waiting for the recovery store
// may hold before sources pause, when Options.MaxSnapshotBytesInFlight is 0.
const DefaultMaxSnapshotBytesInFlight = 128 << 20

// Options says how Run executes a flow. The zero value runs one worker with the defaults.
type Options struct {
	// Workers is the number of workers (goroutines) in this process; 0 means 1. More than the
	// cores add no speed, and the cost of workers grows with the square of their number (every
	// exchange has a channel between every two workers: see MainFunc for measurements).
	Workers int
	// EpochInterval is how often each worker closes its epoch; 0 means DefaultEpochInterval.
	EpochInterval time.Duration
	// MaxEpochsInFlight bounds the epochs closed but not yet committed: when that many wait for
	// their commit (a slow store, a lagging worker), a worker's sources stop reading until a
	// commit comes, which bounds memory (and connectors' in-flight lists) whatever the input
	// rate. 0 means DefaultMaxEpochsInFlight.
	MaxEpochsInFlight int
	// MaxSnapshotBytesInFlight bounds the memory held by the snapshots of stateful steps,
	// sources and sinks that were taken at the end of epochs and are not yet durable in the
	// Recovery store (each snapshot's key and state, encoded compactly, and 48 bytes for the
	// store's sort of it): while
	// they hold more, the sources stop reading (epochs still close), and the commit that
	// brings them below it lets the sources read again. It is a bound on what is taken once
	// it is reached, not a hard cap: the snapshots of what had been read before can still
	// arrive. It also sets how much work the store gets at once: when the store falls
	// behind, one commit covers every epoch that waits, and the store keeps only the newest
	// snapshot of each key, so a larger bound means fewer rows written for keys that change in
	// every epoch. 0 means DefaultMaxSnapshotBytesInFlight; it must not be negative. It does
	// nothing without a Recovery store.
	MaxSnapshotBytesInFlight int64
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
	// recovery store carries on where this one stopped. Without a recovery store, what the
	// stateful steps hold (counts, windows, aggregates not yet emitted) is discarded: the
	// sinks have what was emitted before the stop, nothing more, and the next run starts
	// from the beginning.
	Stop <-chan struct{}
	// Restart restarts a run that failed, in this process, from the last committed epoch.
	// The zero value never restarts. It needs Recovery.
	Restart RestartPolicy
	// OnRestart, if set, is called before each restart's wait, from Run's goroutine (for a
	// metric; the restart is also logged at warn level).
	OnRestart func(RestartEvent)
	// Monitor, if set, counts what the run does, for metrics and readiness (see Monitor), and
	// is what Metrics returns to the connectors. Counting costs an atomic add per batch. Main
	// always sets one, with or without -metrics-addr (which only serves it).
	Monitor *Monitor

	// Cluster, if set, runs this process as one of several that run the flow together (see
	// ClusterOptions). nil runs it on this process alone.
	Cluster *ClusterOptions

	// onInFlight is engine.Config.OnInFlight, for tests (set in export_test.go).
	onInFlight func(epochs uint64, bytes int64)
}

// RestartPolicy says when Run restarts a failed run from its last committed epoch (the recovery
// store's), as Flink's restart strategies do: after a failure of a running flow, it waits (the
// backoff), closes nothing more (every partition and goroutine of the failed attempt is closed
// when it returns), opens the steps again from the store and carries on. Output stays exactly
// once: the failed attempt's uncommitted epochs are replayed.
//
// Restarted: a failure of a running flow, from a source, a sink or their Commit, or from the
// recovery store (an epoch that could not be recorded); on a restart, also a failure to build
// the steps again (the server may still be down). Not restarted: an error found before the
// first attempt ran (configuration, building the steps, listing partitions, opening the
// store), which would fail the same way; an error or panic of a user function (an
// *ItemError, a *PanicError, a Transform's or stateful step's error), which would fail again
// on the same replayed item; a failure a connector marked with Permanent (a poison message);
// a cancelled context; a CrashHook's crash.
//
// A graceful stop (Options.Stop) that comes during the wait before a restart ends Run at once
// with nil and Stats.Stopped, as a stop of a running flow does, after logging the failure at
// warn level: what was committed is final, and the next run resumes after it. A failure of an
// attempt that was already stopping is not restarted: Run returns it.
type RestartPolicy struct {
	// Attempts is how many times in a row a run may be restarted without committing an epoch
	// in between: an attempt that commits an epoch resets the count (and the backoff), so a
	// long-running flow survives any number of server restarts that are far apart. 0 never
	// restarts. When a failure comes with no attempt left, Run returns it, naming the
	// number of restarts.
	Attempts int
	// Backoff is the wait before the first restart of a row; each next one waits twice as
	// long, up to MaxBackoff. 0 means DefaultRestartBackoff.
	Backoff time.Duration
	// MaxBackoff caps the wait; 0 means DefaultMaxRestartBackoff (or Backoff, if longer).
	MaxBackoff time.Duration
}

// DefaultRestartBackoff is the wait before the first restart when RestartPolicy.Backoff is 0.
const DefaultRestartBackoff = time.Second

// DefaultMaxRestartBackoff is the longest wait between restarts when RestartPolicy.MaxBackoff
// is 0.
const DefaultMaxRestartBackoff = time.Minute

// RestartEvent describes a restart, for Options.OnRestart.
type RestartEvent struct {
	Restart int           // the number of this restart in the run: 1, 2, ...
	Attempt int           // the number of this restart in the current row (see Attempts)
	Err     error         // the failure that caused it
	Wait    time.Duration // the wait before the flow is built again
	// Committed is the last committed epoch: the restarted flow resumes after it.
	Committed uint64
}

// Stats is what a run did, as RunStats returns it.
type Stats struct {
	// Restarts is the number of times the run was restarted after a failure.
	Restarts int
	// Read is the number of items the sources read, over all attempts (a restarted attempt
	// reads again what its predecessor had read after the last commit).
	Read uint64
	// Written is the number of items handed to sinks, over all attempts. With a recovery
	// store, what was written after the last committed epoch is not final (a transactional
	// sink discards it, a file sink truncates it at the next run).
	Written uint64
	// Committed is the last committed epoch (with a recovery store, the one the next run
	// resumes after).
	Committed uint64
	// Stopped tells whether the run ended because Options.Stop was closed.
	Stopped bool
	// ResumedAfter is the committed epoch the first attempt resumed after, from the recovery
	// store (0 for a fresh start).
	ResumedAfter uint64

	stopPeer int // the process of the cluster whose stop this one followed, plus one (0: none)
}

// Run executes the flow and returns when every source has ended and the last epoch is
// committed (nil), when ctx is done (ctx's error), or when a step fails (an error naming the
// step, the worker and, for a user function, the item). No goroutine it starts outlives it.
// With Options.Restart, a failure restarts the flow from its last committed epoch (see
// RestartPolicy) before Run gives up.
func Run(ctx context.Context, f *Flow, opts Options) error {
	_, err := RunStats(ctx, f, opts)
	return err
}

// RunStats is Run that also returns what the run did: items read and written, the last
// committed epoch, the restarts, whether it was stopped. The Stats are filled in when Run
// fails too.
func RunStats(ctx context.Context, f *Flow, opts Options) (Stats, error) {
	var st Stats
	if f == nil {
		return st, errors.New("dataflow: Run with a nil flow")
	}
	if f.err != nil {
		return st, fmt.Errorf("flow %q: %w", f.name, f.err)
	}
	if len(f.graph.Steps) == 0 {
		return st, fmt.Errorf("flow %q has no steps", f.name)
	}
	cfg, err := opts.config()
	if err != nil {
		return st, fmt.Errorf("flow %q: %w", f.name, err)
	}
	ctx = context.WithValue(ctx, loggerKey{}, cfg.Logger)
	ctx = context.WithValue(ctx, epochIntervalKey{}, cfg.EpochInterval)
	if m := opts.Monitor; m != nil {
		ctx = context.WithValue(ctx, metricsKey{}, m)
		cfg.Meter = m.attach(f, cfg.Workers)
		cfg.StepContext = func(ctx context.Context, step string) context.Context {
			return context.WithValue(ctx, stepKey{}, step)
		}
	}
	if opts.Recovery == nil {
		cfg.StopWarning = "stopping without a recovery store: the stateful steps' state is discarded, so what they " +
			"have not emitted yet (counts, aggregates waiting for the end of the input) is never written, and the " +
			"next run starts from the beginning"
	}
	row := 0 // restarts since the last attempt that committed an epoch
	for {
		if opts.Monitor != nil {
			opts.Monitor.lag.Reset() // each attempt's connectors report their lag afresh
		}
		c := cfg
		var es engine.Stats
		execution := 0
		if opts.Recovery != nil {
			total := c.Workers
			if cl := opts.Cluster; cl != nil && len(cl.Addresses) > 1 {
				total *= len(cl.Addresses)
			}
			execution, err = f.resume(ctx, opts.Recovery, &c, total)
			es.Committed = max(c.StartEpoch, 1) - 1
			if st.Restarts == 0 {
				st.ResumedAfter = es.Committed
			}
		}
		if err == nil {
			es, err = runAttempt(ctx, f, opts, c, execution)
		}
		st.Read += es.Read
		st.Written += es.Written
		st.Committed = max(st.Committed, es.Committed)
		st.Stopped, st.stopPeer = es.Stopped, es.StopPeer
		if err == nil {
			return st, nil
		}
		ferr := fmt.Errorf("flow %q: %w", f.name, err)
		if opts.Monitor != nil {
			opts.Monitor.errs.Inc()
		}
		if !restartable(ctx, err, es.Running || st.Restarts > 0) || stopped(opts.Stop) {
			return st, ferr
		}
		if es.Committed > max(c.StartEpoch, 1)-1 {
			row = 0 // the attempt made progress
		}
		if row >= opts.Restart.Attempts {
			if st.Restarts == 0 {
				return st, ferr
			}
			return st, fmt.Errorf("flow %q: giving up after %d restarts (the last %d in a row without a commit): %w",
				f.name, st.Restarts, row, err)
		}
		row++
		st.Restarts++
		wait := opts.Restart.wait(row)
		cfg.Logger.Warn("the flow failed; restarting it from the last committed epoch", "flow", f.name,
			"error", ferr.Error(), "restart", st.Restarts, "attempt", row, "of", opts.Restart.Attempts,
			"wait", wait, "committed_epoch", st.Committed)
		if opts.Monitor != nil {
			opts.Monitor.restarts.Inc()
		}
		if opts.OnRestart != nil {
			opts.OnRestart(RestartEvent{Restart: st.Restarts, Attempt: row, Err: ferr, Wait: wait, Committed: st.Committed})
		}
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return st, fmt.Errorf("flow %q: %w (while waiting to restart after: %w)", f.name, ctx.Err(), err)
		case <-opts.Stop:
			// Nothing is running, so nothing is left to finish: this is a clean stop, as
			// one of a running flow is, and the next run resumes after the last commit.
			t.Stop()
			st.Stopped = true
			cfg.Logger.Warn("stopped while waiting to restart after a failure: the failed attempt's uncommitted "+
				"epochs are not committed, and a run with the same recovery store reads them again", "flow", f.name,
				"error", ferr.Error(), "committed_epoch", st.Committed)
			return st, nil
		}
	}
}

// restartable tells whether a failure of an attempt may be cured by a restart (see
// RestartPolicy): ran tells whether the failed attempt had started running, or was itself a
// restart.
func restartable(ctx context.Context, err error, ran bool) bool {
	if !ran || ctx.Err() != nil || errors.Is(err, ErrCrashed) || IsPermanent(err) {
		return false
	}
	var ie *ItemError
	var pe *PanicError
	var ue *userError
	return !errors.As(err, &ie) && !errors.As(err, &pe) && !errors.As(err, &ue)
}

func stopped(stop <-chan struct{}) bool {
	select {
	case <-stop:
		return true
	default:
		return false
	}
}

// wait is the backoff before the nth restart of a row (n >= 1).
func (p RestartPolicy) wait(n int) time.Duration {
	d := p.Backoff
	if d <= 0 {
		d = DefaultRestartBackoff
	}
	most := p.MaxBackoff
	if most <= 0 {
		most = max(DefaultMaxRestartBackoff, d)
	}
	for i := 1; i < n && d < most; i++ {
		d *= 2
	}
	return min(d, most)
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

		MaxSnapshotBytesInFlight: o.MaxSnapshotBytesInFlight,
		OnInFlight:               o.onInFlight,
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
	if cfg.MaxSnapshotBytesInFlight == 0 {
		cfg.MaxSnapshotBytesInFlight = DefaultMaxSnapshotBytesInFlight
	}
	if cfg.MaxSnapshotBytesInFlight < 0 {
		return cfg, fmt.Errorf("max snapshot bytes in flight must not be negative, got %d", o.MaxSnapshotBytesInFlight)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if o.Restart.Attempts < 0 || o.Restart.Backoff < 0 || o.Restart.MaxBackoff < 0 {
		return cfg, fmt.Errorf("restart policy %+v: want no negative attempts or backoff", o.Restart)
	}
	if err := o.Cluster.check(o); err != nil {
		return cfg, err
	}
	if o.Restart.Attempts > 0 && o.Recovery == nil {
		return cfg, errors.New("restarts need a recovery store: a restart without one would read every source " +
			"again from the start and write its output twice; give Options.Recovery or no Options.Restart")
	}
	return cfg, nil
}
