package main

import "time"

// This file holds the baselines: each query written as a plain Go loop over the events in the
// order of the stream (one goroutine, maps and slices, no framework). A baseline sees the
// events in time order, so it closes a window as soon as an event's time passes its end; the
// flows, whose partitions run side by side, close it when the watermark does.

// floorDiv is a / b rounded down.
func floorDiv(a, b int64) int64 {
	q := a / b
	if (a%b != 0) && (a < 0) != (b < 0) {
		q--
	}
	return q
}

type q0Plain struct{}

func newQ0(Config) baseline[Event]            { return q0Plain{} }
func (q0Plain) add(e Event, emit func(Event)) { emit(e) }
func (q0Plain) end(func(Event))               {}

type q1Plain struct{}

func newQ1(Config) baseline[Q1Row] { return q1Plain{} }
func (q1Plain) add(e Event, emit func(Q1Row)) {
	if e.Kind == KindBid {
		emit(q1Row(*e.Bid))
	}
}
func (q1Plain) end(func(Q1Row)) {}

type q2Plain struct{}

func newQ2(Config) baseline[Q2Row] { return q2Plain{} }
func (q2Plain) add(e Event, emit func(Q2Row)) {
	if e.Kind == KindBid && e.Bid.Auction%123 == 0 {
		emit(Q2Row{e.Bid.Auction, e.Bid.Price})
	}
}
func (q2Plain) end(func(Q2Row)) {}

// q3Plain keeps every person and the auctions of category 10 whose seller has not come yet.
type q3Plain struct {
	persons map[int64]*Person
	pending map[int64][]int64
}

func newQ3(Config) baseline[Q3Row] {
	return &q3Plain{persons: map[int64]*Person{}, pending: map[int64][]int64{}}
}

func (q *q3Plain) add(e Event, emit func(Q3Row)) {
	switch {
	case e.Kind == KindPerson:
		p := e.Person
		q.persons[p.ID] = p
		if q3Local(p.State) {
			for _, a := range q.pending[p.ID] {
				emit(Q3Row{p.Name, p.City, p.State, a})
			}
		}
		delete(q.pending, p.ID)
	case e.Kind == KindAuction && e.Auction.Category == 10:
		a := e.Auction
		p, ok := q.persons[a.Seller]
		switch {
		case !ok:
			q.pending[a.Seller] = append(q.pending[a.Seller], a.ID)
		case q3Local(p.State):
			emit(Q3Row{p.Name, p.City, p.State, a.ID})
		}
	}
}

func (q *q3Plain) end(func(Q3Row)) {}

// q4Plain keeps every auction with its highest bid in its lifetime, and the bids of auctions
// that have not come yet.
type q4Plain struct {
	auctions map[int64]*q4State
	early    map[int64][]q4Bid
	order    []int64 // the auctions in the order they came
}

func newQ4(Config) baseline[Q4Row] {
	return &q4Plain{auctions: map[int64]*q4State{}, early: map[int64][]q4Bid{}}
}

func (q *q4Plain) add(e Event, emit func(Q4Row)) {
	switch e.Kind {
	case KindAuction:
		a := e.Auction
		s := &q4State{Open: true, Category: a.Category, Start: a.DateTime, Expires: a.Expires}
		for _, b := range q.early[a.ID] {
			s.bid(b.Time, b.Price)
		}
		delete(q.early, a.ID)
		q.auctions[a.ID] = s
		q.order = append(q.order, a.ID)
	case KindBid:
		b := e.Bid
		if s, ok := q.auctions[b.Auction]; ok {
			s.bid(b.DateTime, b.Price)
		} else {
			q.early[b.Auction] = append(q.early[b.Auction], q4Bid{b.DateTime, b.Price})
		}
	}
}

func (q *q4Plain) end(emit func(Q4Row)) {
	sums := map[int64]q4Sum{}
	var cats []int64
	for _, id := range q.order {
		s := q.auctions[id]
		if s.Bids == 0 {
			continue
		}
		c, ok := sums[s.Category]
		if !ok {
			cats = append(cats, s.Category)
		}
		sums[s.Category] = q4Sum{s.Category, c.Sum + s.Max, c.N + 1}
	}
	for _, c := range cats {
		emit(q4Row(sums[c]))
	}
}

// q5Plain counts the bids per auction of every open sliding window, by window number.
type q5Plain struct {
	length, slide int64 // milliseconds
	counts        map[int64]map[int64]int
	oldest        int64 // the oldest window that may be open
	started       bool
}

func newQ5(c Config) baseline[Q5Row] {
	return &q5Plain{length: c.Window.Milliseconds(), slide: c.Slide.Milliseconds(), counts: map[int64]map[int64]int{}}
}

func (q *q5Plain) add(e Event, emit func(Q5Row)) {
	if e.Kind != KindBid {
		return
	}
	t := e.Bid.DateTime
	first, last := floorDiv(t-q.length, q.slide)+1, floorDiv(t, q.slide)
	if !q.started {
		q.oldest, q.started = first, true
	}
	for ; q.oldest < first; q.oldest++ { // the windows that ended at or before t
		q.close(q.oldest, emit)
	}
	for k := first; k <= last; k++ {
		m := q.counts[k]
		if m == nil {
			m = map[int64]int{}
			q.counts[k] = m
		}
		m[e.Bid.Auction]++
	}
}

func (q *q5Plain) close(k int64, emit func(Q5Row)) {
	m := q.counts[k]
	delete(q.counts, k)
	top := 0
	for _, n := range m {
		top = max(top, n)
	}
	for a, n := range m {
		if n == top {
			emit(Q5Row{a, n, k * q.slide, k*q.slide + q.length})
		}
	}
}

func (q *q5Plain) end(emit func(Q5Row)) {
	for k := range q.counts {
		q.close(k, emit)
	}
}

// q7Plain keeps the highest bids of the open tumbling window.
type q7Plain struct {
	length int64
	k      int64
	top    q7Max
}

func newQ7(c Config) baseline[Q7Row] { return &q7Plain{length: c.Window.Milliseconds()} }

func (q *q7Plain) add(e Event, emit func(Q7Row)) {
	if e.Kind != KindBid {
		return
	}
	k := floorDiv(e.Bid.DateTime, q.length)
	if k != q.k {
		q.end(emit)
		q.k = k
	}
	q.top = q.top.add(*e.Bid)
}

func (q *q7Plain) end(emit func(Q7Row)) {
	for _, b := range q.top.Bids {
		emit(Q7Row{b.Auction, b.Bidder, b.Price, b.DateTime, (q.k + 1) * q.length})
	}
	q.top = q7Max{}
}

// q8Plain keeps, for the open tumbling windows, the persons who registered and the sellers who
// opened an auction in each.
type q8Plain struct {
	length  int64
	persons map[int64]map[int64]string // window -> id -> name
	sellers map[int64]map[int64]bool   // window -> seller
	oldest  int64
}

func newQ8(c Config) baseline[Q8Row] {
	return &q8Plain{length: c.Window.Milliseconds(), persons: map[int64]map[int64]string{}, sellers: map[int64]map[int64]bool{}, oldest: -1 << 62}
}

func (q *q8Plain) add(e Event, emit func(Q8Row)) {
	if e.Kind == KindBid {
		return
	}
	k := floorDiv(e.Millis(), q.length)
	if k > q.oldest {
		q.end(emit) // every window before k has ended: events come in time order
		q.oldest = k
	}
	if e.Kind == KindPerson {
		if q.persons[k] == nil {
			q.persons[k] = map[int64]string{}
		}
		q.persons[k][e.Person.ID] = e.Person.Name
		return
	}
	if q.sellers[k] == nil {
		q.sellers[k] = map[int64]bool{}
	}
	q.sellers[k][e.Auction.Seller] = true
}

func (q *q8Plain) end(emit func(Q8Row)) {
	for k, ps := range q.persons {
		for id, name := range ps {
			if q.sellers[k][id] {
				emit(Q8Row{id, name, k * q.length})
			}
		}
	}
	clear(q.persons)
	clear(q.sellers)
}

// q11Plain keeps every bidder's open session.
type q11Plain struct {
	gap      int64
	sessions map[int64]*Q11Row // by bidder; End is the last bid's time until the session ends
}

func newQ11(c Config) baseline[Q11Row] {
	return &q11Plain{gap: c.SessionGap.Milliseconds(), sessions: map[int64]*Q11Row{}}
}

func (q *q11Plain) add(e Event, emit func(Q11Row)) {
	if e.Kind != KindBid {
		return
	}
	t := e.Bid.DateTime
	s := q.sessions[e.Bid.Bidder]
	if s != nil && t-s.End < q.gap {
		s.Bids++
		s.End = t
		return
	}
	if s != nil {
		emit(Q11Row{s.Bidder, s.Bids, s.Start, s.End + q.gap})
	}
	q.sessions[e.Bid.Bidder] = &Q11Row{Bidder: e.Bid.Bidder, Bids: 1, Start: t, End: t}
}

func (q *q11Plain) end(emit func(Q11Row)) {
	for _, s := range q.sessions {
		emit(Q11Row{s.Bidder, s.Bids, s.Start, s.End + q.gap})
	}
}

// q12Plain counts the bids per bidder of the current wall-clock window.
type q12Plain struct {
	length time.Duration
	start  time.Time
	counts map[int64]int
}

func newQ12(c Config) baseline[Q12Row] {
	return &q12Plain{length: c.Window, counts: map[int64]int{}}
}

func (q *q12Plain) add(e Event, emit func(Q12Row)) {
	if e.Kind != KindBid {
		return
	}
	start := time.Now().Truncate(q.length)
	if !start.Equal(q.start) {
		q.end(emit)
		q.start = start
	}
	q.counts[e.Bid.Bidder]++
}

func (q *q12Plain) end(emit func(Q12Row)) {
	for b, n := range q.counts {
		emit(Q12Row{b, n, q.start.UnixMilli()})
	}
	clear(q.counts)
}
