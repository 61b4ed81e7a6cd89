package windows

import "slices"

// keyState is a key's open windows, by start. Most keys have one window open at a time (a
// session, or the current tumbling window), so the first is held inline: the state of such a
// key is one piece of memory in the timed step's arena, with no slice to follow (a cache miss
// per item) and no array to allocate per window. Two or more windows live in more, whose
// memory is kept for the key's next windows.
//
// It is stored as its windows (storedWins), in the same form as when it was a struct with
// just the slice Wins, so snapshots of either form restore.
type keyState[A any] struct {
	one  [1]winState[A] // the window, when n is 1
	more []winState[A]  // the windows when n >= 2 (len n); else empty, keeping its memory
	n    int
}

// storedWins is the form in which a key's windows are stored.
type storedWins[A any] struct {
	Wins []winState[A]
}

// wins returns the key's windows, by start. The slice shares the state's memory: its windows
// may be changed in place, but only until the state is changed with insert or shrink.
func (st *keyState[A]) wins() []winState[A] {
	if st.n <= 1 {
		return st.one[:st.n]
	}
	return st.more[:st.n]
}

// insert adds w as the i-th window.
func (st *keyState[A]) insert(i int, w winState[A]) {
	switch st.n {
	case 0:
		st.one[0] = w
	case 1:
		st.more = slices.Insert(append(st.more[:0], st.one[0]), i, w)
		st.one[0] = winState[A]{}
	default:
		st.more = slices.Insert(st.more, i, w)
	}
	st.n++
}

// shrink keeps the first k windows (the caller has moved the ones it keeps to the front of
// wins).
func (st *keyState[A]) shrink(k int) {
	if k >= st.n {
		return
	}
	if st.n <= 1 {
		st.one[0] = winState[A]{}
		st.n = 0
		return
	}
	if k == 1 {
		st.one[0] = st.more[0]
	}
	if k <= 1 {
		clear(st.more)
		st.more = st.more[:0]
	} else {
		clear(st.more[k:])
		st.more = st.more[:k]
	}
	st.n = k
}

// load sets the windows to ws (which the state may keep).
func (st *keyState[A]) load(ws []winState[A]) {
	*st = keyState[A]{n: len(ws)}
	if len(ws) == 1 {
		st.one[0] = ws[0]
	} else if len(ws) > 1 {
		st.more = ws
	}
}

// stored is the state in its stored form (nil windows for none, as the slice was).
func (st *keyState[A]) stored() storedWins[A] {
	if st.n == 0 {
		return storedWins[A]{}
	}
	return storedWins[A]{Wins: st.wins()}
}
