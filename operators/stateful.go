package operators

import (
	"errors"
	"fmt"
	"time"

	"github.com/epochflow/epochflow/dataflow"
)

// StateOptions are the optional settings of a stateful operator whose state type S the caller
// chooses (StatefulMap, StatefulMapErr, StatefulFlatMap, Stateful); pass at most one.
type StateOptions[S any] struct {
	// Codec stores each key's state in the recovery store. nil means dataflow.DefaultCodec[S],
	// and then a run with recovery refuses to start when dataflow.CheckCodec finds that S
	// cannot round-trip through it (an interface, an unexported field): give a Codec for such
	// an S. A codec with a method Check() error is asked at start too.
	Codec dataflow.Codec[S]
}

// stateCodec returns the codec a stateful operator op (such as "operators.StatefulMap") stores
// its state with: the one of opts or, without one, the default codec, whose error at start
// names what to change (advice). A second StateOptions is a build error recorded on the flow.
func stateCodec[S, T any](op, name string, in dataflow.Stream[T], opts []StateOptions[S], advice string) (dataflow.Codec[S], bool) {
	if len(opts) > 1 {
		in.Flow().Fail(fmt.Errorf("step %q: %s takes at most one StateOptions, got %d", stepID(in.Flow(), name), op, len(opts)))
		return nil, false
	}
	if len(opts) == 1 && opts[0].Codec != nil {
		return opts[0].Codec, true
	}
	return defaultCodec[S](advice), true
}

// defaultCodec is dataflow.DefaultCodec[S] with a Check that, when S cannot round-trip through
// it, says what to do instead (advice, such as "or pass operators.StateOptions{Codec: ...} to
// operators.StatefulMap").
func defaultCodec[S any](advice string) dataflow.Codec[S] {
	return checkedCodec[S]{Codec: dataflow.DefaultCodec[S](), check: dataflow.CheckCodec[S](), advice: advice}
}

type checkedCodec[S any] struct {
	dataflow.Codec[S]
	check  error
	advice string
}

// Check tells the engine at start, when the run has recovery, that S cannot be stored.
func (c checkedCodec[S]) Check() error {
	if c.check != nil {
		return fmt.Errorf("%w; %s", c.check, c.advice)
	}
	return nil
}

// noCodecAdvice is what the error of an operator without codec option (op) says.
func noCodecAdvice(op string) string {
	return fmt.Sprintf("%s takes no codec: use a value type the default codec can store, "+
		"or write the step with dataflow.Stateful and a StatefulLogic.Codec", op)
}

// StatefulMap adds a keyed step that keeps a state S per key and maps every item with it: for
// each item v of key k it calls fn(state, v), stores the new state, and emits out under k.
// Items are first exchanged so that all items of a key reach the worker that owns the key, and
// fn sees them in the order they arrived there.
//
// State: a new key starts with the zero S; keep=false discards the key's state after out is
// emitted (the next item of the key starts again from the zero S). Epochs: the state carries
// across epochs; out carries the epoch of its item. EOF: nothing is emitted; the output ends.
// A panic in fn stops the flow with an error naming the step, the worker and the item.
//
// With recovery, the state is stored with opts' Codec (at most one StateOptions), by default
// with dataflow.DefaultCodec[S].
func StatefulMap[V, S, W any](name string, in dataflow.Stream[dataflow.KV[V]], fn func(state S, item V) (newState S, out W, keep bool), opts ...StateOptions[S]) dataflow.Stream[dataflow.KV[W]] {
	if !usable(name, in, "the stateful map function", fn == nil) {
		return dataflow.Stream[dataflow.KV[W]]{}
	}
	codec, ok := stateCodec("operators.StatefulMap", name, in, opts,
		"or pass operators.StateOptions{Codec: ...} to operators.StatefulMap")
	if !ok {
		return dataflow.Stream[dataflow.KV[W]]{}
	}
	return dataflow.Stateful(name, in, dataflow.StatefulLogic[V, S, W]{
		Codec: codec,
		OnItem: func(_ string, state *S, _ bool, item V, out *dataflow.Emitter[W]) (bool, error) {
			s, w, keep := fn(*state, item)
			*state = s
			out.Emit(w)
			return keep, nil
		},
	})
}

// StatefulMapErr is StatefulMap for a function that can fail: an error stops the flow with an
// error naming the step, the worker and the item (the key's state is not updated).
//
// State: as StatefulMap. Epochs: the state carries across epochs; out carries the epoch of its
// item. EOF: nothing is emitted; the output ends. opts: as StatefulMap.
func StatefulMapErr[V, S, W any](name string, in dataflow.Stream[dataflow.KV[V]], fn func(state S, item V) (newState S, out W, keep bool, err error), opts ...StateOptions[S]) dataflow.Stream[dataflow.KV[W]] {
	if !usable(name, in, "the stateful map function", fn == nil) {
		return dataflow.Stream[dataflow.KV[W]]{}
	}
	codec, ok := stateCodec("operators.StatefulMapErr", name, in, opts,
		"or pass operators.StateOptions{Codec: ...} to operators.StatefulMapErr")
	if !ok {
		return dataflow.Stream[dataflow.KV[W]]{}
	}
	return dataflow.Stateful(name, in, dataflow.StatefulLogic[V, S, W]{
		Codec: codec,
		OnItem: func(_ string, state *S, _ bool, item V, out *dataflow.Emitter[W]) (bool, error) {
			s, w, keep, err := fn(*state, item)
			if err != nil {
				return false, err
			}
			*state = s
			out.Emit(w)
			return keep, nil
		},
	})
}

// StatefulFlatMap is StatefulMap emitting any number of items per input item: every element of
// out, in order, under the item's key. The slice fn returns is copied: fn may reuse it.
//
// State: a new key starts with the zero S; keep=false discards the key's state after out is
// emitted. Epochs: the state carries across epochs; out carries the epoch of its item. EOF:
// nothing is emitted; the output ends. A panic in fn stops the flow, naming the item. opts: as
// StatefulMap.
func StatefulFlatMap[V, S, W any](name string, in dataflow.Stream[dataflow.KV[V]], fn func(state S, item V) (newState S, out []W, keep bool), opts ...StateOptions[S]) dataflow.Stream[dataflow.KV[W]] {
	if !usable(name, in, "the stateful flat-map function", fn == nil) {
		return dataflow.Stream[dataflow.KV[W]]{}
	}
	codec, ok := stateCodec("operators.StatefulFlatMap", name, in, opts,
		"or pass operators.StateOptions{Codec: ...} to operators.StatefulFlatMap")
	if !ok {
		return dataflow.Stream[dataflow.KV[W]]{}
	}
	return dataflow.Stateful(name, in, dataflow.StatefulLogic[V, S, W]{
		Codec: codec,
		OnItem: func(_ string, state *S, _ bool, item V, out *dataflow.Emitter[W]) (bool, error) {
			s, ws, keep := fn(*state, item)
			*state = s
			for _, w := range ws {
				out.Emit(w)
			}
			return keep, nil
		},
	})
}

// Logic is the per-key object of a Stateful step: one Logic exists per key that has state, and
// the engine calls its methods on the worker that owns the key, never concurrently. V is the
// input value type, W the output value type and S the snapshot type (what recovery stores).
//
// OnItem, OnNotify and OnEOF return the values to emit under the key (the engine copies them
// out before the next call, so a Logic may return the same scratch slice every time) and
// whether to discard the Logic afterwards (false keeps it; the key's next item builds a new
// one). An error stops the flow with an error naming the step, the worker and the item (or the
// key, for OnNotify and OnEOF). A panic is reported the same way.
//
// Embed BaseLogic to get OnNotify, OnEOF and NotifyAt that do nothing.
type Logic[V, W, S any] interface {
	// OnItem handles one item of the key. Its output carries the item's epoch.
	OnItem(item V) (out []W, discard bool, err error)
	// OnNotify is called once the time NotifyAt returned has come; now is the current time. The
	// engine delivers it on the worker loop, between batches. Its output carries the epoch open
	// on the worker at that moment.
	OnNotify(now time.Time) (out []W, discard bool, err error)
	// OnEOF is called when the step's input has ended, for every key that still has a Logic.
	// Returning discard=false keeps the Logic until the run ends, which changes nothing
	// without recovery.
	OnEOF() (out []W, discard bool, err error)
	// NotifyAt returns when OnNotify should next be called; the zero time means never. It is
	// called after every OnItem and OnNotify; a new time replaces the previous one. After
	// OnNotify, a time not after the notification's now counts as never (it was just
	// delivered): return a later time to be notified again.
	NotifyAt() time.Time
	// Snapshot returns the key's state for the recovery store. It is called at the end of
	// every epoch in which the key changed, when the flow runs with recovery; after a restart
	// the step's build function is called with the last committed snapshot as resume. It must
	// not change the Logic.
	Snapshot() S
}

// BaseLogic provides, embedded in a Logic implementation, OnNotify, OnEOF and NotifyAt that do
// nothing: no timers, and the Logic is kept (without output) at EOF.
type BaseLogic[W any] struct{}

// OnNotify emits nothing and keeps the Logic.
func (BaseLogic[W]) OnNotify(time.Time) ([]W, bool, error) { return nil, false, nil }

// OnEOF emits nothing and keeps the Logic.
func (BaseLogic[W]) OnEOF() ([]W, bool, error) { return nil, false, nil }

// NotifyAt asks for no notification.
func (BaseLogic[W]) NotifyAt() time.Time { return time.Time{} }

// Stateful adds a keyed step driven by one Logic object per key, the low-level operator the
// other stateful operators could be written with (like Bytewax's stateful). Items are first
// exchanged so that all items of a key reach the worker that owns the key. The first item of a
// key calls build(key, nil) to make the key's Logic, then Logic.OnItem; later items of the key
// go to the same Logic until it asks to be discarded. An error from build stops the flow,
// naming the item.
//
// With recovery (dataflow.Options.Recovery), the state stored for a key is its Logic's
// Snapshot, encoded with opts' Codec (at most one StateOptions) or by default with
// dataflow.DefaultCodec[S] (so S should then be a plain type: see dataflow.CheckCodec; with
// recovery, a type it cannot round-trip refuses to start). When
// the flow resumes, build is called with the key's last committed snapshot as resume, before
// any item, and NotifyAt is asked again.
//
// State: the Logic per key, kept until a method returns discard=true. Epochs: the Logic carries
// across epochs; at the end of an epoch in which a key changed, Snapshot is called (with
// recovery). Output of OnItem carries the item's epoch, that of OnNotify and OnEOF the epoch
// open at the time. EOF: OnEOF is called for every key that still has a Logic, then the output
// ends.
func Stateful[V, W, S any](name string, in dataflow.Stream[dataflow.KV[V]], build func(key string, resume *S) (Logic[V, W, S], error), opts ...StateOptions[S]) dataflow.Stream[dataflow.KV[W]] {
	if !usable(name, in, "the build function", build == nil) {
		return dataflow.Stream[dataflow.KV[W]]{}
	}
	snap, ok := stateCodec("operators.Stateful", name, in, opts,
		"or pass operators.StateOptions{Codec: ...} to operators.Stateful")
	if !ok {
		return dataflow.Stream[dataflow.KV[W]]{}
	}
	emit := func(ws []W, discard bool, err error, out *dataflow.Emitter[W]) (bool, error) {
		if err != nil {
			return false, err
		}
		for _, w := range ws {
			out.Emit(w)
		}
		return !discard, nil
	}
	codec := &logicCodec[V, W, S]{snap: snap, build: build}
	return dataflow.Stateful(name, in, dataflow.StatefulLogic[V, logicState[V, W, S], W]{
		Codec: codec,
		OnItem: func(key string, st *logicState[V, W, S], exists bool, item V, out *dataflow.Emitter[W]) (bool, error) {
			if !exists {
				l, err := build(key, nil)
				if err != nil {
					return false, fmt.Errorf("build: %w", err)
				}
				if l == nil {
					return false, errors.New("build returned a nil Logic")
				}
				st.logic = l
			}
			ws, discard, err := st.logic.OnItem(item)
			return emit(ws, discard, err, out)
		},
		OnNotify: func(_ string, st *logicState[V, W, S], now time.Time, out *dataflow.Emitter[W]) (bool, error) {
			st.notified = now
			ws, discard, err := st.logic.OnNotify(now)
			return emit(ws, discard, err, out)
		},
		OnEOF: func(_ string, st *logicState[V, W, S], out *dataflow.Emitter[W]) (bool, error) {
			ws, discard, err := st.logic.OnEOF()
			return emit(ws, discard, err, out)
		},
		NotifyAt: func(_ string, st *logicState[V, W, S]) time.Time {
			at := st.logic.NotifyAt()
			if !st.notified.IsZero() {
				// Right after OnNotify: a time not after the notification's is the one just
				// delivered; asking for it again would make the engine call OnNotify over and
				// over in one go.
				if !at.After(st.notified) {
					at = time.Time{}
				}
				st.notified = time.Time{}
			}
			return at
		},
	})
}

// logicState is what a Stateful step keeps per key: the key's Logic, and the time of the
// notification being delivered (zero outside OnNotify).
type logicState[V, W, S any] struct {
	logic    Logic[V, W, S]
	notified time.Time
}

// logicCodec stores a Stateful step's state in the recovery store as its Logic's Snapshot,
// encoded with the snapshot codec, and restores it by calling build with the decoded snapshot
// as resume.
type logicCodec[V, W, S any] struct {
	snap  dataflow.Codec[S]
	build func(key string, resume *S) (Logic[V, W, S], error)
}

// Check tells the engine at start, when the run has recovery, that S cannot be stored (when
// the snapshot codec can tell).
func (c *logicCodec[V, W, S]) Check() error {
	if ch, ok := c.snap.(interface{ Check() error }); ok {
		if err := ch.Check(); err != nil {
			return fmt.Errorf("the Logic's snapshot type cannot be stored: %w", err)
		}
	}
	return nil
}

func (c *logicCodec[V, W, S]) Encode(st logicState[V, W, S]) ([]byte, error) {
	return c.snap.Encode(st.logic.Snapshot())
}

func (c *logicCodec[V, W, S]) Decode(key string, data []byte) (logicState[V, W, S], error) {
	s, err := c.snap.Decode(key, data)
	if err != nil {
		return logicState[V, W, S]{}, err
	}
	l, err := c.build(key, &s)
	if err != nil {
		return logicState[V, W, S]{}, fmt.Errorf("key %q: build: %w", key, err)
	}
	if l == nil {
		return logicState[V, W, S]{}, fmt.Errorf("key %q: build returned a nil Logic", key)
	}
	return logicState[V, W, S]{logic: l}, nil
}

// AppendEncode makes checkedCodec a dataflow.AppendCodec when the codec it wraps is one (the
// default codecs are), so that stateful steps encode an epoch's states into shared buffers.
func (c checkedCodec[S]) AppendEncode(dst []byte, s S) ([]byte, error) {
	if a, ok := c.Codec.(dataflow.AppendCodec[S]); ok {
		return a.AppendEncode(dst, s)
	}
	b, err := c.Codec.Encode(s)
	return append(dst, b...), err
}
