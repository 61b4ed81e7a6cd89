package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
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
	// MaxSnapshotBytesInFlight, if positive, pauses the sources while the snapshots handed
	// to the store's writer and not yet durable hold more bytes (see snapshotBytes).
	MaxSnapshotBytesInFlight int64
	// OnInFlight, if set, is called (under the coordinator's lock: it must not call back
	// into the run) whenever the snapshots held for the store change: with how many epochs
	// they span beyond the committed one and their bytes. For tests of the bounds.
	OnInFlight func(epochs uint64, bytes int64)
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
	// StopWarning, if set, is logged at warn level when a stop begins (what the stop loses).
	StopWarning string
	// Meter, if set, counts what the run does (see Meter); it must have been made for this
	// graph and Workers.
	Meter *Meter
	// StepContext, if set, derives the context a step's node gets (Env.Ctx) from the run's.
	StepContext func(ctx context.Context, step string) context.Context
	// Transport, if set, runs this process as one of a cluster (see Transport): Workers is
	// then the number of workers of each process. Only process 0 has the Store; the others
	// run with Recovery (their snapshots go to process 0 with their frontiers), the
	// StartEpoch and the Restored state process 0 sent them.
	Transport Transport
}

// StepError is an error that happened in a step on a worker. Worker is -1 for an error found
// before any worker ran (setting the step up: listing its partitions), and the message then
// names no worker.
type StepError struct {
	Step   string
	Worker int
	Err    error
}

func (e *StepError) Error() string {
	if e.Worker < 0 {
		return fmt.Sprintf("step %q: %v", e.Step, e.Err)
	}
	return fmt.Sprintf("step %q (worker %d): %v", e.Step, e.Worker, e.Err)
}

func (e *StepError) Unwrap() error { return e.Err }

// Stats is what Run tells about a run, whether it failed or not.
type Stats struct {
	// Running tells whether every node was built and the workers started: an error of a run
	// that never ran is one of its configuration or of building its steps.
	Running bool
	// Read is the number of items the sources emitted; Written the number of items handed
	// to sinks (written, not necessarily committed).
	Read, Written uint64
	// Committed is the last committed epoch when the run ended (StartEpoch-1 when it
	// committed nothing).
	Committed uint64
	// Stopped tells whether the run ended because of a graceful stop (Config.Stop, here or on
	// another process of the cluster).
	Stopped bool
	// StopPeer is, when the stop came from another process of the cluster (it was stopped
	// first), that process's number plus one; 0 otherwise.
	StopPeer int
}

type run struct {
	start    time.Time // epochs close on ticks of EpochInterval from here, on every worker
	cfg      Config
	p        *plan
	coord    *coordinator
	stopping atomic.Bool
	stopPeer atomic.Int64 // the process whose stop this one followed, plus one (0: none)
	workers  []*worker    // this process's
	base     int          // the number of this process's first worker
	total    int          // the workers of the cluster
	fail     func(error)
}

// stop begins a graceful stop.
func (r *run) stop() {
	if r.stopping.Swap(true) {
		return
	}
	if r.cfg.StopWarning != "" {
		r.cfg.Logger.Warn(r.cfg.StopWarning)
	}
	for _, w := range r.workers {
		w.wakeUp()
	}
}

// Run runs the graph until every source has ended and the last epoch is committed, until ctx
// is done, or until a step fails. No goroutine it starts outlives it.
func Run(ctx context.Context, g *Graph, cfg Config) (Stats, error) {
	st := Stats{Committed: max(cfg.StartEpoch, 1) - 1}
	if cfg.Workers < 1 {
		return st, fmt.Errorf("workers must be at least 1, got %d", cfg.Workers)
	}
	if cfg.EpochInterval <= 0 {
		return st, fmt.Errorf("epoch interval must be positive, got %v", cfg.EpochInterval)
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
		return st, err
	}
	if m := cfg.Meter; m != nil && (m.Workers() != cfg.Workers || len(m.workers[0].in) != len(p.steps)) {
		return st, fmt.Errorf("engine: the meter counts %d workers and %d steps, the run has %d and %d",
			m.Workers(), len(m.workers[0].in), cfg.Workers, len(p.steps))
	}
	n := cfg.Workers
	r := &run{cfg: cfg, start: time.Now(), p: p, total: n}
	if t := cfg.Transport; t != nil {
		if cfg.Store != nil && t.Process() != 0 {
			return st, errors.New("engine: only process 0 of a cluster writes the recovery store")
		}
		r.base, r.total = t.Process()*n, t.Processes()*n
		for _, e := range p.edges {
			if e.newRouter == nil || e.balance {
				continue
			}
			step := p.steps[e.to].ID
			if e.codec == nil {
				return st, &StepError{Step: step, Worker: -1, Err: errors.New("its exchange has no codec: it cannot cross processes")}
			}
			if err := e.codec.Check(); err != nil {
				return st, &StepError{Step: step, Worker: -1, Err: fmt.Errorf("its items cannot cross processes: %w", err)}
			}
		}
	}
	total := r.total
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	r.fail = func(err error) { cancel(err) }

	r.coord = &coordinator{frontier: make([]uint64, total), done: make([]bool, total), onCommit: cfg.OnCommit,
		store: cfg.Store, crash: cfg.Crash, ctx: ctx, wakeWriter: make(chan struct{}, 1), meter: cfg.Meter,
		fail: r.fail, transport: cfg.Transport, leader: r.base == 0}
	r.coord.fl.budget, r.coord.fl.hook = cfg.MaxSnapshotBytesInFlight, cfg.OnInFlight
	r.coord.committed.Store(cfg.StartEpoch - 1)
	r.coord.requested = cfg.StartEpoch - 1
	for i := range r.coord.frontier {
		r.coord.frontier[i] = cfg.StartEpoch - 1
	}

	shared := make([]any, len(p.steps))
	for i, s := range p.steps {
		if s.Setup != nil {
			v, err := s.Setup(ctx, total)
			if err != nil {
				return st, &StepError{Step: s.ID, Worker: -1, Err: err}
			}
			shared[i] = v
		}
	}

	workers := make([]*worker, n)
	for i := range workers {
		workers[i] = newWorker(r, p, r.base+i, i, shared)
	}
	r.coord.workers = workers
	r.workers = workers
	r.wireMailboxes(workers)

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
		return st, errors.Join(errs...)
	}

	st.Running = true
	if cfg.Transport != nil {
		cfg.Transport.Attach(r.handler(workers))
	}
	if cfg.Meter != nil {
		cfg.Meter.begin(p, workers, cfg.StartEpoch-1)
		defer cfg.Meter.end()
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
				if cfg.Transport != nil {
					cfg.Transport.SendStop()
				}
				r.stop()
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
	for i, w := range workers {
		st.Read += w.read
		st.Written += w.written
		var pe *PanicError
		if errs[i] != nil && errors.As(errs[i], &pe) {
			cfg.Logger.Debug("stack of the panic", "worker", i, "error", errs[i].Error(), "stack", string(pe.Stack))
		}
	}
	st.Committed = r.coord.committed.Load()
	st.Stopped = r.stopping.Load()
	st.StopPeer = int(r.stopPeer.Load())
	if c == nil {
		return st, errors.Join(errs...)
	}
	// The first failure is the cause; the other workers' errors are its echo (the context was
	// cancelled), except failures of their own, such as a Close that failed.
	out := []error{c}
	for _, e := range errs {
		if e != nil && !errors.Is(e, context.Canceled) && !errors.Is(e, c) {
			out = append(out, e)
		}
	}
	return st, errors.Join(out...)
}

// nextTick is the first tick of the run's epoch clock after now. Every worker closes its epochs
// on the same ticks, so an epoch ends at about the same time everywhere and commits without
// waiting for a worker whose clock lags.
func (r *run) nextTick(now time.Time) time.Time {
	iv := r.cfg.EpochInterval
	k := now.Sub(r.start)/iv + 1
	return r.start.Add(k * iv)
}

// newWorker makes the worker numbered i in the cluster, the local-th of this process.
func newWorker(r *run, p *plan, i, local int, shared []any) *worker {
	n := r.total
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
		parts:       make([]int, len(p.steps)),
		partEnded:   make([][]bool, len(p.steps)),
		gate:        make([]Gate, len(p.steps)),
		heldLast:    make([]bool, len(p.steps)),
		heldSince:   make([]time.Time, len(p.steps)),
		heldTotal:   make([]time.Duration, len(p.steps)),
		origin:      noOrigin,
	}
	if r.cfg.Meter != nil {
		w.m = r.cfg.Meter.workers[local]
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

// wireMailboxes makes the channels of every exchange edge between this process's workers,
// and in a cluster the ends of those from and to the other processes' workers: an exchange
// routed by key connects every worker of the cluster to every other, a balancing one the
// workers of each process, a forward channel a worker to itself.
func (r *run) wireMailboxes(workers []*worker) {
	n := len(workers)
	local := func(g int) *worker {
		if g < r.base || g >= r.base+n {
			return nil
		}
		return workers[g-r.base]
	}
	for eid, e := range r.p.edges {
		if !e.channel {
			continue
		}
		for _, w := range workers {
			w.inbox[eid] = make([]*mailbox, r.total)
			w.outbox[eid] = make([]*mailbox, r.total)
		}
		for rg := range r.total {
			for sg := range r.total {
				recv, send := local(rg), local(sg)
				switch {
				case recv == nil && send == nil:
					continue
				case e.newRouter == nil && !e.balance && sg != rg:
					continue // forward channel: to self only
				case e.balance && (recv == nil || send == nil):
					continue // balancing: within the process
				case recv != nil && send != nil:
					mb := &mailbox{sender: send, recv: recv}
					recv.inbox[eid][sg] = mb
					send.outbox[eid][rg] = mb
					send.outAll = append(send.outAll, mb)
				case send != nil:
					mb := &mailbox{out: &remoteOut{r: r, peer: rg / n, edge: eid, from: sg, to: rg, codec: e.codec,
						router: send.routers[eid]}}
					send.outbox[eid][rg] = mb
					send.outAll = append(send.outAll, mb)
				default:
					recv.inbox[eid][sg] = &mailbox{recv: recv,
						in: &remoteIn{t: r.cfg.Transport, peer: sg / n, edge: eid, from: sg, to: rg}}
				}
			}
		}
	}
}

func (w *worker) build(shared []any) error {
	for i, s := range w.p.steps {
		ctx := w.ctx
		if w.r.cfg.StepContext != nil {
			ctx = w.r.cfg.StepContext(ctx, s.ID)
		}
		env := &Env{Ctx: ctx, StepID: s.ID, Worker: w.index, Workers: w.total,
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
			err = &StepError{Step: w.p.steps[w.cur].ID, Worker: w.index, Err: NewPanicError(p)}
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
