package windows_test

import (
	"fmt"
	"math"
	"slices"
	"strings"
)

// This file is a plain sequential model of the windowers, written apart from the package: it
// knows nothing of the engine, the exchange or the package's state, only the definitions.
// Times are integer milliseconds.

// ev is one test event: a key, a time and a value that names it.
type ev struct {
	Key string
	T   int64
	V   int
}

type wkind int

const (
	kTumbling wkind = iota
	kSliding
	kSession
)

// spec is a windower, the clock's wait, the lateness and the early period (0 for none), in
// milliseconds.
type spec struct {
	kind           wkind
	length, offset int64 // tumbling: length; sliding: length and offset; session: length is the gap
	origin         int64
	wait, lateness int64
	early          int64
	// maxDrift is the watermark alignment (Options.MaxDrift), 0 for none: it changes when the
	// workers read, never what the model says.
	maxDrift int64
}

// spans lists the [start, end) windows of a tumbling or sliding spec that hold t, by brute
// force from the definition.
func (s spec) spans(t int64) [][2]int64 {
	step := s.length
	if s.kind == kSliding {
		step = s.offset
	}
	// The largest k with origin + k*step <= t, then walk down while the window still holds t.
	k := (t - s.origin) / step
	for s.origin+k*step > t {
		k--
	}
	for s.origin+(k+1)*step <= t {
		k++
	}
	var out [][2]int64
	for ; s.origin+k*step+s.length > t; k-- {
		out = append(out, [2]int64{s.origin + k*step, s.origin + k*step + s.length})
	}
	slices.Reverse(out)
	return out
}

// result prints a result as the test's sinks do.
func result(key string, start, end int64, vals []int, update, early bool) string {
	v := slices.Clone(vals)
	slices.Sort(v)
	r := fmt.Sprintf("R %s [%d,%d) %v update=%v", key, start, end, v, update)
	if early {
		r += " early"
	}
	return r
}

func late(key string, start, end int64, v int) string {
	return fmt.Sprintf("L %s [%d,%d) %d", key, start, end, v)
}

// ordered is what modelOrdered computes.
type ordered struct {
	out []string // the results (but the early ones) and the late items
	// early holds every early result that may be emitted: a window that is open, not yet
	// emitted, with the items that came up to some event. Which of them are emitted depends
	// on how often the watermark moves where a window's key is kept (see modelOrdered).
	early  map[string]bool
	merges int // items that merged sessions
}

// modelOrdered runs the events of one partition in order. The watermark before an event is
// the largest time before it minus the wait. A window's result is emitted when the watermark
// reaches its end; an item of a window whose end the watermark has passed (but not its end plus
// the lateness) is added and the window emitted again at once, as an update; an item of a
// window whose end plus the lateness the watermark has reached is late. Sessions: an item opens
// [t, t+gap) and merges with every session of its key that this overlaps (a merge: it overlaps
// two or more), unless it overlaps none and its window is gone.
//
// With an early period, the early results are not all determined by the events: the windowed
// step's worker sees the watermark move with the items of its own keys and at the end of each
// batch of the source, so it may pass an early time of a window together with its end (and
// emit the final result only). So the model lists the early results that may come: each is the
// window as it was after some event (open and not yet emitted), and each comes at most once.
func modelOrdered(s spec, events []ev) ordered {
	type window struct {
		key        string
		start, end int64
		vals       []int
		due, fired bool
	}
	var wins []*window // every open window of every key
	var m ordered
	m.early = map[string]bool{}
	emit := func(w *window) {
		m.out = append(m.out, result(w.key, w.start, w.end, w.vals, w.fired, false))
		w.fired, w.due = true, false
	}
	wm := int64(math.MinInt64)
	advance := func(to int64) {
		if to <= wm {
			return
		}
		wm = to
		kept := wins[:0]
		for _, w := range wins {
			if w.due && w.end <= wm {
				emit(w)
			}
			if w.end+s.lateness > wm {
				kept = append(kept, w)
			}
		}
		wins = kept
	}
	add := func(w *window, v int) {
		w.vals = append(w.vals, v)
		if w.end <= wm {
			emit(w)
			return
		}
		w.due = true
	}
	find := func(key string, start, end int64) *window {
		for _, w := range wins {
			if w.key == key && w.start == start && w.end == end {
				return w
			}
		}
		w := &window{key: key, start: start, end: end}
		wins = append(wins, w)
		return w
	}
	maxSeen := int64(math.MinInt64)
	for _, e := range events {
		if maxSeen > math.MinInt64 {
			advance(maxSeen - s.wait)
		}
		if s.kind != kSession {
			for _, sp := range s.spans(e.T) {
				if wm >= sp[1]+s.lateness {
					m.out = append(m.out, late(e.Key, sp[0], sp[1], e.V))
					continue
				}
				add(find(e.Key, sp[0], sp[1]), e.V)
			}
		} else {
			gap := s.length
			merged := &window{key: e.Key, start: e.T, end: e.T + gap}
			hits := 0
			kept := wins[:0]
			for _, w := range wins {
				if w.key == e.Key && w.start < e.T+gap && e.T < w.end {
					hits++
					merged.start, merged.end = min(merged.start, w.start), max(merged.end, w.end)
					merged.vals = append(merged.vals, w.vals...)
					merged.fired = merged.fired || w.fired
					continue
				}
				kept = append(kept, w)
			}
			wins = kept
			if hits == 0 && e.T+gap+s.lateness <= wm {
				m.out = append(m.out, late(e.Key, e.T, e.T+gap, e.V))
			} else {
				if hits > 1 {
					m.merges++
				}
				wins = append(wins, merged)
				add(merged, e.V)
			}
		}
		maxSeen = max(maxSeen, e.T)
		if s.early > 0 {
			// A window that has fired emits no early results (a session merged with one
			// that has fired waits for its end to emit the update).
			for _, w := range wins {
				if w.due && !w.fired {
					m.early[result(w.key, w.start, w.end, w.vals, false, true)] = true
				}
			}
		}
	}
	advance(math.MaxInt64)
	return m
}

// diffOrdered compares the output of a run with the model's: the results but the early ones
// and the late items must be the model's, and each early result one the model allows, once.
func diffOrdered(got []string, m ordered) string {
	var rest []string
	var b strings.Builder
	seen := map[string]bool{}
	for _, g := range got {
		if !strings.HasSuffix(g, " early") {
			rest = append(rest, g)
			continue
		}
		switch {
		case seen[g]:
			fmt.Fprintf(&b, "  again   %s\n", g)
		case !m.early[g]:
			fmt.Fprintf(&b, "  bad     %s\n", g)
		}
		seen[g] = true
	}
	return b.String() + diff(rest, m.out)
}

// modelOffline is what every window holds when no item is late and no window gets an item
// after its end: windows of all the events, each emitted once.
func modelOffline(s spec, events []ev) []string {
	var out []string
	byKey := map[string][]ev{}
	var keys []string
	for _, e := range events {
		if _, ok := byKey[e.Key]; !ok {
			keys = append(keys, e.Key)
		}
		byKey[e.Key] = append(byKey[e.Key], e)
	}
	for _, key := range keys {
		es := byKey[key]
		if s.kind == kSession {
			slices.SortFunc(es, func(a, b ev) int { return int(a.T - b.T) })
			start, end := es[0].T, es[0].T+s.length
			vals := []int{es[0].V}
			for _, e := range es[1:] {
				if e.T < end {
					end = max(end, e.T+s.length)
					vals = append(vals, e.V)
					continue
				}
				out = append(out, result(key, start, end, vals, false, false))
				start, end, vals = e.T, e.T+s.length, []int{e.V}
			}
			out = append(out, result(key, start, end, vals, false, false))
			continue
		}
		wins := map[[2]int64][]int{}
		for _, e := range es {
			for _, sp := range s.spans(e.T) {
				wins[sp] = append(wins[sp], e.V)
			}
		}
		for sp, vals := range wins {
			out = append(out, result(key, sp[0], sp[1], vals, false, false))
		}
	}
	return out
}

func sorted(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}

func diff(got, want []string) string {
	got, want = sorted(got), sorted(want)
	var b strings.Builder
	i, j := 0, 0
	for i < len(got) || j < len(want) {
		switch {
		case j == len(want) || i < len(got) && got[i] < want[j]:
			fmt.Fprintf(&b, "  extra   %s\n", got[i])
			i++
		case i == len(got) || got[i] > want[j]:
			fmt.Fprintf(&b, "  missing %s\n", want[j])
			j++
		default:
			i++
			j++
		}
	}
	return b.String()
}
