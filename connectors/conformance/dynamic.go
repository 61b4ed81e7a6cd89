package conformance

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/epochflow/epochflow/connectors/flowtest"
	"github.com/epochflow/epochflow/dataflow"
	"github.com/epochflow/epochflow/operators"
)

// DynamicSinkKit describes a sink without partitions or state (a dataflow.DynamicSink: a
// printer, a socket) for TestDynamicSink. Such a sink writes at once and has nothing to
// commit, so a replayed epoch is written again: at least once, visible early.
type DynamicSinkKit[T any] struct {
	// Setup returns a fresh system for one check.
	Setup func(t *testing.T) DynamicSinkSystem[T]
	// Items, EpochInterval and SystemPackages are as in SinkKit.
	Items          int
	EpochInterval  time.Duration
	SystemPackages []string
}

// DynamicSinkSystem is the system behind a dynamic sink for one check.
type DynamicSinkSystem[T any] struct {
	// New returns the sink under test (ToDynamic of it); it is called once per run.
	New func() dataflow.DynamicSink[T]
	// Item and Visible are as in SinkSystem.
	Item    func(id string) T
	Visible func() []string
}

// TestDynamicSink runs a dynamic sink through the checks that apply to it: "all-items",
// "empty", "crash/POINT" (after a resume every item has been written at least once),
// "before-snapshot" (in the middle of an epoch) first, and "close-after-failure/write" (the kit
// fails a Write in place of the system: Close returns within 10 s and no goroutine is left),
// and no goroutine left after a run.
func TestDynamicSink[T any](t *testing.T, kit DynamicSinkKit[T]) {
	t.Helper()
	if kit.Items == 0 {
		kit.Items = 60
	}
	if kit.EpochInterval == 0 {
		kit.EpochInterval = 20 * time.Millisecond
	}
	for _, c := range checks("Write") {
		if c.mode != commitAsIs || c.fail == failCommit {
			continue // nothing to commit
		}
		t.Run(c.name, func(t *testing.T) {
			sys := kit.Setup(t)
			build := func(f *fault) (dataflow.Sink[T], observed) {
				w := &wrappedDynamic[T]{inner: sys.New(), f: f}
				return dataflow.ToDynamic[T](w), w
			}
			items, workers := c.of(kit.Items, 2)
			c.resumes = false // no state
			runSinkCheck(t, build, sys.Item, sys.Visible, AtLeastOnce, true, items, kit.EpochInterval, kit.SystemPackages, c, workers)
		})
	}
}

// wrappedDynamic counts what a dynamic sink was given and closes what a crashed run left.
type wrappedDynamic[T any] struct {
	inner dataflow.DynamicSink[T]
	f     *fault

	mu      sync.Mutex
	written int
	workers []*dynamicWorker[T]
}

func (w *wrappedDynamic[T]) Build(ctx context.Context, wk dataflow.Worker) (dataflow.WorkerSink[T], error) {
	s, err := w.inner.Build(ctx, wk)
	if err != nil {
		return nil, err
	}
	d := &dynamicWorker[T]{inner: s, w: w, name: fmt.Sprintf("worker %d", wk.Index)}
	w.mu.Lock()
	w.workers = append(w.workers, d)
	w.mu.Unlock()
	return d, nil
}

func (w *wrappedDynamic[T]) counts() (int, int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.written, 0
}

func (w *wrappedDynamic[T]) closeAll() error {
	w.mu.Lock()
	ws := append([]*dynamicWorker[T](nil), w.workers...)
	w.mu.Unlock()
	for _, d := range ws {
		if err := d.Close(); err != nil {
			return err
		}
	}
	return nil
}

func (w *wrappedDynamic[T]) minCommits() int { return 0 }

func (w *wrappedDynamic[T]) faults() *fault { return w.f }

type dynamicWorker[T any] struct {
	inner dataflow.WorkerSink[T]
	w     *wrappedDynamic[T]
	name  string
	cl    closer
}

func (d *dynamicWorker[T]) Write(ctx context.Context, b []T) error {
	f := d.w.f
	if f.isFrozen() {
		return nil
	}
	if f.inject(failData) {
		return errInjected
	}
	err := d.inner.Write(ctx, b)
	d.w.mu.Lock()
	d.w.written += len(b)
	d.w.mu.Unlock()
	f.afterData(len(b))
	return err
}

func (d *dynamicWorker[T]) Close() error { return d.cl.close(d.w.f, d.name, d.inner.Close) }

// DynamicSourceKit describes a source without partitions or state (a dataflow.DynamicSource:
// standard input, a socket) for TestDynamicSource. Nothing of such a source is replayed after
// a crash, so the kit checks only runs that end.
type DynamicSourceKit[T any] struct {
	// Setup returns a fresh system for one check.
	Setup func(t *testing.T) DynamicSourceSystem[T]
	// ID, Items, Workers, EpochInterval and SystemPackages are as in SourceKit.
	ID             func(item T) string
	Items          int
	Workers        int
	EpochInterval  time.Duration
	SystemPackages []string
}

// DynamicSourceSystem is the system behind a dynamic source for one check.
type DynamicSourceSystem[T any] struct {
	// New returns the source under test over what Produce put in; called once per run.
	New func() dataflow.DynamicSource[T]
	// Produce puts one item per id into the system, before the run.
	Produce func(ids []string)
}

// TestDynamicSource runs a dynamic source through "all-items" (a run delivers every item
// exactly once and ends) and "empty", with no goroutine left after a run.
func TestDynamicSource[T any](t *testing.T, kit DynamicSourceKit[T]) {
	t.Helper()
	sk := SourceKit[T, struct{}]{ID: kit.ID, Items: kit.Items, Workers: kit.Workers, EpochInterval: kit.EpochInterval, SystemPackages: kit.SystemPackages}
	sk.defaults()
	run := func(t *testing.T, items int) {
		sys := kit.Setup(t)
		leaks := startLeakCheck(sk.SystemPackages)
		want := ids(t.Name(), items)
		sys.Produce(want)
		led := flowtest.NewTwoPhaseSink[string](nil)
		f := dataflow.New("conformance")
		in := dataflow.Input(f, "source", dataflow.FromDynamic[T](sys.New()))
		carried := operators.FilterMap("id", in, func(item T) (string, bool) { id := kit.ID(item); return id, id != "" })
		operators.Output("ledger", carried, led.Output())
		if err := runWithin(f, dataflow.Options{Workers: sk.Workers, EpochInterval: sk.EpochInterval, Logger: quiet}, 2*time.Minute); err != nil {
			t.Fatalf("run: %v", err)
		}
		checkDelivered(t, "source", want, led.Visible(), ExactlyOnce)
		if left := leaks.leaked(); len(left) > 0 {
			t.Errorf("%d goroutines left after the run ended, e.g.:\n%s", len(left), strings.Join(first5(left), "\n\n"))
		}
	}
	t.Run("all-items", func(t *testing.T) { run(t, sk.Items) })
	t.Run("empty", func(t *testing.T) { run(t, 0) })
}
