package dataflow

import (
	"math"
	"slices"
	"testing"

	"pgregory.net/rapid"
)

// The wake-up queue, used as a timed node uses it (a wake-up that moved later is queued again
// when it is popped, a cancelled one is skipped, and refills refresh them), gives for every
// watermark exactly the wake-ups due, in (time, slot) order, whatever the pushes, moves,
// cancellations, watermarks and refills in between.
func TestWakeQueueOrder(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		var q wakeQueue
		// The model: each wake-up has its own slot, and its current time (absent: cancelled).
		due := map[int32]int64{}
		queued := map[int32]int64{} // the time the slot is queued at (as timedEntry.queued)
		refresh := func(w wake) (int64, bool) {
			at, ok := due[w.slot]
			if !ok || queued[w.slot] != w.at {
				return 0, false
			}
			queued[w.slot] = at
			return at, true
		}
		next := int32(0)
		wm := rapid.Int64Range(-50, 0).Draw(t, "wm0")
		for i := range rapid.IntRange(0, 2000).Draw(t, "ops") {
			switch op := rapid.IntRange(0, 7).Draw(t, "op"); {
			case op == 0 && len(due) > 0, op == 1 && len(due) > 0:
				// Move a wake-up later (0) or cancel it (1): nothing is pushed.
				var slots []int32
				for s := range due {
					slots = append(slots, s)
				}
				s := rapid.SampledFrom(sortedSlots(slots)).Draw(t, "slot")
				if op == 0 {
					due[s] += rapid.Int64Range(1, 100).Draw(t, "later")
				} else {
					delete(due, s)
				}
			case op == 2:
				if rapid.IntRange(0, 50).Draw(t, "end?") == 0 {
					wm = math.MaxInt64
				} else if wm < math.MaxInt64-100 {
					wm += rapid.Int64Range(0, 30).Draw(t, "advance")
				}
				var got []wake
				for {
					w, ok := q.popDue(wm, refresh)
					if !ok {
						break
					}
					at, live := due[w.slot]
					if !live || queued[w.slot] != w.at {
						continue // stale
					}
					if at > w.at {
						queued[w.slot] = at
						q.push(wake{at: at, slot: w.slot})
						continue
					}
					got = append(got, w)
					delete(due, w.slot)
				}
				for k := 1; k < len(got); k++ {
					if !got[k-1].before(got[k]) {
						t.Fatalf("op %d: due out of order: %v", i, got)
					}
				}
				for s, at := range due {
					if at <= wm {
						t.Fatalf("op %d, wm %d: slot %d due at %d was not popped (popped %v)", i, wm, s, at, got)
					}
				}
			default:
				w := wake{at: wm + rapid.Int64Range(-10, 400).Draw(t, "ahead"), slot: next}
				if wm == math.MaxInt64 {
					w.at = wm
				}
				next++
				due[w.slot], queued[w.slot] = w.at, w.at
				q.push(w)
			}
		}
	})
}

func sortedSlots(s []int32) []int32 {
	slices.Sort(s)
	return s
}
