package dataflow

import (
	"math"
	"slices"
	"testing"

	"pgregory.net/rapid"
)

// The wake-up queue gives, for any watermark, the earliest wake-up queued if it is due, in
// (time, slot) order, whatever the pushes, the watermarks and the refills in between.
func TestWakeQueueOrder(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		var q wakeQueue
		var model []wake
		wm := int64(rapid.Int64Range(-50, 0).Draw(t, "wm0"))
		for i := range rapid.IntRange(0, 2000).Draw(t, "ops") {
			if rapid.IntRange(0, 3).Draw(t, "pop?") == 0 {
				if rapid.IntRange(0, 50).Draw(t, "end?") == 0 {
					wm = math.MaxInt64
				} else if wm < math.MaxInt64-100 {
					wm += rapid.Int64Range(0, 30).Draw(t, "advance")
				}
				for {
					got, ok := q.popDue(wm)
					slices.SortFunc(model, func(a, b wake) int {
						if a.before(b) {
							return -1
						}
						if b.before(a) {
							return 1
						}
						return 0
					})
					want := len(model) > 0 && model[0].at <= wm
					if ok != want || ok && got != model[0] {
						t.Fatalf("op %d, wm %d: popped %+v %v, want %v (queue %+v)", i, wm, got, ok, model, q)
					}
					if !ok {
						break
					}
					model = model[1:]
				}
				continue
			}
			w := wake{at: wm + rapid.Int64Range(-10, 400).Draw(t, "ahead"), slot: rapid.Int32Range(0, 5).Draw(t, "slot")}
			if wm == math.MaxInt64 {
				w.at = wm
			}
			q.push(w)
			model = append(model, w)
			if q.len() != len(model) {
				t.Fatalf("%d queued, want %d", q.len(), len(model))
			}
			if len(model) > 0 {
				m := model[0].at
				for _, x := range model {
					m = min(m, x.at)
				}
				if q.min() != m {
					t.Fatalf("min %d, want %d", q.min(), m)
				}
			}
		}
	})
}
