package windows

import (
	"fmt"
	"math"
	"time"
)

// Window is one window of a key: its id and its half-open span [Start, End). An item at time t
// is in the window when Start <= t < End.
type Window struct {
	// ID numbers the window within its windower: for Tumbling the number of lengths from the
	// origin, for Sliding the number of offsets from the origin, for Session the start in
	// nanoseconds since 1970 (a merged session takes the id of its start).
	ID    int64
	Start time.Time
	End   time.Time
}

// String shows the window as "[start, end)" in RFC 3339.
func (w Window) String() string {
	return fmt.Sprintf("[%s, %s)", w.Start.Format(time.RFC3339Nano), w.End.Format(time.RFC3339Nano))
}

// span is a window in nanoseconds.
type span struct{ id, start, end int64 }

func (s span) window() Window {
	return Window{ID: s.id, Start: time.Unix(0, s.start).UTC(), End: time.Unix(0, s.end).UTC()}
}

// Windower assigns items to windows by their time. Make one with Tumbling, Sliding or Session.
type Windower interface {
	// assign appends the windows that hold time t (for Tumbling and Sliding).
	assign(t int64, into []span) []span
	// gap is a session windower's gap (0 for the others).
	gap() int64
	// check reports a bad configuration.
	check() error
	String() string
}

// assign is w.assign called on the concrete types of the windowers that assign (Tumbling and
// Sliding; Session assigns none): through the interface, into would escape to the heap, which
// costs an allocation per item. The Windowers are this package's only (its methods are
// unexported).
func assign(w Windower, t int64, into []span) []span {
	switch w := w.(type) {
	case tumbling:
		return w.assign(t, into)
	case sliding:
		return w.assign(t, into)
	}
	return into
}

// Tumbling returns windows of length that follow each other without gaps or overlaps, aligned
// to origin: [origin + k*length, origin + (k+1)*length) for every integer k. Each item is in
// exactly one window.
func Tumbling(length time.Duration, origin time.Time) Windower {
	return tumbling{length: int64(length), origin: origin.UnixNano()}
}

type tumbling struct{ length, origin int64 }

func (w tumbling) assign(t int64, into []span) []span {
	k := floorDiv(t-w.origin, w.length)
	start := w.origin + k*w.length
	return append(into, span{id: k, start: start, end: addSat(start, w.length)})
}

func (tumbling) gap() int64 { return 0 }

func (w tumbling) check() error {
	if w.length <= 0 {
		return fmt.Errorf("tumbling windows: the length %v must be positive", time.Duration(w.length))
	}
	return nil
}

func (w tumbling) String() string { return fmt.Sprintf("tumbling(%v)", time.Duration(w.length)) }

// Sliding returns windows of length that start every offset, aligned to origin:
// [origin + k*offset, origin + k*offset + length) for every integer k. With offset < length
// they overlap and an item is in several (hopping windows); with offset > length there are
// gaps, and an item in a gap is in none (it is neither counted nor late).
func Sliding(length, offset time.Duration, origin time.Time) Windower {
	return sliding{length: int64(length), offset: int64(offset), origin: origin.UnixNano()}
}

type sliding struct{ length, offset, origin int64 }

func (w sliding) assign(t int64, into []span) []span {
	first := floorDiv(t-w.origin-w.length, w.offset) + 1
	last := floorDiv(t-w.origin, w.offset)
	for k := first; k <= last; k++ {
		start := w.origin + k*w.offset
		if t < start || t >= addSat(start, w.length) {
			continue
		}
		into = append(into, span{id: k, start: start, end: addSat(start, w.length)})
	}
	return into
}

func (sliding) gap() int64 { return 0 }

func (w sliding) check() error {
	if w.length <= 0 || w.offset <= 0 {
		return fmt.Errorf("sliding windows: the length %v and the offset %v must be positive", time.Duration(w.length), time.Duration(w.offset))
	}
	return nil
}

func (w sliding) String() string {
	return fmt.Sprintf("sliding(%v every %v)", time.Duration(w.length), time.Duration(w.offset))
}

// Session returns session windows: an item at t opens [t, t+gap), and windows of a key that
// overlap merge into one, so a session is a run of items each less than gap after the one
// before, and it ends gap after its last item. Items exactly gap apart are in two sessions.
// An item that falls between two sessions and overlaps both merges them.
func Session(gap time.Duration) Windower { return session{g: int64(gap)} }

type session struct{ g int64 }

func (session) assign(_ int64, into []span) []span { return into }
func (w session) gap() int64                       { return w.g }

func (w session) check() error {
	if w.g <= 0 {
		return fmt.Errorf("session windows: the gap %v must be positive", time.Duration(w.g))
	}
	return nil
}

func (w session) String() string { return fmt.Sprintf("session(gap %v)", time.Duration(w.g)) }

func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && (a < 0) != (b < 0) {
		q--
	}
	return q
}

func addSat(a, b int64) int64 {
	if b > 0 && a > math.MaxInt64-b {
		return math.MaxInt64
	}
	if b < 0 && a < math.MinInt64-b {
		return math.MinInt64
	}
	return a + b
}
