package flowtest_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/epochflow/epochflow/connectors/flowtest"
	"github.com/epochflow/epochflow/dataflow"
)

func run(t *testing.T, f *dataflow.Flow, workers int) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	return dataflow.Run(ctx, f, dataflow.Options{Workers: workers, EpochInterval: time.Millisecond})
}

func TestSourcePlaysItsScript(t *testing.T) {
	src := flowtest.NewSource(2,
		[]flowtest.Event[int]{flowtest.Items(1, 2, 3), flowtest.Pause[int](200 * time.Millisecond), flowtest.Items(4), flowtest.EOF[int](), flowtest.Items(99)},
		[]flowtest.Event[int]{flowtest.Items(10, 11)})
	f := dataflow.New("script")
	sink := flowtest.NewSink[int]()
	dataflow.Output("out", dataflow.Input(f, "in", src.Input()), sink.Output())
	if err := run(t, f, 2); err != nil {
		t.Fatal(err)
	}
	got := sink.Items()
	slices.Sort(got)
	if !slices.Equal(got, []int{1, 2, 3, 4, 10, 11}) {
		t.Errorf("got %v: items after EOF must not be read", got)
	}
	// The pause is longer than the epoch: 4 comes in a later epoch than 1.
	epochs := map[int]uint64{}
	for e, items := range sink.ByEpoch() {
		for _, v := range items {
			epochs[v] = e
		}
	}
	if epochs[4] <= epochs[1] {
		t.Errorf("4 in epoch %d, 1 in epoch %d: the pause did not end an epoch", epochs[4], epochs[1])
	}
	if c := src.Commits()["part-0"]; len(c) == 0 || c[len(c)-1].Event != 3 {
		t.Errorf("commits of part-0: %v, want the last at the EOF event", c)
	}
	if sink.Committed() == 0 || sink.Closed() != 1 {
		t.Errorf("sink committed %d, closed %d times", sink.Committed(), sink.Closed())
	}
}

func TestAbortStopsTheFlow(t *testing.T) {
	f := dataflow.New("abort")
	in := dataflow.Input(f, "in", flowtest.NewSource(1, []flowtest.Event[int]{flowtest.Items(1), flowtest.Abort[int]()}).Input())
	dataflow.Output("out", in, flowtest.NewSink[int]().Output())
	if err := run(t, f, 1); !errors.Is(err, flowtest.ErrAbort) {
		t.Fatalf("Run = %v, want ErrAbort", err)
	}
}

func TestQueueAcksOnlyOnCommit(t *testing.T) {
	q := flowtest.NewQueue(time.Hour)
	q.Send("a", "b", "c")
	stop := make(chan struct{})
	f := dataflow.New("queue")
	in := dataflow.Input(f, "in", q.Input(2))
	sink := flowtest.NewSink[flowtest.Message]()
	dataflow.Output("out", in, sink.Output())
	go func() {
		for q.Unacked() > 0 {
			time.Sleep(time.Millisecond)
		}
		close(stop)
	}()
	err := dataflow.Run(context.Background(), f, dataflow.Options{EpochInterval: time.Millisecond, Stop: stop})
	if err != nil {
		t.Fatal(err)
	}
	if len(sink.Items()) != 3 || q.Unacked() != 0 {
		t.Fatalf("got %d messages, %d unacked", len(sink.Items()), q.Unacked())
	}
}

func TestTwoPhaseSinkRollsBackUncommitted(t *testing.T) {
	ctx := context.Background()
	s := flowtest.NewTwoPhaseSink[string](nil)
	p, err := s.Build(ctx, "tx", nil)
	if err != nil {
		t.Fatal(err)
	}
	p.Write(ctx, []string{"a"})
	one, _ := p.Snapshot()
	p.Write(ctx, []string{"b"})
	if _, err := p.Snapshot(); err != nil {
		t.Fatal(err)
	}
	p.Write(ctx, []string{"c"}) // never prepared
	if len(s.Visible()) != 0 || s.Prepared() != 2 {
		t.Fatalf("before commit: visible %v, %d prepared", s.Visible(), s.Prepared())
	}
	// A crash, then a resume from the first snapshot: it is committed, the rest rolled back.
	if _, err := s.Build(ctx, "tx", &one); err != nil {
		t.Fatal(err)
	}
	if got := s.Visible(); !slices.Equal(got, []string{"a"}) || s.Prepared() != 0 {
		t.Fatalf("after resume: visible %v, %d prepared", got, s.Prepared())
	}
}
