package dataflow

// wake is a queued wake-up of a StatefulTime step's key: its time and the key's slot in the
// node's arena.
type wake struct {
	at   int64
	slot int32
}

// before orders wake-ups by time, then by slot (which keeps the queue's order independent of
// how it was built, not the order of the calls: the node sorts what is due by key).
func (a wake) before(b wake) bool {
	if a.at != b.at {
		return a.at < b.at
	}
	return a.slot < b.slot
}

// wakeQueue is a 4-ary min-heap of wake-ups, without pointers (the garbage collector does not
// scan it) and without the interface calls of container/heap: a push or pop costs about half
// the levels of a binary heap, each level a few integer comparisons.
type wakeQueue []wake

// min is the earliest wake-up; the queue must not be empty.
func (q wakeQueue) min() wake { return q[0] }

func (q *wakeQueue) push(w wake) {
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

// pop removes and returns the earliest wake-up; the queue must not be empty.
func (q *wakeQueue) pop() wake {
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
