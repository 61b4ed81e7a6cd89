package windows

import (
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/epochflow/epochflow/dataflow"
)

// Logic is what a windowed step does with the items of one window of one key. The accumulator
// A is the window's state; with recovery it is stored, with the window's bounds, at the end of
// every epoch in which it changed: with Codec when it is set, else as JSON, in which case A must
// be a plain type that dataflow.CheckCodec accepts.
type Logic[V, A, R any] struct {
	// Open returns the accumulator of a new window (for a session, the window of its first
	// item). Optional: nil starts from the zero A.
	Open func(key string, w Window) A
	// Add adds an item to a window's accumulator. Required.
	Add func(acc A, item V) A
	// Merge joins the accumulators of two sessions that an item bridges, a being the earlier.
	// Required for Session windows.
	Merge func(a, b A) A
	// Close turns an accumulator into the window's result. It is called for every result
	// emitted, so it must not change acc. Required.
	Close func(key string, w Window, acc A) R
	// Codec stores a window's accumulator in the recovery store and restores it on resume (the
	// window's bounds and counts are stored around it). Optional: nil stores A as JSON, and a
	// run with recovery then refuses to start when dataflow.CheckCodec finds that A cannot
	// round-trip (an interface, an unexported field): give a Codec for such an A. The key
	// Decode gets is the window's key.
	Codec dataflow.Codec[A]
}

// winWire is a window as a Logic.Codec stores it: its accumulator encoded by the codec.
type winWire struct {
	ID, Start, End int64
	Acc            []byte
	N, Emits       int
	Fired          bool
	Due            bool
	Changed        bool
	NextEarly      int64
}

// stateCodec stores a key's windows with a Logic.Codec for the accumulators.
type stateCodec[A any] struct{ acc dataflow.Codec[A] }

func (c stateCodec[A]) Encode(st keyState[A]) ([]byte, error) {
	wins := make([]winWire, st.n)
	for i, w := range st.wins() {
		b, err := c.acc.Encode(w.Acc)
		if err != nil {
			return nil, fmt.Errorf("window %v: encoding the accumulator: %w", span{w.ID, w.Start, w.End}.window(), err)
		}
		wins[i] = winWire{ID: w.ID, Start: w.Start, End: w.End, Acc: b, N: w.N, Emits: w.Emits,
			Fired: w.Fired, Due: w.Due, Changed: w.Changed, NextEarly: w.NextEarly}
	}
	b, err := json.Marshal(wins)
	if err != nil {
		return nil, fmt.Errorf("encoding the windows: %w", err)
	}
	return b, nil
}

func (c stateCodec[A]) Decode(key string, data []byte) (keyState[A], error) {
	var wins []winWire
	if err := json.Unmarshal(data, &wins); err != nil {
		return keyState[A]{}, fmt.Errorf("key %q: decoding the windows: %w", key, err)
	}
	ws := make([]winState[A], len(wins))
	for i, w := range wins {
		acc, err := c.acc.Decode(key, w.Acc)
		if err != nil {
			return keyState[A]{}, fmt.Errorf("key %q: window %v: decoding the accumulator: %w", key, span{w.ID, w.Start, w.End}.window(), err)
		}
		ws[i] = winState[A]{ID: w.ID, Start: w.Start, End: w.End, Acc: acc, N: w.N, Emits: w.Emits,
			Fired: w.Fired, Due: w.Due, Changed: w.Changed, NextEarly: w.NextEarly}
	}
	var st keyState[A]
	st.load(ws)
	return st, nil
}

// Check passes on the check of the accumulator's codec, if it has one (the engine calls it at
// start when the run has recovery).
func (c stateCodec[A]) Check() error {
	if ch, ok := c.acc.(interface{ Check() error }); ok {
		return ch.Check()
	}
	return nil
}

// defaultStateCodec stores a key's windows as JSON (storedWins); its Check says, when A cannot
// round-trip, to give Logic a Codec.
type defaultStateCodec[A any] struct{ wire dataflow.Codec[storedWins[A]] }

func (c defaultStateCodec[A]) Encode(st keyState[A]) ([]byte, error) {
	return c.wire.Encode(st.stored())
}

func (c defaultStateCodec[A]) Decode(key string, data []byte) (keyState[A], error) {
	w, err := c.wire.Decode(key, data)
	if err != nil {
		return keyState[A]{}, err
	}
	var st keyState[A]
	st.load(w.Wins)
	return st, nil
}

func (defaultStateCodec[A]) Check() error {
	if err := dataflow.CheckCodec[A](); err != nil {
		return fmt.Errorf("the window accumulator: %w; or, with windows.Apply, give the Logic a Codec", err)
	}
	return nil
}

// codecFor is the codec of a windowed step's state.
func codecFor[V, A, R any](logic Logic[V, A, R]) dataflow.Codec[keyState[A]] {
	if logic.Codec != nil {
		return stateCodec[A]{acc: logic.Codec}
	}
	return defaultStateCodec[A]{dataflow.DefaultCodec[storedWins[A]]()}
}

// Options tune a windowed step. The zero value emits one result per window, when the watermark
// passes its end, and sends every later item to the late stream.
type Options struct {
	// Lateness keeps a window for that long after the watermark has passed its end: an item
	// that comes in that time is added, and the window's result is emitted again at once,
	// marked as an update (a session it extends or merges waits for its new end). After it,
	// the window is gone and its items are late.
	Lateness time.Duration
	// Early, when positive, makes an open window emit running results: each time the
	// watermark passes another Early after the window's start (before its end), a result
	// marked Early is emitted if items came since the last one. The final result follows at
	// the end as usual. A window that has emitted its final result (a session that merged one
	// that had) emits no early results. Which early results come depends on how the watermark
	// moves on the key's worker (see docs/time.md): one move may pass an early time and the
	// end together.
	Early time.Duration
	// IdleTimeout, when positive, is the idle timeout of the step's clock (see
	// dataflow.Clock.IdleTimeout): a source partition that has read no item for that long
	// stops holding the watermark back until its next item. It is how the joins, which build
	// their clock from a wait, take one; for Apply and the aggregations, which are given a
	// dataflow.Clock, it replaces the clock's. Zero keeps the clock's (none for the joins).
	IdleTimeout time.Duration
	// MaxDrift, when positive, is the step's watermark alignment (see
	// dataflow.Clock.MaxDrift): a worker more than MaxDrift ahead of the slowest other
	// stops reading the sources that feed the step until it catches up. Like IdleTimeout, it
	// is how the joins take one, and it replaces the clock's for the others. Zero keeps the
	// clock's.
	MaxDrift time.Duration
}

// withOptions is clock with the idle timeout and the max drift of o, where o sets them.
func withOptions[V any](clock dataflow.Clock[V], o Options) dataflow.Clock[V] {
	if o.IdleTimeout > 0 {
		clock.IdleTimeout = o.IdleTimeout
	}
	if o.MaxDrift > 0 {
		clock.MaxDrift = o.MaxDrift
	}
	return clock
}

// Result is one result of a window of a key.
type Result[R any] struct {
	Key    string
	Window Window
	Value  R
	// Update marks a result that replaces one emitted before for the same window (an item
	// within the allowed lateness), or for the sessions it merged (whose windows it covers).
	Update bool
	// Early marks a running result of a window that is still open (Options.Early); the
	// window's final result comes later.
	Early bool
}

// Late is an item that came after its window was gone: the watermark had passed the window's
// end plus the allowed lateness. An item of several windows (Sliding) is late once per window
// that is gone, and added to the others.
type Late[V any] struct {
	Key    string
	Window Window
	Item   V
	Time   time.Time // the item's time, from the clock
}

// Meta describes a window whose state is gone for good: the watermark passed its end plus the
// allowed lateness.
type Meta struct {
	Key    string
	Window Window
	// Items is how many items the window holds (for a merged session, all of its parts).
	Items int
	// Results is how many results it emitted (the last one final, the rest updates before it
	// or of the sessions it merged).
	Results int
}

// Outputs are the three streams of a windowed step.
type Outputs[V, R any] struct {
	Results dataflow.Stream[Result[R]]
	Late    dataflow.Stream[Late[V]]
	Meta    dataflow.Stream[Meta]
}

// winState is one window of a key as stored.
type winState[A any] struct {
	ID, Start, End int64
	Acc            A
	N              int   // items
	Emits          int   // results emitted
	Fired          bool  // a final result was emitted
	Due            bool  // a final result (or an update) is still to be emitted
	Changed        bool  // items came since the last result
	NextEarly      int64 // when the next early result is due (with Options.Early)
}

type outKind uint8

const (
	outResult outKind = iota
	outLate
	outMeta
)

// out is what the windowed step emits, before it is split into the three outputs; kept small
// (a span, not a Window; nanoseconds, not a time.Time), as there is one per result.
type out[V, R any] struct {
	kind   outKind
	update bool
	early  bool
	win    span
	value  R
	item   V
	at     int64
	items  int
	emits  int
}

// Apply adds a windowed step over a keyed stream: clock tells the time of each item and
// carries the watermark (dataflow.Clock), windower cuts time into windows, and logic
// aggregates each window of each key. It adds the steps name (the stateful step, with its clock
// step name+".clock") and name+".results", name+".late" and name+".meta", which split its
// output.
//
// State: the open windows of every key, each with its accumulator, on the worker that owns the
// key; with recovery, stored at the end of every epoch for the keys that changed, with the
// step's watermark. Epochs: a result carries the epoch of the item or watermark mark that made
// it. Watermarks: a window emits its result when the watermark reaches its end (the default,
// one final result per window), and is dropped Options.Lateness after that, when its Meta is
// emitted. Late items: an item whose window is gone goes to Outputs.Late with that window,
// never into a result; every one is counted there. EOF: the watermark moves to the end of
// time, so every window emits and is dropped before the output ends. A resumed run starts
// from the committed watermark and windows: a window that had emitted is not emitted again
// (unless an allowed item updates it) and an item that was late stays late.
func Apply[V, A, R any](name string, in dataflow.Stream[dataflow.KV[V]], clock dataflow.Clock[V], windower Windower, logic Logic[V, A, R], opts ...Options) Outputs[V, R] {
	return apply(name, in, clock, windower, logic, firstOptions(opts), false)
}

// firstOptions is the options given, or the zero Options.
func firstOptions(opts []Options) Options {
	if len(opts) > 0 {
		return opts[0]
	}
	return Options{}
}

// apply is Apply; with running, a window emits its result at every item added to it (early
// while it is open, an update after that once it has emitted) and nothing at its end.
func apply[V, A, R any](name string, in dataflow.Stream[dataflow.KV[V]], clock dataflow.Clock[V], windower Windower, logic Logic[V, A, R], o Options, running bool) Outputs[V, R] {
	f := in.Flow()
	if f == nil {
		return Outputs[V, R]{}
	}
	switch {
	case windower == nil:
		f.Fail(fmt.Errorf("step %q: no windower", name))
	case windower.check() != nil:
		f.Fail(fmt.Errorf("step %q: %w", name, windower.check()))
	case logic.Add == nil || logic.Close == nil:
		f.Fail(fmt.Errorf("step %q: Logic.Add and Logic.Close are required", name))
	case windower.gap() > 0 && logic.Merge == nil:
		f.Fail(fmt.Errorf("step %q: session windows need Logic.Merge", name))
	case o.Lateness < 0:
		f.Fail(fmt.Errorf("step %q: the lateness %v must not be negative", name, o.Lateness))
	case o.IdleTimeout < 0:
		f.Fail(fmt.Errorf("step %q: the idle timeout %v must not be negative", name, o.IdleTimeout))
	case o.MaxDrift < 0:
		f.Fail(fmt.Errorf("step %q: the max drift %v must not be negative", name, o.MaxDrift))
	}
	if f.Err() != nil {
		return Outputs[V, R]{}
	}
	if o.Early < 0 {
		f.Fail(fmt.Errorf("step %q: the early period %v must not be negative", name, o.Early))
		return Outputs[V, R]{}
	}
	k := &kernel[V, A, R]{w: windower, logic: logic, late: int64(o.Lateness), early: int64(o.Early), running: running}
	step := dataflow.StatefulTime(name, in, withOptions(clock, o), dataflow.TimedLogic[V, keyState[A], out[V, R]]{
		OnItem:      k.onItem,
		WakeAt:      k.wakeAt,
		OnWatermark: k.onWatermark,
		Codec:       codecFor(logic),
	})
	return Outputs[V, R]{
		Results: pick(name+".results", step, outResult, func(kv dataflow.KV[out[V, R]]) Result[R] {
			return Result[R]{Key: kv.Key, Window: kv.Value.win.window(), Value: kv.Value.value, Update: kv.Value.update, Early: kv.Value.early}
		}),
		Late: pick(name+".late", step, outLate, func(kv dataflow.KV[out[V, R]]) Late[V] {
			return Late[V]{Key: kv.Key, Window: kv.Value.win.window(), Item: kv.Value.item, Time: time.Unix(0, kv.Value.at).UTC()}
		}),
		Meta: pick(name+".meta", step, outMeta, func(kv dataflow.KV[out[V, R]]) Meta {
			return Meta{Key: kv.Key, Window: kv.Value.win.window(), Items: kv.Value.items, Results: kv.Value.emits}
		}),
	}
}

func pick[V, R, T any](name string, in dataflow.Stream[dataflow.KV[out[V, R]]], kind outKind, conv func(dataflow.KV[out[V, R]]) T) dataflow.Stream[T] {
	return dataflow.TransformInto(name, in, func(batch []dataflow.KV[out[V, R]], res []T) ([]T, error) {
		for _, kv := range batch {
			if kv.Value.kind == kind {
				res = append(res, conv(kv))
			}
		}
		return res, nil
	})
}

// kernel is the windowing logic of one step, shared by its keys.
type kernel[V, A, R any] struct {
	w       Windower
	logic   Logic[V, A, R]
	late    int64
	early   int64
	running bool // emit at every item (JoinRunning)
}

func (k *kernel[V, A, R]) open(key string, s span) A {
	if k.logic.Open == nil {
		var zero A
		return zero
	}
	return k.logic.Open(key, s.window())
}

func (k *kernel[V, A, R]) emit(key string, w *winState[A], e *dataflow.Emitter[out[V, R]]) {
	sp := span{id: w.ID, start: w.Start, end: w.End}
	e.Emit(out[V, R]{kind: outResult, win: sp, value: k.logic.Close(key, sp.window(), w.Acc), update: w.Fired})
	w.Fired, w.Due, w.Changed = true, false, false
	w.Emits++
}

// emitEarly emits a running result of an open window.
func (k *kernel[V, A, R]) emitEarly(key string, w *winState[A], wm int64, e *dataflow.Emitter[out[V, R]]) {
	sp := span{id: w.ID, start: w.Start, end: w.End}
	e.Emit(out[V, R]{kind: outResult, win: sp, value: k.logic.Close(key, sp.window(), w.Acc), early: true})
	w.Changed = false
	w.Emits++
	w.NextEarly = k.nextEarly(w.Start, wm)
}

// nextEarly is the first early time of a window starting at start that is after wm.
func (k *kernel[V, A, R]) nextEarly(start, wm int64) int64 {
	if wm < start {
		return addSat(start, k.early)
	}
	return addSat(start, (floorDiv(wm-start, k.early)+1)*k.early)
}

// added settles a window that got an item: emitted at once if the watermark is past its end,
// else due at its end (and early, with Options.Early).
func (k *kernel[V, A, R]) added(key string, w *winState[A], wm int64, e *dataflow.Emitter[out[V, R]]) {
	if k.running {
		// Early while the window is open; after its end, an update once it has emitted.
		sp := span{id: w.ID, start: w.Start, end: w.End}
		open := wm < w.End
		e.Emit(out[V, R]{kind: outResult, win: sp, value: k.logic.Close(key, sp.window(), w.Acc), early: open, update: w.Fired && !open})
		w.Fired, w.Due, w.Changed = true, false, false
		w.Emits++
		return
	}
	if w.End <= wm {
		k.emit(key, w, e)
		return
	}
	w.Due = true
	if k.early > 0 && !w.Fired {
		if !w.Changed || w.NextEarly <= wm {
			w.NextEarly = k.nextEarly(w.Start, wm)
		}
		w.Changed = true
	}
}

func (k *kernel[V, A, R]) onItem(key string, st *keyState[A], _ bool, item V, at, wmT time.Time, e *dataflow.Emitter[out[V, R]]) (bool, error) {
	t, wm := at.UnixNano(), wmT.UnixNano()
	if g := k.w.gap(); g > 0 {
		k.session(key, st, item, t, wm, g, e)
	} else {
		// The kernel is shared by the step's workers: nothing of a call is kept in it.
		var arr [4]span
		for _, s := range assign(k.w, t, arr[:0]) {
			if addSat(s.end, k.late) <= wm {
				e.Emit(out[V, R]{kind: outLate, win: s, item: item, at: t})
				e.CountLate()
				continue
			}
			i, found := slices.BinarySearchFunc(st.wins(), s.start, func(w winState[A], start int64) int {
				return cmpInt(w.Start, start)
			})
			if !found {
				st.insert(i, winState[A]{ID: s.id, Start: s.start, End: s.end, Acc: k.open(key, s)})
			}
			w := &st.wins()[i]
			w.Acc = k.logic.Add(w.Acc, item)
			w.N++
			k.added(key, w, wm, e)
		}
	}
	return st.n > 0, nil
}

// session adds an item to the session it extends, merging the sessions it bridges.
func (k *kernel[V, A, R]) session(key string, st *keyState[A], item V, t, wm, g int64, e *dataflow.Emitter[out[V, R]]) {
	proto := span{id: t, start: t, end: addSat(t, g)}
	first, last := -1, -1
	wins := st.wins()
	for i, w := range wins {
		if w.Start < proto.end && t < w.End {
			if first < 0 {
				first = i
			}
			last = i
		}
	}
	if first < 0 {
		if addSat(proto.end, k.late) <= wm {
			e.Emit(out[V, R]{kind: outLate, win: proto, item: item, at: t})
			e.CountLate()
			return
		}
		i, _ := slices.BinarySearchFunc(wins, t, func(w winState[A], start int64) int { return cmpInt(w.Start, start) })
		st.insert(i, winState[A]{ID: t, Start: t, End: proto.end, Acc: k.open(key, proto)})
		first = i
	} else if first == last {
		// The item extends one session (the common case): in place.
		m := &wins[first]
		if m.Fired {
			m.Changed = false // as below
		}
		if t < m.Start {
			m.Start, m.ID = t, t
		}
		m.End = max(m.End, proto.end)
	} else {
		// Sessions overlap the item only in a run (they do not overlap each other).
		m := wins[first]
		for _, w := range wins[first+1 : last+1] {
			m.Acc = k.logic.Merge(m.Acc, w.Acc)
			m.End = max(m.End, w.End)
			m.N += w.N
			m.Emits += w.Emits
			m.Fired = m.Fired || w.Fired
			if w.Changed && (!m.Changed || w.NextEarly < m.NextEarly) {
				m.NextEarly = w.NextEarly
			}
			m.Changed = m.Changed || w.Changed
		}
		if m.Fired {
			// A session that has emitted its final result emits no early ones (as added
			// says), also when a part it merged was waiting for an early result: it waits
			// for its new end to emit the update.
			m.Changed = false
		}
		if t < m.Start {
			m.Start, m.ID = t, t
		}
		m.End = max(m.End, proto.end)
		st.shrink(len(slices.Delete(wins, first+1, last+1)))
		st.wins()[first] = m
	}
	w := &st.wins()[first]
	w.Acc = k.logic.Add(w.Acc, item)
	w.N++
	k.added(key, w, wm, e)
}

func (k *kernel[V, A, R]) wakeAt(_ string, st *keyState[A]) time.Time {
	next, armed := int64(0), false
	for _, w := range st.wins() {
		at := addSat(w.End, k.late)
		if w.Due {
			at = w.End
			if w.Changed && w.NextEarly < at {
				at = w.NextEarly
			}
		}
		if !armed || at < next {
			next, armed = at, true
		}
	}
	if !armed {
		return time.Time{}
	}
	return time.Unix(0, next).UTC()
}

func (k *kernel[V, A, R]) onWatermark(key string, st *keyState[A], wmT time.Time, e *dataflow.Emitter[out[V, R]]) (bool, error) {
	wm := wmT.UnixNano()
	wins := st.wins()
	kept := 0
	for i := range wins {
		w := &wins[i]
		if w.Due && w.End <= wm {
			k.emit(key, w, e)
		} else if w.Due && w.Changed && k.early > 0 && w.NextEarly <= wm {
			k.emitEarly(key, w, wm, e)
		}
		if addSat(w.End, k.late) <= wm {
			e.Emit(out[V, R]{kind: outMeta, win: span{id: w.ID, start: w.Start, end: w.End}, items: w.N, emits: w.Emits})
			continue
		}
		wins[kept] = *w
		kept++
	}
	st.shrink(kept)
	return kept > 0, nil
}

func cmpInt(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
