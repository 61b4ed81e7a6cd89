package main

import (
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/epochflow/epochflow/dataflow"
	"github.com/epochflow/epochflow/operators"
	"github.com/epochflow/epochflow/windows"
)

// This file holds the queries' flows, written with the public API as a user would. Each
// query's baseline, a plain loop computing the same rows, is in baseline.go.

// unixOrigin aligns every window to 1970-01-01, as Flink's TUMBLE and HOP do.
var unixOrigin = time.Unix(0, 0)

// bids keeps the bids of the stream.
func bids(in dataflow.Stream[Event]) dataflow.Stream[Bid] {
	return operators.FilterMap("bids", in, func(e Event) (Bid, bool) {
		if e.Kind != KindBid {
			return Bid{}, false
		}
		return *e.Bid, true
	})
}

// bidTime is a bid's event time. The generator's partitions each go forward in time, so an
// event-time clock right after the source needs no wait: nothing is ever late.
func bidTime(b Bid) time.Time { return msTime(b.DateTime) }

func key(id int64) string { return strconv.FormatInt(id, 10) }

// q0 is the pass-through: every event, unchanged. It measures the cost of the source and the
// engine.
var q0 = define("q0", "pass-through: every event",
	func(in dataflow.Stream[Event], _ Config) dataflow.Stream[Event] {
		return operators.Map("q0", in, func(e Event) Event { return e })
	}, newQ0, Event.String)

// Q1Row is a bid with its price in euros.
type Q1Row struct {
	Auction, Bidder int64
	Price           float64 // the bid's price (in cents) times 0.908
	DateTime        int64
}

// q1 is the currency conversion: every bid with its price converted from dollars to euros
// (price * 0.908, as Flink's nexmark SQL).
var q1 = define("q1", "currency conversion: every bid, price*0.908",
	func(in dataflow.Stream[Event], _ Config) dataflow.Stream[Q1Row] {
		return operators.FilterMap("q1", in, func(e Event) (Q1Row, bool) {
			if e.Kind != KindBid {
				return Q1Row{}, false
			}
			return q1Row(*e.Bid), true
		})
	}, newQ1, rowString[Q1Row])

func q1Row(b Bid) Q1Row {
	return Q1Row{Auction: b.Auction, Bidder: b.Bidder, Price: float64(b.Price) * 0.908, DateTime: b.DateTime}
}

// Q2Row is a bid of a selected auction.
type Q2Row struct{ Auction, Price int64 }

// q2 is the selection: the auction and price of the bids on auctions whose id is a multiple
// of 123 (Flink's nexmark SQL; the original Nexmark lists a few auction ids instead).
var q2 = define("q2", "selection: bids of auctions whose id % 123 == 0",
	func(in dataflow.Stream[Event], _ Config) dataflow.Stream[Q2Row] {
		return operators.FilterMap("q2", in, func(e Event) (Q2Row, bool) {
			if e.Kind != KindBid || e.Bid.Auction%123 != 0 {
				return Q2Row{}, false
			}
			return Q2Row{e.Bid.Auction, e.Bid.Price}, true
		})
	}, newQ2, rowString[Q2Row])

// Q3Row is an auction of category 10 with its seller's name and place.
type Q3Row struct {
	Name, City, State string
	Auction           int64
}

// q3State is what q3 keeps per person: whether the person has come and lives in a selected
// state, and the auctions of the person that came first.
type q3State struct {
	Seen, Match       bool
	Name, City, State string
	Pending           []int64
}

// q3Local is q3's selection of states.
func q3Local(state string) bool { return state == "OR" || state == "ID" || state == "CA" }

// q3 is the local item suggestion: every auction of category 10 whose seller lives in
// Oregon, Idaho or California, with the seller's name, city and state, as soon as both the
// auction and the person have come (an unwindowed join by seller; Flink's nexmark SQL). The
// state per person is a few fields, and the auctions that came before their seller.
var q3 = define("q3", "local item suggestion: auctions of category 10 by sellers in OR, ID, CA",
	func(in dataflow.Stream[Event], _ Config) dataflow.Stream[Q3Row] {
		sides := operators.Filter("q3.select", in, func(e Event) bool {
			return e.Kind == KindPerson || e.Kind == KindAuction && e.Auction.Category == 10
		})
		byPerson := operators.KeyOn("q3.by-person", sides, func(e Event) string {
			if e.Kind == KindPerson {
				return key(e.Person.ID)
			}
			return key(e.Auction.Seller)
		})
		joined := operators.StatefulFlatMap("q3", byPerson, func(s q3State, e Event) (q3State, []Q3Row, bool) {
			if e.Kind == KindAuction {
				switch {
				case !s.Seen:
					s.Pending = append(s.Pending, e.Auction.ID)
					return s, nil, true
				case s.Match:
					return s, []Q3Row{{s.Name, s.City, s.State, e.Auction.ID}}, true
				}
				return s, nil, true
			}
			p := e.Person
			s.Seen, s.Match = true, q3Local(p.State)
			var out []Q3Row
			if s.Match {
				s.Name, s.City, s.State = p.Name, p.City, p.State
				for _, a := range s.Pending {
					out = append(out, Q3Row{p.Name, p.City, p.State, a})
				}
			}
			s.Pending = nil
			return s, out, true
		})
		return operators.KeyRm("q3.rows", joined)
	}, newQ3, rowString[Q3Row])

// Q4Row is the average closing price of a category.
type Q4Row struct {
	Category int64
	Average  float64 // in cents
	Auctions int64   // how many auctions closed with a bid
}

// q4Bid is a bid q4 holds until its auction comes.
type q4Bid struct{ Time, Price int64 }

// q4State is what q4 keeps per auction: the auction once it has come, its highest bid so far,
// and the bids that came before it (which may fall in its lifetime).
type q4State struct {
	Open                     bool
	Category, Start, Expires int64
	Max                      int64
	Bids                     int64
	Early                    []q4Bid
}

func (s *q4State) bid(t, price int64) {
	if t >= s.Start && t <= s.Expires {
		s.Max = max(s.Max, price)
		s.Bids++
	}
}

// q4Closed is an auction's category and closing price.
type q4Closed struct{ Category, Price int64 }

// q4Sum is the sum and count of a category's closing prices.
type q4Sum struct{ Category, Sum, N int64 }

// q4 is the average closing price per category: each auction's winning bid is its highest
// bid made within its lifetime (from its opening to its expiry, both included), and the query
// gives, per category, the average of the winning bids of its auctions that had one (Flink's
// nexmark SQL: MAX(price) per auction, then AVG per category, without the reserve check of
// the original Nexmark). An auction closes when the watermark passes its expiry, and its
// state is dropped then; the averages are emitted at the end of the input (Flink's query
// emits them as running updates).
var q4 = define("q4", "average winning bid per category",
	func(in dataflow.Stream[Event], c Config) dataflow.Stream[Q4Row] {
		sides := operators.Filter("q4.select", in, func(e Event) bool { return e.Kind != KindPerson })
		byAuction := operators.KeyOn("q4.by-auction", sides, func(e Event) string {
			if e.Kind == KindAuction {
				return key(e.Auction.ID)
			}
			return key(e.Bid.Auction)
		})
		closed := dataflow.StatefulTime("q4.winning", byAuction, dataflow.EventClock(Event.Time, 0).WithMaxDrift(c.MaxDrift),
			dataflow.TimedLogic[Event, q4State, q4Closed]{
				OnItem: func(_ string, s *q4State, _ bool, e Event, _, _ time.Time, _ *dataflow.Emitter[q4Closed]) (bool, error) {
					if e.Kind == KindBid {
						if s.Open {
							s.bid(e.Bid.DateTime, e.Bid.Price)
						} else {
							s.Early = append(s.Early, q4Bid{e.Bid.DateTime, e.Bid.Price})
						}
						return true, nil
					}
					a := e.Auction
					s.Open, s.Category, s.Start, s.Expires = true, a.Category, a.DateTime, a.Expires
					for _, b := range s.Early {
						s.bid(b.Time, b.Price)
					}
					s.Early = nil
					return true, nil
				},
				// An auction closes once no bid at or before its expiry can come; bids whose
				// auction has not come are dropped once it could not come any more in time
				// for them.
				WakeAt: func(_ string, s *q4State) time.Time {
					if s.Open {
						return msTime(s.Expires + 1)
					}
					var last int64
					for _, b := range s.Early { // they come in time order from each partition only
						last = max(last, b.Time)
					}
					if len(s.Early) == 0 {
						return time.Time{}
					}
					return msTime(last + 1)
				},
				OnWatermark: func(_ string, s *q4State, wm time.Time, out *dataflow.Emitter[q4Closed]) (bool, error) {
					if !s.Open {
						// An auction that comes now is at wm or later: the bids before wm
						// cannot be in its lifetime.
						s.Early = slices.DeleteFunc(s.Early, func(b q4Bid) bool { return msTime(b.Time).Before(wm) })
						return len(s.Early) > 0, nil
					}
					if s.Bids > 0 {
						out.Emit(q4Closed{s.Category, s.Max})
					}
					return false, nil
				},
			})
		byCategory := operators.KeyOn("q4.by-category", operators.KeyRm("q4.closed", closed),
			func(c q4Closed) string { return key(c.Category) })
		sums := operators.Fold("q4.average", byCategory, func(string) q4Sum { return q4Sum{} },
			func(s q4Sum, c q4Closed) q4Sum { return q4Sum{c.Category, s.Sum + c.Price, s.N + 1} })
		return operators.Map("q4.rows", sums, func(kv dataflow.KV[q4Sum]) Q4Row { return q4Row(kv.Value) })
	}, newQ4, rowString[Q4Row])

func q4Row(s q4Sum) Q4Row {
	return Q4Row{Category: s.Category, Average: float64(s.Sum) / float64(s.N), Auctions: s.N}
}

// Q5Row is an auction with the most bids in a sliding window.
type Q5Row struct {
	Auction    int64
	Bids       int
	Start, End int64 // the window, milliseconds since 1970
}

// q5Max is, for one window, the highest bid count of an auction and the auctions that have it.
type q5Max struct {
	Max      int
	Auctions []string
}

// q5 is the hot items query: in every sliding window (Config.Window long, one starting every
// Config.Slide, aligned to 1970), the auction or auctions with the most bids (Flink's nexmark
// SQL: every auction whose count is at least the window's maximum, so ties give several
// rows). It counts per auction and window, then gathers each window's counts by window. The
// second step's clock reads the window's start from the counts, which the first step emits
// window by window but, when one watermark move closes several windows, key by key: its wait
// (twice the window length) covers that disorder.
var q5 = define("q5", "hot items: the auctions with the most bids per sliding window",
	func(in dataflow.Stream[Event], c Config) dataflow.Stream[Q5Row] {
		byAuction := operators.KeyOn("q5.by-auction", bids(in), func(b Bid) string { return key(b.Auction) })
		counts := windows.Count("q5.count", byAuction, dataflow.EventClock(bidTime, 0).WithMaxDrift(c.MaxDrift),
			windows.Sliding(c.Window, c.Slide, unixOrigin))
		byWindow := operators.KeyOn("q5.by-window", counts.Results, func(r windows.Result[int]) string {
			return key(r.Window.ID)
		})
		tops := windows.Fold("q5.max", byWindow,
			dataflow.EventClock(func(r windows.Result[int]) time.Time { return r.Window.Start }, 2*c.Window),
			windows.Tumbling(c.Slide, unixOrigin), func() q5Max { return q5Max{} },
			func(m q5Max, r windows.Result[int]) q5Max {
				switch {
				case r.Value > m.Max:
					return q5Max{r.Value, []string{r.Key}}
				case r.Value == m.Max:
					m.Auctions = append(m.Auctions, r.Key)
				}
				return m
			}, nil)
		return operators.FlatMap("q5.rows", tops.Results, func(r windows.Result[q5Max]) []Q5Row {
			out := make([]Q5Row, 0, len(r.Value.Auctions))
			start := r.Window.Start.UnixMilli()
			end := start + c.Window.Milliseconds()
			for _, a := range r.Value.Auctions {
				id, _ := strconv.ParseInt(a, 10, 64) // the keys are the ids q5.by-auction made
				out = append(out, Q5Row{id, r.Value.Max, start, end})
			}
			return out
		})
	}, newQ5, rowString[Q5Row])

// Q7Row is a bid with the highest price of its window.
type Q7Row struct {
	Auction, Bidder, Price, DateTime int64
	End                              int64 // the window's end, milliseconds since 1970
}

// q7Max is the highest price of a window and the bids that have it.
type q7Max struct {
	Price int64
	Bids  []Bid
}

func (m q7Max) add(b Bid) q7Max {
	switch {
	case len(m.Bids) == 0 || b.Price > m.Price:
		return q7Max{b.Price, []Bid{b}}
	case b.Price == m.Price:
		m.Bids = append(m.Bids, b)
	}
	return m
}

func (m q7Max) merge(o q7Max) q7Max {
	for _, b := range o.Bids {
		m = m.add(b)
	}
	return m
}

// q7Shards is how many keys q7 spreads the bids over for its first step.
const q7Shards = 64

// q7 is the highest bid: in every tumbling window of Config.Window, the bid or bids with the
// highest price (Flink's nexmark SQL: the bids whose price equals the window's maximum). The
// first step finds the highest bids per window of each of 64 shards of the auctions, the
// second, keyed by window, those of the window; its clock reads the window's start, with the
// wait q5's second step has for the same reason.
var q7 = define("q7", "highest bid per tumbling window",
	func(in dataflow.Stream[Event], c Config) dataflow.Stream[Q7Row] {
		w := windows.Tumbling(c.Window, unixOrigin)
		byShard := operators.KeyOn("q7.by-shard", bids(in), func(b Bid) string { return key(b.Auction % q7Shards) })
		shardMax := windows.Fold("q7.shard-max", byShard, dataflow.EventClock(bidTime, 0).WithMaxDrift(c.MaxDrift), w,
			func() q7Max { return q7Max{} }, q7Max.add, nil)
		byWindow := operators.KeyOn("q7.by-window", shardMax.Results, func(r windows.Result[q7Max]) string {
			return key(r.Window.ID)
		})
		windowMax := windows.Fold("q7.max", byWindow,
			dataflow.EventClock(func(r windows.Result[q7Max]) time.Time { return r.Window.Start }, 2*c.Window), w,
			func() q7Max { return q7Max{} }, func(m q7Max, r windows.Result[q7Max]) q7Max { return m.merge(r.Value) }, nil)
		return operators.FlatMap("q7.rows", windowMax.Results, func(r windows.Result[q7Max]) []Q7Row {
			out := make([]Q7Row, 0, len(r.Value.Bids))
			for _, b := range r.Value.Bids {
				out = append(out, Q7Row{b.Auction, b.Bidder, b.Price, b.DateTime, r.Window.End.UnixMilli()})
			}
			return out
		})
	}, newQ7, rowString[Q7Row])

// Q8Row is a person who opened an auction in the window they registered in.
type Q8Row struct {
	ID    int64
	Name  string
	Start int64 // the window's start, milliseconds since 1970
}

// q8 is the new users query: the persons who opened an auction in the same tumbling window of
// Config.Window in which they registered, one row per person (Flink's nexmark SQL: persons
// and auctions grouped by id and window, joined on id = seller and the window's start). It is
// a windowed join of persons and auctions by person id. The join's two sides are split from
// the same batches of events and merged again, a batch's persons before its auctions, so the
// merged stream is out of order by up to the event time a batch spans: the join's wait is that
// span (batchSpan).
var q8 = define("q8", "new users: persons who opened an auction in their first window",
	func(in dataflow.Stream[Event], c Config) dataflow.Stream[Q8Row] {
		persons := operators.FilterMap("q8.persons", in, func(e Event) (Person, bool) {
			if e.Kind != KindPerson {
				return Person{}, false
			}
			return *e.Person, true
		})
		auctions := operators.FilterMap("q8.auctions", in, func(e Event) (Auction, bool) {
			if e.Kind != KindAuction {
				return Auction{}, false
			}
			return *e.Auction, true
		})
		joined := windows.Join2("q8",
			operators.KeyOn("q8.person-id", persons, func(p Person) string { return key(p.ID) }),
			operators.KeyOn("q8.seller-id", auctions, func(a Auction) string { return key(a.Seller) }),
			func(p Person) time.Time { return msTime(p.DateTime) }, func(a Auction) time.Time { return msTime(a.DateTime) },
			batchSpan(c), windows.Tumbling(c.Window, unixOrigin), windows.JoinComplete, windows.Options{MaxDrift: c.MaxDrift})
		return operators.Map("q8.new-users", joined.Results, func(r windows.Result[[]windows.Pair[Person, Auction]]) Q8Row {
			p := r.Value[0].Left // JoinComplete: every row has both sides, and one person has one id
			return Q8Row{p.ID, p.Name, r.Window.Start.UnixMilli()}
		})
	}, newQ8, rowString[Q8Row])

// Q11Row is a session of a bidder.
type Q11Row struct {
	Bidder     int64
	Bids       int
	Start, End int64 // the session, milliseconds since 1970: its first bid, its last plus the gap
}

// q11 is the user sessions query: the number of bids of each bidder's sessions, a session
// being bids each less than Config.SessionGap after the one before (Flink's nexmark SQL, but
// for two bids exactly the gap apart, which Flink puts in one session and epochflow in two).
var q11 = define("q11", "user sessions: bids per bidder per session window",
	func(in dataflow.Stream[Event], c Config) dataflow.Stream[Q11Row] {
		byBidder := operators.KeyOn("q11.by-bidder", bids(in), func(b Bid) string { return key(b.Bidder) })
		sessions := windows.Count("q11", byBidder, dataflow.EventClock(bidTime, 0).WithMaxDrift(c.MaxDrift), windows.Session(c.SessionGap))
		return operators.MapErr("q11.rows", sessions.Results, func(r windows.Result[int]) (Q11Row, error) {
			id, err := strconv.ParseInt(r.Key, 10, 64)
			return Q11Row{id, r.Value, r.Window.Start.UnixMilli(), r.Window.End.UnixMilli()}, err
		})
	}, newQ11, rowString[Q11Row])

// Q12Row is the bid count of a bidder in a processing-time window.
type Q12Row struct {
	Bidder int64
	Bids   int
	Start  int64 // the window's start, wall-clock milliseconds since 1970
}

// q12 is the processing-time windows query: the number of bids of each bidder in every
// tumbling window of Config.Window of processing (wall-clock) time, as the windowed step sees
// them (Flink's nexmark SQL). Which window a bid falls in depends on when it is processed, so
// only the total per bidder over all windows is the same from run to run.
var q12 = define("q12", "processing-time windows: bids per bidder per wall-clock window",
	func(in dataflow.Stream[Event], c Config) dataflow.Stream[Q12Row] {
		byBidder := operators.KeyOn("q12.by-bidder", bids(in), func(b Bid) string { return key(b.Bidder) })
		counts := windows.Count("q12", byBidder, dataflow.SystemClock[Bid](), windows.Tumbling(c.Window, unixOrigin))
		return operators.MapErr("q12.rows", counts.Results, func(r windows.Result[int]) (Q12Row, error) {
			id, err := strconv.ParseInt(r.Key, 10, 64)
			return Q12Row{id, r.Value, r.Window.Start.UnixMilli()}, err
		})
	}, newQ12, q12String).withDeterministic(q12Totals)

func q12String(r Q12Row) string {
	return strconv.FormatInt(r.Bidder, 10) + "\t" + strconv.Itoa(r.Bids) + "\t" + strconv.FormatInt(r.Start, 10)
}

// q12Totals turns q12's formatted rows into each bidder's total over all windows, the part of
// q12's output that does not depend on when the bids were processed.
func q12Totals(rows []string) []string {
	totals := map[string]int{}
	for _, r := range rows {
		f := strings.Split(r, "\t")
		n, err := strconv.Atoi(f[min(1, len(f)-1)])
		if err != nil || len(f) != 3 {
			n = -1 << 30 // a malformed row spoils its bidder's total, so the comparison fails
		}
		totals[f[0]] += n
	}
	out := make([]string, 0, len(totals))
	for b, n := range totals {
		out = append(out, b+"\t"+strconv.Itoa(n))
	}
	return out
}

// batchSpan is the event time that a batch of a partition spans (Config.Batch events of the
// stream), rounded up: the disorder that splitting a stream into two and merging them again
// makes.
func batchSpan(c Config) time.Duration {
	return time.Duration(int64(c.Batch)*int64(time.Second)/c.Rate) + time.Millisecond
}
