package dataflow

import (
	"fmt"
	"math"
	"time"

	"github.com/epochflow/epochflow/dataflow/internal/engine"
)

// Clock says how an event-time step (StatefulTime, and the windows package on top of it) tells
// the time of its items and how far its watermark has come. The watermark w is a promise: no
// item with a time before w is expected any more (one that comes anyway is late).
//
// With a Timestamp, the clock is an event-time clock. The watermark is tracked per source
// partition and combined by minimum, as in Flink (per split) and Timely:
//
//   - On every upstream worker of the step, each source partition the worker reads has its own
//     watermark, the largest event time seen from it minus Wait; the worker's watermark is the
//     minimum over its partitions that have not ended and are not idle (a partition that has
//     read nothing yet holds it at the beginning of time), and never goes back. The worker
//     sends it through the step's keyed exchange to every worker of the step, in order with
//     its items. This holds when the step's input comes from its sources through stateless
//     steps on the same worker (Transform, TransformInto, Split, Merge, and the operators built
//     on them), so that each batch comes from one partition. When an exchange (a keyed
//     stateful step, Redistribute) or a Combine is on the way, the partition of an item is
//     not known there, and the upstream worker counts as one partition.
//   - A worker of the step takes the minimum over the upstream workers (as Flink's input
//     channels and Timely's frontier do), so one partition that lags holds the watermark back
//     for all. An upstream worker whose input has ended counts as the end of time.
//   - With IdleTimeout, a partition that has read no item for that long is idle and left out
//     of its worker's minimum until its next item; a worker all of whose partitions are idle
//     is left out of the step's minimum. A partition that ends stops holding its worker's
//     watermark back from the worker's next batch or idle check (its whole input ending sends
//     the end of time at once).
//
// Without a Timestamp (SystemClock), every item is stamped with the time the step sees it, and
// the watermark is the current time: nothing is ever late.
type Clock[V any] struct {
	// Timestamp returns an item's event time. nil makes a system-time clock. Times before
	// 1678 or after 2262 (what int64 nanoseconds hold) are clamped.
	Timestamp func(V) time.Time
	// Wait is the bounded out-of-orderness: an item may come up to Wait after an item with a
	// later time (of the same source partition) and still be on time.
	Wait time.Duration
	// IdleTimeout, when positive, lets a source partition that has read no item for that long
	// (wall-clock time) stop holding the watermark back, until its next item. Zero means a
	// partition holds the watermark back until it ends.
	IdleTimeout time.Duration
	// MaxDrift, when positive, turns on watermark alignment (Flink's maxAllowedWatermarkDrift):
	// a worker whose own watermark is more than MaxDrift ahead of the slowest other upstream
	// worker of the step in the cluster (as last heard from it; one that is idle, has ended
	// or has sent nothing yet does not count) stops reading the sources that feed the step
	// until that worker catches up. It goes on handling what reaches it meanwhile. A held
	// partition's idle timeout (IdleTimeout, in any step it feeds straight) counts only the
	// time it was not held back, so it is not taken for idle for want of a chance to read;
	// a silent partition of a worker held back most of the time goes idle that much later.
	// Workers that read their partitions at different speeds then stay within MaxDrift of
	// each other in event time, so a key has fewer windows open at once and the step holds
	// less state, at the cost of the faster workers' idle time. A partition that stops
	// sending without ending holds every worker back, unless IdleTimeout is set. The step
	// must be fed straight from its sources (through steps such as Transform, KeyOn, Filter
	// or Merge, with no exchange or combiner on the way), and a source may feed one aligned
	// step only: Run fails otherwise, naming the step. Zero (the default) lets every worker
	// read as fast as it can.
	MaxDrift time.Duration
}

// EventClock returns an event-time clock: ts gives each item's time, and an item may be up to
// wait behind the latest time seen before it without being late.
func EventClock[V any](ts func(V) time.Time, wait time.Duration) Clock[V] {
	return Clock[V]{Timestamp: ts, Wait: wait}
}

// WithMaxDrift returns the clock with MaxDrift set to d: watermark alignment.
func (c Clock[V]) WithMaxDrift(d time.Duration) Clock[V] {
	c.MaxDrift = d
	return c
}

// SystemClock returns a clock that stamps every item with the time the step sees it.
func SystemClock[V any]() Clock[V] { return Clock[V]{} }

// WithIdleTimeout returns the clock with IdleTimeout set to d.
func (c Clock[V]) WithIdleTimeout(d time.Duration) Clock[V] {
	c.IdleTimeout = d
	return c
}

// EndOfTime is the watermark after every input has ended: every window has closed.
var EndOfTime = time.Unix(0, math.MaxInt64).UTC()

// BeginningOfTime is the watermark before any item has been seen.
var BeginningOfTime = time.Unix(0, math.MinInt64).UTC()

const (
	minTime = math.MinInt64
	maxTime = math.MaxInt64
)

// nanos turns t into int64 nanoseconds since 1970, clamped to what int64 holds.
func nanos(t time.Time) int64 {
	if t.Before(BeginningOfTime) {
		return minTime
	}
	if t.After(EndOfTime) {
		return maxTime
	}
	return t.UnixNano()
}

// fromNanos is the inverse of nanos, in UTC.
func fromNanos(n int64) time.Time { return time.Unix(0, n).UTC() }

// subSat is a-b, saturating at the ends of int64.
func subSat(a, b int64) int64 {
	if b > 0 && a < minTime+b {
		return minTime
	}
	if b < 0 && a > maxTime+b {
		return maxTime
	}
	return a - b
}

type envKind uint8

const (
	envItem envKind = iota // an item, with the sender's watermark before it
	envMark                // the sender's watermark advanced (maxTime: its input ended)
	envIdle                // the sender is idle
)

// stamped is what crosses the exchange of an event-time step: an item with its time, or a
// watermark mark of one upstream worker.
type stamped[V any] struct {
	kv   KV[V]
	ts   int64
	wm   int64
	from int32
	kind envKind
}

// stampRouter routes items by key and copies marks to every worker, keeping the order of each
// sender's messages per destination, so a mark never overtakes the items before it.
type stampRouter[V any] struct {
	bufs  [][]stamped[V]
	total uint64
	pool  *batchPool[stamped[V]]
}

func (r *stampRouter[V]) add(d uint64, s stamped[V]) {
	if r.bufs[d] == nil {
		r.bufs[d] = r.pool.get()
	}
	r.bufs[d] = append(r.bufs[d], s)
}

func (r *stampRouter[V]) Route(batch any) error {
	if r.total == 1 {
		// One worker takes everything, in order: no key to hash.
		if r.bufs[0] == nil {
			r.bufs[0] = r.pool.get()
		}
		r.bufs[0] = append(r.bufs[0], batch.([]stamped[V])...)
		return nil
	}
	for _, s := range batch.([]stamped[V]) {
		if s.kind == envItem {
			r.add(KeyHash(s.kv.Key)%r.total, s)
			continue
		}
		for d := range r.total {
			r.add(d, s)
		}
	}
	return nil
}

func (r *stampRouter[V]) Pending(dest int) int { return len(r.bufs[dest]) }

func (r *stampRouter[V]) Take(dest int) any {
	b := r.bufs[dest]
	r.bufs[dest] = nil
	return b
}

func (r *stampRouter[V]) Recycle(batch any) { r.pool.put(batch) }

func byStampKey[V any]() func(self, total int, shared any) engine.Router {
	pool := newBatchPool[stamped[V]](exchangeBatch)
	return func(_, total int, _ any) engine.Router {
		return &stampRouter[V]{bufs: make([][]stamped[V], total), total: uint64(total), pool: pool}
	}
}

// clockStep adds the step that runs on every upstream worker of an event-time step: it stamps
// items with their time and the worker's watermark, and sends marks when the watermark moves,
// when the worker goes idle, and at the end of its input.
func clockStep[V any](step string, in Stream[KV[V]], clock Clock[V]) Stream[stamped[V]] {
	s := in.flow.add(clockName(step), &engine.Step{Kind: "clock", Inputs: []engine.Edge{in.edge()}, Outputs: 1,
		New: func(env *engine.Env, _ any) (engine.Node, error) {
			n := newClockNode(env, clock)
			if clock.Timestamp != nil && clock.MaxDrift > 0 {
				n.align = alignerOf(env, step, int64(clock.MaxDrift))
				n.align.own = &n.sent
				if err := env.AddGate(n.align); err != nil {
					return nil, fmt.Errorf("watermark alignment (MaxDrift %v) needs a step fed straight from its sources, and holds them back for this step alone: %w", clock.MaxDrift, err)
				}
			}
			return n, nil
		}})
	if s == nil {
		return Stream[stamped[V]]{}
	}
	return Stream[stamped[V]]{flow: in.flow, step: s}
}

// partClock is what a clock step keeps of one source partition of its worker.
type partClock struct {
	max  int64     // largest event time seen
	seen time.Time // when the last item came (for the idle timeout)
	// held is how long the partition had been held back by alignment (Env.OriginHeld) when
	// its last item came: holds since then do not count towards its idle timeout.
	held time.Duration
	idle bool
	used bool // counts in the worker's watermark (see clockNode.parts)
}

// clockNode keeps one upstream worker's watermark: the minimum over the source partitions it
// reads (Env.Origins) of each partition's largest event time minus the wait, leaving out the
// partitions that have ended or are idle, and never going back. When the step is not fed
// straight from its sources (an exchange or a combiner is on the way), the origin of a batch
// is unknown and the worker counts as one partition.
//
// It keeps no snapshot: after a resume the step's workers start from the watermark they had
// committed, and this worker's watermark (from the times seen since) can only raise it.
type clockNode[V any] struct {
	env   *engine.Env
	clock Clock[V]
	buf   []stamped[V] // the last output batch, reused when the exchange copied it
	// parts has one entry per source partition of Env.Origins, which count from the start (a
	// partition that has sent nothing could send anything), then one for the batches of
	// unknown origin, which counts once it has had an item, or from the start when there
	// are no origins.
	parts []partClock
	sent  int64 // last watermark sent in a mark or stamped on an item
	// marked is the last watermark sent in a mark, to every worker. An item's stamp reaches
	// only the worker of its key, so a watermark that has only been stamped is still marked at
	// the end of the batch: else the other workers would take it in a later epoch, each
	// worker's snapshot would hold another watermark, and windows would close late.
	marked int64
	idle   bool // an idle mark was sent, and no item came since
	ended  bool
	align  *aligner // with Clock.MaxDrift
	// flushed is the mark last flushed for alignment (with align).
	flushed int64
}

func newClockNode[V any](env *engine.Env, clock Clock[V]) *clockNode[V] {
	n := &clockNode[V]{env: env, clock: clock, sent: minTime, marked: minTime, flushed: minTime}
	if clock.Timestamp == nil {
		return n
	}
	now := time.Now()
	n.parts = make([]partClock, env.Origins()+1)
	for i := range n.parts {
		n.parts[i] = partClock{max: minTime, seen: now, used: i < len(n.parts)-1 || len(n.parts) == 1}
	}
	return n
}

// partWm is a partition's own watermark.
func (n *clockNode[V]) partWm(p *partClock) int64 {
	if p.max == minTime {
		return minTime
	}
	return subSat(p.max, int64(n.clock.Wait))
}

// active tells whether partition i holds the worker's watermark back.
func (n *clockNode[V]) active(i int) bool {
	p := &n.parts[i]
	return p.used && !p.idle && (i == len(n.parts)-1 || !n.env.OriginEnded(i))
}

// othersWm is the minimum watermark of the active partitions other than skip, and whether
// there is one.
func (n *clockNode[V]) othersWm(skip int) (int64, bool) {
	m, ok := int64(maxTime), false
	for i := range n.parts {
		if i != skip && n.active(i) {
			m, ok = min(m, n.partWm(&n.parts[i])), true
		}
	}
	return m, ok
}

// wm is the worker's watermark: the minimum over its active partitions, never going back.
func (n *clockNode[V]) wm() int64 {
	m, ok := n.othersWm(-1)
	if !ok {
		return n.sent
	}
	return max(n.sent, m)
}

func (n *clockNode[V]) OnBatch(_ int, epoch uint64, batch any) (err error) {
	items := batch.([]KV[V])
	if len(items) == 0 {
		return nil
	}
	out := n.buf[:0]
	n.buf = nil
	if cap(out) < len(items)+1 {
		out = make([]stamped[V], 0, len(items)+1)
	}
	from := int32(n.env.Worker)
	i := 0
	defer func() {
		if p := recover(); p != nil {
			err = ItemErr(items[i], PanicErr(p))
		}
	}()
	if n.clock.Timestamp == nil {
		for ; i < len(items); i++ {
			out = append(out, stamped[V]{kv: items[i], from: from})
		}
	} else {
		// Every item of a batch comes from one partition (or all from unknown ones).
		o := len(n.parts) - 1
		if x := n.env.Origin(); x >= 0 && x < o {
			o = x
		}
		p := &n.parts[o]
		p.used, p.idle, n.idle = true, false, false
		if n.clock.IdleTimeout > 0 {
			p.seen = time.Now()
			p.held = n.env.OriginHeld(o, p.seen)
		}
		others, bounded := n.othersWm(o)
		for ; i < len(items); i++ {
			ts := nanos(n.clock.Timestamp(items[i].Value))
			// The worker's watermark before the item.
			wm := n.partWm(p)
			if bounded {
				wm = min(wm, others)
			}
			wm = max(wm, n.sent)
			out = append(out, stamped[V]{kv: items[i], ts: ts, wm: wm, from: from})
			n.sent = wm
			p.max = max(p.max, ts)
		}
		if wm := n.wm(); wm > n.marked {
			out = append(out, stamped[V]{kind: envMark, wm: wm, from: from})
			n.sent, n.marked = wm, wm
		}
	}
	if err := n.env.Emit(0, epoch, out); err != nil {
		return err
	}
	n.flushMarks(false)
	if n.env.Reusable(0) {
		clear(out)
		n.buf = out
	}
	return nil
}

// flushMarks sends the marks at once, with alignment (Clock.MaxDrift): faster workers wait for
// this one's watermark, which then goes out each time it has moved a quarter of the drift (or
// always, with now), not once the exchange's buffers fill, which on a sparse stream may take
// many batches.
func (n *clockNode[V]) flushMarks(now bool) {
	if n.align == nil || n.marked == maxTime {
		return
	}
	if now || subSat(n.marked, n.flushed) >= n.align.drift/4 {
		n.env.Flush(0)
		n.flushed = n.marked
	}
}

// NextTime is when the next of this worker's partitions becomes idle, if it has an idle timeout.
func (n *clockNode[V]) NextTime() time.Time {
	if n.clock.IdleTimeout <= 0 || n.clock.Timestamp == nil || n.ended {
		return time.Time{}
	}
	var at time.Time
	now := time.Now()
	for i := range n.parts {
		if n.active(i) {
			if t := n.idleAt(i, now); at.IsZero() || t.Before(at) {
				at = t
			}
		}
	}
	return at
}

// idleAt is when partition i becomes idle, as of now: its idle timeout after its last item,
// plus the time it has been held back by alignment since (Env.OriginHeld), during which it
// could not read. While it is held back that time grows with now, so the moment moves on.
func (n *clockNode[V]) idleAt(i int, now time.Time) time.Time {
	p := &n.parts[i]
	return p.seen.Add(n.clock.IdleTimeout + n.env.OriginHeld(i, now) - p.held)
}

// OnTime marks the partitions idle that have read nothing for the idle timeout. When none is
// left active it marks the worker idle; else the watermark of the others may have moved.
func (n *clockNode[V]) OnTime(now time.Time, epoch uint64) error {
	// A partition held back by watermark alignment (of this step or another one that reads
	// the same source) reads nothing through no fault of its own: its idle timeout leaves
	// that time out (idleAt).
	for i := range n.parts {
		if n.active(i) && !now.Before(n.idleAt(i, now)) {
			n.parts[i].idle = true
		}
	}
	from := int32(n.env.Worker)
	if _, ok := n.othersWm(-1); !ok {
		if n.idle {
			return nil
		}
		n.idle = true
		if err := n.env.Emit(0, epoch, []stamped[V]{{kind: envIdle, from: from}}); err != nil {
			return err
		}
		n.flushMarks(true)
		return nil
	}
	if wm := n.wm(); wm > n.marked {
		n.sent, n.marked = wm, wm
		if err := n.env.Emit(0, epoch, []stamped[V]{{kind: envMark, wm: wm, from: from}}); err != nil {
			return err
		}
		n.flushMarks(false)
	}
	return nil
}

// OnEOF sends the end of time: this worker holds no window open any more.
func (n *clockNode[V]) OnEOF(epoch uint64) error {
	n.ended = true
	n.sent, n.marked = maxTime, maxTime
	return n.env.Emit(0, epoch, []stamped[V]{{kind: envMark, wm: maxTime, from: int32(n.env.Worker)}})
}

func (n *clockNode[V]) OnClose(uint64) error { return nil }
func (n *clockNode[V]) Close() error         { return nil }

// clockName is the name of the clock step of an event-time step called name.
func clockName(name string) string { return fmt.Sprintf("%s.clock", name) }
