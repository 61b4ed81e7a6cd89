package windows_test

import (
	"context"
	"fmt"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/epochflow/epochflow/connectors/flowtest"
	"github.com/epochflow/epochflow/dataflow"
	"github.com/epochflow/epochflow/operators"
	"github.com/epochflow/epochflow/windows"
)

// busySource has one partition that reads an item of key a every millisecond, 10 ms of event
// time apart from 10 on, until stop is closed (then it ends); after n items it calls atN.
type busySource struct {
	n    int
	atN  func()
	stop <-chan struct{}
}

func (s busySource) Parts(context.Context) ([]string, error) { return []string{"busy"}, nil }

func (s busySource) Build(context.Context, string, *int) (dataflow.StatefulSource[ev, int], error) {
	return &busyPart{s: s}, nil
}

type busyPart struct {
	s    busySource
	done int
}

func (p *busyPart) Next(context.Context) ([]ev, error) {
	select {
	case <-p.s.stop:
		return nil, io.EOF
	default:
	}
	p.done++
	if p.done == p.s.n {
		p.s.atN()
	}
	return []ev{e("a", int64(10*p.done), p.done)}, nil
}

func (p *busyPart) NextAwake() time.Time              { return time.Now().Add(time.Millisecond) }
func (p *busyPart) Snapshot() int                     { return p.done }
func (p *busyPart) Commit(context.Context, int) error { return nil }
func (p *busyPart) Close() error                      { return nil }

// idleJoinInputs are the two inputs of the join idle tests, read by one worker: the left one
// busy (a@10, a@20, ... until released), the right one quiet (its partition p1 reads a@0, then
// nothing until released, then a@5; its p0 is empty). Both are released once the busy one has read 200 items (at least 200 ms
// after the quiet one's first item, far past an idle timeout of 20 ms).
func idleJoinInputs(f *dataflow.Flow) (left dataflow.Stream[dataflow.KV[ev]], right dataflow.Stream[dataflow.KV[rightEv]]) {
	release := make(chan struct{})
	var once sync.Once
	free := func() { once.Do(func() { close(release) }) }
	busy := operators.Input(f, "busy", dataflow.FromPartitioned[ev, int](busySource{n: 200, atN: free, stop: release}))
	quiet := operators.Input(f, "quiet", dataflow.FromPartitioned[ev, int](&idleSource{
		p1: []ev{e("a", 0, 1000), e("a", 5, 1005)}, release: release}))
	left = operators.KeyOn("lkey", busy, func(x ev) string { return x.Key })
	right = operators.MapValue("rval", operators.KeyOn("rkey", quiet, func(x ev) string { return x.Key }),
		func(x ev) rightEv { return rightEv{x} })
	return left, right
}

func runIdleJoin(t *testing.T, f *dataflow.Flow) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := dataflow.Run(ctx, f, dataflow.Options{Workers: 1, EpochInterval: 2 * time.Millisecond, Logger: quiet}); err != nil {
		t.Fatalf("Run: %v", err)
	}
}

// TestJoin2IdleInput: Join2 takes the clock's idle timeout in its Options. Without one, the
// quiet input holds the watermark at 0 and its item at 5 joins the window [0,10); with one, the
// quiet input is left out once idle, the busy input's watermark closes [0,10) with the item at
// 0 alone, and the item at 5 is late.
func TestJoin2IdleInput(t *testing.T) {
	for _, tc := range []struct {
		idle         time.Duration
		first, lates []string
	}{
		{idle: 0, first: []string{"a [0,10) [-/1000 -/1005]"}},
		{idle: 20 * time.Millisecond, first: []string{"a [0,10) [-/1000]"}, lates: []string{"a [0,10) 1005"}},
	} {
		t.Run(fmt.Sprint("idle=", tc.idle), func(t *testing.T) {
			f := dataflow.New("j")
			left, right := idleJoinInputs(f)
			out := windows.Join2("join", left, right, func(x ev) time.Time { return ms(x.T) }, func(r rightEv) time.Time { return ms(r.E.T) },
				0, windows.Tumbling(10*time.Millisecond, ms(0)), windows.JoinFinal, windows.Options{IdleTimeout: tc.idle})
			first := operators.Filter("first", out.Results, func(r windows.Result[[]windows.Pair[ev, rightEv]]) bool {
				return r.Window.Start.UnixMilli() == 0
			})
			rs, ls := flowtest.NewSink[string](), flowtest.NewSink[string]()
			operators.Output("out", operators.Map("show", first, func(r windows.Result[[]windows.Pair[ev, rightEv]]) string {
				var rows []string
				for _, p := range r.Value {
					l, rr := "-", "-"
					if p.Left != nil {
						l = fmt.Sprint(p.Left.V)
					}
					if p.Right != nil {
						rr = fmt.Sprint(p.Right.E.V)
					}
					rows = append(rows, l+"/"+rr)
				}
				return fmt.Sprintf("%s [%d,%d) %v", r.Key, r.Window.Start.UnixMilli(), r.Window.End.UnixMilli(), sorted(rows))
			}), rs.Output())
			operators.Output("late", operators.Map("show-late", out.Late, func(l windows.Late[windows.Either[ev, rightEv]]) string {
				return fmt.Sprintf("%s [%d,%d) %d", l.Key, l.Window.Start.UnixMilli(), l.Window.End.UnixMilli(), l.Item.Right.E.V)
			}), ls.Output())
			runIdleJoin(t, f)
			same(t, "window [0,10)", rs.Items(), tc.first)
			same(t, "late", sorted(ls.Items()), tc.lates)
		})
	}
}

// TestIntervalJoinIdleInput: IntervalJoin takes the clock's idle timeout in its Options. The
// quiet input's item at 5 matches the busy input's item at 10 (interval [t-5, t+5]); without an
// idle timeout it is on time and joins it, with one the watermark has passed it (the quiet
// input was left out once idle) and it is late.
func TestIntervalJoinIdleInput(t *testing.T) {
	for _, tc := range []struct {
		idle        time.Duration
		rows, lates []string
	}{
		{idle: 0, rows: []string{"row a 1-1005"}},
		{idle: 20 * time.Millisecond, lates: []string{"late a 1005 [0,10]"}},
	} {
		t.Run(fmt.Sprint("idle=", tc.idle), func(t *testing.T) {
			f := dataflow.New("ij")
			left, right := idleJoinInputs(f)
			out := windows.IntervalJoin("ij", left, right, func(x ev) time.Time { return ms(x.T) }, func(r rightEv) time.Time { return ms(r.E.T) },
				0, 5*time.Millisecond, 5*time.Millisecond, windows.Options{IdleTimeout: tc.idle})
			rs, ls := flowtest.NewSink[string](), flowtest.NewSink[string]()
			operators.Output("rows", operators.Map("show", out.Rows, func(r windows.Row[ev, rightEv]) string {
				return fmt.Sprintf("row %s %d-%d", r.Key, r.Left.V, r.Right.E.V)
			}), rs.Output())
			operators.Output("late", operators.Map("show-late", out.Late, func(l windows.Late[windows.Either[ev, rightEv]]) string {
				return fmt.Sprintf("late %s %d [%d,%d]", l.Key, l.Item.Right.E.V, l.Window.Start.UnixMilli(), l.Window.End.Add(-time.Nanosecond).UnixMilli())
			}), ls.Output())
			runIdleJoin(t, f)
			same(t, "rows", sorted(rs.Items()), tc.rows)
			same(t, "late", sorted(ls.Items()), tc.lates)
		})
	}
}
