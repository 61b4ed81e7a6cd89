package dataflow

import (
	"cmp"
	"encoding/binary"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/epochflow/epochflow/dataflow/internal/engine"
)

// TimedLogic says what a keyed event-time step does with each key's state S. As in
// StatefulLogic, every function runs on the worker that owns the key, state points at the key's
// state (the zero S when exists is false), and keep=false discards it.
type TimedLogic[V, S, W any] struct {
	// OnItem handles one item of the key: at is its time (from the clock), wm the step's
	// watermark when it came (items before wm are late). Required.
	OnItem func(key string, state *S, exists bool, item V, at, wm time.Time, out *Emitter[W]) (keep bool, err error)
	// WakeAt returns the event time at which the key wants OnWatermark (the zero time for
	// never). It is asked after every call, and for every restored key. Optional.
	WakeAt func(key string, state *S) time.Time
	// OnWatermark is called once the watermark has reached the time WakeAt asked for; wm is
	// the watermark (EndOfTime once every input has ended). Optional.
	OnWatermark func(key string, state *S, wm time.Time, out *Emitter[W]) (keep bool, err error)
	// Codec stores the state, as StatefulLogic.Codec does. nil means DefaultCodec.
	Codec Codec[S]
}

// StatefulTime adds a keyed stateful step that keeps time with clock: items are stamped and
// exchanged by key with the watermark of every upstream worker, the minimum over the source
// partitions it reads (see Clock), and each key can
// ask to be called when the watermark reaches a time. It adds a clock step named name+".clock"
// on the upstream workers.
//
// State: one S per key, as Stateful; with recovery it is stored at the end of every epoch for
// the keys that changed, and so is the step's watermark, so a resumed run starts from the
// watermark it had committed (no item is treated as on time that was late before) and every
// key's pending wake-up is asked again of WakeAt. Epochs: output items carry the epoch of the
// item or mark that caused them. Watermarks: the step's watermark is the minimum over upstream
// workers that are not idle (each sending the minimum over its source partitions that are not
// idle nor ended), and never goes back. EOF: every upstream worker's end moves its
// watermark to EndOfTime, so OnWatermark is called for every key that asked for a wake-up;
// keys that still have state then keep it, and the output ends.
func StatefulTime[V, S, W any](name string, in Stream[KV[V]], clock Clock[V], logic TimedLogic[V, S, W]) Stream[KV[W]] {
	if !in.valid() {
		return Stream[KV[W]]{}
	}
	if logic.OnItem == nil {
		in.flow.fail(fmt.Errorf("step %q: TimedLogic.OnItem is nil", name))
		return Stream[KV[W]]{}
	}
	if clock.Wait < 0 || clock.IdleTimeout < 0 || clock.MaxDrift < 0 {
		in.flow.fail(fmt.Errorf("step %q: the clock's wait (%v), idle timeout (%v) and max drift (%v) must not be negative", name, clock.Wait, clock.IdleTimeout, clock.MaxDrift))
		return Stream[KV[W]]{}
	}
	stamps := clockStep(name, in, clock)
	if !stamps.valid() {
		return Stream[KV[W]]{}
	}
	e := stamps.edge()
	e.NewRouter = byStampKey[V]()
	e.Codec = stampBatchCodec[V]()
	system := clock.Timestamp == nil
	s := in.flow.add(name, &engine.Step{Kind: "stateful-time", Inputs: []engine.Edge{e}, Outputs: 1,
		New: func(env *engine.Env, _ any) (engine.Node, error) {
			n, err := newTimedNode(env, logic, system)
			if err == nil && !system && clock.MaxDrift > 0 {
				alignerOf(env, name, int64(clock.MaxDrift)).ref = func() (int64, int, bool) { return n.alignRef(env.Worker) }
			}
			return n, err
		}})
	if s == nil {
		return Stream[KV[W]]{}
	}
	return Stream[KV[W]]{flow: in.flow, step: s}
}

// Snapshot keys of a StatefulTime step: a key's state under "k"+key, a worker's watermark under
// "w"+worker.
const (
	timedKeyPrefix = "k"
	timedWmPrefix  = "w"
)

// timedEntry is a key's slot in a timed node's arena: what every item of the key touches
// first, then its state, then its key.
type timedEntry[S any] struct {
	wake int64 // the armed wake-up time, when armed
	// queued is the time of the key's earliest wake-up in the queue, when inQueue. A wake-up
	// that moves later (a session extended by each of its items) pushes nothing: the entry
	// already queued comes first, and advance queues it again at the key's wake then. Only an
	// earlier one is pushed, so the queue takes a push per item only while wake-ups move
	// earlier.
	queued    int64
	armed     bool
	inQueue   bool
	dirty     bool
	persisted bool
	live      bool // the key has state (else its slot is vacant; or free, out of the index)
	state     S
	key       string
}

// timedNode keeps its keys in an arena (a slice of entries, indexed from a map of the keys),
// so that the wake-up queue names a key by its slot: popping a wake-up needs no map lookup, and
// the queue holds no pointers.
//
// A key whose state is discarded keeps its slot, vacant, and its place in the index: a key
// whose windows close and open again (most of them) then costs no map delete and insert each
// time, which also keeps the index free of the tombstones that such churn leaves, and which
// lengthen every lookup. Vacant slots are freed (sweep) once they outnumber twice the most
// keys with state since the last sweep (plus 1024), so the arena holds at most about three
// times what the step needed at its peak, and a sweep's cost is spread over the vacates that
// led to it. A wake-up still queued for a vacant or freed slot is stale, as it
// is when the key's wake-up moved.
type timedNode[V, S, W any] struct {
	env    *engine.Env
	logic  TimedLogic[V, S, W]
	codec  Codec[S]
	system bool
	index  map[string]int32 // key -> slot
	slots  []timedEntry[S]
	free   []int32 // free slots
	vacant int     // indexed slots without state
	peak   int     // the most keys with state since the last sweep
	sweeps int     // how many sweeps were made
	found  []int32 // OnBatch's scratch: the slot of each item's key, or -1
	out    Emitter[W]
	timers wakeQueue
	// refreshFn is refresh, made once (a method value made at each call would be allocated).
	refreshFn func(wake) (int64, bool)
	due       []dueWake // fire's scratch
	track     bool
	dirty     []int32 // slots changed in the epoch (a slot may be listed again once reused)
	deleted   []string

	senders []int64 // per upstream worker: its watermark
	idle    []bool  // per upstream worker: idle
	wm      int64   // the step's watermark on this worker
	savedWm int64   // the watermark last stored
	ended   bool
	lateMet interface{ Add(float64) } // the Monitor's late-items counter, or nil
}

func newTimedNode[V, S, W any](env *engine.Env, logic TimedLogic[V, S, W], system bool) (*timedNode[V, S, W], error) {
	n := &timedNode[V, S, W]{env: env, logic: logic, codec: logic.Codec, system: system,
		index: map[string]int32{}, track: env.Recovery,
		senders: make([]int64, env.Workers), idle: make([]bool, env.Workers), wm: minTime, savedWm: minTime}
	for i := range n.senders {
		n.senders[i] = minTime
	}
	n.refreshFn = n.refresh
	if m, _ := env.Ctx.Value(metricsKey{}).(*Monitor); m != nil {
		n.lateMet = m.late
	}
	if n.codec == nil {
		n.codec = DefaultCodec[S]()
		if env.Recovery {
			if err := CheckCodec[S](); err != nil {
				return nil, fmt.Errorf("%w; or give the step a codec (TimedLogic.Codec)", err)
			}
		}
	} else if c, ok := n.codec.(interface{ Check() error }); ok && env.Recovery {
		if err := c.Check(); err != nil {
			return nil, err
		}
	}
	var restored []string
	for _, r := range env.Restored() {
		switch {
		case strings.HasPrefix(r.Key, timedWmPrefix):
			// Every worker of the step had the same watermark at the end of a committed
			// epoch (barriers are aligned, and marks go to all); the largest stored is the
			// newest.
			wm, k := binary.Varint(r.State)
			if k <= 0 {
				return nil, fmt.Errorf("restoring the watermark %q: bad encoding", r.Key)
			}
			n.wm = max(n.wm, wm)
		case strings.HasPrefix(r.Key, timedKeyPrefix):
			key := r.Key[len(timedKeyPrefix):]
			if WorkerForKey(key, env.Workers) != env.Worker {
				continue
			}
			st, err := n.codec.Decode(key, r.State)
			if err != nil {
				return nil, fmt.Errorf("restoring state: %w", err)
			}
			slot := n.alloc(key)
			e := &n.slots[slot]
			e.state, e.persisted = st, true
			n.enliven(e)
			restored = append(restored, key)
		}
	}
	n.savedWm = n.wm
	slices.Sort(restored)
	for _, key := range restored {
		n.arm(n.index[key])
	}
	return n, nil
}

// alloc takes a free slot for key (not in the index) and indexes it, vacant.
func (n *timedNode[V, S, W]) alloc(key string) int32 {
	var slot int32
	if k := len(n.free); k > 0 {
		slot = n.free[k-1]
		n.free = n.free[:k-1]
	} else {
		n.slots = append(n.slots, timedEntry[S]{})
		slot = int32(len(n.slots) - 1)
	}
	n.slots[slot] = timedEntry[S]{key: key}
	n.index[key] = slot
	n.vacant++
	return slot
}

// enliven marks a vacant slot as holding its key's state.
func (n *timedNode[V, S, W]) enliven(e *timedEntry[S]) {
	e.live = true
	n.vacant--
	n.peak = max(n.peak, len(n.index)-n.vacant)
}

// vacate discards the state of slot's key, keeping the slot for the key, and sweeps when the
// vacant slots are too many.
func (n *timedNode[V, S, W]) vacate(slot int32) {
	e := &n.slots[slot]
	*e = timedEntry[S]{key: e.key}
	n.vacant++
	if n.vacant > 2*n.peak+1024 {
		n.sweep()
	}
}

// sweep frees the vacant slots and drops their keys from the index.
func (n *timedNode[V, S, W]) sweep() {
	for key, slot := range n.index {
		if !n.slots[slot].live {
			delete(n.index, key)
			n.slots[slot] = timedEntry[S]{}
			n.free = append(n.free, slot)
		}
	}
	n.vacant = 0
	n.peak = len(n.index)
	n.sweeps++
}

func (n *timedNode[V, S, W]) OnBatch(_ int, epoch uint64, batch any) (err error) {
	items := batch.([]stamped[V])
	found, sweeps := n.lookUp(items), n.sweeps
	i := 0
	defer func() {
		if p := recover(); p != nil {
			err = ItemErr(items[i].kv, PanicErr(p))
		}
	}()
	for ; i < len(items); i++ {
		s := items[i]
		if n.system {
			if s.kind != envItem {
				continue
			}
			now := nanos(time.Now())
			if err := n.advance(now); err != nil {
				return err
			}
			s.ts = now
		} else {
			from := int(s.from)
			switch s.kind {
			case envItem, envMark:
				n.idle[from] = false
				n.senders[from] = max(n.senders[from], s.wm)
			case envIdle:
				n.idle[from] = true
			}
			if err := n.advance(n.combined()); err != nil {
				return err
			}
			if s.kind != envItem {
				continue
			}
		}
		kv := s.kv
		slot := found[i]
		if slot < 0 || n.sweeps != sweeps {
			// A key new in the batch (an item before may have added it), or a sweep may have
			// freed the slot found.
			var ok bool
			if slot, ok = n.index[kv.Key]; !ok {
				slot = n.alloc(kv.Key)
			}
		}
		e := &n.slots[slot]
		exists := e.live
		n.out.key = kv.Key
		keep, err := n.logic.OnItem(kv.Key, &e.state, exists, kv.Value, fromNanos(s.ts), fromNanos(n.wm), &n.out)
		if err != nil {
			if !exists {
				var zero S
				e.state = zero // a vacant slot holds the zero state
			}
			return ItemErr(kv, err)
		}
		n.settle(slot, exists, keep)
	}
	return n.flush(epoch)
}

// lookUp finds the slots of the keys of a batch's items (-1 for a key not indexed, or not an
// item). The lookups are independent of each other, so in a loop of their own the processor
// overlaps their cache misses, where a loop that handles each item in between could not: with
// many keys, most of the time of a lookup is spent waiting for the key and its map group.
// (Reading each slot found in the same loop, to overlap its miss too, gained nothing.)
func (n *timedNode[V, S, W]) lookUp(items []stamped[V]) []int32 {
	found := n.found[:0]
	for k := range items {
		slot := int32(-1)
		if items[k].kind == envItem {
			if s, ok := n.index[items[k].kv.Key]; ok {
				slot = s
			}
		}
		found = append(found, slot)
	}
	n.found = found
	return found
}

// combined is the minimum watermark of the upstream workers that are not idle (the current
// watermark when all are idle).
func (n *timedNode[V, S, W]) combined() int64 {
	m, active := int64(maxTime), false
	for i, wm := range n.senders {
		if !n.idle[i] {
			m, active = min(m, wm), true
		}
	}
	if !active {
		return n.wm
	}
	return m
}

// alignRef is the smallest watermark of the upstream workers other than self that are not
// idle and have sent one (ended ones sent the end of time), the number of that worker, and
// whether there is one: what watermark alignment holds worker self back for (see aligner).
// Self's own watermark is left out, as its marks to this node may still wait in its buffers.
func (n *timedNode[V, S, W]) alignRef(self int) (int64, int, bool) {
	m, at, ok := int64(maxTime), -1, false
	for i, wm := range n.senders {
		if i != self && !n.idle[i] && wm != minTime && wm < m {
			m, at, ok = wm, i, true
		}
	}
	return m, at, ok
}

// advance moves the watermark to wm if that is later, and calls OnWatermark for every key whose
// wake-up time it reached, in the order of their times (keys due at the same time in the order
// of the keys).
func (n *timedNode[V, S, W]) advance(wm int64) error {
	if wm <= n.wm {
		return nil
	}
	n.wm = wm
	if n.timers.len() == 0 || n.timers.min() > wm {
		return nil
	}
	return n.fire(wm)
}

// fire calls OnWatermark for the wake-ups due at wm.
func (n *timedNode[V, S, W]) fire(wm int64) (err error) {
	var cur string
	defer func() {
		if p := recover(); p != nil {
			err = userErr(fmt.Errorf("key %q: on watermark: %w", cur, PanicErr(p)))
		}
	}()
	// Only the wake-ups due now are called; one that a call re-arms at or before wm is called
	// at the next advance, so a logic that keeps asking for the past cannot hang the worker.
	due := n.due[:0]
	for {
		t, ok := n.timers.popDue(wm, n.refreshFn)
		if !ok {
			break
		}
		e := &n.slots[t.slot]
		if !e.live || !e.inQueue || e.queued != t.at {
			continue // stale: the key was dropped, or an earlier wake-up of it was queued since
		}
		e.inQueue = false
		if !e.armed {
			continue
		}
		if e.wake > t.at { // the wake-up moved later: queue it there (this loop takes it if due)
			e.queued, e.inQueue = e.wake, true
			n.timers.push(wake{at: e.wake, slot: t.slot})
			continue
		}
		due = append(due, dueWake{at: t.at, key: e.key, slot: t.slot})
	}
	// A slot is due at most once (its other queued wake-ups are stale). No slot is freed and
	// taken by another key while the due ones are called: only OnItem adds keys.
	if len(due) > 1 {
		slices.SortFunc(due, func(a, b dueWake) int {
			if a.at != b.at {
				return cmp.Compare(a.at, b.at)
			}
			return strings.Compare(a.key, b.key)
		})
	}
	n.due = due
	for _, t := range due {
		e := &n.slots[t.slot]
		if !e.live || !e.armed || e.wake != t.at {
			continue // stale
		}
		e.armed = false
		if n.logic.OnWatermark == nil {
			continue
		}
		cur = e.key
		n.out.key = e.key
		keep, err := n.logic.OnWatermark(e.key, &e.state, fromNanos(wm), &n.out)
		if err != nil {
			return userErr(fmt.Errorf("key %q: on watermark: %w", cur, err))
		}
		n.settle(t.slot, true, keep)
	}
	return nil
}

// refresh tells the wake-up queue when a wake-up it is about to bring near is due: later when
// the key's wake-up moved later (it is queued there now), or never when it is stale. It is
// what the loop of fire does with a wake-up popped.
func (n *timedNode[V, S, W]) refresh(t wake) (int64, bool) {
	e := &n.slots[t.slot]
	if !e.live || !e.inQueue || e.queued != t.at {
		return 0, false
	}
	if !e.armed {
		e.inQueue = false
		return 0, false
	}
	if e.wake > t.at {
		e.queued = e.wake
		return e.wake, true
	}
	return t.at, true
}

// dueWake is a wake-up that fire calls, with its key to sort by (in the slot, each comparison
// of the sort would miss the caches).
type dueWake struct {
	at   int64
	key  string
	slot int32
}

// settle records what a call did to the key in slot: a key whose state is discarded is left
// vacant (and a new one that is not kept stays so), a kept one is marked changed and armed
// again.
func (n *timedNode[V, S, W]) settle(slot int32, exists, keep bool) {
	e := &n.slots[slot]
	if !keep {
		if exists && n.track && e.persisted {
			n.deleted = append(n.deleted, e.key)
		}
		if exists {
			n.vacate(slot)
		} else {
			var zero S
			e.state = zero // what the call left in it
		}
		return
	}
	if !exists {
		n.enliven(e)
	}
	if n.track && !e.dirty {
		e.dirty = true
		n.dirty = append(n.dirty, slot)
	}
	n.arm(slot)
}

func (n *timedNode[V, S, W]) arm(slot int32) {
	if n.logic.WakeAt == nil {
		return
	}
	e := &n.slots[slot]
	at := n.logic.WakeAt(e.key, &e.state)
	if at.IsZero() {
		e.armed = false
		return
	}
	t := nanos(at)
	if e.armed && e.wake == t {
		return
	}
	e.armed, e.wake = true, t
	if !e.inQueue || t < e.queued {
		e.queued, e.inQueue = t, true
		n.timers.push(wake{at: t, slot: slot})
	}
}

func (n *timedNode[V, S, W]) flush(epoch uint64) error {
	if n.out.late > 0 {
		if n.lateMet != nil {
			n.lateMet.Add(float64(n.out.late))
		}
		n.out.late = 0
	}
	if len(n.out.out) == 0 {
		return nil
	}
	out := n.out.out
	n.out.out = nil
	err := n.env.Emit(0, epoch, out)
	if n.env.Reusable(0) {
		// Every consumer is done with the batch: its memory takes the next one.
		clear(out)
		n.out.out = out[:0]
	}
	return err
}

// NextTime is the earliest wake-up of a system-time step (an event-time step is woken by its
// marks instead).
func (n *timedNode[V, S, W]) NextTime() time.Time {
	if !n.system || n.timers.len() == 0 || n.ended {
		return time.Time{}
	}
	return fromNanos(n.timers.min())
}

// OnTime moves a system-time step's watermark to now.
func (n *timedNode[V, S, W]) OnTime(now time.Time, epoch uint64) error {
	if err := n.advance(nanos(now)); err != nil {
		return err
	}
	return n.flush(epoch)
}

// OnEOF moves the watermark to the end of time (every upstream worker has sent its end mark
// already with an event-time clock; a system-time step gets there here).
func (n *timedNode[V, S, W]) OnEOF(epoch uint64) error {
	if err := n.advance(maxTime); err != nil {
		return err
	}
	n.ended = true
	return n.flush(epoch)
}

// OnClose stores the changed keys' states, the tombstones and the watermark (with recovery).
func (n *timedNode[V, S, W]) OnClose(epoch uint64) error {
	if !n.track {
		return nil
	}
	for _, slot := range n.dirty {
		e := &n.slots[slot]
		if !e.live || !e.dirty {
			continue
		}
		b, err := n.codec.Encode(e.state)
		if err != nil {
			return fmt.Errorf("key %q: encoding state: %w", e.key, err)
		}
		e.dirty, e.persisted = false, true
		n.env.Save(epoch, timedKeyPrefix+e.key, b, false)
	}
	if len(n.deleted) > 1 {
		slices.Sort(n.deleted)
		n.deleted = slices.Compact(n.deleted)
	}
	for _, key := range n.deleted {
		if slot, ok := n.index[key]; !ok || !n.slots[slot].live {
			n.env.Save(epoch, timedKeyPrefix+key, nil, true)
		}
	}
	n.dirty = n.dirty[:0]
	n.deleted = n.deleted[:0]
	if n.wm != n.savedWm && !n.system {
		n.env.Save(epoch, timedWmPrefix+strconv.Itoa(n.env.Worker), binary.AppendVarint(nil, n.wm), false)
		n.savedWm = n.wm
	}
	return nil
}

// ConsumesBatches tells the engine that the node keeps nothing of a batch but copies.
func (n *timedNode[V, S, W]) ConsumesBatches() {}

func (n *timedNode[V, S, W]) Close() error { return nil }
