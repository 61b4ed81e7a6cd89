package dataflow

import (
	"container/heap"
	"fmt"
	"time"

	"github.com/epochflow/epochflow/dataflow/internal/engine"
)

// StatefulLogic says what a keyed stateful step does with each key's state S. Every function is
// called on the worker that owns the key, never concurrently. state points at the key's state
// (the zero S when exists is false) and may be changed in place; a function returns keep=false
// to discard the key's state. Output goes to out, under the same key.
type StatefulLogic[V, S, W any] struct {
	// OnItem handles one item of the key. Required.
	OnItem func(key string, state *S, exists bool, item V, out *Emitter[W]) (keep bool, err error)
	// OnNotify is called once the time NotifyAt asked for has come. Optional.
	OnNotify func(key string, state *S, now time.Time, out *Emitter[W]) (keep bool, err error)
	// OnEOF is called for every key that still has state when the input ends. Optional; without
	// it the state is kept as it is.
	OnEOF func(key string, state *S, out *Emitter[W]) (keep bool, err error)
	// NotifyAt, if set, is called after OnItem and OnNotify and returns when the key wants
	// OnNotify (the zero time for never). A restored key is asked too.
	NotifyAt func(key string, state *S) time.Time
	// Codec stores the state in the recovery store: at the end of every epoch, the state of
	// each key that changed in it (a discarded key is stored as deleted). Optional: nil means
	// DefaultCodec, and a run with recovery refuses to start when CheckCodec finds S cannot
	// round-trip through it. A codec with a method Check() error is asked the same at start.
	Codec Codec[S]
}

// Emitter collects a stateful step's output for one key.
type Emitter[W any] struct {
	key  string
	out  []KV[W]
	late uint64
}

// Emit sends w downstream under the current key.
func (e *Emitter[W]) Emit(w W) { e.out = append(e.out, KV[W]{Key: e.key, Value: w}) }

// CountLate counts one late item in the run's epochflow_late_items_total (with a Monitor; a
// windowed step calls it for every item it sends to its late stream).
func (e *Emitter[W]) CountLate() { e.late++ }

// Key returns the key whose state is being handled.
func (e *Emitter[W]) Key() string { return e.key }

// Stateful adds a keyed stateful step. Items are first exchanged so that every item of a key
// reaches the worker that owns the key (KeyHash of the key modulo the workers).
//
// State: one S per key, created by the key's first item and kept until a function returns
// keep=false. Epochs: the state of epoch e is complete before any item of e+1 is applied
// (barriers are aligned); output items carry the epoch of the item or event that caused them.
// EOF: OnEOF is called for every key that has state, then the output ends.
func Stateful[V, S, W any](name string, in Stream[KV[V]], logic StatefulLogic[V, S, W]) Stream[KV[W]] {
	if !in.valid() {
		return Stream[KV[W]]{}
	}
	if logic.OnItem == nil {
		in.flow.fail(fmt.Errorf("step %q: StatefulLogic.OnItem is nil", name))
		return Stream[KV[W]]{}
	}
	e := in.edge()
	e.NewRouter = byKey[V]()
	e.Codec = kvBatchCodec[V]()
	s := in.flow.add(name, &engine.Step{Kind: "stateful", Inputs: []engine.Edge{e}, Outputs: 1,
		New: func(env *engine.Env, _ any) (engine.Node, error) {
			return newStatefulNode(env, logic)
		}})
	if s == nil {
		return Stream[KV[W]]{}
	}
	return Stream[KV[W]]{flow: in.flow, step: s}
}

type entry[S any] struct {
	state     S
	notify    time.Time
	dirty     bool // changed in the open epoch (tracked with recovery only)
	persisted bool // the recovery store has a state of this key
	gone      bool // discarded: no longer in the node's map
}

// dirtyKey is a key whose state changed in the open epoch, with its entry (so that the end of
// the epoch finds the state without a map lookup per key).
type dirtyKey[S any] struct {
	key string
	e   *entry[S]
}

type statefulNode[V, S, W any] struct {
	env     *engine.Env
	logic   StatefulLogic[V, S, W]
	codec   Codec[S]
	states  map[string]*entry[S]
	out     Emitter[W]
	timers  timerHeap
	track   bool          // recovery is on: remember which keys changed
	dirty   []dirtyKey[S] // keys whose state changed in the open epoch
	deleted []string      // keys discarded in the open epoch that the store has a state of

	appender AppendCodec[S] // codec, if it is one
	buf      []byte         // what encodeState fills: states of the epoch being saved
}

func newStatefulNode[V, S, W any](env *engine.Env, logic StatefulLogic[V, S, W]) (*statefulNode[V, S, W], error) {
	// Sized for this worker's share of the restored keys: a resume of a million keys spent
	// half its time growing the map.
	size := len(env.Restored()) / max(env.Workers, 1)
	n := &statefulNode[V, S, W]{env: env, logic: logic, codec: logic.Codec, states: make(map[string]*entry[S], size), track: env.Recovery}
	if n.codec == nil {
		n.codec = DefaultCodec[S]()
		if env.Recovery {
			if err := CheckCodec[S](); err != nil {
				return nil, fmt.Errorf("%w; or give the step a codec (StatefulLogic.Codec)", err)
			}
		}
	} else if c, ok := n.codec.(interface{ Check() error }); ok && env.Recovery {
		if err := c.Check(); err != nil {
			return nil, err
		}
	}
	n.appender, _ = n.codec.(AppendCodec[S])
	for _, r := range env.Restored() {
		if WorkerForKey(r.Key, env.Workers) != env.Worker {
			continue
		}
		st, err := n.codec.Decode(r.Key, r.State)
		if err != nil {
			return nil, fmt.Errorf("restoring state: %w", err)
		}
		e := &entry[S]{state: st, persisted: true}
		n.states[r.Key] = e
		n.arm(r.Key, e)
	}
	return n, nil
}

func (n *statefulNode[V, S, W]) OnBatch(_ int, epoch uint64, batch any) (err error) {
	items := batch.([]KV[V])
	i := 0
	defer func() {
		if p := recover(); p != nil {
			err = ItemErr(items[i], PanicErr(p))
		}
	}()
	for ; i < len(items); i++ {
		kv := items[i]
		e := n.states[kv.Key]
		exists := e != nil
		if !exists {
			e = &entry[S]{}
		}
		n.out.key = kv.Key
		keep, err := n.logic.OnItem(kv.Key, &e.state, exists, kv.Value, &n.out)
		if err != nil {
			return ItemErr(kv, err)
		}
		n.settle(kv.Key, e, exists, keep)
	}
	return n.flush(epoch)
}

// settle stores or drops a key's state after a call, and arms its timer.
func (n *statefulNode[V, S, W]) settle(key string, e *entry[S], exists, keep bool) {
	if !keep {
		if exists {
			n.discard(key, e)
		}
		return
	}
	if n.track && !e.dirty {
		e.dirty = true
		n.dirty = append(n.dirty, dirtyKey[S]{key, e})
	}
	if !exists {
		n.states[key] = e
	}
	n.arm(key, e)
}

// discard drops a key's state; a key the store has a state of gets a tombstone at the end of
// the epoch, one it never saw needs none.
func (n *statefulNode[V, S, W]) discard(key string, e *entry[S]) {
	delete(n.states, key)
	e.gone = true
	if n.track && e.persisted {
		n.deleted = append(n.deleted, key)
	}
}

// arm asks NotifyAt when the key wants OnNotify.
func (n *statefulNode[V, S, W]) arm(key string, e *entry[S]) {
	if n.logic.NotifyAt != nil {
		at := n.logic.NotifyAt(key, &e.state)
		if !at.Equal(e.notify) {
			e.notify = at
			if !at.IsZero() {
				heap.Push(&n.timers, timer{at: at, key: key})
			}
		}
	}
}

func (n *statefulNode[V, S, W]) flush(epoch uint64) error {
	if len(n.out.out) == 0 {
		return nil
	}
	out := n.out.out
	n.out.out = nil
	return n.env.Emit(0, epoch, out)
}

func (n *statefulNode[V, S, W]) NextTime() time.Time {
	if len(n.timers) == 0 {
		return time.Time{}
	}
	return n.timers[0].at
}

func (n *statefulNode[V, S, W]) OnTime(now time.Time, epoch uint64) (err error) {
	var cur string
	defer func() {
		if p := recover(); p != nil {
			err = userErr(fmt.Errorf("key %q: notify: %w", cur, PanicErr(p)))
		}
	}()
	// Only the timers due now fire; one a call re-arms for a time already past fires on the
	// next call, so a logic that keeps asking for the past cannot hang the worker.
	var due []timer
	for len(n.timers) > 0 && !now.Before(n.timers[0].at) {
		due = append(due, heap.Pop(&n.timers).(timer))
	}
	for _, t := range due {
		e := n.states[t.key]
		if e == nil || !e.notify.Equal(t.at) {
			continue // stale: the key was discarded or asked for another time
		}
		e.notify = time.Time{}
		if n.logic.OnNotify == nil {
			continue
		}
		cur = t.key
		n.out.key = t.key
		keep, err := n.logic.OnNotify(t.key, &e.state, now, &n.out)
		if err != nil {
			return userErr(fmt.Errorf("key %q: notify: %w", t.key, err))
		}
		n.settle(t.key, e, true, keep)
	}
	return n.flush(epoch)
}

func (n *statefulNode[V, S, W]) OnEOF(epoch uint64) (err error) {
	if n.logic.OnEOF == nil {
		return nil
	}
	var cur string
	defer func() {
		if p := recover(); p != nil {
			err = userErr(fmt.Errorf("key %q: at EOF: %w", cur, PanicErr(p)))
		}
	}()
	for key, e := range n.states {
		cur = key
		n.out.key = key
		keep, err := n.logic.OnEOF(key, &e.state, &n.out)
		if err != nil {
			return userErr(fmt.Errorf("key %q: at EOF: %w", key, err))
		}
		if !keep {
			n.discard(key, e)
		} else if n.track && !e.dirty {
			e.dirty = true
			n.dirty = append(n.dirty, dirtyKey[S]{key, e})
		}
	}
	n.timers = nil
	return n.flush(epoch)
}

// OnClose saves the state of every key that changed in the epoch, and a tombstone for every
// key discarded in it that the store holds (with recovery). With an AppendCodec the states are
// encoded into shared buffers (see encodeState), not a slice each.
func (n *statefulNode[V, S, W]) OnClose(epoch uint64) error {
	if !n.track {
		return nil
	}
	n.env.Reserve(len(n.dirty) + len(n.deleted))
	n.buf = nil // the previous epoch's snapshots still hold theirs
	for _, d := range n.dirty {
		key, e := d.key, d.e
		if e.gone || !e.dirty {
			continue // discarded since (a new entry of the key is listed after it)
		}
		b, err := n.encodeState(e.state, len(n.dirty))
		if err != nil {
			return fmt.Errorf("key %q: encoding state: %w", key, err)
		}
		e.dirty, e.persisted = false, true
		n.env.Save(epoch, key, b, false)
	}
	// A key is listed in deleted at most once an epoch: discard lists only an entry the
	// store has a state of, and the entry a key gets after it (created in the epoch) has
	// none. So no sort to drop duplicates (at EOF, when a final step discards every key,
	// sorting a million keys cost more than the commit of their tombstones).
	for _, key := range n.deleted {
		if _, ok := n.states[key]; !ok {
			n.env.Save(epoch, key, nil, true)
		}
	}
	clear(n.dirty) // the entries of discarded keys can be collected
	n.dirty = n.dirty[:0]
	n.deleted = n.deleted[:0]
	n.buf = nil
	return nil
}

// encodeBufMin and encodeBufMax bound the buffers a step encodes an epoch's states into.
const (
	encodeBufMin = 4 << 10
	encodeBufMax = 1 << 20
)

// encodeState encodes a state for a snapshot: with an AppendCodec into n.buf, a buffer shared
// by the snapshots of the epoch (a fresh one when it is full, sized for the keys left, so that
// what a snapshot holds is never written again), else with Encode. keys is the number of keys
// the epoch saves, for the first buffer's size.
func (n *statefulNode[V, S, W]) encodeState(state S, keys int) ([]byte, error) {
	if n.appender == nil {
		return n.codec.Encode(state)
	}
	if cap(n.buf)-len(n.buf) < 16 {
		n.buf = make([]byte, 0, min(max(keys*4, encodeBufMin), encodeBufMax))
	}
	start := len(n.buf)
	b, err := n.appender.AppendEncode(n.buf, state)
	if err != nil {
		return nil, err
	}
	if start > 0 && &b[:1][0] != &n.buf[:1][0] {
		// It did not fit and append moved it: the state alone into the new array, which
		// later states then share (the bytes copied to it before start are unused).
		b = b[start:]
		n.buf = b
		start = 0
	} else {
		n.buf = b
	}
	st := n.buf[start:len(n.buf):len(n.buf)]
	if len(st) == 0 {
		st = []byte{}
	}
	return st, nil
}

// ConsumesBatches tells the engine that the node keeps nothing of a batch but copies.
func (n *statefulNode[V, S, W]) ConsumesBatches() {}

func (n *statefulNode[V, S, W]) Close() error { return nil }

type timer struct {
	at  time.Time
	key string
}

type timerHeap []timer

func (h timerHeap) Len() int           { return len(h) }
func (h timerHeap) Less(i, j int) bool { return h[i].at.Before(h[j].at) }
func (h timerHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *timerHeap) Push(x any)        { *h = append(*h, x.(timer)) }
func (h *timerHeap) Pop() any {
	old := *h
	t := old[len(old)-1]
	*h = old[:len(old)-1]
	return t
}
