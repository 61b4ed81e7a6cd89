package engine

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"time"
)

// worker runs every step of the plan over its share of the data, on one goroutine.
type worker struct {
	r     *run
	p     *plan
	index int
	total int
	ctx   context.Context

	nodes   []Node
	envs    []*Env
	timed   []int // steps whose node is Timed
	sources []int // source steps
	commit  []int // steps whose node is a Committer

	ended    []bool // step has ended (OnEOF called, unless stopped)
	endedIn  []int  // number of ended inputs per step
	stopped  []bool // some input of the step stopped early
	stopSeen bool

	routers     []Router     // per edge, for exchange edges
	routerEpoch []uint64     // per edge, the epoch of what the router holds
	inbox       [][]*mailbox // per edge: from each sender (nil where none)
	outbox      [][]*mailbox // per edge: to each receiver (nil where none)
	edgeEnded   []bool       // per channel edge, on the receiving side
	outAll      []*mailbox

	epoch     []uint64 // per depth: the open epoch
	groupDone []bool
	closeAt   time.Time
	committed uint64
	lastSent  uint64 // last frontier reported
	cur       int    // the step being called, for panic reports
	pack      *Pack  // the snapshots taken since the last report; nil when none
	snapSize  int    // about how many bytes a snapshot takes in a pack (see Env.Reserve)
	turn      int    // rotates the ties of balancing edges

	wake  chan struct{}
	timer *time.Timer

	parts     []int    // per source step: the partitions its node reads here (Env.SetParts)
	partEnded [][]bool // per source step and partition: ended (Env.PartEnded)
	origin    origin   // the source partition whose batch is being handed on (Env.EmitPart)

	gate []Gate // per source step: what holds it back while closed (Env.AddGate), or nil
	// Per source step with a gate (Env.AddGate): whether the gate was closed when last looked
	// at, since when, and how long it had held the source back before that (Env.OriginHeld).
	heldLast  []bool
	heldSince []time.Time
	heldTotal []time.Duration
	locals    map[any]any // values shared by the nodes of this worker (Env.Local)

	read, written uint64 // items emitted by sources, and handed to sinks

	m *workerMeter // nil without a Meter
}

// batchLen is the number of items of a batch (a slice).
func batchLen(batch any) uint64 {
	if v := reflect.ValueOf(batch); v.Kind() == reflect.Slice {
		return uint64(v.Len())
	}
	return 0
}

func (w *worker) wakeUp() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

func (w *worker) wrap(step int, err error) error {
	if err == nil {
		return nil
	}
	var se *StepError
	if errors.As(err, &se) {
		return err
	}
	return &StepError{Step: w.p.steps[step].ID, Worker: w.index, Err: err}
}

// emit hands a batch from an output port to its consumers.
func (w *worker) emit(step, port int, epoch uint64, batch any) error {
	if w.p.steps[step].Source {
		w.read += batchLen(batch)
	}
	m := w.m
	var n uint64
	if m != nil {
		n = batchLen(batch)
		m.out[step].Add(n)
		if w.p.steps[step].Source {
			m.in[step].Add(n)
		}
	}
	for _, eid := range w.p.outEdges[step][port] {
		e := &w.p.edges[eid]
		switch {
		case !e.channel:
			sink := w.p.steps[e.to].Outputs == 0
			if sink {
				w.written += batchLen(batch)
			}
			if m != nil {
				m.in[e.to].Add(n)
				if sink {
					m.out[e.to].Add(n)
				}
			}
			prev := w.cur
			w.cur = e.to
			err := w.nodes[e.to].OnBatch(e.toPort, epoch, batch)
			w.cur = prev
			if err != nil {
				return w.wrap(e.to, err)
			}
		case e.balance:
			w.outbox[eid][w.leastLoaded(eid)].send(message{kind: msgData, epoch: epoch, batch: batch})
		case e.newRouter == nil: // forward channel
			w.outbox[eid][w.index].send(message{kind: msgData, epoch: epoch, batch: batch})
		default:
			r := w.routers[eid]
			if w.routerEpoch[eid] != epoch {
				w.flushEdge(eid)
				w.routerEpoch[eid] = epoch
			}
			if err := r.Route(batch); err != nil {
				return w.wrap(e.to, err)
			}
			for dest := range w.total {
				if r.Pending(dest) >= w.r.cfg.BatchSize {
					w.outbox[eid][dest].send(message{kind: msgData, epoch: epoch, batch: r.Take(dest)})
				}
			}
		}
	}
	return nil
}

// leastLoaded picks the receiver of a balancing edge with the fewest messages waiting, taking
// turns among equals.
func (w *worker) leastLoaded(eid int) int {
	boxes := w.outbox[eid]
	w.turn++
	best, bestN := -1, int32(0)
	for i := range boxes {
		d := (w.turn + i) % len(boxes)
		if boxes[d] == nil {
			continue // a worker of another process
		}
		if n := boxes[d].n.Load(); best < 0 || n < bestN {
			best, bestN = d, n
		}
	}
	return best
}

// flushEdge sends what the router of an exchange edge holds.
func (w *worker) flushEdge(eid int) bool {
	r := w.routers[eid]
	if r == nil {
		return false
	}
	sent := false
	for dest := range w.total {
		if r.Pending(dest) > 0 {
			w.outbox[eid][dest].send(message{kind: msgData, epoch: w.routerEpoch[eid], batch: r.Take(dest)})
			sent = true
		}
	}
	return sent
}

func (w *worker) flushAll() bool {
	sent := false
	for eid := range w.routers {
		if w.flushEdge(eid) {
			sent = true
		}
	}
	return sent
}

// sendMarker flushes and then sends a barrier or the end of stream on every channel that
// consumes step.
func (w *worker) sendMarker(step int, kind msgKind, epoch uint64) {
	for _, edges := range w.p.outEdges[step] {
		for _, eid := range edges {
			if !w.p.edges[eid].channel {
				continue
			}
			w.flushEdge(eid)
			for _, mb := range w.outbox[eid] {
				if mb != nil {
					mb.send(message{kind: kind, epoch: epoch})
				}
			}
		}
	}
}

// endStep ends a step whose inputs have all ended and passes the end on. OnEOF is called only
// for a real end of input; a step that ends because of a graceful stop keeps its state as it is
// (it is snapshotted, and a resumed run carries on with it).
func (w *worker) endStep(step int, stopped bool) error {
	if w.ended[step] {
		return nil
	}
	d := w.p.steps[step].depth
	w.cur = step
	if !stopped {
		if err := w.nodes[step].OnEOF(w.epoch[d]); err != nil {
			return w.wrap(step, err)
		}
	} else if ee, ok := w.nodes[step].(EpochEnder); ok {
		if err := ee.OnEpochEnd(w.epoch[d]); err != nil {
			return w.wrap(step, err)
		}
	}
	w.ended[step] = true
	kind := msgEOF
	if stopped {
		kind = msgStop
	}
	w.sendMarker(step, kind, 0)
	for _, edges := range w.p.outEdges[step] {
		for _, eid := range edges {
			if !w.p.edges[eid].channel {
				if err := w.inputEnded(w.p.edges[eid].to, stopped); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

func (w *worker) inputEnded(step int, stopped bool) error {
	w.endedIn[step]++
	if stopped {
		w.stopped[step] = true
	}
	if w.endedIn[step] == len(w.p.steps[step].Inputs) {
		return w.endStep(step, w.stopped[step])
	}
	return nil
}

// stopSources ends every source of this worker without OnEOF, for a graceful stop: the open
// epoch is closed and committed, and the run then returns.
func (w *worker) stopSources() error {
	for _, s := range w.sources {
		if err := w.endStep(s, true); err != nil {
			return err
		}
	}
	if !w.groupDone[0] && w.groupEnded(0) {
		return w.finishGroup(0)
	}
	return nil
}

// closeGroup ends epoch e for every step of depth d: snapshots, then barriers downstream.
func (w *worker) closeGroup(d int, e uint64) error {
	for _, s := range w.p.groups[d] {
		w.cur = s
		if ee, ok := w.nodes[s].(EpochEnder); ok && !w.ended[s] {
			if err := ee.OnEpochEnd(e); err != nil {
				return w.wrap(s, err)
			}
		}
		if err := w.nodes[s].OnClose(e); err != nil {
			return w.wrap(s, err)
		}
		if !w.ended[s] {
			w.sendMarker(s, msgBarrier, e)
		}
	}
	return nil
}

func (w *worker) groupEnded(d int) bool {
	for _, s := range w.p.groups[d] {
		if !w.ended[s] {
			return false
		}
	}
	return true
}

// finishGroup takes the last snapshot of a group whose steps have all ended.
func (w *worker) finishGroup(d int) error {
	if err := w.closeGroup(d, w.epoch[d]); err != nil {
		return err
	}
	if d == 0 {
		w.epochEnded(w.epoch[0], time.Now())
	}
	w.groupDone[d] = true
	w.report()
	return nil
}

// drain takes the messages of depth d's channels that belong to its open epoch, and closes
// epochs as they align.
func (w *worker) drain(d int) (bool, error) {
	progress := false
	for !w.groupDone[d] {
		moved := false
		e := w.epoch[d]
		for _, eid := range w.p.channels[d] {
			edge := &w.p.edges[eid]
			for _, mb := range w.inbox[eid] {
				if mb == nil {
					continue
				}
				for range 64 {
					msg, ok := mb.peek()
					if !ok {
						break
					}
					if msg.kind == msgData && msg.epoch > e {
						mb.reached = max(mb.reached, msg.epoch-1)
						break
					}
					mb.pop()
					moved = true
					switch msg.kind {
					case msgData:
						if msg.epoch < e {
							return progress, fmt.Errorf("engine: step %q got a batch of closed epoch %d in epoch %d", w.p.steps[edge.to].ID, msg.epoch, e)
						}
						w.cur = edge.to
						node := w.nodes[edge.to]
						if mb.in != nil {
							b, err := edge.codec.DecodeBatch(msg.batch.(encoded))
							if err != nil {
								return progress, w.wrap(edge.to, fmt.Errorf("decoding a batch from worker %d of process %d: %w",
									mb.in.from, mb.in.peer, err))
							}
							msg.batch = b
						}
						if w.p.steps[edge.to].Outputs == 0 {
							w.written += batchLen(msg.batch)
						}
						if m := w.m; m != nil {
							n := batchLen(msg.batch)
							m.in[edge.to].Add(n)
							if w.p.steps[edge.to].Outputs == 0 {
								m.out[edge.to].Add(n)
							}
						}
						if err := node.OnBatch(edge.toPort, e, msg.batch); err != nil {
							return progress, w.wrap(edge.to, err)
						}
						if _, ok := node.(Consumer); ok && edge.newRouter != nil {
							if mb.sender != nil {
								mb.sender.routers[eid].Recycle(msg.batch)
							} else {
								w.routers[eid].Recycle(msg.batch)
							}
						}
					case msgBarrier:
						mb.reached = max(mb.reached, msg.epoch)
					case msgEOF, msgStop:
						mb.reached, mb.eof, mb.stopped = eofEpoch, true, msg.kind == msgStop
						if ended, stopped := w.allEnded(eid); ended {
							w.edgeEnded[eid] = true
							if err := w.inputEnded(edge.to, stopped); err != nil {
								return progress, err
							}
						}
					}
				}
			}
		}
		if w.groupEnded(d) {
			return true, w.finishGroup(d)
		}
		aligned := true
		for _, eid := range w.p.channels[d] {
			for _, mb := range w.inbox[eid] {
				if mb != nil && mb.reached < e {
					aligned = false
				}
			}
		}
		if aligned {
			if err := w.closeGroup(d, e); err != nil {
				return progress, err
			}
			w.epoch[d] = e + 1
			w.report()
			moved = true
		}
		if !moved {
			break
		}
		progress = true
	}
	return progress, nil
}

// allEnded tells whether every sender of a channel edge has ended, and whether any of them
// stopped.
func (w *worker) allEnded(eid int) (ended, stopped bool) {
	for _, mb := range w.inbox[eid] {
		if mb == nil {
			continue
		}
		if !mb.eof {
			return false, false
		}
		stopped = stopped || mb.stopped
	}
	return true, stopped
}

// frontier is the last epoch every group of this worker has closed, and whether all are done.
func (w *worker) frontier() (uint64, bool) {
	f, done := uint64(eofEpoch), true
	final := uint64(0)
	for d := range w.epoch {
		if w.groupDone[d] {
			final = max(final, w.epoch[d])
			continue
		}
		done = false
		f = min(f, w.epoch[d]-1)
	}
	if done {
		return final, true
	}
	return f, false
}

func (w *worker) report() {
	f, done := w.frontier()
	full := w.pack != nil && w.pack.Len() > 0
	if done || f != w.lastSent || full {
		w.lastSent = f
		var pack *Pack
		if full { // an empty one (Reserve without Save) stays the worker's
			pack, w.pack = w.pack, nil
			w.snapSize = pack.Size()/pack.Len() + 1
			if w.r.coord.hit("after-snapshot") {
				return
			}
		}
		w.r.coord.report(w.index, f, done, pack)
	}
}

// inFlight is the number of this worker's epochs not committed: the closed ones and the open
// one. A worker may close its open epoch while inFlight <= MaxEpochsInFlight, and its sources
// read only while that holds too; so once MaxEpochsInFlight epochs are closed but not
// committed, reading stops until a commit, however slow the store or a lagging worker.
func (w *worker) inFlight() uint64 { return w.epoch[0] - w.committed }

// canRead tells whether the sources may read: not too many epochs in flight, not too many
// snapshot bytes waiting for the store (the commit that lowers them wakes the workers), no
// full mailbox. (A source whose gate is closed does not read either: see held.) Epochs still close while reading is paused, so every worker reaches the
// epochs the store waits for and the writer always has something to commit.
func (w *worker) canRead() bool {
	if w.inFlight() > uint64(w.r.cfg.MaxEpochsInFlight) || w.r.coord.fl.over.Load() {
		return false
	}
	for _, mb := range w.outAll {
		if mb.full() {
			return false
		}
	}
	return true
}

// held tells whether source step s is held back by its gate (Env.AddGate), and keeps the
// time it has been held back: a hold counts from the first look that found the gate closed to
// the first that found it open again.
func (w *worker) held(s int, now time.Time) bool {
	g := w.gate[s]
	if g == nil {
		return false
	}
	closed := g.Closed()
	switch {
	case closed && !w.heldLast[s]:
		w.heldSince[s] = now
	case !closed && w.heldLast[s]:
		w.heldTotal[s] += now.Sub(w.heldSince[s])
	}
	w.heldLast[s] = closed
	return closed
}

func (w *worker) pollSources(now time.Time) (bool, error) {
	if w.groupDone[0] || !w.canRead() {
		return false, nil
	}
	progress := false
	e := w.epoch[0]
	for _, s := range w.sources {
		if w.ended[s] || w.held(s, now) {
			continue
		}
		w.cur = s
		prog, eof, err := w.nodes[s].(SourceNode).Poll(e)
		if err != nil {
			return progress, w.wrap(s, err)
		}
		progress = progress || prog
		if eof {
			if err := w.endStep(s, false); err != nil {
				return progress, err
			}
			progress = true
		}
	}
	if w.groupEnded(0) {
		return true, w.finishGroup(0)
	}
	return progress, nil
}

func (w *worker) maybeCloseEpoch(now time.Time) (bool, error) {
	if w.groupDone[0] || now.Before(w.closeAt) || w.inFlight() > uint64(w.r.cfg.MaxEpochsInFlight) {
		return false, nil
	}
	e := w.epoch[0]
	if err := w.closeGroup(0, e); err != nil {
		return false, err
	}
	w.epochEnded(e, now)
	w.epoch[0] = e + 1
	if w.m != nil {
		w.m.open.Store(e + 1)
	}
	w.closeAt = w.r.nextTick(now)
	w.report()
	return true, nil
}

func (w *worker) runTimers(now time.Time) (bool, error) {
	progress := false
	for _, s := range w.timed {
		if w.ended[s] {
			continue
		}
		t := w.nodes[s].(Timed)
		if at := t.NextTime(); !at.IsZero() && !now.Before(at) {
			w.cur = s
			if err := t.OnTime(now, w.epoch[w.p.steps[s].depth]); err != nil {
				return progress, w.wrap(s, err)
			}
			progress = true
		}
	}
	return progress, nil
}

func (w *worker) commitUpTo(c uint64) error {
	if w.r.coord.hit("before-commit-calls") {
		return ErrCrashed
	}
	// Downstream first: a sink makes an epoch's output final before a source of the same
	// worker acknowledges its input.
	for i := len(w.commit) - 1; i >= 0; i-- {
		s := w.commit[i]
		w.cur = s
		if err := w.nodes[s].(Committer).Commit(w.ctx, c); err != nil {
			return w.wrap(s, err)
		}
		if w.r.coord.hit("inside-commit") {
			return ErrCrashed
		}
	}
	w.committed = c
	return nil
}

// epochEnded tells the meter that epoch ended at this worker's sources.
func (w *worker) epochEnded(epoch uint64, at time.Time) {
	if w.m != nil {
		w.r.cfg.Meter.epochEnded(epoch, at)
	}
}

func (w *worker) done() bool {
	for _, d := range w.groupDone {
		if !d {
			return false
		}
	}
	return true
}

// loop runs until every step has ended and the last epoch is committed, or ctx is done.
func (w *worker) loop() error {
	if w.r.cfg.StartEpoch > 1 {
		// A resumed run: commit the resume states once more before the first read, in case
		// the commit of that epoch was lost in the crash.
		if err := w.commitUpTo(w.r.cfg.StartEpoch - 1); err != nil {
			return err
		}
	}
	w.closeAt = w.r.nextTick(time.Now())
	w.report()
	for {
		if err := w.ctx.Err(); err != nil {
			return err
		}
		if c := w.r.coord.committed.Load(); c > w.committed {
			if err := w.commitUpTo(c); err != nil {
				return err
			}
		}
		if w.done() {
			w.flushAll()
			if w.r.coord.finished.Load() && w.committed >= w.r.coord.committed.Load() {
				return nil
			}
			w.park(time.Time{}, nil)
			continue
		}
		if !w.stopSeen && w.r.stopping.Load() {
			w.stopSeen = true
			if err := w.stopSources(); err != nil {
				return err
			}
		}
		progress := false
		for d := 1; d < len(w.epoch); d++ {
			p, err := w.drain(d)
			if err != nil {
				return err
			}
			progress = progress || p
		}
		now := time.Now()
		p, err := w.runTimers(now)
		if err != nil {
			return err
		}
		progress = progress || p
		if p, err = w.pollSources(now); err != nil {
			return err
		}
		progress = progress || p
		if p, err = w.maybeCloseEpoch(now); err != nil {
			return err
		}
		progress = progress || p
		if progress {
			continue
		}
		if w.flushAll() {
			continue
		}
		w.park(w.deadline())
	}
}

// deadline is the earliest time the worker has something to do without being woken, and the
// channels of sources that push.
func (w *worker) deadline() (time.Time, []<-chan struct{}) {
	var at time.Time
	earliest := func(t time.Time) {
		if !t.IsZero() && (at.IsZero() || t.Before(at)) {
			at = t
		}
	}
	var chans []<-chan struct{}
	if !w.groupDone[0] && w.inFlight() <= uint64(w.r.cfg.MaxEpochsInFlight) {
		earliest(w.closeAt)
	}
	if !w.groupDone[0] && w.canRead() {
		now := time.Now()
		for _, s := range w.sources {
			if w.ended[s] || w.held(s, now) {
				continue
			}
			t, cs := w.nodes[s].(SourceNode).Awake()
			earliest(t)
			chans = append(chans, cs...)
		}
	}
	for _, s := range w.timed {
		if !w.ended[s] {
			earliest(w.nodes[s].(Timed).NextTime())
		}
	}
	return at, chans
}

// park waits for a wake-up, a source's channel, the deadline or the end of the run.
func (w *worker) park(at time.Time, chans []<-chan struct{}) {
	var timerC <-chan time.Time
	if !at.IsZero() {
		d := time.Until(at)
		if d <= 0 {
			return
		}
		w.timer.Reset(d)
		timerC = w.timer.C
		defer w.timer.Stop()
	}
	// Plain selects for the usual cases (no reflection, no allocation); a nil channel is
	// never ready.
	switch len(chans) {
	case 0:
		select {
		case <-w.wake:
		case <-w.ctx.Done():
		case <-timerC:
		}
		return
	case 1:
		select {
		case <-w.wake:
		case <-w.ctx.Done():
		case <-timerC:
		case <-chans[0]:
		}
		return
	case 2:
		select {
		case <-w.wake:
		case <-w.ctx.Done():
		case <-timerC:
		case <-chans[0]:
		case <-chans[1]:
		}
		return
	}
	cases := make([]reflect.SelectCase, 0, len(chans)+3)
	cases = append(cases,
		reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(w.wake)},
		reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(w.ctx.Done())})
	if timerC != nil {
		cases = append(cases, reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(timerC)})
	}
	for _, c := range chans {
		cases = append(cases, reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(c)})
	}
	reflect.Select(cases)
}
