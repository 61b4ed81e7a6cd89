package windows

import (
	"fmt"
	"time"

	"github.com/epochflow/epochflow/dataflow"
)

// Row is a row of an interval join: a left and a right item of one key whose times match.
type Row[A, B any] struct {
	Key   string
	Left  A
	Right B
}

// IntervalOutputs are the streams of an IntervalJoin: the rows, and the items that came after
// the watermark had passed their time, each with the closed interval of the other side's times
// it would have matched, as a Window whose End is one nanosecond past the interval's end.
type IntervalOutputs[A, B any] struct {
	Rows dataflow.Stream[Row[A, B]]
	Late dataflow.Stream[Late[Either[A, B]]]
}

// timed is an item of an interval join's state with its time.
type timed[T any] struct {
	T    int64
	Item T
}

// intervalState is a key's items of each side that may still match an item on time.
type intervalState[A, B any] struct {
	Left  []timed[A]
	Right []timed[B]
}

type intervalOut[A, B any] struct {
	row  Row[A, B]
	late *Late[Either[A, B]]
}

// IntervalJoin joins two keyed streams of different types per key by time, as Flink's interval
// join does: a left item at time t matches every right item of the key whose time is in
// [t-lower, t+upper]. A row is emitted as soon as its second item comes. Times come from
// leftTime and rightTime, with one watermark of the given wait (see dataflow.Clock).
//
// State: per key, the items of each side that an item on time could still match; a left item
// at t is dropped once the watermark passes t+upper, a right item at s once it passes s+lower,
// so the state does not grow without bound. Epochs: a row carries the epoch of the item that
// completed it. Late items: an item whose time is before the watermark when it comes is not
// joined; it goes to Late with the interval it would have matched in. EOF: the watermark moves
// to the end of time and the state is dropped (no row is owed). It adds the steps name+".left",
// name+".right", name+".merge", name (a dataflow.StatefulTime with its clock step),
// name+".rows" and name+".late".
//
// Of opts only IdleTimeout and MaxDrift apply (the clock's idle timeout and watermark
// alignment, see dataflow.Clock): an idle source partition stops holding the watermark back,
// so its next items may be late. Lateness or Early set is a build error.
func IntervalJoin[A, B any](name string, left dataflow.Stream[dataflow.KV[A]], right dataflow.Stream[dataflow.KV[B]],
	leftTime func(A) time.Time, rightTime func(B) time.Time, wait, lower, upper time.Duration, opts ...Options) IntervalOutputs[A, B] {
	f := left.Flow()
	if f == nil || right.Flow() == nil {
		return IntervalOutputs[A, B]{}
	}
	o := firstOptions(opts)
	switch {
	case leftTime == nil || rightTime == nil:
		f.Fail(fmt.Errorf("step %q: IntervalJoin needs both time functions", name))
	case lower+upper < 0:
		f.Fail(fmt.Errorf("step %q: the interval [t-%v, t+%v] is empty", name, lower, upper))
	case o.Lateness != 0 || o.Early != 0:
		f.Fail(fmt.Errorf("step %q: IntervalJoin takes only Options.IdleTimeout and MaxDrift (got Lateness %v, Early %v)", name, o.Lateness, o.Early))
	case o.IdleTimeout < 0:
		f.Fail(fmt.Errorf("step %q: the idle timeout %v must not be negative", name, o.IdleTimeout))
	case o.MaxDrift < 0:
		f.Fail(fmt.Errorf("step %q: the max drift %v must not be negative", name, o.MaxDrift))
	}
	if f.Err() != nil {
		return IntervalOutputs[A, B]{}
	}
	lo, up := int64(lower), int64(upper)
	both, clock := eitherSides(name, left, right, leftTime, rightTime, wait)
	step := dataflow.StatefulTime(name, both, withOptions(clock, o), dataflow.TimedLogic[Either[A, B], intervalState[A, B], intervalOut[A, B]]{
		OnItem: func(key string, st *intervalState[A, B], _ bool, e Either[A, B], at, wmT time.Time, out *dataflow.Emitter[intervalOut[A, B]]) (bool, error) {
			t, wm := at.UnixNano(), wmT.UnixNano()
			if t < wm {
				// The interval of right times a left item matches, or of left times a right one does.
				win := span{id: t, start: t - lo, end: addSat(t, up+1)}
				if e.IsRight {
					win = span{id: t, start: t - up, end: addSat(t, lo+1)}
				}
				out.Emit(intervalOut[A, B]{late: &Late[Either[A, B]]{Key: key, Window: win.window(), Item: e, Time: at}})
				out.CountLate()
				return len(st.Left)+len(st.Right) > 0, nil
			}
			if e.IsRight {
				for _, l := range st.Left {
					if t >= l.T-lo && t <= addSat(l.T, up) {
						out.Emit(intervalOut[A, B]{row: Row[A, B]{Key: key, Left: l.Item, Right: e.Right}})
					}
				}
				st.Right = append(st.Right, timed[B]{T: t, Item: e.Right})
			} else {
				for _, r := range st.Right {
					if r.T >= t-lo && r.T <= addSat(t, up) {
						out.Emit(intervalOut[A, B]{row: Row[A, B]{Key: key, Left: e.Left, Right: r.Item}})
					}
				}
				st.Left = append(st.Left, timed[A]{T: t, Item: e.Left})
			}
			return true, nil
		},
		WakeAt: func(_ string, st *intervalState[A, B]) time.Time {
			next, ok := int64(0), false
			for _, l := range st.Left {
				if at := addSat(l.T, up+1); !ok || at < next {
					next, ok = at, true
				}
			}
			for _, r := range st.Right {
				if at := addSat(r.T, lo+1); !ok || at < next {
					next, ok = at, true
				}
			}
			if !ok {
				return time.Time{}
			}
			return time.Unix(0, next).UTC()
		},
		OnWatermark: func(_ string, st *intervalState[A, B], wmT time.Time, _ *dataflow.Emitter[intervalOut[A, B]]) (bool, error) {
			wm := wmT.UnixNano()
			// An item on time comes at or after wm: a left item at t can match it only while
			// t+upper >= wm, a right item at s only while s+lower >= wm.
			keptL := st.Left[:0]
			for _, l := range st.Left {
				if addSat(l.T, up) >= wm {
					keptL = append(keptL, l)
				}
			}
			clear(st.Left[len(keptL):])
			keptR := st.Right[:0]
			for _, r := range st.Right {
				if addSat(r.T, lo) >= wm {
					keptR = append(keptR, r)
				}
			}
			clear(st.Right[len(keptR):])
			st.Left, st.Right = keptL, keptR
			return len(keptL)+len(keptR) > 0, nil
		},
	})
	return IntervalOutputs[A, B]{
		Rows: dataflow.Transform(name+".rows", step, func(b []dataflow.KV[intervalOut[A, B]]) ([]Row[A, B], error) {
			var rows []Row[A, B]
			for _, kv := range b {
				if kv.Value.late == nil {
					rows = append(rows, kv.Value.row)
				}
			}
			return rows, nil
		}),
		Late: dataflow.Transform(name+".late", step, func(b []dataflow.KV[intervalOut[A, B]]) ([]Late[Either[A, B]], error) {
			var lates []Late[Either[A, B]]
			for _, kv := range b {
				if kv.Value.late != nil {
					lates = append(lates, *kv.Value.late)
				}
			}
			return lates, nil
		}),
	}
}
