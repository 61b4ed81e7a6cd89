package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"
)

// Config is how a graph is run.
type Config struct {
	Workers           int           // workers in this process
	EpochInterval     time.Duration // how often a worker closes its epoch
	MaxEpochsInFlight int           // sources pause when this many epochs are not committed
	BatchSize         int           // items per batch sent across an exchange
	Logger            *slog.Logger
	Recovery          bool
	StartEpoch        uint64 // first epoch (committed epoch + 1)
	// OnCommit is called with the new committed epoch before any Commit for it runs.
	OnCommit func(epoch uint64) error
	// Store, if set, durably records each committed epoch with its snapshots before any
	// Commit of it runs. Without it epochs are committed in memory.
	Store Store
	// Restored is the state to resume from, per step id.
	Restored map[string][]Restored
	// Crash, if set, is called at named points of the commit protocol (for crash tests); when
	// it returns true the run stops there as if the process died: no more commits, no Close.
	Crash func(point string) bool
	// Stop, when closed, makes the run stop gracefully: sources stop reading, the open epoch
	// is closed and committed, and Run returns nil. Steps do not see an end of input.
	Stop <-chan struct{}
}

// StepError is an error that happened in a step on a worker.
type StepError struct {
	Step   string
	Worker int
	Err    error
}

func (e *StepError) Error() string {
	return fmt.Sprintf("step %q (worker %d): %v", e.Step, e.Worker, e.Err)
}

func (e *StepError) Unwrap() error { return e.Err }

type run struct {
	start    time.Time // epochs close on ticks of EpochInterval from here, on every worker
	cfg      Config
	coord    *coordinator
	stopping atomic.Bool
}

// Run runs the graph until every source has ended and the last epoch is committed, until ctx
// is done, or until a step fails. No goroutine it starts outlives it.
func Run(ctx context.Context, g *Graph, cfg Config) (err error) {
	if cfg.Workers < 1 {
		return fmt.Errorf("workers must be at least 1, got %d", cfg.Workers)
	}
	if cfg.EpochInterval <= 0 {
		return fmt.Errorf("epoch interval must be positive, got %v", cfg.EpochInterval)
	}
	if cfg.MaxEpochsInFlight < 1 {
		cfg.MaxEpochsInFlight = 4
	}
	if cfg.BatchSize < 1 {
		cfg.BatchSize = 1024
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.StartEpoch < 1 {
		cfg.StartEpoch = 1
	}
	p, err := compile(g)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)

	r := &run{cfg: cfg, start: time.Now()}
	n := cfg.Workers
	r.coord = &coordinator{frontier: make([]uint64, n), done: make([]bool, n), onCommit: cfg.OnCommit,
		store: cfg.Store, crash: cfg.Crash, ctx: ctx, wakeWriter: make(chan struct{}, 1),
		fail: func(err error) { cancel(err) }}
	r.coord.committed.Store(cfg.StartEpoch - 1)
	r.coord.requested = cfg.StartEpoch - 1
	for i := range r.coord.frontier {
		r.coord.frontier[i] = cfg.StartEpoch - 1
	}

	shared := make([]any, len(p.steps))
	for i, s := range p.steps {
		if s.Setup != nil {
			v, err := s.Setup(ctx, n)
			if err != nil {
				return &StepError{Step: s.ID, Worker: -1, Err: err}
			}
			shared[i] = v
		}
	}

	workers := make([]*worker, n)
	for i := range workers {
		workers[i] = newWorker(r, p, i, n, shared)
	}
	r.coord.workers = workers
	wireMailboxes(p, workers)

	// Build every node; on failure close what was built.
	var buildErr error
	for _, w := range workers {
		w.ctx = ctx
		if err := w.build(shared); err != nil {
			buildErr = err
			break
		}
	}
	if buildErr != nil {
		var errs []error
		errs = append(errs, buildErr)
		for _, w := range workers {
			errs = append(errs, w.closeNodes())
		}
		return errors.Join(errs...)
	}

	var wg sync.WaitGroup
	if cfg.Store != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.coord.writer()
		}()
	}
	if cfg.Stop != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			select {
			case <-cfg.Stop:
				r.stopping.Store(true)
				for _, w := range workers {
					w.wakeUp()
				}
			case <-ctx.Done():
			}
		}()
	}
	errs := make([]error, n)
	var workersDone sync.WaitGroup
	for i, w := range workers {
		workersDone.Add(1)
		go func() {
			defer workersDone.Done()
			errs[i] = w.main()
			if errs[i] != nil {
				cancel(errs[i])
			}
		}()
	}
	workersDone.Wait()
	c := context.Cause(ctx)
	cancel(nil) // ends the stop watcher
	wg.Wait()
	if c == nil {
		return errors.Join(errs...)
	}
	// The first failure is the cause; the other workers' errors are its echo (the context was
	// cancelled), except failures of their own, such as a Close that failed.
	out := []error{c}
	for _, e := range errs {
		if e != nil && !errors.Is(e, context.Canceled) && !errors.Is(e, c) {
			out = append(out, e)
		}
	}
	return errors.Join(out...)
}

// nextTick is the first tick of the run's epoch clock after now. Every worker closes its epochs
// on the same ticks, so an epoch ends at about the same time everywhere and commits without
// waiting for a worker whose clock lags.
func (r *run) nextTick(now time.Time) time.Time {
	iv := r.cfg.EpochInterval
	k := now.Sub(r.start)/iv + 1
	return r.start.Add(k * iv)
}

func newWorker(r *run, p *plan, i, n int, shared []any) *worker {
	w := &worker{
		r: r, p: p, index: i, total: n,
		nodes:       make([]Node, len(p.steps)),
		envs:        make([]*Env, len(p.steps)),
		ended:       make([]bool, len(p.steps)),
		endedIn:     make([]int, len(p.steps)),
		stopped:     make([]bool, len(p.steps)),
		routers:     make([]Router, len(p.edges)),
		routerEpoch: make([]uint64, len(p.edges)),
		inbox:       make([][]*mailbox, len(p.edges)),
		outbox:      make([][]*mailbox, len(p.edges)),
		edgeEnded:   make([]bool, len(p.edges)),
		epoch:       make([]uint64, p.maxDepth+1),
		groupDone:   make([]bool, p.maxDepth+1),
		committed:   r.cfg.StartEpoch - 1,
		lastSent:    r.cfg.StartEpoch - 1,
		wake:        make(chan struct{}, 1),
		timer:       time.NewTimer(time.Hour),
	}
	w.timer.Stop()
	for d := range w.epoch {
		w.epoch[d] = r.cfg.StartEpoch
	}
	for eid, e := range p.edges {
		if e.newRouter != nil {
			w.routers[eid] = e.newRouter(i, n, shared[e.to])
		}
	}
	return w
}

func wireMailboxes(p *plan, workers []*worker) {
	n := len(workers)
	for eid, e := range p.edges {
		if !e.channel {
			continue
		}
		for _, w := range workers {
			w.inbox[eid] = make([]*mailbox, n)
			w.outbox[eid] = make([]*mailbox, n)
		}
		for _, recv := range workers {
			for _, send := range workers {
				if e.newRouter == nil && !e.balance && send != recv {
					continue // forward channel: to self only
				}
				mb := &mailbox{sender: send, recv: recv}
				recv.inbox[eid][send.index] = mb
				send.outbox[eid][recv.index] = mb
				send.outAll = append(send.outAll, mb)
			}
		}
	}
}

func (w *worker) build(shared []any) error {
	for i, s := range w.p.steps {
		env := &Env{Ctx: w.ctx, StepID: s.ID, Worker: w.index, Workers: w.total,
			Logger: w.r.cfg.Logger, Recovery: w.r.cfg.Recovery, StartEpoch: w.r.cfg.StartEpoch, w: w, step: i}
		w.envs[i] = env
		node, err := s.New(env, shared[i])
		if err != nil {
			return &StepError{Step: s.ID, Worker: w.index, Err: err}
		}
		w.nodes[i] = node
		if s.Source {
			if _, ok := node.(SourceNode); !ok {
				return &StepError{Step: s.ID, Worker: w.index, Err: errors.New("engine: source node does not implement SourceNode")}
			}
			w.sources = append(w.sources, i)
		}
		if _, ok := node.(Timed); ok {
			w.timed = append(w.timed, i)
		}
		if _, ok := node.(Committer); ok {
			w.commit = append(w.commit, i)
		}
	}
	for i, s := range w.p.steps {
		w.envs[i].reusable = make([]bool, s.Outputs)
		for port := range s.Outputs {
			ok := true
			for _, eid := range w.p.outEdges[i][port] {
				e := w.p.edges[eid]
				if e.newRouter != nil {
					continue // the router copies
				}
				if _, consumer := w.nodes[e.to].(Consumer); e.channel || !consumer {
					ok = false
				}
			}
			w.envs[i].reusable[port] = ok
		}
	}
	return nil
}

func (w *worker) closeNodes() error {
	var errs []error
	for i := len(w.nodes) - 1; i >= 0; i-- {
		if w.nodes[i] != nil {
			if err := w.nodes[i].Close(); err != nil {
				errs = append(errs, &StepError{Step: w.p.steps[i].ID, Worker: w.index, Err: err})
			}
			w.nodes[i] = nil
		}
	}
	return errors.Join(errs...)
}

// main runs the loop, turns a panic into an error naming the step, and closes the nodes.
func (w *worker) main() (err error) {
	defer func() {
		if p := recover(); p != nil {
			w.r.cfg.Logger.Error("panic in step", "step", w.p.steps[w.cur].ID, "worker", w.index,
				"panic", fmt.Sprint(p), "stack", string(debug.Stack()))
			err = &StepError{Step: w.p.steps[w.cur].ID, Worker: w.index, Err: fmt.Errorf("panic: %v", p)}
		}
		if errors.Is(context.Cause(w.ctx), ErrCrashed) {
			return // a simulated crash: nothing is closed
		}
		if cerr := w.closeNodes(); cerr != nil {
			err = errors.Join(err, cerr)
		}
	}()
	return w.loop()
}
