package windows

import (
	"cmp"
	"slices"

	"github.com/epochflow/epochflow/dataflow"
)

// Fold aggregates each window of each key into an A: init gives a new window's accumulator and
// fn adds an item. For Session windows, merge joins two sessions' accumulators (nil is allowed
// for the others). State, epochs, watermarks, late items and EOF are as for Apply.
func Fold[V, A any](name string, in dataflow.Stream[dataflow.KV[V]], clock dataflow.Clock[V], w Windower, init func() A, fn func(acc A, item V) A, merge func(a, b A) A, opts ...Options) Outputs[V, A] {
	var open func(string, Window) A
	if init != nil {
		open = func(string, Window) A { return init() }
	}
	return Apply(name, in, clock, w, Logic[V, A, A]{
		Open:  open,
		Add:   fn,
		Merge: merge,
		Close: func(_ string, _ Window, acc A) A { return acc },
	}, opts...)
}

// reduced is Reduce's accumulator: the value and whether there is one.
type reduced[V any] struct {
	V   V
	Set bool
}

// Reduce combines the items of each window of each key with fn (which must be associative: a
// session merge combines two partial results). The result is the combination of the window's
// items in the order they came. State, epochs, watermarks, late items and EOF are as for Apply.
func Reduce[V any](name string, in dataflow.Stream[dataflow.KV[V]], clock dataflow.Clock[V], w Windower, fn func(acc, item V) V, opts ...Options) Outputs[V, V] {
	return Apply(name, in, clock, w, Logic[V, reduced[V], V]{
		Add: func(acc reduced[V], item V) reduced[V] {
			if !acc.Set {
				return reduced[V]{V: item, Set: true}
			}
			return reduced[V]{V: fn(acc.V, item), Set: true}
		},
		Merge: func(a, b reduced[V]) reduced[V] {
			switch {
			case !a.Set:
				return b
			case !b.Set:
				return a
			}
			return reduced[V]{V: fn(a.V, b.V), Set: true}
		},
		Close: func(_ string, _ Window, acc reduced[V]) V { return acc.V },
	}, opts...)
}

// Count counts the items of each window of each key. State, epochs, watermarks, late items and
// EOF are as for Apply.
func Count[V any](name string, in dataflow.Stream[dataflow.KV[V]], clock dataflow.Clock[V], w Windower, opts ...Options) Outputs[V, int] {
	return Apply(name, in, clock, w, Logic[V, int, int]{
		Add:   func(n int, _ V) int { return n + 1 },
		Merge: func(a, b int) int { return a + b },
		Close: func(_ string, _ Window, n int) int { return n },
	}, opts...)
}

// Collect gathers the items of each window of each key in a slice, in the order they came (a
// merged session: the earlier session's items, then the later's). Every result is a new slice.
// State, epochs, watermarks, late items and EOF are as for Apply.
func Collect[V any](name string, in dataflow.Stream[dataflow.KV[V]], clock dataflow.Clock[V], w Windower, opts ...Options) Outputs[V, []V] {
	return Apply(name, in, clock, w, Logic[V, []V, []V]{
		Add:   func(acc []V, item V) []V { return append(acc, item) },
		Merge: func(a, b []V) []V { return append(a, b...) },
		Close: func(_ string, _ Window, acc []V) []V { return slices.Clone(acc) },
	}, opts...)
}

// Max gives the largest item of each window of each key. State, epochs, watermarks, late items
// and EOF are as for Apply.
func Max[V cmp.Ordered](name string, in dataflow.Stream[dataflow.KV[V]], clock dataflow.Clock[V], w Windower, opts ...Options) Outputs[V, V] {
	return Reduce(name, in, clock, w, func(a, b V) V { return max(a, b) }, opts...)
}

// Min gives the smallest item of each window of each key. State, epochs, watermarks, late items
// and EOF are as for Apply.
func Min[V cmp.Ordered](name string, in dataflow.Stream[dataflow.KV[V]], clock dataflow.Clock[V], w Windower, opts ...Options) Outputs[V, V] {
	return Reduce(name, in, clock, w, func(a, b V) V { return min(a, b) }, opts...)
}
