package dataflow_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/epochflow/epochflow/connectors/flowtest"
	"github.com/epochflow/epochflow/dataflow"
	"github.com/epochflow/epochflow/recovery"
)

var errLost = errors.New("connection lost")

// flakySink is a TwoPhaseSink whose partition fails its nth Write of every attempt while
// failures are left (n=1 fails at once, before anything commits), as a sink whose server went
// away would. It counts the partitions built and closed.
type flakySink struct {
	*flowtest.TwoPhaseSink[int]
	nth    int
	left   atomic.Int64
	mu     sync.Mutex
	built  int
	closed int
}

func newFlakySink(nth, failures int) *flakySink {
	s := &flakySink{TwoPhaseSink: flowtest.NewTwoPhaseSink[int](nil), nth: nth}
	s.left.Store(int64(failures))
	return s
}

func (s *flakySink) Output() dataflow.Sink[int] { return dataflow.ToPartitioned[int, uint64](s) }

func (s *flakySink) Build(ctx context.Context, part string, resume *uint64) (dataflow.StatefulSink[int, uint64], error) {
	p, err := s.TwoPhaseSink.Build(ctx, part, resume)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	s.built++
	s.mu.Unlock()
	return &flakyPart{StatefulSink: p, s: s}, nil
}

func (s *flakySink) counts() (built, closed int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.built, s.closed
}

type flakyPart struct {
	dataflow.StatefulSink[int, uint64]
	s      *flakySink
	writes int
}

func (p *flakyPart) Write(ctx context.Context, batch []int) error {
	p.writes++
	if p.writes == p.s.nth && p.s.left.Add(-1) >= 0 {
		return fmt.Errorf("writing %d items: %w", len(batch), errLost)
	}
	return p.StatefulSink.Write(ctx, batch)
}

func (p *flakyPart) Close() error {
	p.s.mu.Lock()
	p.s.closed++
	p.s.mu.Unlock()
	return p.StatefulSink.Close()
}

// failingStore fails its commits number from..from+n-1, as a store on a full disk would.
type failingStore struct {
	recovery.Store
	from, n int
	calls   atomic.Int64
}

func (s *failingStore) Commit(ctx context.Context, e recovery.Epoch) error {
	if c := int(s.calls.Add(1)); c >= s.from && c < s.from+s.n {
		return fmt.Errorf("disk full: %w", errLost)
	}
	return s.Store.Commit(ctx, e)
}

// restartFlow reads 0..n-1 in batches of 5 with a pause every 10 items (so that epochs commit while it
// runs), doubles every item and writes it to sink.
func restartFlow(n int, sink *flakySink) *dataflow.Flow {
	var script []flowtest.Event[int]
	for i := 0; i < n; i += 10 {
		var items []int
		for j := i; j < min(i+10, n); j++ {
			items = append(items, j)
		}
		script = append(script, flowtest.Items(items...), flowtest.Pause[int](5*time.Millisecond))
	}
	f := dataflow.New("restart")
	in := dataflow.Input(f, "in", flowtest.NewSource(5, script).Input())
	spread := dataflow.Redistribute("spread", in)
	dataflow.Output("out", dataflow.Transform("double", spread, double), sink.Output())
	return f
}

func wantDoubled(n int) []int {
	want := make([]int, n)
	for i := range want {
		want[i] = 2 * i
	}
	return want
}

// A run whose sink fails three times, or whose store fails to record an epoch, is restarted
// from the last committed epoch each time: in the end every item is written exactly once, the
// restarts are counted and reported, every partition built is closed, and no goroutine
// outlives Run.
func TestRestartAfterFailuresWritesExactlyOnce(t *testing.T) {
	defer goleak.VerifyNone(t)
	for _, c := range []struct {
		name         string
		sinkFailures int // the sink fails its 4th write of an attempt, this many times
		storeFailure int // the store fails this commit (0: none)
		restarts     int
	}{
		{"sink", 3, 0, 3},
		{"store", 0, 3, 1},
	} {
		for _, workers := range []int{1, 3} {
			t.Run(fmt.Sprintf("%s/workers=%d", c.name, workers), func(t *testing.T) {
				const n = 600
				sink := newFlakySink(4, c.sinkFailures)
				store := openStore(t, t.TempDir())
				defer store.Close()
				fs := &failingStore{Store: store, from: c.storeFailure, n: 1}
				if c.storeFailure == 0 {
					fs.n = 0
				}
				var events []dataflow.RestartEvent
				st, err := dataflow.RunStats(context.Background(), restartFlow(n, sink), dataflow.Options{
					Workers: workers, EpochInterval: 3 * time.Millisecond, Recovery: fs,
					Restart:   dataflow.RestartPolicy{Attempts: 3, Backoff: time.Millisecond},
					OnRestart: func(e dataflow.RestartEvent) { events = append(events, e) },
				})
				if err != nil {
					t.Fatalf("Run = %v, want the restarts to cure the failures", err)
				}
				got := sink.Visible()
				slices.Sort(got)
				if !slices.Equal(got, wantDoubled(n)) {
					t.Fatalf("after %d restarts the sink has %d items, want each of %d exactly once", st.Restarts, len(got), n)
				}
				if st.Restarts != c.restarts || len(events) != c.restarts {
					t.Fatalf("Stats.Restarts = %d, OnRestart called %d times; want %d", st.Restarts, len(events), c.restarts)
				}
				for i, e := range events {
					if e.Restart != i+1 || !errors.Is(e.Err, errLost) || e.Wait <= 0 || e.Attempt < 1 || e.Attempt > 3 {
						t.Errorf("restart event %d: %+v", i, e)
					}
				}
				if built, closed := sink.counts(); built != c.restarts+1 || closed != built {
					t.Errorf("sink partitions: %d built, %d closed; want %d attempts, each closed", built, closed, c.restarts+1)
				}
				if st.Read < n || st.Written < n {
					t.Errorf("Stats: %d read, %d written; want at least %d each", st.Read, st.Written, n)
				}
				ci, err := store.Committed(context.Background())
				if err != nil || st.Committed != ci.Epoch || ci.Epoch == 0 {
					t.Errorf("Stats.Committed = %d, the store's committed epoch %d (%v)", st.Committed, ci.Epoch, err)
				}
			})
		}
	}
}

// A failure that restarts do not cure (no epoch committed in between) is given up after the
// policy's attempts, with an error naming the last failure and the number of restarts; the
// waits grow.
func TestRestartGivesUpAfterTheAttempts(t *testing.T) {
	defer goleak.VerifyNone(t)
	sink := newFlakySink(1, 1000)
	store := openStore(t, t.TempDir())
	defer store.Close()
	var waits []time.Duration
	st, err := dataflow.RunStats(context.Background(), restartFlow(100, sink), dataflow.Options{
		EpochInterval: 3 * time.Millisecond, Recovery: store,
		Restart:   dataflow.RestartPolicy{Attempts: 3, Backoff: time.Millisecond},
		OnRestart: func(e dataflow.RestartEvent) { waits = append(waits, e.Wait) },
	})
	if !errors.Is(err, errLost) || !strings.Contains(err.Error(), "giving up after 3 restarts") ||
		!strings.Contains(err.Error(), `step "restart.out"`) {
		t.Fatalf("Run = %v, want the sink's failure after 3 restarts", err)
	}
	if st.Restarts != 3 || !slices.Equal(waits, []time.Duration{time.Millisecond, 2 * time.Millisecond, 4 * time.Millisecond}) {
		t.Fatalf("%d restarts, waits %v; want 3 restarts waiting 1ms, 2ms, 4ms", st.Restarts, waits)
	}
	if built, closed := sink.counts(); built != 4 || closed != 4 {
		t.Errorf("sink partitions: %d built, %d closed; want 4", built, closed)
	}
}

// An error or a panic of a user function, an error found before the flow ran, and a run
// without a recovery store are not restarted.
func TestRestartSkipsWhatARestartCannotCure(t *testing.T) {
	defer goleak.VerifyNone(t)
	store := openStore(t, t.TempDir())
	defer func() { store.Close() }()
	policy := dataflow.RestartPolicy{Attempts: 5, Backoff: time.Millisecond}
	for _, c := range []struct {
		name string
		fn   func([]int) ([]int, error)
	}{
		{"error", func(b []int) ([]int, error) { return nil, errors.New("bad input") }},
		{"item error", func(b []int) ([]int, error) {
			return nil, dataflow.ForEach(b, func(int) error { return errors.New("bad item") })
		}},
		{"panic", func(b []int) ([]int, error) { panic("oops") }},
	} {
		f := dataflow.New("user" + strings.ReplaceAll(c.name, " ", ""))
		in := dataflow.Input(f, "in", flowtest.List(1, 2, 3))
		dataflow.Output("out", dataflow.Transform("fn", in, c.fn), flowtest.NewSink[int]().Output())
		st, err := dataflow.RunStats(context.Background(), f, dataflow.Options{Recovery: store, Restart: policy})
		if err == nil || st.Restarts != 0 {
			t.Errorf("%s: Run = %v after %d restarts, want the error and no restart", c.name, err, st.Restarts)
		}
		store.Close()
		store = openStore(t, t.TempDir())
	}

	// A build error (listing the sink's partitions fails) of the first attempt.
	f := dataflow.New("build")
	in := dataflow.Input(f, "in", flowtest.List(1, 2, 3))
	dataflow.Output("out", in, dataflow.ToPartitioned[int, uint64](noParts{}))
	st, err := dataflow.RunStats(context.Background(), f, dataflow.Options{Recovery: store, Restart: policy})
	if !errors.Is(err, errLost) || st.Restarts != 0 {
		t.Errorf("build error: Run = %v after %d restarts, want the error and no restart", err, st.Restarts)
	}

	// Without a store, a restart would read the sources again: refused.
	err = dataflow.Run(context.Background(), restartFlow(10, newFlakySink(1, 1)), dataflow.Options{Restart: policy})
	if err == nil || !strings.Contains(err.Error(), "restarts need a recovery store") {
		t.Errorf("restarts without a store: Run = %v", err)
	}
}

// noParts is a sink whose Parts fails.
type noParts struct{}

func (noParts) Parts(context.Context) ([]string, error) { return nil, errLost }
func (noParts) PartFor(int, int) int                    { return 0 }
func (noParts) Build(context.Context, string, *uint64) (dataflow.StatefulSink[int, uint64], error) {
	return nil, errLost
}

// A graceful stop during the wait before a restart ends Run at once, as a clean stop: nil,
// Stats.Stopped, and the failure logged at warn level.
func TestStopDuringRestartWait(t *testing.T) {
	defer goleak.VerifyNone(t)
	store := openStore(t, t.TempDir())
	defer store.Close()
	stop := make(chan struct{})
	start := time.Now()
	var log syncBuffer
	st, err := dataflow.RunStats(context.Background(), restartFlow(100, newFlakySink(1, 1000)), dataflow.Options{
		Recovery: store, Stop: stop, Logger: slog.New(slog.NewTextHandler(&log, nil)),
		Restart:   dataflow.RestartPolicy{Attempts: 3, Backoff: time.Hour},
		OnRestart: func(dataflow.RestartEvent) { close(stop) },
	})
	if err != nil || !st.Stopped || st.Restarts != 1 {
		t.Fatalf("RunStats = %+v, %v; want a stop (nil, Stopped) during the first restart's wait", st, err)
	}
	if want := `level=WARN msg="stopped while waiting to restart after a failure`; !strings.Contains(log.String(), want) ||
		!strings.Contains(log.String(), errLost.Error()) {
		t.Errorf("the log lacks %q with the failure:\n%s", want, log.String())
	}
	if d := time.Since(start); d > time.Minute {
		t.Fatalf("Run took %v: the stop did not end the wait", d)
	}
}

// An error found before any worker runs (listing a sink's or a source's partitions) names
// the step and no worker: not "worker -1".
func TestSetupErrorNamesNoWorker(t *testing.T) {
	defer goleak.VerifyNone(t)
	f := dataflow.New("setup")
	in := dataflow.Input(f, "in", flowtest.List(1, 2, 3))
	dataflow.Output("out", in, dataflow.ToPartitioned[int, uint64](noParts{}))
	err := dataflow.Run(context.Background(), f, dataflow.Options{Workers: 2})
	var se *dataflow.StepError
	if !errors.As(err, &se) || se.Step != "setup.out" || se.Worker != -1 || !errors.Is(err, errLost) {
		t.Fatalf("Run = %v, want a StepError of setup.out before the workers ran", err)
	}
	if msg := err.Error(); strings.Contains(msg, "worker") ||
		!strings.Contains(msg, `step "setup.out": listing partitions: connection lost`) {
		t.Fatalf("Run = %q, want the step and its failure, no worker", msg)
	}
}

// RunStats counts the items read and those handed to sinks, and the committed epoch.
func TestRunStatsCounts(t *testing.T) {
	defer goleak.VerifyNone(t)
	items := make([]int, 100)
	for i := range items {
		items[i] = i
	}
	f := dataflow.New("counts")
	in := dataflow.Input(f, "in", flowtest.List(items...))
	even := dataflow.Transform("even", dataflow.Redistribute("spread", in), func(b []int) ([]int, error) {
		var out []int
		for _, v := range b {
			if v%2 == 0 {
				out = append(out, v)
			}
		}
		return out, nil
	})
	dataflow.Output("out", even, flowtest.NewSink[int]().Output())
	st, err := dataflow.RunStats(context.Background(), f, dataflow.Options{Workers: 3})
	if err != nil || st.Read != 100 || st.Written != 50 || st.Committed == 0 || st.Stopped || st.Restarts != 0 {
		t.Fatalf("RunStats = %+v, %v; want 100 read, 50 written, an epoch committed", st, err)
	}
}

// A graceful stop of a run without a recovery store warns, when it begins, that the state is
// discarded; with a store it does not.
func TestStopWithoutAStoreWarns(t *testing.T) {
	defer goleak.VerifyNone(t)
	for _, withStore := range []bool{false, true} {
		f := dataflow.New("stop")
		in := dataflow.Input(f, "in", flowtest.NewSource(1, []flowtest.Event[int]{
			flowtest.Items(1, 2), flowtest.Pause[int](time.Hour)}).Input())
		sink := flowtest.NewSink[int]()
		dataflow.Output("out", in, sink.Output())
		var logs syncBuffer
		opts := dataflow.Options{Logger: slog.New(slog.NewTextHandler(&logs, nil)), EpochInterval: time.Millisecond}
		if withStore {
			store := openStore(t, t.TempDir())
			defer store.Close()
			opts.Recovery = store
		}
		stop, done := make(chan struct{}), make(chan struct{})
		opts.Stop = stop
		go func() { // stops the run once both items are written
			defer close(stop)
			for len(sink.Items()) < 2 {
				select {
				case <-done:
					return
				case <-time.After(time.Millisecond):
				}
			}
		}()
		st, err := dataflow.RunStats(context.Background(), f, opts)
		close(done)
		warned := strings.Contains(logs.String(), `level=WARN msg="stopping without a recovery store: the stateful steps' state is discarded`)
		if err != nil || !st.Stopped || warned == withStore {
			t.Errorf("store %v: RunStats = %+v, %v; warned %v\n%s", withStore, st, err, warned, logs.String())
		}
	}
}

// Cancelling the context during the wait before a restart ends Run at once with the
// context's error and the failure.
func TestCancelDuringRestartWait(t *testing.T) {
	defer goleak.VerifyNone(t)
	store := openStore(t, t.TempDir())
	defer store.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	start := time.Now()
	_, err := dataflow.RunStats(ctx, restartFlow(100, newFlakySink(1, 1000)), dataflow.Options{
		Recovery:  store,
		Restart:   dataflow.RestartPolicy{Attempts: 3, Backoff: time.Hour},
		OnRestart: func(dataflow.RestartEvent) { cancel() },
	})
	if !errors.Is(err, context.Canceled) || !errors.Is(err, errLost) || !strings.Contains(err.Error(), "while waiting to restart") {
		t.Fatalf("Run = %v", err)
	}
	if d := time.Since(start); d > time.Minute {
		t.Fatalf("Run took %v: the cancel did not end the wait", d)
	}
}

// poisonPart fails its second Write with an error marked Permanent, as a source or sink does
// for input it would reject again after a restart.
type poisonPart struct {
	dataflow.StatefulSink[int, uint64]
	writes int
}

func (p *poisonPart) Write(ctx context.Context, batch []int) error {
	if p.writes++; p.writes == 2 {
		return fmt.Errorf("item %d: %w", batch[0], dataflow.Permanent(errLost))
	}
	return p.StatefulSink.Write(ctx, batch)
}

type poisonSink struct{ *flowtest.TwoPhaseSink[int] }

func (s poisonSink) Build(ctx context.Context, part string, resume *uint64) (dataflow.StatefulSink[int, uint64], error) {
	p, err := s.TwoPhaseSink.Build(ctx, part, resume)
	return &poisonPart{StatefulSink: p}, err
}

// A running flow's failure marked Permanent is returned at once, with the restart policy on:
// no restart, and the error reads and unwraps as the connector wrote it.
func TestPermanentFailureIsNotRestarted(t *testing.T) {
	defer goleak.VerifyNone(t)
	store := openStore(t, t.TempDir())
	defer store.Close()
	restarts := 0
	sink := poisonSink{flowtest.NewTwoPhaseSink[int](nil)}
	f := dataflow.New("poison")
	in := dataflow.Input(f, "in", flowtest.NewSource(5, []flowtest.Event[int]{flowtest.Items(1, 2, 3, 4, 5), flowtest.Pause[int](20 * time.Millisecond), flowtest.Items(6, 7)}).Input())
	dataflow.Output("out", in, dataflow.ToPartitioned[int, uint64](sink))
	st, err := dataflow.RunStats(context.Background(), f, dataflow.Options{Recovery: store, EpochInterval: 5 * time.Millisecond,
		Restart: dataflow.RestartPolicy{Attempts: 3, Backoff: time.Millisecond}, OnRestart: func(dataflow.RestartEvent) { restarts++ }})
	if !errors.Is(err, errLost) || !dataflow.IsPermanent(err) || st.Restarts != 0 || restarts != 0 {
		t.Fatalf("Run = %v after %d restarts, want the permanent failure and no restart", err, st.Restarts)
	}
	if !strings.Contains(err.Error(), "item 6: connection lost") {
		t.Fatalf("error %q does not read as the connector wrote it", err)
	}
	if dataflow.Permanent(nil) != nil || dataflow.IsPermanent(errLost) {
		t.Fatal("Permanent(nil) is not nil, or an unmarked error reads as permanent")
	}
}
