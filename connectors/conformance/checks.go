package conformance

import (
	"strings"
	"time"
)

// check is one of the kit's checks: how its run commits, how many workers it has, where it
// crashes or fails, and whether it has items.
type check struct {
	name    string
	mode    commitMode
	workers int       // 0: the kit's Workers
	crash   string    // "" for none, midEpoch or a point of dataflow.Options.CrashHook
	fail    failPoint // a failure injected in the first run
	resumes bool      // the run after the crash resumes its partitions from states
	call    string    // the data call a failData check fails: "Next" or "Write"
	empty   bool
}

// midEpoch names the kit's own crash point, in the middle of an open epoch: the engine's
// CrashHook has no point before Snapshot, so the kit's wrapper freezes the connector after the
// first batch with items (no call reaches it any more, as after the death of the process) and
// the run crashes at the next point the engine reaches.
const midEpoch = "before-snapshot"

// checks are the checks TestSource (data "Next") and TestSink (data "Write") run, in order.
// A crash or failure check runs one worker, so that sinks commit before sources on the only
// worker and what was acknowledged can be compared with what was written.
func checks(data string) []check {
	cs := []check{{name: "all-items"}, {name: "empty", empty: true}}
	cs = append(cs, check{name: "crash/" + midEpoch, workers: 1, crash: midEpoch})
	for _, p := range crashPoints {
		// From after-commit-record on, the epoch with the first items is recorded, so every
		// partition of the next run resumes from a state.
		resumes := p == "after-commit-record" || p == "before-commit-calls" || p == "inside-commit"
		cs = append(cs, check{name: "crash/" + p, workers: 1, crash: p, resumes: resumes})
	}
	return append(cs, check{name: "commit-twice", mode: commitTwice}, check{name: "commit-skipped", mode: commitSkipFirst},
		check{name: "close-after-failure/" + strings.ToLower(data), workers: 1, fail: failData, call: data},
		check{name: "close-after-failure/commit", workers: 1, fail: failCommit})
}

// defaults fills in what the kit left zero.
func defaults(items, workers *int, epoch *time.Duration) {
	if *items == 0 {
		*items = 60
	}
	if *workers == 0 {
		*workers = 2
	}
	if *epoch == 0 {
		*epoch = 20 * time.Millisecond
	}
}

// of returns the check's item count and worker count for these settings.
func (c check) of(items, workers int) (int, int) {
	if c.empty {
		items = 0
	}
	if c.workers != 0 {
		workers = c.workers
	}
	return items, workers
}

// minCalls returns the fewest Commit calls among the committers, -1 for none.
func minCalls(cs []*committer) int {
	n := -1
	for _, c := range cs {
		if n < 0 || c.calls < n {
			n = c.calls
		}
	}
	return n
}

// newFault returns the fault of a check's run: the first run crashes or fails as the check
// says, later runs do neither.
func (c check) newFault(first bool) *fault {
	if !first {
		return &fault{}
	}
	return &fault{mid: c.crash == midEpoch, fail: c.fail}
}

// crashHook returns the crash hook of a check's first run (nil for none); ready tells when
// the run may crash (for an engine point) and check runs just before it does.
func (c check) crashHook(f *fault, ready func() bool, check func()) func(string) bool {
	switch c.crash {
	case "":
		return nil
	case midEpoch:
		return crashOnce("", f.isFrozen, check)
	}
	return crashOnce(c.crash, ready, check)
}

// what describes the check's crash or failure for its messages.
func (c check) what() string {
	switch {
	case c.crash != "":
		return "a crash at " + c.crash
	case c.fail == failCommit:
		return "the failure injected into Commit"
	}
	return "the failure injected into " + c.call
}
