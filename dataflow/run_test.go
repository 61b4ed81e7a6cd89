package dataflow_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/epochflow/epochflow/connectors/flowtest"
	"github.com/epochflow/epochflow/dataflow"
)

func double(b []int) ([]int, error) {
	out := make([]int, len(b))
	for i, v := range b {
		out[i] = 2 * v
	}
	return out, nil
}

func TestDuplicateStepIDIsABuildError(t *testing.T) {
	f := dataflow.New("dup")
	in := dataflow.Input(f, "in", flowtest.List(1, 2, 3))
	a := dataflow.Transform("x", in, double)
	b := dataflow.Transform("x", a, double)
	if b.Flow() != nil {
		t.Error("the second step with a used name returned a live stream")
	}
	err := dataflow.Run(context.Background(), f, dataflow.Options{})
	if err == nil || !strings.Contains(err.Error(), `"dup.x"`) {
		t.Fatalf("Run = %v, want an error naming dup.x", err)
	}
	if f.Err() == nil {
		t.Error("Flow.Err is nil after a duplicate id")
	}
}

func TestBadNamesAreBuildErrors(t *testing.T) {
	for _, name := range []string{"", "a b", ".a", "a..b", "a."} {
		f := dataflow.New("f")
		dataflow.Input(f, name, flowtest.List(1))
		if f.Err() == nil {
			t.Errorf("step name %q was accepted", name)
		}
	}
	f := dataflow.New("f")
	dataflow.Input(f, "in", dataflow.Source[int]{})
	if err := f.Err(); err == nil || !strings.Contains(err.Error(), "zero dataflow.Source") {
		t.Errorf("a zero Source gave %v", err)
	}
}

// A user function's error stops the flow with an error naming the step, the worker and the
// item; no goroutine is left behind.
func TestUserErrorNamesStepWorkerAndItem(t *testing.T) {
	defer goleak.VerifyNone(t)
	for _, workers := range []int{1, 4} {
		f := dataflow.New("errs")
		in := dataflow.Input(f, "in", flowtest.List(1, 2, 3, 42, 5))
		spread := dataflow.Redistribute("spread", in)
		bad := dataflow.Transform("check", spread, func(b []int) ([]int, error) {
			return b, dataflow.ForEach(b, func(v int) error {
				if v == 42 {
					return errors.New("42 is not allowed")
				}
				return nil
			})
		})
		dataflow.Output("out", bad, flowtest.NewSink[int]().Output())
		err := dataflow.Run(context.Background(), f, dataflow.Options{Workers: workers})
		var se *dataflow.StepError
		var ie *dataflow.ItemError
		if !errors.As(err, &se) || !errors.As(err, &ie) {
			t.Fatalf("workers=%d: Run = %v, want a StepError wrapping an ItemError", workers, err)
		}
		if se.Step != "errs.check" || ie.Item != "42" || se.Worker < 0 || se.Worker >= workers {
			t.Errorf("workers=%d: step %q worker %d item %q", workers, se.Step, se.Worker, ie.Item)
		}
		for _, want := range []string{`"errs.check"`, "worker", "item 42", "42 is not allowed"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("error %q does not mention %s", err, want)
			}
		}
	}
}

// A panic in a user function is reported as an error, not a crash.
func TestPanicBecomesAnError(t *testing.T) {
	defer goleak.VerifyNone(t)
	f := dataflow.New("panics")
	in := dataflow.Input(f, "in", flowtest.List("a", "b", "boom"))
	p := dataflow.Transform("explode", in, func(b []string) ([]string, error) {
		for _, s := range b {
			if s == "boom" {
				panic("kaboom")
			}
		}
		return b, nil
	})
	dataflow.Output("out", p, flowtest.NewSink[string]().Output())
	err := dataflow.Run(context.Background(), f, dataflow.Options{Workers: 2})
	if err == nil || !strings.Contains(err.Error(), "panics.explode") || !strings.Contains(err.Error(), "kaboom") {
		t.Fatalf("Run = %v, want an error naming the step and the panic", err)
	}
}

// Cancelling the context stops a running flow promptly; Run returns the context's error and no
// goroutine outlives it.
func TestCancelStopsTheFlow(t *testing.T) {
	defer goleak.VerifyNone(t)
	src := flowtest.NewSource(1, []flowtest.Event[int]{flowtest.Items(1, 2), flowtest.Pause[int](time.Hour)})
	f := dataflow.New("cancel")
	in := dataflow.Input(f, "in", src.Input())
	dataflow.Output("out", dataflow.Redistribute("spread", in), flowtest.NewSink[int]().Output())
	ctx, cancel := context.WithCancel(context.Background())
	go func() { time.Sleep(50 * time.Millisecond); cancel() }()
	err := dataflow.Run(ctx, f, dataflow.Options{Workers: 3, EpochInterval: 10 * time.Millisecond})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Run = %v, want context.Canceled", err)
	}
}

func sum() dataflow.StatefulLogic[int, int, int] {
	return dataflow.StatefulLogic[int, int, int]{
		OnItem: func(_ string, s *int, _ bool, v int, out *dataflow.Emitter[int]) (bool, error) {
			*s += v
			return true, nil
		},
		OnEOF: func(_ string, s *int, out *dataflow.Emitter[int]) (bool, error) {
			out.Emit(*s)
			return false, nil
		},
	}
}

func keyed(b []int) ([]dataflow.KV[int], error) {
	out := make([]dataflow.KV[int], len(b))
	for i, v := range b {
		out[i] = dataflow.KV[int]{Key: fmt.Sprint(v % 3), Value: v}
	}
	return out, nil
}

// A graceful stop closes and commits the open epoch and returns nil, without an end of input:
// the EOF-only output of a stateful step is not emitted.
func TestGracefulStop(t *testing.T) {
	defer goleak.VerifyNone(t)
	src := flowtest.NewSource(2, []flowtest.Event[int]{flowtest.Items(1, 2, 3, 4, 5), flowtest.Pause[int](time.Hour)})
	f := dataflow.New("stop")
	in := dataflow.Input(f, "in", src.Input())
	raw := flowtest.NewSink[int]()
	dataflow.Output("raw", in, raw.Output())
	sums := flowtest.NewSink[dataflow.KV[int]]()
	dataflow.Output("sums", dataflow.Stateful("sum", dataflow.Transform("key", in, keyed), sum()), sums.Output())
	stop := make(chan struct{})
	go func() {
		for len(raw.Items()) < 5 {
			time.Sleep(time.Millisecond)
		}
		close(stop)
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := dataflow.Run(ctx, f, dataflow.Options{Workers: 2, EpochInterval: time.Hour, Stop: stop}); err != nil {
		t.Fatal(err)
	}
	if got := raw.Items(); !slices.Equal(got, []int{1, 2, 3, 4, 5}) {
		t.Errorf("raw sink got %v", got)
	}
	if got := sums.Items(); len(got) != 0 {
		t.Errorf("a stop emitted EOF output %v", got)
	}
	if raw.Committed() != 1 || sums.Committed() != 1 {
		t.Errorf("committed epochs: raw %d sums %d, want 1", raw.Committed(), sums.Committed())
	}
	if commits := src.Commits()["part-0"]; len(commits) == 0 || commits[len(commits)-1] != (flowtest.Position{Event: 1}) {
		t.Errorf("source commits %v, want the last at event 1", commits)
	}
}

// A stop that came before the run started (a SIGTERM while Main opened its store) ends the
// run at once and cleanly: the open epoch is committed, nothing is lost, nothing is emitted
// as if the input had ended.
func TestStopBeforeRun(t *testing.T) {
	defer goleak.VerifyNone(t)
	src := flowtest.NewSource(2, []flowtest.Event[int]{flowtest.Items(1, 2, 3, 4, 5), flowtest.Pause[int](time.Hour)})
	f := dataflow.New("stop-early")
	in := dataflow.Input(f, "in", src.Input())
	sums := flowtest.NewSink[dataflow.KV[int]]()
	dataflow.Output("sums", dataflow.Stateful("sum", dataflow.Transform("key", in, keyed), sum()), sums.Output())
	stop := make(chan struct{})
	close(stop)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := dataflow.Run(ctx, f, dataflow.Options{Workers: 2, EpochInterval: time.Hour, Stop: stop}); err != nil {
		t.Fatal(err)
	}
	if got := sums.Items(); len(got) != 0 {
		t.Errorf("a stop emitted EOF output %v", got)
	}
	if sums.Committed() != 1 {
		t.Errorf("committed epochs: %d, want 1", sums.Committed())
	}
}

// A step that merges a stream read on this worker with one that crossed an exchange gets all of
// both, epoch by epoch (the local side is aligned through a forward channel).
func TestMergeAcrossExchangeDepths(t *testing.T) {
	for _, workers := range []int{1, 3} {
		var script []flowtest.Event[int]
		var want []int
		for i := range 40 {
			script = append(script, flowtest.Items(i), flowtest.Pause[int](time.Millisecond))
			want = append(want, i, 1000+i)
		}
		f := dataflow.New("depths")
		in := dataflow.Input(f, "in", flowtest.NewSource(3, script).Input())
		shifted := dataflow.Transform("shift", dataflow.Redistribute("spread", in), func(b []int) ([]int, error) {
			out := make([]int, len(b))
			for i, v := range b {
				out[i] = v + 1000
			}
			return out, nil
		})
		sink := flowtest.NewSink[int]()
		dataflow.Output("out", dataflow.Merge("merge", in, shifted), sink.Output())
		if err := dataflow.Run(context.Background(), f, dataflow.Options{Workers: workers, EpochInterval: time.Millisecond}); err != nil {
			t.Fatal(err)
		}
		got := sink.Items()
		slices.Sort(got)
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Fatalf("workers=%d: got %v, want %v", workers, got, want)
		}
		// Every item lands in the epoch it was read in: v and v+1000 share one.
		epochOf := map[int]uint64{}
		for e, items := range sink.ByEpoch() {
			for _, v := range items {
				epochOf[v] = e
			}
		}
		for i := range 40 {
			if epochOf[i] != epochOf[1000+i] {
				t.Errorf("workers=%d: %d in epoch %d but %d in epoch %d", workers, i, epochOf[i], 1000+i, epochOf[1000+i])
			}
		}
	}
}

// countingSource never ends and counts what it has read.
type countingSource struct{ read atomic.Int64 }

func (s *countingSource) Build(_ context.Context, w dataflow.Worker) (dataflow.WorkerSource[int], error) {
	return s, nil
}
func (s *countingSource) Next(context.Context) ([]int, error) {
	s.read.Add(100)
	return make([]int, 100), nil
}
func (s *countingSource) Close() error { return nil }

// When epochs wait for a commit that does not come (the store stalls), the sources stop
// reading once MaxEpochsInFlight epochs are closed but not committed: memory stays bounded.
// And with a bound of 1, epochs still close and commit.
func TestSourcesPauseWhileCommitsLag(t *testing.T) {
	for _, max := range []int{1, 2} {
		src := &countingSource{}
		var stalled atomic.Bool
		release := make(chan struct{})
		f := dataflow.New("lag")
		in := dataflow.Input(f, "in", dataflow.FromDynamic[int](src))
		sink := flowtest.NewSink[int]()
		dataflow.Output("out", dataflow.Transform("none", in, func([]int) ([]int, error) { return nil, nil }), sink.Output())
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		store := openStore(t, t.TempDir())
		defer store.Close()
		go func() {
			done <- dataflow.Run(ctx, f, dataflow.Options{EpochInterval: 2 * time.Millisecond, MaxEpochsInFlight: max,
				Recovery: store,
				CrashHook: func(point string) bool {
					if point == "before-commit-record" && sink.Committed() >= 2 && stalled.CompareAndSwap(false, true) {
						<-release // the store stalls on this epoch's commit
					}
					return false
				}})
		}()
		for deadline := time.Now().Add(20 * time.Second); !stalled.Load(); time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				cancel()
				<-done
				t.Fatalf("max=%d: no second epoch was committed in 20 s", max)
			}
		}
		// Reading stops once the bound is reached (within 10 s on a loaded machine), and
		// then stays stopped while the commit stalls.
		before := src.read.Load()
		for deadline := time.Now().Add(10 * time.Second); ; before = src.read.Load() {
			time.Sleep(100 * time.Millisecond)
			if src.read.Load() == before {
				break
			}
			if time.Now().After(deadline) {
				close(release)
				cancel()
				<-done
				t.Fatalf("max=%d: the source kept reading for 10 s while the commit stalled", max)
			}
		}
		time.Sleep(300 * time.Millisecond)
		if after := src.read.Load(); after != before {
			t.Errorf("max=%d: the source read %d more items while %d epochs waited for their commit", max, after-before, max)
		}
		close(release)
		for deadline := time.Now().Add(10 * time.Second); src.read.Load() == before; time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Errorf("max=%d: the source did not resume reading within 10 s of the commit", max)
				break
			}
		}
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Fatal(err)
		}
	}
}
