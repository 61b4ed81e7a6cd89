package conformance

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/epochflow/epochflow/connectors/flowtest"
	"github.com/epochflow/epochflow/dataflow"
	"github.com/epochflow/epochflow/operators"
	"github.com/epochflow/epochflow/recovery"
)

// SourceKit describes a source connector for TestSource.
type SourceKit[T, S any] struct {
	// Setup returns a fresh system for one check (a queue, a topic, a slot named after
	// t.Name()), registering its cleanup with t.
	Setup func(t *testing.T) SourceSystem[T, S]
	// ID returns the id Produce gave the item's message or row, or "" for an item that
	// carries none (a transaction's begin or commit marker), which the kit leaves out.
	ID func(item T) string
	// Guarantee is what the source promises across crashes: AtLeastOnce (a queue that may
	// redeliver what a crash left unacknowledged) or ExactlyOnce (a log whose position is in
	// the snapshot).
	Guarantee Guarantee
	// Items is how many items each check produces; 0 means 60.
	Items int
	// Workers is the worker count of the checks that do not crash; 0 means 2. Crash checks
	// run one worker, so that sinks commit before the source on the only worker and the kit
	// can compare what was acknowledged with what was written.
	Workers int
	// EpochInterval is the flows' epoch interval; 0 means 20ms.
	EpochInterval time.Duration
	// SystemPackages lists the import paths (or function names: any part of a stack frame)
	// of code that runs the system itself in the test process, such as an embedded broker
	// ("github.com/twmb/franz-go/pkg/kfake") or a shared HTTP client's idle connections
	// ("net/http.(*persistConn)"); goroutines with such a frame may outlive a run. Every other goroutine started during a check
	// must have ended once its runs did. The harness closes its own clients before it returns
	// from Produce or Visible.
	SystemPackages []string
}

// SourceSystem is the system behind a source for one check.
type SourceSystem[T, S any] struct {
	// New returns the source under test over this system; it is called once per run (a run
	// is a new process: it may build a new client).
	New func() dataflow.PartitionedSource[T, S]
	// Produce puts one message (row, record) per id into the system. It is called once per
	// check, before the first run, also with no ids (the "empty" check).
	Produce func(ids []string)
	// Remaining, if set, returns how many produced messages the system still holds for
	// delivery (not acknowledged), while no flow runs. Leave it nil for a source whose
	// position lives only in the flow's snapshot (a log or a file).
	Remaining func() int
}

func (k *SourceKit[T, S]) defaults() { defaults(&k.Items, &k.Workers, &k.EpochInterval) }

// TestSource runs the source under test through the kit's checks, one subtest each:
// "all-items" (a run reads every item, and the system holds none afterwards), "empty" (a
// run with nothing to read ends), "crash/POINT" for every point of the commit protocol,
// "before-snapshot" (in the middle of an epoch) first (a crash there acknowledged nothing that
// was not committed, and a resumed run delivers every item, as the Guarantee says),
// "commit-twice" (Commit is idempotent), "commit-skipped" (a later Commit covers skipped
// ones), and "close-after-failure/next" and "close-after-failure/commit" (the kit fails a
// Next or a Commit in place of the system: Close returns within 10 s, no goroutine is left,
// nothing uncommitted was acknowledged, and a resumed run delivers every item). In every
// run, a partition resumed from a state must get Commit with that state first. After every
// run no goroutine of the source is left.
func TestSource[T, S any](t *testing.T, kit SourceKit[T, S]) {
	t.Helper()
	kit.defaults()
	for _, c := range checks("Next") {
		t.Run(c.name, func(t *testing.T) { srcRun(t, kit.Setup(t), &kit, c) })
	}
}

// ids returns n ids unique to the check.
func ids(name string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s#%d", name, i)
	}
	return out
}

// srcRun produces the check's items, runs the flow (crashing or failing once, if the check
// says so, and then resuming) and checks what the ledger and the system hold.
func srcRun[T, S any](r reporter, sys SourceSystem[T, S], kit *SourceKit[T, S], c check) {
	r.Helper()
	items, workers := c.of(kit.Items, kit.Workers)
	mode := c.mode
	leaks := startLeakCheck(kit.SystemPackages)
	want := ids(r.Name(), items)
	sys.Produce(want)
	store, err := recovery.OpenSQLite(context.Background(), r.TempDir(), recovery.SQLiteOptions{})
	if err != nil {
		r.Fatalf("opening a recovery store: %v", err)
	}
	defer store.Close() // closed below; this is for a failure on the way
	// What a failed run leaves is counted from here: the store's goroutines are not its.
	runLeaks := startLeakCheck(kit.SystemPackages)
	// The kit's exactly-once sink outlives the runs: what every run committed, repeats kept.
	led := flowtest.NewTwoPhaseSink[string](nil)
	runs := 0
	for first := true; ; first = false {
		runs++
		f := c.newFault(first)
		src := &wrappedSource[T, S]{inner: sys.New(), mode: mode, f: f}
		f2 := dataflow.New("conformance")
		in := dataflow.Input(f2, "source", dataflow.FromPartitioned[T, S](src))
		carried := operators.FilterMap("id", in, func(item T) (string, bool) { id := kit.ID(item); return id, id != "" })
		out := &wrappedSink[string, uint64]{inner: led, f: &fault{}} // counts what this run wrote
		operators.Output("ledger", carried, dataflow.ToPartitioned[string, uint64](out))
		opts := dataflow.Options{Workers: workers, EpochInterval: kit.EpochInterval, Recovery: store, Logger: quiet}
		if first {
			opts.CrashHook = c.crashHook(f, func() bool { w, _ := out.counts(); return w > 0 }, nil)
		}
		err := runWithin(f2, opts, 2*time.Minute)
		if first && c.crash != "" || first && c.fail != failNone {
			switch {
			case c.crash != "" && !errors.Is(err, dataflow.ErrCrashed):
				r.Fatalf("run %d was to crash at %s after the first item was read, but it ended with %v (does the source read its items?)", runs, c.crash, err)
			case c.fail != failNone && !errors.Is(err, errInjected):
				r.Fatalf("run %d was to fail with %s after the first item was read, but it ended with %v (does the source read its items?)", runs, c.what(), err)
			}
			if err := src.closeAll(); err != nil && c.crash != "" {
				r.Logf("closing the partitions the crashed run left open: %v", err)
			}
			f.report(r, runs) // with a Close that the kit timed out
			if c.fail != failNone {
				if left := runLeaks.leaked(); len(left) > 0 {
					r.Errorf("after %s, %d goroutines were left once the run had closed its partitions (Close after a failure must end every goroutine of the partition), e.g.:\n%s",
						c.what(), len(left), strings.Join(first5(left), "\n\n"))
				}
			}
			if sys.Remaining != nil {
				rem, committed := sys.Remaining(), len(unique(led.Visible()))
				if rem < items-committed {
					r.Fatalf("after %s: the system holds %d of %d messages for delivery, but only %d were committed: %d were acknowledged before their epoch committed",
						c.what(), rem, items, committed, items-committed-rem)
				}
			}
			continue
		}
		f.report(r, runs)
		if err != nil {
			r.Fatalf("run %d: %v", runs, err)
		}
		if c.resumes && f.resumedParts() == 0 {
			r.Errorf("the run after %s resumed no partition from a state, so the check of Commit(resume state) proved nothing", c.what())
		}
		// A source without Remaining has nothing to show for a skipped Commit (its position
		// is in the snapshot), so only a queue-like source must have had some to skip.
		if mode == commitSkipFirst && len(want) > 0 && sys.Remaining != nil {
			if n := src.minCommits(); n <= skipCommits {
				r.Fatalf("the check needs more than %d Commit calls per partition to skip some, got %d: produce more items or give the source a longer idle timeout", skipCommits, n)
			}
		}
		break
	}
	checkDelivered(r, "source", want, led.Visible(), kit.Guarantee)
	if sys.Remaining != nil {
		if rem := sys.Remaining(); rem != 0 {
			r.Errorf("after the last run ended, the system still holds %d messages for delivery: Commit did not acknowledge everything the committed epochs read", rem)
		}
	}
	if err := store.Close(); err != nil {
		r.Errorf("closing the recovery store: %v", err)
	}
	if left := leaks.leaked(); len(left) > 0 {
		r.Errorf("%d goroutines left after the runs ended (a connector's goroutine must not outlive Close), e.g.:\n%s", len(left), strings.Join(first5(left), "\n\n"))
	}
}

// crashOnce returns a crash hook that crashes the run the first time it reaches point ("":
// any point) once ready says so; before it does, it calls check (if set), which may fail the
// check.
func crashOnce(point string, ready func() bool, check func()) func(string) bool {
	var crashed atomic.Bool
	return func(p string) bool {
		if point != "" && p != point || crashed.Load() || !ready() {
			return false
		}
		if !crashed.CompareAndSwap(false, true) {
			return false
		}
		if check != nil {
			check()
		}
		return true
	}
}

// runWithin runs f, failing if it takes longer than limit (a source that never ends).
func runWithin(f *dataflow.Flow, opts dataflow.Options, limit time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	err := dataflow.Run(ctx, f, opts)
	if ctx.Err() != nil {
		return fmt.Errorf("the run did not end within %v (does the source end at an idle timeout?): %w", limit, err)
	}
	return err
}

// checkDelivered compares the ids committed with the ids produced, as g says.
func checkDelivered(r reporter, what string, want, got []string, g Guarantee) {
	r.Helper()
	count := map[string]int{}
	for _, id := range got {
		count[id]++
	}
	var lost, doubled, strange []string
	for _, id := range want {
		switch n := count[id]; {
		case n == 0:
			lost = append(lost, id)
		case n > 1 && g == ExactlyOnce:
			doubled = append(doubled, fmt.Sprintf("%s (%d times)", id, n))
		}
		delete(count, id)
	}
	for id := range count {
		strange = append(strange, id)
	}
	sort.Strings(strange)
	if len(lost) > 0 {
		r.Errorf("%s: %d of %d items lost, e.g. %v", what, len(lost), len(want), first5(lost))
	}
	if len(doubled) > 0 {
		r.Errorf("%s promises %s, but %d items were delivered more than once, e.g. %v", what, g, len(doubled), first5(doubled))
	}
	if len(strange) > 0 {
		r.Errorf("%s: %d items that were never produced, e.g. %v", what, len(strange), first5(strange))
	}
}

func first5(s []string) []string { return s[:min(len(s), 5)] }

func unique(s []string) map[string]bool {
	m := make(map[string]bool, len(s))
	for _, v := range s {
		m[v] = true
	}
	return m
}
