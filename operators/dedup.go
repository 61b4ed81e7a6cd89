package operators

import (
	"fmt"
	"time"

	"github.com/epochflow/epochflow/dataflow"
)

// Deduplicate adds a keyed step (with name+".key" before it and name+".unkey" after it) that
// passes on the first item of every id and drops later items with the same id that come
// within window of the first (window 0: forever). Items whose id is "" are always passed on
// and leave no state. It is how an exactly-once sink stays exact behind an at-least-once
// source: a queue delivers a message again when a crash lost the ack of an epoch that had
// committed, and with a recovery store the ids seen are committed state, so the redelivery is
// dropped.
//
// State: per id, the time until which it is remembered (a timer forgets it then); the state
// grows with the ids seen within window. Epochs: an item keeps its epoch. EOF: nothing more is
// emitted.
func Deduplicate[T any](name string, in dataflow.Stream[T], id func(T) string, window time.Duration) dataflow.Stream[T] {
	if !usable(name, in, "the id function", id == nil) || !validName(in.Flow(), name) {
		return dataflow.Stream[T]{}
	}
	if window < 0 {
		in.Flow().Fail(fmt.Errorf("step %q: negative window %v", name, window))
		return dataflow.Stream[T]{}
	}
	keyed := KeyOn(name+".key", in, id)
	logic := dataflow.StatefulLogic[T, int64, T]{
		OnItem: func(key string, until *int64, exists bool, item T, out *dataflow.Emitter[T]) (bool, error) {
			if key == "" {
				out.Emit(item)
				return false, nil
			}
			if !exists {
				out.Emit(item)
				if window > 0 {
					*until = time.Now().Add(window).UnixNano()
				}
			}
			return true, nil // a redelivery keeps the first delivery's deadline
		},
	}
	if window > 0 {
		logic.NotifyAt = func(_ string, until *int64) time.Time { return time.Unix(0, *until) }
		logic.OnNotify = func(string, *int64, time.Time, *dataflow.Emitter[T]) (bool, error) {
			return false, nil // the window is over: forget the id
		}
	}
	return KeyRm(name+".unkey", dataflow.Stateful(name, keyed, logic))
}
