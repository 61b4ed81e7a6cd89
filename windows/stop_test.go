package windows_test

import (
	"context"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/epochflow/epochflow/connectors/flowtest"
	"github.com/epochflow/epochflow/dataflow"
	"github.com/epochflow/epochflow/operators"
	"github.com/epochflow/epochflow/recovery"
	"github.com/epochflow/epochflow/windows"
)

// holdSource has one partition that yields its items one at a time, resuming at the position
// it is given; with hold set it yields nothing once it reaches hold (until the run stops).
type holdSource struct {
	items []ev
	hold  int // 0: never
}

func (s holdSource) Parts(context.Context) ([]string, error) { return []string{"p"}, nil }

func (s holdSource) Build(_ context.Context, _ string, resume *int) (dataflow.StatefulSource[ev, int], error) {
	p := &holdPart{s: s}
	if resume != nil {
		p.pos = *resume
	}
	return p, nil
}

type holdPart struct {
	s   holdSource
	pos int
}

func (p *holdPart) Next(context.Context) ([]ev, error) {
	if p.s.hold > 0 && p.pos == p.s.hold {
		return nil, nil
	}
	if p.pos == len(p.s.items) {
		return nil, io.EOF
	}
	p.pos++
	return p.s.items[p.pos-1 : p.pos], nil
}

func (p *holdPart) Snapshot() int                     { return p.pos }
func (p *holdPart) Commit(context.Context, int) error { return nil }
func (p *holdPart) Close() error                      { return nil }

// TestGracefulStopKeepsWindowsOpen: a graceful stop is not an end of input: the windows still
// open are not emitted but kept in the snapshot, and the resumed run emits them whole, once.
func TestGracefulStopKeepsWindowsOpen(t *testing.T) {
	items := []ev{e("a", 1, 1), e("a", 5, 2), e("a", 12, 3), e("a", 15, 4), e("b", 30, 5)}
	dir := t.TempDir()
	sink := flowtest.NewTwoPhaseSink[string](nil)
	run := func(hold int) {
		t.Helper()
		f := dataflow.New("t")
		in := operators.Input(f, "in", dataflow.FromPartitioned[ev, int](holdSource{items: items, hold: hold}))
		keyed := operators.KeyOn("key", in, func(x ev) string { return x.Key })
		res := windows.Apply("w", keyed, dataflow.EventClock(func(x ev) time.Time { return ms(x.T) }, 0),
			windows.Tumbling(10*time.Millisecond, ms(0)), windows.Logic[ev, []int, []int]{
				Add:   func(acc []int, x ev) []int { return append(acc, x.V) },
				Close: func(_ string, _ windows.Window, acc []int) []int { return acc },
			})
		operators.Output("out", operators.Map("show", res.Results, show), sink.Output())
		store, err := recovery.OpenSQLite(context.Background(), dir, recovery.SQLiteOptions{})
		if err != nil {
			t.Fatal(err)
		}
		defer store.Close()
		stop := make(chan struct{})
		var once sync.Once
		opts := dataflow.Options{Workers: 2, EpochInterval: 2 * time.Millisecond, Recovery: store, Logger: quiet, Stop: stop}
		// With hold, stop once [0,10) is out: the source holds at the item at 15, so [10,20) is
		// open. (Both runs have the step: a resumed flow must have the same steps.)
		seen := operators.Inspect("stop", res.Results, func(r windows.Result[[]int]) {
			if hold > 0 && r.Window.Start.UnixMilli() == 0 {
				once.Do(func() { close(stop) })
			}
		})
		operators.Output("void", seen, flowtest.NewSink[windows.Result[[]int]]().Output())
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := dataflow.Run(ctx, f, opts); err != nil {
			t.Fatalf("run (hold %d): %v", hold, err)
		}
	}
	run(3)
	if got := sorted(sink.Visible()); len(got) != 1 || got[0] != "a [0,10) [1 2]" {
		t.Fatalf("after the stop: %q, want only a [0,10) [1 2]", got)
	}
	run(0)
	same(t, "after the resume", sorted(sink.Visible()), []string{"a [0,10) [1 2]", "a [10,20) [3 4]", "b [30,40) [5]"})
}
