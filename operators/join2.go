package operators

import (
	"fmt"
	"time"

	"github.com/epochflow/epochflow/dataflow"
)

// Join2Options configures a Join2: Insert and Emit as for Join (the zero value is InsertLast,
// EmitComplete), and a TTL.
type Join2Options struct {
	Insert InsertMode
	Emit   EmitMode
	// TTL, when positive, bounds how long a key's state lives, counted in wall-clock time from
	// the key's first value: then EmitFinal emits the key's rows as at EOF, and every mode
	// discards the state, so a key whose other side never comes does not live forever. The
	// deadline is part of the state and survives a resume. Zero keeps state until the mode
	// discards it or EOF.
	TTL time.Duration
}

// Row2 is one row of a Join2: a value of each side, nil for a side without one (EmitFinal,
// EmitRunning). Each row owns its values.
type Row2[A, B any] struct {
	Left  *A
	Right *B
}

// side2 is a value of one of Join2's sides.
type side2[A, B any] struct {
	Left    A
	Right   B
	IsRight bool
}

// join2State is a key's values of each side, and the key's TTL deadline.
type join2State[A, B any] struct {
	Left     []A
	Right    []B
	Deadline time.Time
}

// Join2 joins two keyed streams of different value types by key: the unwindowed, typed form of
// Join. Rows carry a *A and a *B. InsertLast and InsertFirst keep one value per side,
// InsertProduct all of them (rows are then the product, left values in order, each with every
// right value in order); EmitComplete emits once both sides have a value and discards the key,
// EmitFinal emits at EOF (or at the TTL) whatever sides are present, EmitRunning emits the
// key's rows after every value. For a join by time, see the windows package (Join2 per window,
// IntervalJoin).
//
// It adds the steps name+".left", name+".right", name+".merge" and the keyed step name. State:
// per key, the kept values of each side (and the TTL deadline); with recovery it is stored with
// the default codec, so A and B must be types it round-trips. Epochs: the state carries across
// epochs; rows carry the epoch of the value (or TTL) that made them. EOF: EmitFinal emits every
// key's rows; every key's state is discarded.
func Join2[A, B any](name string, opts Join2Options, left dataflow.Stream[dataflow.KV[A]], right dataflow.Stream[dataflow.KV[B]]) dataflow.Stream[dataflow.KV[Row2[A, B]]] {
	var zero dataflow.Stream[dataflow.KV[Row2[A, B]]]
	f := left.Flow()
	if f == nil || right.Flow() == nil || !validName(f, name) {
		return zero
	}
	switch {
	case right.Flow() != f:
		f.Fail(fmt.Errorf("step %q: the right side belongs to flow %q", stepID(f, name), right.Flow().Name()))
		return zero
	case !knownModes(f, name, opts.Insert, opts.Emit):
		return zero
	case opts.TTL < 0:
		f.Fail(fmt.Errorf("step %q: the TTL %v must not be negative", stepID(f, name), opts.TTL))
		return zero
	}
	l := dataflow.Transform(name+".left", left, func(b []dataflow.KV[A]) ([]dataflow.KV[side2[A, B]], error) {
		out := make([]dataflow.KV[side2[A, B]], len(b))
		for i, kv := range b {
			out[i] = dataflow.KV[side2[A, B]]{Key: kv.Key, Value: side2[A, B]{Left: kv.Value}}
		}
		return out, nil
	})
	r := dataflow.Transform(name+".right", right, func(b []dataflow.KV[B]) ([]dataflow.KV[side2[A, B]], error) {
		out := make([]dataflow.KV[side2[A, B]], len(b))
		for i, kv := range b {
			out[i] = dataflow.KV[side2[A, B]]{Key: kv.Key, Value: side2[A, B]{Right: kv.Value, IsRight: true}}
		}
		return out, nil
	})
	insert, emit, ttl := opts.Insert, opts.Emit, opts.TTL
	logic := dataflow.StatefulLogic[side2[A, B], join2State[A, B], Row2[A, B]]{
		Codec: defaultCodec[join2State[A, B]](noCodecAdvice("operators.Join2")),
		OnItem: func(_ string, s *join2State[A, B], exists bool, v side2[A, B], out *dataflow.Emitter[Row2[A, B]]) (bool, error) {
			if !exists && ttl > 0 {
				s.Deadline = time.Now().Add(ttl)
			}
			if v.IsRight {
				s.Right = keep2(s.Right, v.Right, insert)
			} else {
				s.Left = keep2(s.Left, v.Left, insert)
			}
			switch {
			case emit == EmitComplete && len(s.Left) > 0 && len(s.Right) > 0:
				rows2(s, out)
				return false, nil
			case emit == EmitRunning:
				rows2(s, out)
			}
			return true, nil
		},
		OnEOF: func(_ string, s *join2State[A, B], out *dataflow.Emitter[Row2[A, B]]) (bool, error) {
			if emit == EmitFinal {
				rows2(s, out)
			}
			return false, nil
		},
	}
	if ttl > 0 {
		logic.NotifyAt = func(_ string, s *join2State[A, B]) time.Time { return s.Deadline }
		logic.OnNotify = func(_ string, s *join2State[A, B], _ time.Time, out *dataflow.Emitter[Row2[A, B]]) (bool, error) {
			if emit == EmitFinal {
				rows2(s, out)
			}
			return false, nil
		}
	}
	return dataflow.Stateful(name, dataflow.Merge(name+".merge", l, r), logic)
}

// keep2 adds v to a side's values as the insert mode says.
func keep2[T any](vals []T, v T, mode InsertMode) []T {
	switch {
	case mode == InsertProduct:
		return append(vals, v)
	case mode == InsertFirst && len(vals) > 0:
		return vals
	}
	return []T{v}
}

// rows2 emits the product of the key's values, a side without values giving one nil entry.
func rows2[A, B any](s *join2State[A, B], out *dataflow.Emitter[Row2[A, B]]) {
	ls := make([]*A, 0, max(len(s.Left), 1))
	for _, v := range s.Left {
		ls = append(ls, &v)
	}
	if len(ls) == 0 {
		ls = append(ls, nil)
	}
	rs := make([]*B, 0, max(len(s.Right), 1))
	for _, v := range s.Right {
		rs = append(rs, &v)
	}
	if len(rs) == 0 {
		rs = append(rs, nil)
	}
	for _, l := range ls {
		for _, r := range rs {
			out.Emit(Row2[A, B]{Left: copyPtr(l), Right: copyPtr(r)})
		}
	}
}

// copyPtr gives each row its own value.
func copyPtr[T any](p *T) *T {
	if p == nil {
		return nil
	}
	v := *p
	return &v
}
