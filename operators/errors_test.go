package operators_test

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/epochflow/epochflow/connectors/flowtest"
	"github.com/epochflow/epochflow/dataflow"
	"github.com/epochflow/epochflow/operators"
)

var errBoom = errors.New("boom failed")

func failOn(s string) error {
	if s == "boom" {
		return errBoom
	}
	return nil
}

func panicOn(s string) {
	if s == "boom" {
		panic("boom!")
	}
}

// failLogic fails (or panics) in OnItem on "boom" and, when atEOF, in OnEOF.
type failLogic struct {
	operators.BaseLogic[string]
	panics bool
	atEOF  bool
}

func (l *failLogic) OnItem(v string) ([]string, bool, error) {
	if l.panics {
		panicOn(v)
	}
	return []string{v}, false, failOn(v)
}

func (l *failLogic) OnEOF() ([]string, bool, error) {
	if l.atEOF {
		return nil, false, errBoom
	}
	return nil, false, nil
}

func (l *failLogic) Snapshot() int { return 0 }

// TestItemErrors checks that an error or a panic of a user function stops Run with an error
// that names the step, the worker and the item, and that no goroutine outlives Run.
func TestItemErrors(t *testing.T) {
	defer goleak.VerifyNone(t)
	const keyedItem = "{Key:boom Value:boom}"
	type caseT struct {
		name  string
		op    func(in S) any // returns the stream to write out (a dataflow.Stream of some type)
		step  string
		item  string
		keyed bool // the step runs on the worker that owns the key "boom"
		panic bool
	}
	keyed := func(in S) KS { return operators.KeyOn("key", in, func(s string) string { return s }) }
	cases := []caseT{
		{name: "MapErr", op: func(in S) any {
			return operators.MapErr("op", in, func(s string) (string, error) { return s, failOn(s) })
		}, step: "t.op", item: `"boom"`},
		{name: "Map", op: func(in S) any {
			return operators.Map("op", in, func(s string) string { panicOn(s); return s })
		}, step: "t.op", item: `"boom"`, panic: true},
		{name: "MapValue", op: func(in S) any {
			return operators.MapValue("op", keyed(in), func(s string) string { panicOn(s); return s })
		}, step: "t.op", item: keyedItem, panic: true},
		{name: "Filter", op: func(in S) any {
			return operators.Filter("op", in, func(s string) bool { panicOn(s); return true })
		}, step: "t.op", item: `"boom"`, panic: true},
		{name: "FilterErr", op: func(in S) any {
			return operators.FilterErr("op", in, func(s string) (bool, error) { return true, failOn(s) })
		}, step: "t.op", item: `"boom"`},
		{name: "FilterValue", op: func(in S) any {
			return operators.FilterValue("op", keyed(in), func(s string) bool { panicOn(s); return false })
		}, step: "t.op", item: keyedItem, panic: true},
		{name: "FilterMap", op: func(in S) any {
			return operators.FilterMap("op", in, func(s string) (string, bool) { panicOn(s); return s, true })
		}, step: "t.op", item: `"boom"`, panic: true},
		{name: "FilterMapErr", op: func(in S) any {
			return operators.FilterMapErr("op", in, func(s string) (string, bool, error) { return s, true, failOn(s) })
		}, step: "t.op", item: `"boom"`},
		{name: "FlatMap", op: func(in S) any {
			return operators.FlatMap("op", in, func(s string) []string { panicOn(s); return []string{s, s} })
		}, step: "t.op", item: `"boom"`, panic: true},
		{name: "FlatMapSeq", op: func(in S) any {
			return operators.FlatMapSeq("op", in, func(s string) iter.Seq[string] {
				return func(yield func(string) bool) { yield(s); panicOn(s) }
			})
		}, step: "t.op", item: `"boom"`, panic: true},
		{name: "FlatMapErr", op: func(in S) any {
			return operators.FlatMapErr("op", in, func(s string) ([]string, error) { return []string{s}, failOn(s) })
		}, step: "t.op", item: `"boom"`},
		{name: "FlatMapValue", op: func(in S) any {
			return operators.FlatMapValue("op", keyed(in), func(s string) []string { panicOn(s); return nil })
		}, step: "t.op", item: keyedItem, panic: true},
		{name: "Inspect", op: func(in S) any { return operators.Inspect("op", in, panicOn) },
			step: "t.op", item: `"boom"`, panic: true},
		{name: "Branch", op: func(in S) any {
			yes, _ := operators.Branch("op", in, func(s string) bool { panicOn(s); return true })
			return yes
		}, step: "t.op", item: `"boom"`, panic: true},
		{name: "KeyOn", op: func(in S) any {
			return operators.KeyOn("op", in, func(s string) string { panicOn(s); return s })
		}, step: "t.op", item: `"boom"`, panic: true},
		{name: "StatefulMap", op: func(in S) any {
			return operators.StatefulMap("op", keyed(in), func(n int, s string) (int, int, bool) { panicOn(s); return n, n, true })
		}, step: "t.op", item: keyedItem, keyed: true, panic: true},
		{name: "StatefulMapErr", op: func(in S) any {
			return operators.StatefulMapErr("op", keyed(in), func(n int, s string) (int, int, bool, error) { return n, n, true, failOn(s) })
		}, step: "t.op", item: keyedItem, keyed: true},
		{name: "StatefulFlatMap", op: func(in S) any {
			return operators.StatefulFlatMap("op", keyed(in), func(n int, s string) (int, []int, bool) { panicOn(s); return n, nil, true })
		}, step: "t.op", item: keyedItem, keyed: true, panic: true},
		{name: "Stateful/OnItem error", op: func(in S) any {
			return operators.Stateful("op", keyed(in), func(string, *int) (operators.Logic[string, string, int], error) {
				return &failLogic{}, nil
			})
		}, step: "t.op", item: keyedItem, keyed: true},
		{name: "Stateful/OnItem panic", op: func(in S) any {
			return operators.Stateful("op", keyed(in), func(string, *int) (operators.Logic[string, string, int], error) {
				return &failLogic{panics: true}, nil
			})
		}, step: "t.op", item: keyedItem, keyed: true, panic: true},
		{name: "Stateful/build error", op: func(in S) any {
			return operators.Stateful("op", keyed(in), func(key string, _ *int) (operators.Logic[string, string, int], error) {
				return &failLogic{}, failOn(key)
			})
		}, step: "t.op", item: keyedItem, keyed: true},
		{name: "Stateful/build nil", op: func(in S) any {
			return operators.Stateful("op", keyed(in), func(key string, _ *int) (operators.Logic[string, string, int], error) {
				if key == "boom" {
					return nil, nil
				}
				return &failLogic{}, nil
			})
		}, step: "t.op", item: keyedItem, keyed: true},
		{name: "Reduce", op: func(in S) any {
			return operators.Reduce("op", keyed(in), func(a, b string) string { panicOn(b); return a + b })
		}, step: "t.op", item: keyedItem, keyed: true, panic: true},
		{name: "Fold", op: func(in S) any {
			return operators.Fold("op", keyed(in), func(key string) int { panicOn(key); return 0 },
				func(n int, _ string) int { return n + 1 })
		}, step: "t.op", item: keyedItem, keyed: true, panic: true},
		{name: "Count", op: func(in S) any {
			return operators.Count("op", in, func(s string) string { panicOn(s); return s })
		}, step: "t.op.combine", item: `"boom"`, panic: true},
		// MaxBy and MinBy first combine on the item's own worker (the source's, worker 0).
		{name: "MaxBy", op: func(in S) any {
			return operators.MaxBy("op", keyed(in), func(a, b string) bool { panicOn(b); return a < b })
		}, step: "t.op.combine", item: keyedItem, panic: true},
		{name: "MinBy", op: func(in S) any {
			return operators.MinBy("op", keyed(in), func(a, b string) bool { panicOn(a); return a < b })
		}, step: "t.op.combine", item: keyedItem, panic: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			eachWorkers(t, func(t *testing.T, workers int) {
				f := dataflow.New("t")
				// "boom" comes twice, so that Reduce and MaxBy call their function with it.
				in := operators.Input(f, "in", flowtest.List("a", "b", "boom", "c", "boom", "d"))
				switch s := c.op(in).(type) {
				case S:
					operators.Output("out", s, flowtest.NewSink[string]().Output())
				case KS:
					operators.Output("out", s, flowtest.NewSink[dataflow.KV[string]]().Output())
				case dataflow.Stream[dataflow.KV[int]]:
					operators.Output("out", s, flowtest.NewSink[dataflow.KV[int]]().Output())
				default:
					t.Fatalf("unexpected stream type %T", s)
				}
				err := runFlow(t, f, workers)
				if err == nil {
					t.Fatal("Run returned nil")
				}
				wantWorker := 0
				if c.keyed {
					wantWorker = dataflow.WorkerForKey("boom", workers)
				}
				var se *dataflow.StepError
				if !errors.As(err, &se) || se.Step != c.step || se.Worker != wantWorker {
					t.Fatalf("error %v: want a StepError for step %q on worker %d, got %+v", err, c.step, wantWorker, se)
				}
				var ie *dataflow.ItemError
				if !errors.As(err, &ie) || ie.Item != c.item {
					t.Fatalf("error %v: want an ItemError for item %s, got %+v", err, c.item, ie)
				}
				msg := err.Error()
				for _, want := range []string{fmt.Sprintf("step %q", c.step), fmt.Sprintf("worker %d", wantWorker), "item " + c.item} {
					if !strings.Contains(msg, want) {
						t.Errorf("error %q does not contain %q", msg, want)
					}
				}
				if c.panic {
					if !strings.Contains(msg, "panic: boom!") {
						t.Errorf("error %q does not report the panic", msg)
					}
					// The frame of the user code that panicked: panicOn's panic, not the
					// operator's nor the engine's.
					if !strings.Contains(msg, "errors_test.go:30)") {
						t.Errorf("error %q does not name the user code's frame, errors_test.go:30", msg)
					}
				} else if !errors.Is(err, errBoom) && !strings.Contains(msg, "build returned a nil Logic") {
					t.Errorf("error %q does not wrap the function's error", msg)
				}
			})
		})
	}
}

// TestPanicWithError checks that a panic with an error value keeps it in the chain.
func TestPanicWithError(t *testing.T) {
	defer goleak.VerifyNone(t)
	f := dataflow.New("t")
	in := operators.Input(f, "in", flowtest.List("boom"))
	operators.Output("out", operators.Map("op", in, func(s string) string { panic(failOn(s)) }), flowtest.NewSink[string]().Output())
	err := runFlow(t, f, 1)
	if !errors.Is(err, errBoom) || !strings.Contains(err.Error(), `step "t.op" (worker 0): item "boom": panic: boom failed`) {
		t.Fatalf("got %v", err)
	}
}

// TestKeyErrors checks errors of per-key calls that have no item (a Logic's OnEOF): the error
// names the step, the worker and the key.
func TestKeyErrors(t *testing.T) {
	defer goleak.VerifyNone(t)
	eachWorkers(t, func(t *testing.T, workers int) {
		f := dataflow.New("t")
		in := operators.KeyOn("key", operators.Input(f, "in", flowtest.List("k")), func(s string) string { return s })
		out := operators.Stateful("op", in, func(string, *int) (operators.Logic[string, string, int], error) {
			return &failLogic{atEOF: true}, nil
		})
		operators.Output("out", out, flowtest.NewSink[dataflow.KV[string]]().Output())
		err := runFlow(t, f, workers)
		var se *dataflow.StepError
		if !errors.As(err, &se) || se.Step != "t.op" || se.Worker != dataflow.WorkerForKey("k", workers) ||
			!errors.Is(err, errBoom) || !strings.Contains(err.Error(), `key "k"`) {
			t.Fatalf("got %v", err)
		}
	})
}

// TestCancel checks that cancelling Run's context stops a flow that waits on its source and
// on a Collect timer, and that no goroutine outlives Run.
func TestCancel(t *testing.T) {
	defer goleak.VerifyNone(t)
	eachWorkers(t, func(t *testing.T, workers int) {
		f, in := keyedFlow(10, flowtest.Items(kv("a", 1), kv("b", 2)), flowtest.Pause[KI](time.Minute))
		lists := operators.Collect("collect", in, 10, 30*time.Second)
		counts := operators.StatefulMap("count", lists, func(n int, l []int) (int, int, bool) { return n + len(l), n, true })
		operators.Output("out", counts, flowtest.NewSink[dataflow.KV[int]]().Output())
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		start := time.Now()
		err := dataflow.Run(ctx, f, dataflow.Options{Workers: workers, EpochInterval: epochInterval})
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Run = %v, want the context's error", err)
		}
		if d := time.Since(start); d > 5*time.Second {
			t.Fatalf("Run took %v to stop", d)
		}
	})
}
