package dataflow

import (
	"slices"
	"testing"

	"pgregory.net/rapid"
)

// The wake-up queue pops in (time, slot) order whatever the pushes and pops interleaved.
func TestWakeQueueOrder(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		var q wakeQueue
		var model []wake
		for i := range rapid.IntRange(0, 300).Draw(t, "ops") {
			if len(model) > 0 && rapid.IntRange(0, 2).Draw(t, "pop?") == 0 {
				got := q.pop()
				slices.SortFunc(model, func(a, b wake) int {
					if a.before(b) {
						return -1
					}
					if b.before(a) {
						return 1
					}
					return 0
				})
				if got != model[0] {
					t.Fatalf("op %d: popped %+v, want %+v", i, got, model[0])
				}
				model = model[1:]
				continue
			}
			w := wake{at: rapid.Int64Range(-5, 20).Draw(t, "at"), slot: rapid.Int32Range(0, 5).Draw(t, "slot")}
			q.push(w)
			model = append(model, w)
		}
		if len(q) != len(model) {
			t.Fatalf("%d queued, want %d", len(q), len(model))
		}
	})
}
