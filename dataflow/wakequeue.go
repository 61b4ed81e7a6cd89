package dataflow

import (
	"math"
	"slices"
)

// wake is a queued wake-up of a StatefulTime step's key: its time and the key's slot in the
// node's arena.
type wake struct {
	at   int64
	slot int32
}

// before orders wake-ups by time, then by slot, so that the order in which they leave the queue
// does not depend on the order in which they came (the node sorts what is due by key anyway).
func (a wake) before(b wake) bool {
	if a.at != b.at {
		return a.at < b.at
	}
	return a.slot < b.slot
}

// wakeQueue holds the wake-ups of a timed node's keys in two tiers, as the top rungs of a
// ladder queue: near, a heap of those before horizon, and far, an unsorted list of the others,
// appended to. When near runs dry and the earliest of far is due, a refill moves the earliest
// eighth or so of far to near (and every one that is due). So a wake-up far ahead costs an
// append, and a few sequential scans of far until it comes near, instead of a push into and a
// pop out of a heap of every key, whose lower levels miss the caches: with a hundred thousand
// keys each re-queued as its session grows, that pop was most of the cost of a wake-up.
// Neither tier holds pointers.
//
// Every wake-up in near is before horizon and every one in far is at or after it, so the
// earliest is near's, or far's when near is empty.
type wakeQueue struct {
	near    wakeHeap
	far     []wake
	horizon int64   // near holds the wake-ups before it, far the others
	farMin  int64   // the earliest time in far, when far is not empty
	sample  []int64 // refill's scratch
}

// len is the number of queued wake-ups.
func (q *wakeQueue) len() int { return len(q.near) + len(q.far) }

// min is the earliest time queued; the queue must not be empty.
func (q *wakeQueue) min() int64 {
	if len(q.near) > 0 {
		return q.near[0].at
	}
	return q.farMin
}

// push queues w.
func (q *wakeQueue) push(w wake) {
	if w.at < q.horizon {
		q.near.push(w)
		return
	}
	if len(q.far) == 0 || w.at < q.farMin {
		q.farMin = w.at
	}
	q.far = append(q.far, w)
}

// popDue removes and returns the earliest wake-up if it is at or before wm, in the order of
// wake.before. A refill passes each wake-up that comes near to refresh, which returns the
// time it is due now, later if it moved (it is then queued there), or false if it is no longer
// wanted (it is dropped).
func (q *wakeQueue) popDue(wm int64, refresh func(wake) (int64, bool)) (wake, bool) {
	for len(q.near) == 0 {
		if len(q.far) == 0 || q.farMin > wm {
			return wake{}, false
		}
		q.refill(wm, refresh)
	}
	if q.near[0].at > wm {
		return wake{}, false
	}
	return q.near.pop(), true
}

// refill moves the earliest wake-ups of far to near, which is empty: every one at or before wm,
// and about an eighth of far (estimated from a sample of it), so that each wake-up is scanned
// a few times before it comes near. Those that refresh moves past the new horizon stay far,
// so a wake-up that keeps moving later (a session that grows) costs no heap push or pop, and
// the misses of refresh (the key's slot) overlap in a loop.
func (q *wakeQueue) refill(wm int64, refresh func(wake) (int64, bool)) {
	h := int64(math.MaxInt64)
	if len(q.far) > 64 {
		// Times of 64 evenly spread wake-ups; the 8th smallest estimates the eighth.
		s := q.sample[:0]
		step := len(q.far) / 64
		for i := range 64 {
			s = append(s, q.far[i*step].at)
		}
		slices.Sort(s)
		q.sample = s
		h = s[8]
	}
	if wm < math.MaxInt64 {
		h = max(h, wm+1)
	}
	kept := q.far[:0]
	farMin := int64(math.MaxInt64)
	for _, w := range q.far {
		if w.at < h || w.at <= wm {
			at, ok := refresh(w)
			if !ok {
				continue
			}
			w.at = at
			if w.at < h || w.at <= wm {
				q.near.push(w)
				continue
			}
		}
		kept = append(kept, w)
		farMin = min(farMin, w.at)
	}
	q.far, q.farMin, q.horizon = kept, farMin, h
}

// wakeHeap is a 4-ary min-heap of wake-ups, without the interface calls of container/heap:
// a push or pop costs about half the levels of a binary heap, each level a few integer
// comparisons.
type wakeHeap []wake

func (q *wakeHeap) push(w wake) {
	h := append(*q, w)
	i := len(h) - 1
	for i > 0 {
		p := (i - 1) / 4
		if !w.before(h[p]) {
			break
		}
		h[i] = h[p]
		i = p
	}
	h[i] = w
	*q = h
}

// pop removes and returns the earliest wake-up; the heap must not be empty.
func (q *wakeHeap) pop() wake {
	h := *q
	top := h[0]
	n := len(h) - 1
	last := h[n]
	h = h[:n]
	*q = h
	if n == 0 {
		return top
	}
	i := 0
	for {
		c := 4*i + 1
		if c >= n {
			break
		}
		m := c
		for j := c + 1; j < c+4 && j < n; j++ {
			if h[j].before(h[m]) {
				m = j
			}
		}
		if !h[m].before(last) {
			break
		}
		h[i] = h[m]
		i = m
	}
	h[i] = last
	return top
}
