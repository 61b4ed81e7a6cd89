package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/epochflow/epochflow/connectors/flowtest"
	"github.com/epochflow/epochflow/dataflow"
	"github.com/epochflow/epochflow/recovery"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// testConfig is a small stream whose windows are short enough that every windowed query has
// many: 20,000 events at 1,000 a second make 20 s of event time.
func testConfig(seed uint64) Config {
	return Config{Events: 20_000, Seed: seed, Rate: 1000, Window: 2 * time.Second, Slide: 500 * time.Millisecond,
		SessionGap: 300 * time.Millisecond, Batch: 128}
}

// runQuery runs q's flow over c with workers workers and returns the rows it wrote.
func runQuery(t *testing.T, q Query, c Config, workers int) []string {
	t.Helper()
	sink := flowtest.NewTwoPhaseSink[string](nil)
	out := sink.Output()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	m := &Meter{}
	if err := dataflow.Run(ctx, q.Build(c, m, &out), dataflow.Options{Workers: workers, EpochInterval: 5 * time.Millisecond, Logger: quiet}); err != nil {
		t.Fatalf("%s, %d workers: %v", q.Name, workers, err)
	}
	if m.Events.Load() != c.Events {
		t.Fatalf("%s: the source generated %d events, want %d", q.Name, m.Events.Load(), c.Events)
	}
	if got := int64(len(sink.Visible())); got != m.Rows.Load() {
		t.Fatalf("%s: the sink has %d rows, the meter counted %d", q.Name, got, m.Rows.Load())
	}
	return sink.Visible()
}

// diff compares two multisets of rows and describes how they differ ("" when they are equal).
func diff(got, want []string) string {
	count := map[string]int{}
	for _, r := range got {
		count[r]++
	}
	for _, r := range want {
		count[r]--
	}
	var extra, missing []string
	for r, n := range count {
		for ; n > 0; n-- {
			extra = append(extra, r)
		}
		for ; n < 0; n++ {
			missing = append(missing, r)
		}
	}
	if len(extra)+len(missing) == 0 {
		return ""
	}
	slices.Sort(extra)
	slices.Sort(missing)
	cut := func(s []string) []string { return s[:min(len(s), 5)] }
	return fmt.Sprintf("%d rows, want %d (the baseline's): %d extra, e.g. %q; %d missing, e.g. %q",
		len(got), len(want), len(extra), cut(extra), len(missing), cut(missing))
}

// Every query's flow writes the rows of its plain Go baseline (as a multiset; for q12, whose
// windows are of processing time, the same total per bidder), whatever the seed and the
// number of workers (and so of source partitions); the run with 3 workers has watermark
// alignment on (-max-drift), which changes when workers read, never what they write.
func TestQueriesMatchBaseline(t *testing.T) {
	for _, q := range Queries {
		t.Run(q.Name, func(t *testing.T) {
			t.Parallel()
			for i, workers := range []int{1, 2, 3} {
				c := testConfig(uint64(i + 1))
				if workers == 3 {
					c.MaxDrift = 200 * time.Millisecond
				}
				_, want := q.Baseline(c, true)
				if len(want) == 0 {
					t.Fatalf("seed %d: the baseline has no rows: the test would prove nothing", c.Seed)
				}
				got := runQuery(t, q, c, workers)
				if d := diff(q.deterministic(got), q.deterministic(want)); d != "" {
					t.Errorf("seed %d, %d workers: %s", c.Seed, workers, d)
				}
			}
		})
	}
}

// Every query's flow, crashed twice partway (once with an epoch snapshotted but not committed,
// once in the Commit calls of a committed epoch) and resumed from its SQLite recovery store,
// writes exactly the rows of its baseline, once: the source resumes after the events of the
// last committed epoch, the stateful steps from their state.
func TestQueriesMatchBaselineAfterCrashes(t *testing.T) {
	for _, q := range Queries {
		t.Run(q.Name, func(t *testing.T) {
			t.Parallel()
			c := testConfig(7)
			_, want := q.Baseline(c, true)
			dir := t.TempDir()
			sink := flowtest.NewTwoPhaseSink[string](nil)
			out := sink.Output()
			var generated int64
			// Run 0 crashes once it has generated half the events, run 1 a quarter of them
			// later; run 2 finishes. Each run's sources stop reading at its crash point, so the
			// crash comes partway whatever the speed of the machine.
			for run, point := range []string{"after-snapshot", "inside-commit", ""} {
				cc := c
				var crashed, committed atomic.Bool
				at := c.Events / 2
				if run == 1 {
					at = c.Events / 4
				}
				m := &Meter{}
				if point != "" {
					cc.hold = func(n int64) bool { return n >= at && !crashed.Load() }
				}
				store, err := recovery.OpenSQLite(context.Background(), dir, recovery.SQLiteOptions{})
				if err != nil {
					t.Fatal(err)
				}
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				stats, err := dataflow.RunStats(ctx, q.Build(cc, m, &out), dataflow.Options{
					Workers: 2, EpochInterval: 2 * time.Millisecond, Recovery: store, Logger: quiet,
					// The crash comes once an epoch holding the events up to the hold has
					// been committed, so that the next run resumes partway.
					CrashHook: func(p string) bool {
						switch {
						case point == "" || m.Events.Load() < at:
						case p == "after-commit-record":
							committed.Store(true)
						case p == point && committed.Load():
							crashed.Store(true)
							return true
						}
						return false
					},
				})
				cancel()
				if cerr := store.Close(); cerr != nil {
					t.Fatal(cerr)
				}
				generated += m.Events.Load()
				switch {
				case run > 0 && (stats.ResumedAfter == 0 || m.Events.Load() >= c.Events):
					t.Fatalf("run %d resumed after epoch %d and generated %d events: it did not resume where run %d had committed", run, stats.ResumedAfter, m.Events.Load(), run-1)
				case point == "" && err != nil:
					t.Fatalf("run %d (resumed): %v", run, err)
				case point != "" && !errors.Is(err, dataflow.ErrCrashed):
					t.Fatalf("run %d: %v, want a crash at %s", run, err, point)
				}
			}
			if generated < c.Events {
				t.Errorf("the runs generated %d events in all, want at least %d", generated, c.Events)
			}
			got := sink.Visible()
			if d := diff(q.deterministic(got), q.deterministic(want)); d != "" {
				t.Errorf("after two crashes: %s", d)
			}
		})
	}
}

// The generator follows the Nexmark model: of every 50 events one person, 3 auctions and 46
// bids, with consecutive ids; auctions and bids refer to persons and auctions that exist or
// come within the next few; times grow at the configured rate; and the same seed gives the same
// stream, another seed another.
func TestGeneratorFollowsTheModel(t *testing.T) {
	c := Config{Events: 50_000, Seed: 3, Rate: 2000}
	g, again, other := NewGenerator(c), NewGenerator(c), NewGenerator(Config{Events: 50_000, Seed: 4, Rate: 2000})
	kinds := map[Kind]int{}
	var persons, auctions int64
	same := 0
	for n := range c.Events {
		e := g.Event(n)
		kinds[e.Kind]++
		if e.String() != again.Event(n).String() {
			t.Fatalf("event %d differs between two generators of the same seed", n)
		}
		if e.String() == other.Event(n).String() {
			same++
		}
		if want := baseMillis + n/2; e.Millis() != want {
			t.Fatalf("event %d at %d ms, want %d (2,000 a second)", n, e.Millis(), want)
		}
		switch e.Kind {
		case KindPerson:
			if e.Person.ID != firstPersonID+persons {
				t.Fatalf("event %d: person %d, want %d", n, e.Person.ID, firstPersonID+persons)
			}
			persons++
		case KindAuction:
			if e.Auction.ID != firstAuctionID+auctions {
				t.Fatalf("event %d: auction %d, want %d", n, e.Auction.ID, firstAuctionID+auctions)
			}
			auctions++
			if s := e.Auction.Seller; s < firstPersonID || s >= firstPersonID+persons+personIDLead {
				t.Fatalf("event %d: auction by seller %d, with %d persons so far", n, s, persons)
			}
			if e.Auction.Expires <= e.Auction.DateTime || e.Auction.Category < 10 || e.Auction.Category >= 15 {
				t.Fatalf("event %d: %v", n, e)
			}
		case KindBid:
			b := e.Bid
			if b.Auction < firstAuctionID || b.Auction >= firstAuctionID+auctions+auctionIDLead {
				t.Fatalf("event %d: bid on auction %d, with %d auctions so far", n, b.Auction, auctions)
			}
			if b.Bidder < firstPersonID || b.Bidder >= firstPersonID+persons+personIDLead {
				t.Fatalf("event %d: bid by %d, with %d persons so far", n, b.Bidder, persons)
			}
			if b.Price < 100 || b.Price > 100_000_000 {
				t.Fatalf("event %d: price %d", n, b.Price)
			}
		}
	}
	if kinds[KindPerson] != 1000 || kinds[KindAuction] != 3000 || kinds[KindBid] != 46_000 {
		t.Errorf("kinds %v, want 1,000 persons, 3,000 auctions and 46,000 bids", kinds)
	}
	if same > 1000 {
		t.Errorf("%d of %d events are the same with another seed", same, c.Events)
	}
}

// Each partition of the source generates its share of the stream in order, in batches that
// span at most Config.Batch events of the stream, and together the partitions generate every
// event once; a partition built with a resume state goes on after the events it counts.
func TestSourcePartitionsShareTheStream(t *testing.T) {
	c := Config{Events: 1000, Seed: 1, Batch: 30}.withDefaults()
	g := NewGenerator(c)
	ctx := context.Background()
	src := source{c: c}
	var all []string
	for p := range 3 {
		part := fmt.Sprintf("%d/3", p)
		r, err := src.Build(ctx, part, nil)
		if err != nil {
			t.Fatal(err)
		}
		var evs []Event
		for {
			b, err := r.Next(ctx)
			if len(b) > 10 {
				t.Fatalf("partition %s: a batch of %d events: it spans more than a batch (30) of the stream", part, len(b))
			}
			evs = append(evs, b...)
			if errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				t.Fatal(err)
			}
		}
		if want := (1000 - p + 2) / 3; len(evs) != want {
			t.Fatalf("partition %s generated %d events, want %d", part, len(evs), want)
		}
		for i, e := range evs {
			if want := g.Event(int64(p + 3*i)); e.String() != want.String() {
				t.Fatalf("partition %s, event %d: %v, want %v", part, i, e, want)
			}
		}
		all = append(all, strings.Repeat("x", len(evs)))
		resume := int64(100)
		r2, err := src.Build(ctx, part, &resume)
		if err != nil {
			t.Fatal(err)
		}
		b, err := r2.Next(ctx)
		if err != nil || len(b) == 0 || b[0].String() != evs[100].String() {
			t.Fatalf("partition %s resumed after 100 events: %d events, %v; want event %v first", part, len(b), err, evs[100])
		}
	}
	if n := len(strings.Join(all, "")); n != int(c.Events) {
		t.Errorf("the partitions generated %d events, want %d", n, c.Events)
	}
	if _, err := src.Build(ctx, "3/3", nil); err == nil {
		t.Error("partition 3/3 was built")
	}
}
