// Command clicks counts clicks per user per event-time window with an epochflow flow. It reads
// lines "RFC3339-timestamp<TAB>user" and writes one "user<TAB>window-start<TAB>window-end<TAB>count"
// line per user and window (RFC 3339, UTC), once the window has closed, in no particular order.
//
//	go run ./examples/clicks -input FILE -output FILE -window 1m [-slide D | -session-gap D]
//	    [-wait D] [-late FILE] [-workers N] [-epoch-interval D] [-recovery DIR]
//
// -window D gives tumbling windows of D aligned to the Unix epoch; with -slide S they are
// sliding windows of length D starting every S; -session-gap G gives session windows instead
// (a user's clicks less than G apart). -wait is the out-of-orderness bound: a click may come up
// to -wait after a later click and still be counted; a click later than that is late and goes
// to -late as "timestamp<TAB>user" (once per window it missed), or is only counted in the
// metrics when -late is not given. With -recovery the run survives kill -9: the next run resumes
// and every window's line is in the output exactly once.
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/epochflow/epochflow/connectors/file"
	"github.com/epochflow/epochflow/connectors/stdio"
	"github.com/epochflow/epochflow/dataflow"
	"github.com/epochflow/epochflow/operators"
	"github.com/epochflow/epochflow/windows"
)

// config is what the flags say.
type config struct {
	input, output, late string
	window, slide, gap  time.Duration
	wait                time.Duration
	exists              file.IfExists
}

func main() {
	var c config
	flag.StringVar(&c.input, "input", "", "file of \"RFC3339-timestamp<TAB>user\" lines (default: standard input)")
	flag.StringVar(&c.output, "output", "", "file to write the window counts to (default: standard output)")
	flag.StringVar(&c.late, "late", "", "file to write the late clicks to (default: none, only counted)")
	flag.DurationVar(&c.window, "window", 0, "tumbling window length (or sliding window length with -slide)")
	flag.DurationVar(&c.slide, "slide", 0, "sliding windows: start one every D (needs -window)")
	flag.DurationVar(&c.gap, "session-gap", 0, "session windows with this inactivity gap (instead of -window)")
	flag.DurationVar(&c.wait, "wait", 0, "out-of-orderness bound: how far behind a later click a click may come and still count")
	flag.Var(&c.exists, "output-exists", "what a run without recovery state for an output file does when that file holds data: refuse (the default), replace it, or append to it")
	dataflow.Usage("clicks counts clicks per user per event-time window and writes one \"user<TAB>window-start<TAB>window-end<TAB>count\" line per user and window.",
		"clicks -input clicks.tsv -output counts.tsv -window 1m -wait 10s -late late.tsv -recovery state")
	dataflow.MainFunc(func() (*dataflow.Flow, error) { return build(c, dataflow.GraphOnly()) })
}

// click is one parsed input line.
type click struct {
	At   time.Time
	User string
}

func parse(line string) (click, error) {
	ts, user, ok := strings.Cut(line, "\t")
	if !ok || user == "" {
		return click{}, fmt.Errorf("line %q: want \"RFC3339-timestamp<TAB>user\"", line)
	}
	at, err := time.Parse(time.RFC3339Nano, ts)
	if err != nil {
		return click{}, fmt.Errorf("line %q: %w", line, err)
	}
	return click{At: at, User: user}, nil
}

func (c config) windower() (windows.Windower, error) {
	switch {
	case c.gap > 0 && (c.window > 0 || c.slide > 0):
		return nil, errors.New("-session-gap excludes -window and -slide")
	case c.gap > 0:
		return windows.Session(c.gap), nil
	case c.window <= 0:
		return nil, errors.New("give -window D (tumbling, or sliding with -slide) or -session-gap D")
	case c.slide > 0:
		return windows.Sliding(c.window, c.slide, time.Unix(0, 0)), nil
	}
	return windows.Tumbling(c.window, time.Unix(0, 0)), nil
}

func formatCount(r windows.Result[int]) string {
	return fmt.Sprintf("%s\t%s\t%s\t%d", r.Key, r.Window.Start.UTC().Format(time.RFC3339Nano),
		r.Window.End.UTC().Format(time.RFC3339Nano), r.Value)
}

func formatLate(l windows.Late[click]) string {
	return fmt.Sprintf("%s\t%s", l.Item.At.UTC().Format(time.RFC3339Nano), l.Item.User)
}

// build returns the flow: read, spread the lines over the workers, parse, key by user, count per
// window, write the counts (and the late clicks). With graph (-graph, which needs no flag) the
// window flags may be missing or wrong: the chart is the same for every windower.
func build(c config, graph bool) (*dataflow.Flow, error) {
	w, err := c.windower()
	switch {
	case err != nil && graph:
		w = windows.Tumbling(time.Minute, time.Unix(0, 0))
	case err != nil:
		return nil, err
	}
	if c.wait < 0 {
		if !graph {
			return nil, fmt.Errorf("-wait %v must not be negative", c.wait)
		}
		c.wait = 0
	}
	flow := dataflow.New("clicks")
	var src dataflow.Source[string]
	if c.input == "" {
		src = stdio.Lines()
	} else {
		src = file.Lines(c.input)
	}
	lines := operators.Input(flow, "read", src)
	// One file is one partition, read by one worker: spread its lines over all workers. Each
	// worker sees a part of the file in its order, so a disorder within -wait in the file stays
	// within it on every worker.
	spread := operators.Redistribute("spread", lines)
	clicks := operators.MapErr("parse", spread, parse)
	byUser := operators.KeyOn("user", clicks, func(c click) string { return c.User })
	clock := dataflow.EventClock(func(c click) time.Time { return c.At }, c.wait)
	out := windows.Count("count", byUser, clock, w)
	var sink dataflow.Sink[windows.Result[int]]
	if c.output == "" {
		sink = stdio.PrintTo(os.Stdout, formatCount)
	} else {
		sink = file.LinesOut(c.output, formatCount, file.OnExisting(c.exists), file.ExistsFlag("-output-exists"))
	}
	operators.Output("write", out.Results, sink)
	if c.late != "" {
		operators.Output("write-late", out.Late, file.LinesOut(c.late, formatLate, file.OnExisting(c.exists), file.ExistsFlag("-output-exists")))
	}
	return flow, nil
}
