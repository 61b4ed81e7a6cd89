// Command nexmark runs a query of the Nexmark benchmark (an online auction: persons, auctions
// and bids) on epochflow, over events from the Nexmark generator, and prints how many events a
// second the run processed.
//
//	go run ./examples/nexmark -query q5 -events 10000000 [-workers W] [-recovery DIR]
//
// The generator is a partitioned source, one partition per worker: partition p of P generates
// the events p, p+P, p+2P... of one deterministic stream (-seed), whose event times advance by
// 1/-rate seconds an event. The query's rows are counted, or printed with -print. See README.md
// for the queries.
package main

import (
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/epochflow/epochflow/connectors/stdio"
	"github.com/epochflow/epochflow/dataflow"
)

func main() {
	var c Config
	query := flag.String("query", "q0", "the query to run: "+queryNames())
	print := flag.Bool("print", false, "print the query's rows on standard output (besides counting them)")
	flag.Int64Var(&c.Events, "events", 1_000_000, "how many events to generate")
	flag.Uint64Var(&c.Seed, "seed", 1, "the generator's seed: the same seed gives the same events")
	flag.Int64Var(&c.Rate, "rate", 10_000, "events per second of event time (not a throttle: events are generated as fast as the flow reads)")
	flag.Int64Var(&c.ActivePersons, "active-persons", 1000, "how many of the newest persons auctions and bids refer to")
	flag.Int64Var(&c.ActiveAuctions, "active-auctions", 100, "how many of the newest auctions bids refer to")
	flag.DurationVar(&c.Window, "window", 10*time.Second, "the window length of q5, q7, q8 and q12")
	flag.DurationVar(&c.Slide, "slide", 2*time.Second, "how often q5's sliding windows start")
	flag.DurationVar(&c.SessionGap, "session-gap", 10*time.Second, "q11's session gap")
	flag.DurationVar(&c.MaxDrift, "max-drift", 0, "watermark alignment of q4, q5, q7, q8 and q11: a worker more than D of event time ahead of the slowest waits for it (0: none)")
	dataflow.Usage("nexmark runs a query of the Nexmark benchmark over generated auction events and prints the events per second of the run.",
		"nexmark -query q5 -events 1000000 -workers 2 -recovery state")
	dataflow.MainFunc(func() (*dataflow.Flow, error) {
		q, ok := queryNamed(*query)
		if !ok {
			return nil, fmt.Errorf("-query %q: want one of %s", *query, queryNames())
		}
		if err := c.check(); err != nil && !dataflow.GraphOnly() {
			return nil, fmt.Errorf("flags: %w", err)
		}
		m := &Meter{Done: func(m *Meter, elapsed time.Duration) {
			fmt.Fprintf(os.Stderr, "%s: %d events, %d rows in %v: %.0f events/s\n", q.Name, m.Events.Load(), m.Rows.Load(),
				elapsed.Round(time.Millisecond), float64(m.Events.Load())/elapsed.Seconds())
		}}
		var sink *dataflow.Sink[string]
		if *print {
			s := stdio.PrintTo(os.Stdout, func(s string) string { return s })
			sink = &s
		}
		f := q.Build(c, m, sink)
		return f, f.Err()
	})
}

func queryNames() string {
	names := make([]string, len(Queries))
	for i, q := range Queries {
		names[i] = q.Name
	}
	return strings.Join(names, ", ")
}
