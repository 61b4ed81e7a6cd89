package conformance

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/epochflow/epochflow/connectors/flowtest"
	"github.com/epochflow/epochflow/dataflow"
	"github.com/epochflow/epochflow/operators"
	"github.com/epochflow/epochflow/recovery"
)

// SinkKit describes a sink connector for TestSink.
type SinkKit[T, S any] struct {
	// Setup returns a fresh system for one check (a table, a topic, a file named after
	// t.Name()), registering its cleanup with t.
	Setup func(t *testing.T) SinkSystem[T, S]
	// Guarantee is what a reader of the system sees once the flow ended, across crashes:
	// ExactlyOnce (a transaction or a truncation per epoch) or AtLeastOnce.
	Guarantee Guarantee
	// VisibleEarly says that readers may see output of epochs not committed yet (which a
	// resume replaces), as readers of a file do. Without it the kit checks that nothing is
	// visible before the first Commit of a run that wrote it.
	VisibleEarly bool
	// Items is how many items each check writes; 0 means 60.
	Items int
	// Workers is the worker count of the checks that do not crash; 0 means 2.
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

// SinkSystem is the system behind a sink for one check.
type SinkSystem[T, S any] struct {
	// New returns the sink under test over this system; it is called once per run.
	New func() dataflow.PartitionedSink[T, S]
	// Item returns the item that writes the message (row, record, line) of id.
	Item func(id string) T
	// Visible returns the ids a reader of the system sees now (a read-committed consumer, a
	// SELECT, the file's lines), repeats included.
	Visible func() []string
}

func (k *SinkKit[T, S]) defaults() { defaults(&k.Items, &k.Workers, &k.EpochInterval) }

// TestSink runs the sink under test through the kit's checks, one subtest each: "all-items"
// (every item is visible at the end, as the Guarantee says), "empty", "crash/POINT" for
// every point of the commit protocol, "before-snapshot" (in the middle of an epoch) first
// (nothing is visible before its Commit unless VisibleEarly, and after a resume every item is
// visible as the Guarantee says), "commit-twice" (Commit is idempotent), "commit-skipped" (a
// later Commit covers skipped ones), and "close-after-failure/write" and
// "close-after-failure/commit" (the kit fails a Write or a Commit in place of the system:
// Close returns within 10 s, no goroutine is left, and after a resume every item is visible as
// the Guarantee says). In every run, a partition resumed from a state must get Commit with
// that state first. After every run no goroutine of the sink is left.
func TestSink[T, S any](t *testing.T, kit SinkKit[T, S]) {
	t.Helper()
	kit.defaults()
	for _, c := range checks("Write") {
		t.Run(c.name, func(t *testing.T) { sinkRun(t, kit.Setup(t), &kit, c) })
	}
}

// script spreads the items over several epochs: batches of a few items with pauses of two
// epoch intervals between them, so that a run commits many epochs with items.
func script(want []string, epoch time.Duration) []flowtest.Event[string] {
	var ev []flowtest.Event[string]
	const per = 10
	for i := 0; i < len(want); i += per {
		ev = append(ev, flowtest.Items(want[i:min(i+per, len(want))]...), flowtest.Pause[string](2*epoch))
	}
	return append(ev, flowtest.EOF[string]())
}

func sinkRun[T, S any](r reporter, sys SinkSystem[T, S], kit *SinkKit[T, S], c check) {
	r.Helper()
	build := func(f *fault) (dataflow.Sink[T], observed) {
		w := &wrappedSink[T, S]{inner: sys.New(), mode: c.mode, f: f}
		return dataflow.ToPartitioned[T, S](w), w
	}
	items, workers := c.of(kit.Items, kit.Workers)
	runSinkCheck(r, build, sys.Item, sys.Visible, kit.Guarantee, kit.VisibleEarly, items, kit.EpochInterval, kit.SystemPackages, c, workers)
}

// observed is what the kit learns from its wrapper around the sink under test.
type observed interface {
	counts() (written, commitsAfterWrite int)
	closeAll() error
	minCommits() int
	faults() *fault
}

func runSinkCheck[T any](r reporter, build func(*fault) (dataflow.Sink[T], observed), item func(string) T, visible func() []string,
	g Guarantee, early bool, items int, epoch time.Duration, system []string, c check, workers int) {
	r.Helper()
	leaks := startLeakCheck(system)
	want := ids(r.Name(), items)
	store, err := recovery.OpenSQLite(context.Background(), r.TempDir(), recovery.SQLiteOptions{})
	if err != nil {
		r.Fatalf("opening a recovery store: %v", err)
	}
	defer store.Close() // closed below; this is for a failure on the way
	// What a failed run leaves is counted from here: the store's goroutines are not its.
	runLeaks := startLeakCheck(system)
	// One source over every run: it resumes at the position of the last committed epoch.
	src := flowtest.NewSource(4, script(want, epoch))
	runs := 0
	for first := true; ; first = false {
		runs++
		out, sink := build(c.newFault(first))
		f := dataflow.New("conformance")
		in := operators.Input(f, "source", src.Input())
		operators.Output("sink", operators.Map("item", in, item), out)
		opts := dataflow.Options{Workers: workers, EpochInterval: epoch, Recovery: store, Logger: quiet}
		var mu sync.Mutex
		var seen []string // visible before any Commit
		crash := ""
		if first {
			crash = c.crash
		}
		if crash != "" {
			ready := func() bool { w, _ := sink.counts(); return w > 0 }
			check := func() {
				if early {
					return
				}
				if _, commits := sink.counts(); commits > 0 {
					return
				}
				if v := visible(); len(v) > 0 {
					mu.Lock()
					seen = v
					mu.Unlock()
				}
			}
			opts.CrashHook = c.crashHook(sink.faults(), ready, check)
		}
		err := runWithin(f, opts, 2*time.Minute)
		if first && c.fail != failNone {
			if !errors.Is(err, errInjected) {
				r.Fatalf("run %d was to fail with %s after the first item was written, but it ended with %v", runs, c.what(), err)
			}
			sink.closeAll()
			sink.faults().report(r, runs) // with a Close that the kit timed out
			if left := runLeaks.leaked(); len(left) > 0 {
				r.Errorf("after %s, %d goroutines were left once the run had closed its partitions (Close after a failure must end every goroutine of the partition), e.g.:\n%s",
					c.what(), len(left), strings.Join(first5(left), "\n\n"))
			}
			continue
		}
		if crash != "" {
			if !errors.Is(err, dataflow.ErrCrashed) {
				r.Fatalf("run %d was to crash at %s after the first item was written, but it ended with %v", runs, crash, err)
			}
			if err := sink.closeAll(); err != nil {
				r.Logf("closing the partitions the crashed run left open: %v", err)
			}
			mu.Lock()
			if len(seen) > 0 {
				r.Errorf("at %s, before any Commit of the run: %d items were visible already, e.g. %v (a sink whose readers may see uncommitted output sets SinkKit.VisibleEarly)",
					crash, len(seen), first5(seen))
			}
			mu.Unlock()
			sink.faults().report(r, runs)
			continue
		}
		sink.faults().report(r, runs)
		if err != nil {
			r.Fatalf("run %d: %v", runs, err)
		}
		if c.resumes && sink.faults().resumedParts() == 0 {
			r.Errorf("the run after %s resumed no partition from a state, so the check of Commit(resume state) proved nothing", c.what())
		}
		if c.mode == commitSkipFirst && len(want) > 0 {
			if n := sink.minCommits(); n <= skipCommits {
				r.Fatalf("the check needs more than %d Commit calls per partition to skip some, got %d", skipCommits, n)
			}
		}
		break
	}
	got, err := visibleWithin(visible, len(want), 30*time.Second)
	if err != nil {
		r.Errorf("%v", err)
	}
	checkDelivered(r, "sink", want, got, g)
	if err := store.Close(); err != nil {
		r.Errorf("closing the recovery store: %v", err)
	}
	if left := leaks.leaked(); len(left) > 0 {
		r.Errorf("%d goroutines left after the runs ended (a connector's goroutine must not outlive Close), e.g.:\n%s", len(left), strings.Join(first5(left), "\n\n"))
	}
}

// visibleWithin waits until at least n ids are visible (a sink may commit on its own
// goroutine, and a reader may see a commit a moment after it), then returns them.
func visibleWithin(visible func() []string, n int, limit time.Duration) ([]string, error) {
	deadline := time.Now().Add(limit)
	for {
		got := visible()
		if len(unique(got)) >= n {
			return got, nil
		}
		if time.Now().After(deadline) {
			return got, fmt.Errorf("after the last run ended, %d of %d items became visible within %v", len(unique(got)), n, limit)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
