package operators

import (
	"cmp"
	"errors"
	"fmt"
	"time"

	"github.com/epochflow/epochflow/dataflow"
)

// final adds a keyed step that folds every value of a key into a state S with step and, at
// EOF, emits the state once and discards it: the shape of Reduce, Fold, Count, Max and Min (op,
// named in the error of a state type the default codec cannot store).
func final[V, S any](op, name string, in dataflow.Stream[dataflow.KV[V]], step func(key string, state *S, exists bool, v V)) dataflow.Stream[dataflow.KV[S]] {
	return dataflow.Stateful(name, in, dataflow.StatefulLogic[V, S, S]{
		Codec: defaultCodec[S](noCodecAdvice(op)),
		OnItem: func(key string, state *S, exists bool, v V, _ *dataflow.Emitter[S]) (bool, error) {
			step(key, state, exists, v)
			return true, nil
		},
		OnEOF: func(_ string, state *S, out *dataflow.Emitter[S]) (bool, error) {
			out.Emit(*state)
			return false, nil
		},
	})
}

// combined puts a combiner (dataflow.Combine) named name+".combine" before a keyed step that
// merges values with merge, so that each worker sends one value per key and epoch.
func combined[V any](name string, in dataflow.Stream[dataflow.KV[V]], merge func(acc, v V) V) dataflow.Stream[dataflow.KV[V]] {
	return dataflow.Combine(name+".combine", in,
		func(kv dataflow.KV[V]) string { return kv.Key },
		func(kv dataflow.KV[V]) V { return kv.Value }, merge)
}

// Reduce adds a keyed step that combines all values of a key into one with fn, in the order
// they arrive at the key's worker: the first value is the accumulator, then acc = fn(acc, v)
// for each later value. Like Bytewax's reduce_final, it emits one item per key at EOF.
//
// State: the accumulator per key. Epochs: the state carries across epochs and nothing is
// emitted before EOF. EOF: every key's accumulator is emitted (in the epoch open at EOF) and
// discarded. A panic in fn stops the flow, naming the item.
func Reduce[V any](name string, in dataflow.Stream[dataflow.KV[V]], fn func(acc, v V) V) dataflow.Stream[dataflow.KV[V]] {
	if !usable(name, in, "the reduce function", fn == nil) {
		return dataflow.Stream[dataflow.KV[V]]{}
	}
	return final("operators.Reduce", name, in, func(_ string, acc *V, exists bool, v V) {
		if exists {
			*acc = fn(*acc, v)
		} else {
			*acc = v
		}
	})
}

// Fold adds a keyed step that folds all values of a key into an accumulator: init(key) makes
// the key's accumulator at its first value, then acc = fn(acc, v) for every value, in the
// order they arrive at the key's worker. Like Bytewax's fold_final, it emits one item per key
// at EOF.
//
// State: the accumulator per key. Epochs: the state carries across epochs and nothing is
// emitted before EOF. EOF: every key's accumulator is emitted and discarded. A panic in init or
// fn stops the flow, naming the item.
func Fold[V, A any](name string, in dataflow.Stream[dataflow.KV[V]], init func(key string) A, fn func(acc A, v V) A) dataflow.Stream[dataflow.KV[A]] {
	if !usable(name, in, "the init function", init == nil) || !usable(name, in, "the fold function", fn == nil) {
		return dataflow.Stream[dataflow.KV[A]]{}
	}
	return final("operators.Fold", name, in, func(key string, acc *A, exists bool, v V) {
		if !exists {
			*acc = init(key)
		}
		*acc = fn(*acc, v)
	})
}

// Count adds a step that counts the items of in per key(item) and emits (key, count) once per
// key at EOF, like Bytewax's count_final. It keys the items in an internal step named
// name+".key" (where a panic in key is reported), then counts in the step named name.
//
// State: a count per key. Epochs: the counts carry across epochs and nothing is emitted before
// EOF. EOF: every key's count is emitted and discarded.
func Count[T any](name string, in dataflow.Stream[T], key func(T) string) dataflow.Stream[dataflow.KV[int]] {
	if !usable(name, in, "the key function", key == nil) || !validName(in.Flow(), name) {
		return dataflow.Stream[dataflow.KV[int]]{}
	}
	// Each worker counts its own items per key and epoch first (a combiner), so one partial
	// count per key and worker crosses the exchange, however hot the key.
	counts := dataflow.Combine(name+".combine", in, key, func(T) int { return 1 }, func(a, b int) int { return a + b })
	return final("operators.Count", name, counts, func(_ string, n *int, _ bool, v int) { *n += v })
}

// validName records a build error for an empty name, which would give a composite operator's
// internal steps confusing ids.
func validName(f *dataflow.Flow, name string) bool {
	if name == "" {
		f.Fail(errors.New("step name: empty name"))
		return false
	}
	return true
}

// Max adds a keyed step that emits, once per key at EOF, the largest value of the key (the
// first of equal ones; a NaN is smaller than any number, as cmp.Less has it).
//
// State: the largest value so far per key. Epochs: the state carries across epochs and nothing
// is emitted before EOF. EOF: every key's maximum is emitted and discarded.
func Max[V cmp.Ordered](name string, in dataflow.Stream[dataflow.KV[V]]) dataflow.Stream[dataflow.KV[V]] {
	return MaxBy(name, in, cmp.Less[V])
}

// Min adds a keyed step that emits, once per key at EOF, the smallest value of the key (the
// first of equal ones; a NaN is smaller than any number, as cmp.Less has it).
//
// State: the smallest value so far per key. Epochs: the state carries across epochs and nothing
// is emitted before EOF. EOF: every key's minimum is emitted and discarded.
func Min[V cmp.Ordered](name string, in dataflow.Stream[dataflow.KV[V]]) dataflow.Stream[dataflow.KV[V]] {
	return MinBy(name, in, cmp.Less[V])
}

// MaxBy is Max ordering values with less (a strict weak order): it keeps a new value only when
// the value kept so far is less than it. A panic in less stops the flow, naming the item.
//
// State: the largest value so far per key. Epochs: the state carries across epochs and nothing
// is emitted before EOF. EOF: every key's maximum is emitted and discarded.
func MaxBy[V any](name string, in dataflow.Stream[dataflow.KV[V]], less func(a, b V) bool) dataflow.Stream[dataflow.KV[V]] {
	if !usable(name, in, "the less function", less == nil) {
		return dataflow.Stream[dataflow.KV[V]]{}
	}
	larger := func(m, v V) V {
		if less(m, v) {
			return v
		}
		return m
	}
	return final("operators.MaxBy", name, combined(name, in, larger), func(_ string, m *V, exists bool, v V) {
		if !exists {
			*m = v
		} else {
			*m = larger(*m, v)
		}
	})
}

// MinBy is Min ordering values with less (a strict weak order): it keeps a new value only when
// it is less than the value kept so far. A panic in less stops the flow, naming the item.
//
// State: the smallest value so far per key. Epochs: the state carries across epochs and nothing
// is emitted before EOF. EOF: every key's minimum is emitted and discarded.
func MinBy[V any](name string, in dataflow.Stream[dataflow.KV[V]], less func(a, b V) bool) dataflow.Stream[dataflow.KV[V]] {
	if !usable(name, in, "the less function", less == nil) {
		return dataflow.Stream[dataflow.KV[V]]{}
	}
	smaller := func(m, v V) V {
		if less(v, m) {
			return v
		}
		return m
	}
	return final("operators.MinBy", name, combined(name, in, smaller), func(_ string, m *V, exists bool, v V) {
		if !exists {
			*m = v
		} else {
			*m = smaller(*m, v)
		}
	})
}

// collectState is a Collect step's state per key. Its fields are exported so that the
// default codec stores it in the recovery store.
type collectState[V any] struct {
	Items    []V
	Deadline time.Time
}

// Collect adds a keyed step that gathers the values of each key into lists, in the order they
// arrive at the key's worker. A key's list is emitted when it holds maxItems values (if
// maxItems > 0), when timeout has passed since its first value (if timeout > 0), or at EOF,
// whichever comes first; the key's next value starts a new list. maxItems == 0 means no size
// bound and timeout == 0 no time bound; a negative one, or neither bound, is a build error
// recorded on the flow. The timeout is system time, delivered by the worker loop, so it fires
// also while the input is idle.
//
// State: the list being filled per key (and its deadline); it is discarded when emitted.
// Epochs: lists carry across epochs; a full list carries the epoch of its last value, a timed
// out one the epoch open on the worker when the timeout fired. EOF: every remaining list is
// emitted and discarded.
func Collect[V any](name string, in dataflow.Stream[dataflow.KV[V]], maxItems int, timeout time.Duration) dataflow.Stream[dataflow.KV[[]V]] {
	if !usable(name, in, "", false) {
		return dataflow.Stream[dataflow.KV[[]V]]{}
	}
	var bad string
	switch {
	case maxItems < 0:
		bad = fmt.Sprintf("maxItems is %d; it must be at least 1, or 0 for no size bound", maxItems)
	case timeout < 0:
		bad = fmt.Sprintf("timeout is %v; it must be positive, or 0 for no time bound", timeout)
	case maxItems == 0 && timeout == 0:
		bad = "neither maxItems nor timeout is set: a list would grow until EOF"
	}
	if bad != "" {
		in.Flow().Fail(fmt.Errorf("step %q: %s", stepID(in.Flow(), name), bad))
		return dataflow.Stream[dataflow.KV[[]V]]{}
	}
	logic := dataflow.StatefulLogic[V, collectState[V], []V]{
		Codec: defaultCodec[collectState[V]](noCodecAdvice("operators.Collect")),
		OnItem: func(_ string, s *collectState[V], _ bool, v V, out *dataflow.Emitter[[]V]) (bool, error) {
			if len(s.Items) == 0 && timeout > 0 {
				s.Deadline = time.Now().Add(timeout)
			}
			s.Items = append(s.Items, v)
			if maxItems > 0 && len(s.Items) >= maxItems {
				out.Emit(s.Items)
				return false, nil
			}
			return true, nil
		},
		OnNotify: func(_ string, s *collectState[V], _ time.Time, out *dataflow.Emitter[[]V]) (bool, error) {
			if len(s.Items) > 0 {
				out.Emit(s.Items)
			}
			return false, nil
		},
		OnEOF: func(_ string, s *collectState[V], out *dataflow.Emitter[[]V]) (bool, error) {
			if len(s.Items) > 0 {
				out.Emit(s.Items)
			}
			return false, nil
		},
	}
	if timeout > 0 {
		logic.NotifyAt = func(_ string, s *collectState[V]) time.Time { return s.Deadline }
	}
	return dataflow.Stateful(name, in, logic)
}
