package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"

	"github.com/epochflow/epochflow/dataflow"
)

// Config says what the generator generates and how the windowed queries cut time. The zero
// value of each field means its default (see withDefaults).
type Config struct {
	// Events is how many events the stream has in all (default 1,000,000).
	Events int64
	// Seed makes the stream: the same seed gives the same events.
	Seed uint64
	// Rate is how many events a second of event time holds (default 10,000, Nexmark's first
	// event rate): event n happens n/Rate seconds after the base time. It is not a wall-clock
	// throttle: the source generates as fast as the flow reads.
	Rate int64
	// ActivePersons is how many of the newest persons new auctions and bids refer to (default
	// 1,000, Nexmark's numActivePeople).
	ActivePersons int64
	// ActiveAuctions is how many of the newest auctions bids refer to (default 100, Nexmark's
	// numInFlightAuctions).
	ActiveAuctions int64
	// Partitions is how many source partitions generate the stream (0: one per worker).
	Partitions int
	// Batch is how many events of the stream a read covers (default 1,024): a partition
	// generates its share of them (one in every Partitions).
	Batch int
	// Window is the length of the tumbling windows of q7, q8 and q12 and of the sliding
	// windows of q5 (default 10 s, as in Flink's Nexmark).
	Window time.Duration
	// Slide is how often q5's sliding windows start (default 2 s).
	Slide time.Duration
	// SessionGap is q11's session gap (default 10 s).
	SessionGap time.Duration
	// MaxDrift is the watermark alignment of the event-time steps that read the generator's
	// partitions (q4, q5, q7, q8 and q11; see dataflow.Clock.MaxDrift): a worker more than
	// MaxDrift of event time ahead of the slowest waits for it. 0 (the default): none.
	MaxDrift time.Duration

	meter *Meter // counts the events generated, if not nil
	// hold, if set, is asked before every read with the events the meter counted: while it
	// returns true the partitions read nothing (tests use it to stop a run partway).
	hold func(generated int64) bool
}

// The constants of the Nexmark generator (Flink's NexmarkGenerator and GeneratorConfig).
const (
	personProportion  = 1
	auctionProportion = 3
	bidProportion     = 46
	totalProportion   = personProportion + auctionProportion + bidProportion

	firstPersonID   = 1000
	firstAuctionID  = 1000
	firstCategoryID = 10
	numCategories   = 5
	personIDLead    = 10
	auctionIDLead   = 10

	hotAuctionRatio = 100 // hot auctions are those whose base-0 id is a multiple of it
	hotSellerRatio  = 100
	hotBidderRatio  = 100
	hotAuctions     = 2 // 1 in hotAuctions bids is on a recent auction, the rest on a hot one
	hotSellers      = 4
	hotBidders      = 4
)

// baseMillis is the event time of event 0: 2026-01-01T00:00:00Z. A fixed base keeps the stream
// the same from run to run (Flink's generator starts at the wall clock).
var baseMillis = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixMilli()

// withDefaults returns c with every zero field set to its default.
func (c Config) withDefaults() Config {
	def := func(v *int64, d int64) {
		if *v == 0 {
			*v = d
		}
	}
	def(&c.Events, 1_000_000)
	def(&c.Rate, 10_000)
	def(&c.ActivePersons, 1000)
	def(&c.ActiveAuctions, 100)
	if c.Batch == 0 {
		c.Batch = 1024
	}
	if c.Window == 0 {
		c.Window = 10 * time.Second
	}
	if c.Slide == 0 {
		c.Slide = 2 * time.Second
	}
	if c.SessionGap == 0 {
		c.SessionGap = 10 * time.Second
	}
	return c
}

// check reports a configuration that cannot generate a stream.
func (c Config) check() error {
	switch {
	case c.Events < 0 || c.Rate < 0 || c.ActivePersons < 0 || c.ActiveAuctions < 0:
		return errors.New("nexmark: the event count, rate and active persons and auctions must not be negative")
	case c.Partitions < 0 || c.Batch < 0:
		return errors.New("nexmark: partitions and batch must not be negative")
	case c.Window < 0 || c.Slide < 0 || c.SessionGap < 0:
		return errors.New("nexmark: window, slide and session gap must not be negative")
	case c.Window > 0 && c.Slide > c.Window:
		return fmt.Errorf("nexmark: the slide %v is longer than the window %v", c.Slide, c.Window)
	}
	return nil
}

// Generator makes the events of the stream of a Config: Event(n) is event n, the same every
// time for the same Config, whoever asks and in whatever order. It is not safe for concurrent
// use: give each goroutine its own.
type Generator struct {
	c   Config
	pcg rand.PCG
	r   *rand.Rand
}

// NewGenerator returns a generator of c's stream.
func NewGenerator(c Config) *Generator {
	g := &Generator{c: c.withDefaults()}
	g.r = rand.New(&g.pcg)
	return g
}

// Millis returns the event time of event n, in milliseconds since 1970.
func (g *Generator) Millis(n int64) int64 { return baseMillis + n*1000/g.c.Rate }

// Event returns event n of the stream. Its kind follows the Nexmark proportions: of every 50
// events, the first is a person, the next 3 auctions, the other 46 bids.
func (g *Generator) Event(n int64) Event {
	// Each event has a random stream of its own, seeded by the seed and its number, so that
	// an event does not depend on which partition makes it nor on what it made before.
	g.pcg.Seed(g.c.Seed, mix(uint64(n)))
	ms := g.Millis(n)
	switch rem := n % totalProportion; {
	case rem < personProportion:
		return Event{Kind: KindPerson, Person: g.person(n, ms)}
	case rem < personProportion+auctionProportion:
		return Event{Kind: KindAuction, Auction: g.auction(n, ms)}
	default:
		return Event{Kind: KindBid, Bid: g.bid(n, ms)}
	}
}

// mix is SplitMix64's finaliser: it spreads consecutive event numbers over the seed space.
func mix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
	x = (x ^ x>>27) * 0x94d049bb133111eb
	return x ^ x>>31
}

// lastPerson returns the base-0 id of the newest person at or before event n.
func lastPerson(n int64) int64 {
	epoch, offset := n/totalProportion, n%totalProportion
	if offset >= personProportion {
		offset = personProportion - 1
	}
	return epoch*personProportion + offset
}

// lastAuction returns the base-0 id of the newest auction at or before event n.
func lastAuction(n int64) int64 {
	epoch, offset := n/totalProportion, n%totalProportion
	switch {
	case offset < personProportion:
		epoch--
		offset = auctionProportion - 1
	case offset >= personProportion+auctionProportion:
		offset = auctionProportion - 1
	default:
		offset -= personProportion
	}
	return epoch*auctionProportion + offset
}

// nextPerson returns the base-0 id of a recent person (or one of the next few, which do not
// exist yet: as in Nexmark, a few bids and auctions refer to persons still to come).
func (g *Generator) nextPerson(n int64) int64 {
	people := lastPerson(n) + 1
	active := min(people, g.c.ActivePersons)
	return people - active + g.r.Int64N(active+personIDLead)
}

// nextAuction returns the base-0 id of a recent auction (or one of the next few).
func (g *Generator) nextAuction(n int64) int64 {
	last := lastAuction(n)
	lo := max(last-g.c.ActiveAuctions, 0)
	return lo + g.r.Int64N(last-lo+1+auctionIDLead)
}

// price returns a price in cents, log-uniform between 1 and 1,000,000 dollars.
func (g *Generator) price() int64 {
	return int64(math.Round(math.Pow(10, g.r.Float64()*6) * 100))
}

var (
	firstNames = []string{"Peter", "Paul", "Luke", "John", "Saul", "Vicky", "Kate", "Julie", "Sarah", "Deiter", "Walter"}
	lastNames  = []string{"Shultz", "Abrams", "Spencer", "White", "Bartels", "Walton", "Smith", "Jones", "Noris"}
	states     = []string{"AZ", "CA", "ID", "OR", "WA", "WY"}
	cities     = []string{"Phoenix", "Los Angeles", "San Francisco", "Boise", "Portland", "Bend", "Redmond", "Seattle", "Kent", "Cheyenne"}
	// names and emails are every first and last name, made once so that a person costs no
	// string building.
	names, emails = func() (n, e []string) {
		for _, f := range firstNames {
			for _, l := range lastNames {
				n = append(n, f+" "+l)
				e = append(e, f+"."+l+"@example.com")
			}
		}
		return n, e
	}()
	items    = []string{"bicycle", "camera", "chair", "clock", "guitar", "lamp", "painting", "phone", "rug", "watch"}
	adjs     = []string{"antique", "broken", "fine", "new", "rare", "used", "vintage"}
	channels = []string{"Google", "Facebook", "Baidu", "Apple"}
	urls     = func() (u []string) {
		for i := range 100 {
			u = append(u, "https://www.nexmark.com/item.htm?query=1&channel_id="+strconv.Itoa(i))
		}
		return u
	}()
)

func (g *Generator) person(n, ms int64) *Person {
	i := g.r.IntN(len(names))
	return &Person{
		ID:       firstPersonID + lastPerson(n),
		Name:     names[i],
		Email:    emails[i],
		City:     cities[g.r.IntN(len(cities))],
		State:    states[g.r.IntN(len(states))],
		DateTime: ms,
	}
}

func (g *Generator) auction(n, ms int64) *Auction {
	seller := g.nextPerson(n)
	if g.r.IntN(hotSellers) > 0 {
		seller = lastPerson(n) / hotSellerRatio * hotSellerRatio
	}
	initial := g.price()
	// An auction lasts up to twice the event time that the next ActiveAuctions auctions take
	// to be opened (Nexmark's nextAuctionLengthMs).
	ahead := g.c.ActiveAuctions * totalProportion / auctionProportion
	horizon := g.Millis(n+ahead) - ms
	return &Auction{
		ID:          firstAuctionID + lastAuction(n),
		ItemName:    items[g.r.IntN(len(items))],
		Description: adjs[g.r.IntN(len(adjs))],
		InitialBid:  initial,
		Reserve:     initial + g.price(),
		DateTime:    ms,
		Expires:     ms + 1 + g.r.Int64N(max(horizon*2, 1)),
		Seller:      firstPersonID + seller,
		Category:    firstCategoryID + g.r.Int64N(numCategories),
	}
}

func (g *Generator) bid(n, ms int64) *Bid {
	auction := g.nextAuction(n)
	if g.r.IntN(hotAuctions) > 0 {
		auction = lastAuction(n) / hotAuctionRatio * hotAuctionRatio
	}
	bidder := g.nextPerson(n)
	if g.r.IntN(hotBidders) > 0 {
		bidder = lastPerson(n)/hotBidderRatio*hotBidderRatio + 1
	}
	c := g.r.IntN(len(urls))
	return &Bid{
		Auction:  firstAuctionID + auction,
		Bidder:   firstPersonID + bidder,
		Price:    g.price(),
		Channel:  channels[c%len(channels)],
		URL:      urls[c],
		DateTime: ms,
	}
}

// source is the generator as a partitioned epochflow source: partition p of P generates the
// events p, p+P, p+2P, ... of the one stream, in order, so the events of a run do not depend on
// P, and each partition's event times only grow (its watermark needs no wait). A partition's
// state is how many events it has generated: a resumed run goes on from there.
type source struct{ c Config }

// Source returns the generator of c as an epochflow source.
func Source(c Config) dataflow.Source[Event] {
	return dataflow.FromPartitioned[Event, int64](source{c: c.withDefaults()})
}

// Parts lists the partitions "0/P" .. "P-1/P" (P is Config.Partitions, or the worker count):
// each names its stride, which its events depend on.
func (s source) Parts(ctx context.Context) ([]string, error) {
	if err := s.c.check(); err != nil {
		return nil, err
	}
	p := s.c.Partitions
	if p == 0 {
		p = max(dataflow.WorkerCount(ctx), 1)
	}
	parts := make([]string, p)
	for i := range parts {
		parts[i] = strconv.Itoa(i) + "/" + strconv.Itoa(p)
	}
	return parts, nil
}

// Build opens partition part, after the events its resume state says it had generated.
func (s source) Build(_ context.Context, part string, resume *int64) (dataflow.StatefulSource[Event, int64], error) {
	i, n, ok := strings.Cut(part, "/")
	index, err1 := strconv.ParseInt(i, 10, 64)
	stride, err2 := strconv.ParseInt(n, 10, 64)
	if !ok || err1 != nil || err2 != nil || index < 0 || index >= stride {
		return nil, fmt.Errorf("nexmark: partition %q is not \"INDEX/COUNT\"", part)
	}
	s.c.meter.begin()
	r := &reader{g: NewGenerator(s.c), index: index, stride: stride, batch: s.c.Batch, meter: s.c.meter, hold: s.c.hold}
	if resume != nil {
		if *resume < 0 {
			return nil, fmt.Errorf("nexmark: partition %q: resume state %d is negative", part, *resume)
		}
		r.done = *resume
	}
	return r, nil
}

// reader is one open partition of the source.
type reader struct {
	g             *Generator
	index, stride int64
	done          int64 // events generated so far: the next is index + done*stride
	batch         int
	meter         *Meter
	hold          func(int64) bool
}

// Next generates the partition's next batch, or returns io.EOF after its last event.
func (r *reader) Next(context.Context) ([]Event, error) {
	if r.hold != nil && r.meter != nil && r.hold(r.meter.Events.Load()) {
		return nil, nil
	}
	// A batch is the partition's events among the next Batch of the stream, so that it spans
	// the same event time whatever the number of partitions. A new slice every time: the
	// batch is the engine's once returned.
	n := r.index + r.done*r.stride
	limit := min((n/int64(r.batch)+1)*int64(r.batch), r.g.c.Events)
	buf := make([]Event, 0, (limit-n+r.stride-1)/r.stride)
	for ; n < limit; n += r.stride {
		buf = append(buf, r.g.Event(n))
		r.done++
	}
	r.count(len(buf))
	if n >= r.g.c.Events {
		return buf, io.EOF
	}
	return buf, nil
}

func (r *reader) count(n int) {
	if r.meter != nil {
		r.meter.Events.Add(int64(n))
	}
}

// Snapshot returns how many events the partition has generated.
func (r *reader) Snapshot() int64 { return r.done }

// Commit does nothing: a generator has nothing to acknowledge.
func (r *reader) Commit(context.Context, int64) error { return nil }

// Close does nothing.
func (r *reader) Close() error { return nil }
