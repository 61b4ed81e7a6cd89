package operators

import (
	"fmt"
	"iter"
	"slices"

	"github.com/epochflow/epochflow/dataflow"
)

// Every stateless operator here but Inspect is a dataflow.TransformInto, whose output memory
// the engine reuses from batch to batch, and whose batch function is a tight loop with one
// deferred recover per batch (recoverItem), so that a panic names the item without a closure
// call per item.

// Map adds a step that replaces every item x with fn(x).
//
// State: none. Epochs: output items keep the epoch of their input. EOF: the output ends when in
// ends. A panic in fn stops the flow with an error naming the step, the worker and the item.
func Map[T, U any](name string, in dataflow.Stream[T], fn func(T) U) dataflow.Stream[U] {
	if !usable(name, in, "the map function", fn == nil) {
		return dataflow.Stream[U]{}
	}
	return dataflow.TransformInto(name, in, func(batch []T, out []U) (_ []U, err error) {
		i := 0
		defer recoverItem(batch, &i, &err)
		out = slices.Grow(out, len(batch))[:len(batch)]
		for ; i < len(batch); i++ {
			out[i] = fn(batch[i])
		}
		return out, nil
	})
}

// MapErr is Map for a function that can fail: an error from fn stops the flow with an error
// naming the step, the worker and the item (a *dataflow.StepError wrapping a
// *dataflow.ItemError wrapping fn's error).
//
// State: none. Epochs: output items keep the epoch of their input. EOF: the output ends when in
// ends.
func MapErr[T, U any](name string, in dataflow.Stream[T], fn func(T) (U, error)) dataflow.Stream[U] {
	if !usable(name, in, "the map function", fn == nil) {
		return dataflow.Stream[U]{}
	}
	return dataflow.TransformInto(name, in, func(batch []T, out []U) (_ []U, err error) {
		i := 0
		defer recoverItem(batch, &i, &err)
		out = slices.Grow(out, len(batch))[:len(batch)]
		for ; i < len(batch); i++ {
			u, err := fn(batch[i])
			if err != nil {
				return nil, dataflow.ItemErr(batch[i], err)
			}
			out[i] = u
		}
		return out, nil
	})
}

// MapValue adds a step that replaces the value v of every item of a keyed stream with fn(v),
// keeping the key. It does not exchange items: they stay on their worker.
//
// State: none. Epochs: output items keep the epoch of their input. EOF: the output ends when in
// ends. A panic in fn stops the flow, naming the item (key and value).
func MapValue[V, W any](name string, in dataflow.Stream[dataflow.KV[V]], fn func(V) W) dataflow.Stream[dataflow.KV[W]] {
	if !usable(name, in, "the map function", fn == nil) {
		return dataflow.Stream[dataflow.KV[W]]{}
	}
	return dataflow.TransformInto(name, in, func(batch []dataflow.KV[V], out []dataflow.KV[W]) (_ []dataflow.KV[W], err error) {
		i := 0
		defer recoverItem(batch, &i, &err)
		out = slices.Grow(out, len(batch))[:len(batch)]
		for ; i < len(batch); i++ {
			out[i] = dataflow.KV[W]{Key: batch[i].Key, Value: fn(batch[i].Value)}
		}
		return out, nil
	})
}

// filter appends the items of batch for which pred is true to out.
func filter[T any](batch, out []T, pred func(T) bool) (_ []T, err error) {
	i := 0
	defer recoverItem(batch, &i, &err)
	out = slices.Grow(out, len(batch))
	for ; i < len(batch); i++ {
		if pred(batch[i]) {
			out = append(out, batch[i])
		}
	}
	return out, nil
}

// Filter adds a step that keeps the items for which pred returns true and drops the others.
//
// State: none. Epochs: items keep their epoch. EOF: the output ends when in ends. A panic in
// pred stops the flow, naming the item.
func Filter[T any](name string, in dataflow.Stream[T], pred func(T) bool) dataflow.Stream[T] {
	if !usable(name, in, "the predicate", pred == nil) {
		return dataflow.Stream[T]{}
	}
	return dataflow.TransformInto(name, in, func(batch, out []T) ([]T, error) { return filter(batch, out, pred) })
}

// FilterValue adds a step that keeps the items of a keyed stream whose value satisfies pred.
//
// State: none. Epochs: items keep their epoch. EOF: the output ends when in ends. A panic in
// pred stops the flow, naming the item.
func FilterValue[V any](name string, in dataflow.Stream[dataflow.KV[V]], pred func(V) bool) dataflow.Stream[dataflow.KV[V]] {
	if !usable(name, in, "the predicate", pred == nil) {
		return dataflow.Stream[dataflow.KV[V]]{}
	}
	return dataflow.TransformInto(name, in, func(batch, out []dataflow.KV[V]) ([]dataflow.KV[V], error) {
		return filter(batch, out, func(kv dataflow.KV[V]) bool { return pred(kv.Value) })
	})
}

// FilterErr is Filter for a predicate that can fail: an error stops the flow with an error
// naming the step, the worker and the item.
//
// State: none. Epochs: items keep their epoch. EOF: the output ends when in ends.
func FilterErr[T any](name string, in dataflow.Stream[T], pred func(T) (bool, error)) dataflow.Stream[T] {
	if !usable(name, in, "the predicate", pred == nil) {
		return dataflow.Stream[T]{}
	}
	return dataflow.TransformInto(name, in, func(batch, out []T) (_ []T, err error) {
		i := 0
		defer recoverItem(batch, &i, &err)
		out = slices.Grow(out, len(batch))
		for ; i < len(batch); i++ {
			ok, err := pred(batch[i])
			if err != nil {
				return nil, dataflow.ItemErr(batch[i], err)
			}
			if ok {
				out = append(out, batch[i])
			}
		}
		return out, nil
	})
}

// FilterMap adds a step that calls fn on every item and emits its result when fn returns true
// (and nothing otherwise): a Map and a Filter in one pass.
//
// State: none. Epochs: output items keep the epoch of their input. EOF: the output ends when in
// ends. A panic in fn stops the flow, naming the item.
func FilterMap[T, U any](name string, in dataflow.Stream[T], fn func(T) (U, bool)) dataflow.Stream[U] {
	if !usable(name, in, "the filter-map function", fn == nil) {
		return dataflow.Stream[U]{}
	}
	return dataflow.TransformInto(name, in, func(batch []T, out []U) (_ []U, err error) {
		i := 0
		defer recoverItem(batch, &i, &err)
		out = slices.Grow(out, len(batch))
		for ; i < len(batch); i++ {
			if u, ok := fn(batch[i]); ok {
				out = append(out, u)
			}
		}
		return out, nil
	})
}

// FilterMapErr is FilterMap for a function that can fail: an error stops the flow with an error
// naming the step, the worker and the item.
//
// State: none. Epochs: output items keep the epoch of their input. EOF: the output ends when in
// ends.
func FilterMapErr[T, U any](name string, in dataflow.Stream[T], fn func(T) (U, bool, error)) dataflow.Stream[U] {
	if !usable(name, in, "the filter-map function", fn == nil) {
		return dataflow.Stream[U]{}
	}
	return dataflow.TransformInto(name, in, func(batch []T, out []U) (_ []U, err error) {
		i := 0
		defer recoverItem(batch, &i, &err)
		out = slices.Grow(out, len(batch))
		for ; i < len(batch); i++ {
			u, ok, err := fn(batch[i])
			if err != nil {
				return nil, dataflow.ItemErr(batch[i], err)
			}
			if ok {
				out = append(out, u)
			}
		}
		return out, nil
	})
}

// FlatMap adds a step that replaces every item x with the items of fn(x), in order (none when
// fn returns an empty slice). The slice fn returns is copied: fn may reuse it.
//
// State: none. Epochs: output items keep the epoch of their input. EOF: the output ends when in
// ends. A panic in fn stops the flow, naming the item.
func FlatMap[T, U any](name string, in dataflow.Stream[T], fn func(T) []U) dataflow.Stream[U] {
	if !usable(name, in, "the flat-map function", fn == nil) {
		return dataflow.Stream[U]{}
	}
	return dataflow.TransformInto(name, in, func(batch []T, out []U) (_ []U, err error) {
		i := 0
		defer recoverItem(batch, &i, &err)
		out = slices.Grow(out, len(batch))
		for ; i < len(batch); i++ {
			us := fn(batch[i])
			if len(out)+len(us) > cap(out) {
				out = grow(out, len(us), i+1, len(batch))
			}
			out = append(out, us...)
		}
		return out, nil
	})
}

// FlatMapSeq adds a step that replaces every item x with the items fn(x) yields, in order:
// FlatMap for a function that returns an iterator, such as strings.FieldsSeq, so that no
// slice is built per item. Use it on hot paths where FlatMap's per-item slices would keep
// the garbage collector busy.
//
// State: none. Epochs: output items keep the epoch of their input. EOF: the output ends when in
// ends. A panic in fn or in the iterator stops the flow, naming the item.
func FlatMapSeq[T, U any](name string, in dataflow.Stream[T], fn func(T) iter.Seq[U]) dataflow.Stream[U] {
	if !usable(name, in, "the flat-map function", fn == nil) {
		return dataflow.Stream[U]{}
	}
	return dataflow.TransformInto(name, in, func(batch []T, out []U) (_ []U, err error) {
		i := 0
		defer recoverItem(batch, &i, &err)
		out = slices.Grow(out, len(batch))
		// One yield function per batch, not one per item as a range-over-func loop would
		// allocate.
		yield := func(u U) bool {
			out = append(out, u)
			return true
		}
		for ; i < len(batch); i++ {
			fn(batch[i])(yield)
		}
		return out, nil
	})
}

// FlatMapErr is FlatMap for a function that can fail: an error stops the flow with an error
// naming the step, the worker and the item.
//
// State: none. Epochs: output items keep the epoch of their input. EOF: the output ends when in
// ends.
func FlatMapErr[T, U any](name string, in dataflow.Stream[T], fn func(T) ([]U, error)) dataflow.Stream[U] {
	if !usable(name, in, "the flat-map function", fn == nil) {
		return dataflow.Stream[U]{}
	}
	return dataflow.TransformInto(name, in, func(batch []T, out []U) (_ []U, err error) {
		i := 0
		defer recoverItem(batch, &i, &err)
		out = slices.Grow(out, len(batch))
		for ; i < len(batch); i++ {
			us, err := fn(batch[i])
			if err != nil {
				return nil, dataflow.ItemErr(batch[i], err)
			}
			if len(out)+len(us) > cap(out) {
				out = grow(out, len(us), i+1, len(batch))
			}
			out = append(out, us...)
		}
		return out, nil
	})
}

// FlatMapValue adds a step that replaces every item (k, v) of a keyed stream with one item
// (k, w) for every w of fn(v).
//
// State: none. Epochs: output items keep the epoch of their input. EOF: the output ends when in
// ends. A panic in fn stops the flow, naming the item.
func FlatMapValue[V, W any](name string, in dataflow.Stream[dataflow.KV[V]], fn func(V) []W) dataflow.Stream[dataflow.KV[W]] {
	if !usable(name, in, "the flat-map function", fn == nil) {
		return dataflow.Stream[dataflow.KV[W]]{}
	}
	return dataflow.TransformInto(name, in, func(batch []dataflow.KV[V], out []dataflow.KV[W]) (_ []dataflow.KV[W], err error) {
		i := 0
		defer recoverItem(batch, &i, &err)
		out = slices.Grow(out, len(batch))
		for ; i < len(batch); i++ {
			ws := fn(batch[i].Value)
			if len(out)+len(ws) > cap(out) {
				out = grow(out, len(ws), i+1, len(batch))
			}
			for _, w := range ws {
				out = append(out, dataflow.KV[W]{Key: batch[i].Key, Value: w})
			}
		}
		return out, nil
	})
}

// grow returns a copy of out with room for at least more items, when done of total input
// items have been handled. Once it has seen a few items it projects the final length from the
// output per input item so far (plus an eighth), so that a flat map copies its output about
// once instead of log n times; the projection is capped at 4 times the length needed now, so
// an outlier item cannot make it allocate much more than the output it has.
func grow[U any](out []U, more, done, total int) []U {
	need := len(out) + more
	size := max(need, 2*cap(out))
	if done >= 16 {
		est := need * total / done
		size = max(need, cap(out)+cap(out)/4, min(est+est/8, 4*need))
	}
	grown := make([]U, len(out), size)
	copy(grown, out)
	return grown
}

// Flatten adds a step that replaces every slice item with its elements, in order.
//
// State: none. Epochs: output items keep the epoch of their input. EOF: the output ends when in
// ends.
func Flatten[T any](name string, in dataflow.Stream[[]T]) dataflow.Stream[T] {
	if !usable(name, in, "", false) {
		return dataflow.Stream[T]{}
	}
	return dataflow.TransformInto(name, in, func(batch [][]T, out []T) ([]T, error) {
		n := 0
		for _, s := range batch {
			n += len(s)
		}
		out = slices.Grow(out, n)
		for _, s := range batch {
			out = append(out, s...)
		}
		return out, nil
	})
}

// Inspect adds a step that calls fn on every item (to log or count it) and passes the items on
// unchanged: the output batch is the input batch. fn must not modify the item (a pointer's
// target or a slice's elements).
//
// State: none. Epochs: items keep their epoch. EOF: the output ends when in ends. A panic in fn
// stops the flow, naming the item.
func Inspect[T any](name string, in dataflow.Stream[T], fn func(T)) dataflow.Stream[T] {
	if !usable(name, in, "the inspect function", fn == nil) {
		return dataflow.Stream[T]{}
	}
	return dataflow.Transform(name, in, func(batch []T) (out []T, err error) {
		i := 0
		defer recoverItem(batch, &i, &err)
		for ; i < len(batch); i++ {
			fn(batch[i])
		}
		return batch, nil
	})
}

// Branch adds a step that sends every item for which pred returns true to trues and every other
// item to falses.
//
// State: none. Epochs: items keep their epoch. EOF: both outputs end when in ends. A panic in
// pred stops the flow, naming the item.
func Branch[T any](name string, in dataflow.Stream[T], pred func(T) bool) (trues, falses dataflow.Stream[T]) {
	if !usable(name, in, "the predicate", pred == nil) {
		return dataflow.Stream[T]{}, dataflow.Stream[T]{}
	}
	return dataflow.Split(name, in, func(item T) (bool, error) { return pred(item), nil })
}

// Merge adds a step whose output carries every item of every input. All inputs must belong to
// the same flow; a zero input among valid ones is recorded as a build error.
//
// State: none. Epochs: items keep their epoch; an epoch ends on the output when it has ended on
// every input. EOF: the output ends when every input has ended.
func Merge[T any](name string, ins ...dataflow.Stream[T]) dataflow.Stream[T] {
	if !sameFlow(name, ins) {
		return dataflow.Stream[T]{}
	}
	return dataflow.Merge(name, ins...)
}

// sameFlow checks that every stream of ins is valid and belongs to one flow, recording a build
// error on that flow when a stream is zero or belongs to another flow.
func sameFlow[T any](name string, ins []dataflow.Stream[T]) bool {
	var f *dataflow.Flow
	for _, in := range ins {
		if in.Flow() != nil {
			f = in.Flow()
			break
		}
	}
	if f == nil || f.Err() != nil {
		return false
	}
	for i, in := range ins {
		switch {
		case in.Flow() == nil:
			f.Fail(fmt.Errorf("step %q: input %d is a zero Stream", stepID(f, name), i))
			return false
		case in.Flow() != f:
			f.Fail(fmt.Errorf("step %q: input %d belongs to flow %q, not %q", stepID(f, name), i, in.Flow().Name(), f.Name()))
			return false
		}
	}
	return true
}

// Redistribute adds a step that spreads the items of in over all workers, to share out the
// work behind a source with few partitions (one file, one queue) or among workers that run at
// different speeds: each batch goes whole to the worker with the fewest batches of this step
// waiting (in turn among equals), so a busy or slow worker gets less.
//
// State: none. Epochs: items keep their epoch. EOF: the output ends when in ends.
func Redistribute[T any](name string, in dataflow.Stream[T]) dataflow.Stream[T] {
	return dataflow.Redistribute(name, in)
}

// KeyOn adds a step that turns every item x into the keyed item (key(x), x), ready for the
// keyed operators. It does not move items between workers; the keyed operators do.
//
// State: none. Epochs: items keep their epoch. EOF: the output ends when in ends. A panic in
// key stops the flow, naming the item.
func KeyOn[T any](name string, in dataflow.Stream[T], key func(T) string) dataflow.Stream[dataflow.KV[T]] {
	if !usable(name, in, "the key function", key == nil) {
		return dataflow.Stream[dataflow.KV[T]]{}
	}
	return dataflow.TransformInto(name, in, func(batch []T, out []dataflow.KV[T]) (_ []dataflow.KV[T], err error) {
		i := 0
		defer recoverItem(batch, &i, &err)
		out = slices.Grow(out, len(batch))[:len(batch)]
		for ; i < len(batch); i++ {
			out[i] = dataflow.KV[T]{Key: key(batch[i]), Value: batch[i]}
		}
		return out, nil
	})
}

// KeyRm adds a step that drops the key of every item of a keyed stream, keeping the value.
//
// State: none. Epochs: items keep their epoch. EOF: the output ends when in ends.
func KeyRm[V any](name string, in dataflow.Stream[dataflow.KV[V]]) dataflow.Stream[V] {
	if !usable(name, in, "", false) {
		return dataflow.Stream[V]{}
	}
	return dataflow.TransformInto(name, in, func(batch []dataflow.KV[V], out []V) ([]V, error) {
		out = slices.Grow(out, len(batch))[:len(batch)]
		for i := range batch {
			out[i] = batch[i].Value
		}
		return out, nil
	})
}
