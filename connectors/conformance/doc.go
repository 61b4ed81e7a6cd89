// Package conformance is a test kit for connector authors: it runs a source or a sink in real
// flows, with a recovery store, and checks that it keeps the commit contract of
// dataflow.StatefulSource and dataflow.StatefulSink:
//
//   - a source acknowledges nothing whose epoch has not committed (checked after a crash at
//     every point of the protocol: in the middle of an epoch, before its Snapshot, after the
//     snapshot, before and after the store's record, before the Commit calls and between
//     them), and after a resume every item is delivered (at least once, or exactly once where
//     the connector says so);
//   - a sink makes nothing visible before its epoch commits (unless it says its readers may
//     see uncommitted output, as a file does), and after crashes at every point each item is
//     visible once (or at least once);
//   - Commit is idempotent (the kit calls it twice) and subsuming (the kit skips the first
//     calls of a run, and a later one must cover them);
//   - a partition resumed from a state gets Commit with that very state first (the engine
//     repeats the commit a crash may have lost), so it must not change the state Build was
//     given;
//   - after a failure of the system (the kit fails a Next, Write or Commit in place of the
//     connector), Close returns within 10 s and leaves no goroutine, and a resumed run
//     delivers every item;
//   - a run with nothing to read ends cleanly, and no goroutine outlives a run.
//
// The engine has no crash point before Snapshot (dataflow.Options.CrashHook starts at
// "after-snapshot"), so for "crash/before-snapshot" the kit's wrapper freezes the connector
// after the first batch with items, as the death of the process would (no call reaches it any
// more: no Snapshot of the open epoch, no Commit, no Close), and the run crashes at the next
// point the engine reaches. After every crash the kit closes what the run left open, as the
// end of the process would.
//
// A connector's test calls TestSource or TestSink with a harness that knows the system the
// connector talks to: how to put items into it, how many items it still holds for delivery,
// what a reader of it sees. Each check gets a fresh system from the harness's Setup, so that
// checks do not see each other's items:
//
//	func TestConformance(t *testing.T) {
//		conformance.TestSource(t, conformance.SourceKit[mq.Message, mq.State]{
//			Setup: func(t *testing.T) conformance.SourceSystem[mq.Message, mq.State] {
//				q := newQueue(t) // a queue named after t.Name()
//				return conformance.SourceSystem[mq.Message, mq.State]{
//					New:       func() dataflow.PartitionedSource[mq.Message, mq.State] { return mq.NewSource(q.cfg(idleEOF)) },
//					Produce:   q.send,
//					Remaining: q.depth,
//				}
//			},
//			ID:        func(m mq.Message) string { return string(m.Body) },
//			Guarantee: conformance.AtLeastOnce,
//		})
//	}
//
// Sources under test must end (io.EOF) once their system has had nothing new for a short
// while (an idle timeout of a few hundred milliseconds), so that the kit's flows end.
package conformance

import "log/slog"

// Guarantee is what a connector promises about the items a flow reads or writes through it
// across crashes and resumes.
type Guarantee int

const (
	// AtLeastOnce: every item is delivered (or written) once or more; a crash may repeat some.
	AtLeastOnce Guarantee = iota + 1
	// ExactlyOnce: every item is delivered (or made visible) exactly once.
	ExactlyOnce
)

func (g Guarantee) String() string {
	switch g {
	case AtLeastOnce:
		return "at-least-once"
	case ExactlyOnce:
		return "exactly-once"
	}
	return "unknown guarantee"
}

// quiet is the flows' logger: the kit's runs resume on purpose.
var quiet = slog.New(slog.DiscardHandler)

// crashPoints are the named points of the commit protocol (dataflow.Options.CrashHook).
var crashPoints = []string{"after-snapshot", "before-commit-record", "after-commit-record", "before-commit-calls", "inside-commit"}
