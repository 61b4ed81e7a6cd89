package engine

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/epochflow/epochflow/recovery"
)

// Env is what a node gets from the worker that runs it.
type Env struct {
	Ctx     context.Context
	StepID  string
	Worker  int // global worker index
	Workers int // total workers in the cluster
	Logger  *slog.Logger
	// Recovery tells whether snapshots are kept; without it stateful nodes need not track
	// changed keys.
	Recovery bool
	// StartEpoch is the first epoch of the run: the committed epoch it resumes from, plus one.
	StartEpoch uint64

	w        *worker
	step     int
	reusable []bool
	origins  *originMap // computed by Origins
}

// origin is a source partition on a worker: the source step and the partition's number there.
type origin struct{ step, part int }

// noOrigin is the origin of a batch that no source is emitting just now.
var noOrigin = origin{step: -1}

// originMap numbers the source partitions that feed a step on a worker (see Env.Origins).
type originMap struct {
	known bool // every path into the step comes from sources through local steps that keep origins
	n     int
	base  map[int]int // source step -> number of its first partition
	of    []origin    // per number
}

// SetParts tells the worker, from a source node's New, how many partitions the node reads on
// this worker; EmitPart and PartEnded number them 0..n-1.
func (e *Env) SetParts(n int) {
	e.w.parts[e.step] = n
	e.w.partEnded[e.step] = make([]bool, n)
}

// EmitPart is Emit for a source node that read batch from its partition part: while the batch
// is handed on through local edges, Env.Origin of the steps it reaches tells that partition.
func (e *Env) EmitPart(port int, epoch uint64, batch any, part int) error {
	w := e.w
	prev := w.origin
	w.origin = origin{step: e.step, part: part}
	err := w.emit(e.step, port, epoch, batch)
	w.origin = prev
	return err
}

// PartEnded records, from a source node, that its partition part has ended (Env.OriginEnded).
func (e *Env) PartEnded(part int) {
	if ended := e.w.partEnded[e.step]; part >= 0 && part < len(ended) {
		ended[part] = true
	}
}

// Origins returns how many source partitions feed the step on this worker when every path into
// the step comes from sources through local edges and steps that keep origins
// (Step.KeepsOrigin), so that every batch the step gets comes whole from one of them; it
// returns 0 when some path crosses an exchange or a step that mixes batches (a combiner), and
// when no partition is read on this worker. The partitions are numbered by source step, then
// by their number in the source (SetParts). Nodes are built in the order of the steps, so a
// node may call it from New.
func (e *Env) Origins() int { return e.originMap().n }

// Origin returns the number (of Origins) of the source partition that the batch being handled
// now comes from, or -1 when that is not known: the step has no Origins, or the batch was not
// emitted while a source handed on what it read.
func (e *Env) Origin() int {
	o := e.w.origin
	if o.step < 0 {
		return -1
	}
	m := e.originMap()
	base, ok := m.base[o.step]
	if !ok || o.part < 0 || o.part >= e.w.parts[o.step] {
		return -1
	}
	return base + o.part
}

// Gate holds back the sources that feed a step on a worker: while Closed returns true, the
// worker reads none of them, and still reads its other sources, drains its inputs, runs its
// timers and closes its epochs. Closed is called on the worker's goroutine (before each read,
// and before it parks); it must be cheap. A gate reopens through what the worker does
// meanwhile: an item or mark the worker takes from an input wakes it, and it asks the gate
// again at its next turn.
type Gate interface {
	Closed() bool
}

// AddGate makes the sources that feed the step on this worker read only while g is open (see
// Gate). It fails when some path into the step crosses an exchange or a step that does not
// keep origins (see Origins): the step's items then come from other workers' sources too,
// which this worker cannot hold back. It fails too when one of those sources already has a
// gate: two gates over one source could each hold back what the other waits for.
func (e *Env) AddGate(g Gate) error {
	m := e.originMap()
	if !m.known {
		return errors.New("its input does not come from its sources through local steps only (an exchange, such as a keyed step or a redistribution, or a combiner is on the way)")
	}
	for s := range m.base {
		if e.w.gate[s] != nil {
			return fmt.Errorf("its source %q already feeds another step that holds it back", e.w.p.steps[s].ID)
		}
	}
	for s := range m.base {
		e.w.gate[s] = g
	}
	return nil
}

// OriginHeld returns how long, in all, up to now, the source partition numbered i (of Origins)
// has been held back by a gate (Env.AddGate): a step that tells idle inputs by the time since
// their last item (Clock.IdleTimeout) leaves that time out, as a partition held back reads
// nothing through no fault of its own. A hold counts while the gate was last seen closed.
// It is 0 for a partition whose source has no gate, and for an unknown one.
func (e *Env) OriginHeld(i int, now time.Time) time.Duration {
	m := e.originMap()
	if i < 0 || i >= m.n {
		return 0
	}
	w, s := e.w, m.of[i].step
	if w.gate[s] == nil {
		return 0
	}
	d := w.heldTotal[s]
	if w.heldLast[s] {
		d += now.Sub(w.heldSince[s])
	}
	return d
}

// Flush sends at once what the exchanges out of the step's output port hold for every
// receiver, instead of when a buffer fills or the worker has nothing else to do: for what is
// small but urgent, such as a watermark others wait for.
func (e *Env) Flush(port int) {
	w := e.w
	for _, eid := range w.p.outEdges[e.step][port] {
		if w.p.edges[eid].newRouter != nil {
			w.flushEdge(eid)
		}
	}
}

// Local returns the value that key names on this worker for this run, made by mk at the
// first call with that key: so that the nodes of several steps on one worker can share it.
// Nodes are built one after another on a worker, so mk needs no lock; the value is used on
// the worker's goroutine only.
func (e *Env) Local(key any, mk func() any) any {
	if v, ok := e.w.locals[key]; ok {
		return v
	}
	if e.w.locals == nil {
		e.w.locals = map[any]any{}
	}
	v := mk()
	e.w.locals[key] = v
	return v
}

// OriginEnded tells whether the source partition numbered i (of Origins) has ended.
func (e *Env) OriginEnded(i int) bool {
	m := e.originMap()
	if i < 0 || i >= m.n {
		return false
	}
	o := m.of[i]
	return e.w.partEnded[o.step][o.part]
}

func (e *Env) originMap() *originMap {
	if e.origins != nil {
		return e.origins
	}
	e.origins = &originMap{}
	p := e.w.p
	seen := map[int]bool{}
	var sources []int
	ok := true
	var visit func(step int)
	visit = func(step int) {
		for _, eid := range p.inEdges[step] {
			if !ok {
				return
			}
			edge := p.edges[eid]
			if edge.channel {
				ok = false
				return
			}
			if seen[edge.from] {
				continue
			}
			seen[edge.from] = true
			switch s := p.steps[edge.from]; {
			case s.Source:
				sources = append(sources, edge.from)
			case s.KeepsOrigin:
				visit(edge.from)
			default:
				ok = false
			}
		}
	}
	visit(e.step)
	if !ok {
		return e.origins
	}
	slices.Sort(sources)
	m := &originMap{known: true, base: map[int]int{}}
	for _, s := range sources {
		m.base[s] = m.n
		for i := range e.w.parts[s] {
			m.of = append(m.of, origin{step: s, part: i})
		}
		m.n += e.w.parts[s]
	}
	e.origins = m
	return m
}

// Reusable tells whether a batch emitted on port is free again once Emit returns: every
// consumer either copies it (an exchange) or keeps nothing of it (a Consumer). A node may then
// reuse the batch's memory for its next output.
func (e *Env) Reusable(port int) bool { return e.reusable[port] }

// Save records a piece of the step's state at the end of epoch (called from OnClose): key is a
// state key or a partition key; deleted marks a key whose state was discarded.
func (e *Env) Save(epoch uint64, key string, state []byte, deleted bool) {
	if e.w.pack == nil {
		e.w.pack = e.w.r.coord.reuse()
	}
	e.w.pack.Add(e.StepID, key, epoch, state, deleted)
}

// Reserve makes room for n more calls of Save, so that a step that knows how many snapshots
// it takes at the end of an epoch has them appended without regrowing the worker's pack
// (which copies it twice on average). The room is estimated from the size of the snapshots
// the worker took before. A worker's first Save or Reserve after a report takes a pack the
// store's writer is done with, if there is one.
func (e *Env) Reserve(n int) {
	w := e.w
	if w.pack == nil {
		w.pack = w.r.coord.reuse()
	}
	// A hint, not a bound: at most reserveMax bytes, and 16 a snapshot before the first pack.
	w.pack.Grow(min(n*cmp.Or(w.snapSize, 16), reserveMax))
}

// reserveMax bounds the room Reserve makes at once: a pack grows beyond it by appending.
const reserveMax = 64 << 20

// Restored returns the state the step had at the committed epoch the run resumes from: every
// key of the step, on every worker (a node keeps the keys it owns).
func (e *Env) Restored() []Restored { return e.w.r.cfg.Restored[e.StepID] }

// Emit passes a batch of items of epoch to every consumer of output port. The batch is handed
// over: the caller must not modify it afterwards, and consumers must not modify it either.
func (e *Env) Emit(port int, epoch uint64, batch any) error {
	return e.w.emit(e.step, port, epoch, batch)
}

// Pack is where a worker saves its steps' snapshots at the end of an epoch. It is the
// recovery store's own type, so that the snapshots reach the store as the workers took them,
// without a copy.
type Pack = recovery.Pack

// Restored is one key's state loaded from the recovery store.
type Restored struct {
	Key   string
	State []byte
}

// Store is where committed epochs are recorded. Commit must be durable when it returns: it
// records every snapshot of every pack and marks epoch as committed, atomically. The packs
// are reused once it has returned.
type Store interface {
	Commit(ctx context.Context, epoch uint64, frontiers []uint64, packs []*Pack) error
}

// Node is the per-worker instance of a step. The worker calls its methods from one goroutine.
type Node interface {
	// OnBatch handles a batch of items of epoch arriving on input port.
	OnBatch(port int, epoch uint64, batch any) error
	// OnEOF is called once, when every input of the step has ended. Items emitted in it belong
	// to epoch.
	OnEOF(epoch uint64) error
	// OnClose is called when epoch has ended on every input (and for a source, on this worker's
	// clock). It must not emit. It is where snapshots are taken.
	OnClose(epoch uint64) error
	// Close releases the node's resources. It is called once, last.
	Close() error
}

// SourceNode is the node of a step that reads from outside.
type SourceNode interface {
	Node
	// Poll reads what is available now and emits it with epoch. It reports whether it emitted
	// anything and whether every partition of this worker has ended.
	Poll(epoch uint64) (progress, eof bool, err error)
	// Awake tells when to poll again if nothing is available: a time (zero for none) and
	// channels that become ready when data arrives.
	Awake() (time.Time, []<-chan struct{})
}

// Consumer is implemented by nodes that never keep a batch (nor hand it on) after OnBatch
// returns, so that the engine may reuse its memory.
type Consumer interface {
	ConsumesBatches()
}

// EpochEnder is implemented by nodes that emit what they hold when an epoch ends (a combiner
// that merges items within an epoch): OnEpochEnd is called, before OnClose and before the
// epoch's barrier is sent on, at the end of every epoch and before a graceful stop; what it
// emits belongs to epoch.
type EpochEnder interface {
	OnEpochEnd(epoch uint64) error
}

// Timed is implemented by nodes that ask to be woken at a time.
type Timed interface {
	// NextTime is the earliest time the node wants OnTime called; zero for none.
	NextTime() time.Time
	// OnTime is called once now has reached NextTime; items it emits belong to epoch.
	OnTime(now time.Time, epoch uint64) error
}

// Committer is implemented by nodes that hold source or sink partitions.
type Committer interface {
	// Commit is called on the node's worker when every epoch up to epoch is committed.
	Commit(ctx context.Context, epoch uint64) error
}
