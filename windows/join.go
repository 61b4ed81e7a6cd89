package windows

import (
	"fmt"
	"slices"
	"time"

	"github.com/epochflow/epochflow/dataflow"
	"github.com/epochflow/epochflow/operators"
)

// Either is an item of one of the two sides of a Join2 or an IntervalJoin: Left when IsRight is
// false, else Right. Their late streams carry them.
type Either[A, B any] struct {
	Left    A
	Right   B
	IsRight bool
}

// Pair is a row of a Join2: an item of each side, or nil for a side that had none in the window
// (JoinFinal and JoinRunning).
type Pair[A, B any] struct {
	Left  *A
	Right *B
}

// JoinMode says when a window join (Join, Join2) gives rows, as operators.Join's EmitMode does
// for a key.
type JoinMode uint8

const (
	// JoinComplete gives the rows of windows in which every side has items (an inner join per
	// window), once per window when it closes: every item of each side with every item of the
	// others. The default.
	JoinComplete JoinMode = iota
	// JoinFinal gives rows for every window when it closes: the product of the sides' items, a
	// side with none giving one missing entry (a full outer join per window).
	JoinFinal
	// JoinRunning gives, each time an item is added to a window, the window's rows so far (as
	// JoinFinal would give them then), marked Early while the window is open; nothing more
	// when it closes, as the last of them holds every row. An item within the allowed lateness
	// gives them again, marked Update. Options.Early does not apply.
	JoinRunning
)

// String returns the constant's name ("JoinComplete", ...).
func (m JoinMode) String() string {
	switch m {
	case JoinComplete:
		return "JoinComplete"
	case JoinFinal:
		return "JoinFinal"
	case JoinRunning:
		return "JoinRunning"
	}
	return fmt.Sprintf("JoinMode(%d)", uint8(m))
}

// checkJoin fails the flow, naming the step, when a join's mode or options do not go together.
func checkJoin(f *dataflow.Flow, name string, mode JoinMode, opts []Options) bool {
	switch {
	case mode > JoinRunning:
		f.Fail(fmt.Errorf("step %q: unknown join mode %v", name, mode))
	case mode == JoinRunning && firstOptions(opts).Early > 0:
		f.Fail(fmt.Errorf("step %q: JoinRunning emits at every item; Options.Early (%v) does not apply", name, firstOptions(opts).Early))
	default:
		return true
	}
	return false
}

// windowJoin adds the windowed step name of a window join, over the sides' items tagged and
// merged in one stream: Apply with logic (whose Close gives no rows for a window that JoinComplete
// skips), emitting at every item for JoinRunning, and for JoinComplete the step name+".rows",
// which drops the results without rows.
func windowJoin[T, A, R any](name string, both dataflow.Stream[dataflow.KV[T]], clock dataflow.Clock[T], w Windower, mode JoinMode,
	logic Logic[T, A, []R], opts []Options) Outputs[T, []R] {
	out := apply(name, both, clock, w, logic, firstOptions(opts), mode == JoinRunning)
	if mode == JoinComplete && out.Results.Flow() != nil {
		out.Results = dataflow.Transform(name+".rows", out.Results, func(b []Result[[]R]) ([]Result[[]R], error) {
			var keep []Result[[]R]
			for _, r := range b {
				if len(r.Value) > 0 {
					keep = append(keep, r)
				}
			}
			return keep, nil
		})
	}
	return out
}

// tagSide adds the step name, which wraps every value of a keyed stream with wrap.
func tagSide[In, T any](name string, in dataflow.Stream[dataflow.KV[In]], wrap func(In) T) dataflow.Stream[dataflow.KV[T]] {
	return dataflow.TransformInto(name, in, func(b []dataflow.KV[In], out []dataflow.KV[T]) ([]dataflow.KV[T], error) {
		out = slices.Grow(out, len(b))[:len(b)]
		for i, kv := range b {
			out[i] = dataflow.KV[T]{Key: kv.Key, Value: wrap(kv.Value)}
		}
		return out, nil
	})
}

// eitherSides tags the items of two sides as Either (steps name+".left" and name+".right") and
// merges them (name+".merge"), with one event-time clock of the given wait over both.
func eitherSides[A, B any](name string, left dataflow.Stream[dataflow.KV[A]], right dataflow.Stream[dataflow.KV[B]],
	leftTime func(A) time.Time, rightTime func(B) time.Time, wait time.Duration) (dataflow.Stream[dataflow.KV[Either[A, B]]], dataflow.Clock[Either[A, B]]) {
	l := tagSide(name+".left", left, func(a A) Either[A, B] { return Either[A, B]{Left: a} })
	r := tagSide(name+".right", right, func(b B) Either[A, B] { return Either[A, B]{Right: b, IsRight: true} })
	clock := dataflow.EventClock(func(e Either[A, B]) time.Time {
		if e.IsRight {
			return rightTime(e.Right)
		}
		return leftTime(e.Left)
	}, wait)
	return dataflow.Merge(name+".merge", l, r), clock
}

// joinAcc is a window's items of each side, in the order they came.
type joinAcc[A, B any] struct {
	Left  []A
	Right []B
}

// Join2 joins two keyed streams of different types per key and window: each window of a key
// emits the rows (Pair) of the left and right items that fell in it, by the items' event times
// (leftTime and rightTime) and one watermark with the given wait. The rows come as one Result
// per emission whose Value lists them (left items in the order they came, each with every
// right item in the order they came); mode says when (JoinComplete: at the window's end, if
// both sides have items; JoinFinal: at its end; JoinRunning: at every item).
//
// It adds the steps name+".left" and name+".right" (which tag the sides), name+".merge", then
// the windowed step name (see Apply, whose state, epochs, watermarks, late items and EOF
// apply: a late item of either side goes to the late stream, as an Either) and, for
// JoinComplete, name+".rows", which drops the windows with a side empty. Options work as for
// Apply (Options.IdleTimeout sets the clock's idle timeout); with Lateness a window's rows are
// emitted again, whole, as an Update, when an item within the lateness comes. With recovery, A
// and B are stored with the default codec, so they must be types it round-trips.
func Join2[A, B any](name string, left dataflow.Stream[dataflow.KV[A]], right dataflow.Stream[dataflow.KV[B]],
	leftTime func(A) time.Time, rightTime func(B) time.Time, wait time.Duration, w Windower, mode JoinMode, opts ...Options) Outputs[Either[A, B], []Pair[A, B]] {
	f := left.Flow()
	if f == nil || right.Flow() == nil {
		return Outputs[Either[A, B], []Pair[A, B]]{}
	}
	if leftTime == nil || rightTime == nil {
		f.Fail(fmt.Errorf("step %q: Join2 needs both time functions", name))
		return Outputs[Either[A, B], []Pair[A, B]]{}
	}
	if !checkJoin(f, name, mode, opts) {
		return Outputs[Either[A, B], []Pair[A, B]]{}
	}
	both, clock := eitherSides(name, left, right, leftTime, rightTime, wait)
	return windowJoin(name, both, clock, w, mode, Logic[Either[A, B], joinAcc[A, B], []Pair[A, B]]{
		Add: func(acc joinAcc[A, B], e Either[A, B]) joinAcc[A, B] {
			if e.IsRight {
				acc.Right = append(acc.Right, e.Right)
			} else {
				acc.Left = append(acc.Left, e.Left)
			}
			return acc
		},
		Merge: func(a, b joinAcc[A, B]) joinAcc[A, B] {
			return joinAcc[A, B]{Left: append(a.Left, b.Left...), Right: append(a.Right, b.Right...)}
		},
		Close: func(_ string, _ Window, acc joinAcc[A, B]) []Pair[A, B] { return pairs(acc, mode) },
	}, opts)
}

// pairs is the product of a window's sides; but for JoinComplete, a side with no item gives
// one nil entry.
func pairs[A, B any](acc joinAcc[A, B], mode JoinMode) []Pair[A, B] {
	if mode == JoinComplete && (len(acc.Left) == 0 || len(acc.Right) == 0) {
		return nil
	}
	ls := make([]*A, 0, max(len(acc.Left), 1))
	for i := range acc.Left {
		v := acc.Left[i]
		ls = append(ls, &v)
	}
	if len(ls) == 0 {
		ls = append(ls, nil)
	}
	rs := make([]*B, 0, max(len(acc.Right), 1))
	for i := range acc.Right {
		v := acc.Right[i]
		rs = append(rs, &v)
	}
	if len(rs) == 0 {
		rs = append(rs, nil)
	}
	out := make([]Pair[A, B], 0, len(ls)*len(rs))
	for _, l := range ls {
		for _, r := range rs {
			out = append(out, Pair[A, B]{Left: l, Right: r})
		}
	}
	return out
}

// Tagged is an item of a Join with the index of its side (its stream in the sides given). Join's
// late stream carries them.
type Tagged[V any] struct {
	Side  int
	Value V
}

// Join joins two or more keyed streams of one value type per key and window, as operators.Join
// (with InsertProduct) does per key: each window of a key emits the rows (operators.JoinRow, one
// entry per side in the order of sides) of the product of the items of each side that fell in
// it, by their event times from clock. Each Result's Value lists the rows, the last side
// varying fastest, each side's items in the order they came (operators.JoinProduct); mode says
// when they come (JoinComplete: at the window's end, if every side has items; JoinFinal: at its
// end, a side without items giving an entry with Present false; JoinRunning: at every item).
//
// It adds the steps name+".tag0", name+".tag1", ... (which tag each side with its index),
// name+".merge", the windowed step name and, for JoinComplete, name+".rows", which drops the
// windows with a side empty. State, epochs, watermarks, late items and EOF are as for Apply:
// the state is each open window's items of every side (stored with the default codec, so V
// must be a type it round-trips); a late item of any side goes to the late stream with its
// side; at EOF every window emits as its mode says. Options work as for Apply; with Lateness a
// window's rows are emitted again, whole, as an Update, when an item within the lateness comes.
// Fewer than two sides, or sides of different flows, is a build error recorded on the flow.
func Join[V any](name string, sides []dataflow.Stream[dataflow.KV[V]], clock dataflow.Clock[V], w Windower, mode JoinMode, opts ...Options) Outputs[Tagged[V], []operators.JoinRow[V]] {
	var zero Outputs[Tagged[V], []operators.JoinRow[V]]
	if len(sides) == 0 || sides[0].Flow() == nil {
		return zero
	}
	f := sides[0].Flow()
	if len(sides) < 2 {
		f.Fail(fmt.Errorf("step %q: a join needs at least 2 sides, got %d", name, len(sides)))
		return zero
	}
	for i, s := range sides {
		if s.Flow() == nil {
			return zero // a step before failed, and said so on its flow
		}
		if s.Flow() != f {
			f.Fail(fmt.Errorf("step %q: side %d belongs to flow %q, not %q", name, i, s.Flow().Name(), f.Name()))
			return zero
		}
	}
	if !checkJoin(f, name, mode, opts) {
		return zero
	}
	tagged := make([]dataflow.Stream[dataflow.KV[Tagged[V]]], len(sides))
	for i, s := range sides {
		tagged[i] = tagSide(fmt.Sprintf("%s.tag%d", name, i), s, func(v V) Tagged[V] { return Tagged[V]{Side: i, Value: v} })
	}
	both := dataflow.Merge(name+".merge", tagged...)
	tclock := dataflow.Clock[Tagged[V]]{Wait: clock.Wait, IdleTimeout: clock.IdleTimeout, MaxDrift: clock.MaxDrift}
	if ts := clock.Timestamp; ts != nil {
		tclock.Timestamp = func(t Tagged[V]) time.Time { return ts(t.Value) }
	}
	n := len(sides)
	return windowJoin(name, both, tclock, w, mode, Logic[Tagged[V], [][]V, []operators.JoinRow[V]]{
		Open: func(string, Window) [][]V { return make([][]V, n) },
		Add: func(acc [][]V, t Tagged[V]) [][]V {
			acc[t.Side] = append(acc[t.Side], t.Value)
			return acc
		},
		Merge: func(a, b [][]V) [][]V {
			for i := range a {
				a[i] = append(a[i], b[i]...)
			}
			return a
		},
		Close: func(_ string, _ Window, acc [][]V) []operators.JoinRow[V] {
			if mode == JoinComplete && slices.ContainsFunc(acc, func(l []V) bool { return len(l) == 0 }) {
				return nil
			}
			return operators.JoinProduct(acc)
		},
	}, opts)
}
