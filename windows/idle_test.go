package windows_test

import (
	"context"
	"io"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/epochflow/epochflow/connectors/flowtest"
	"github.com/epochflow/epochflow/dataflow"
	"github.com/epochflow/epochflow/operators"
	"github.com/epochflow/epochflow/windows"
)

// idleSource has two partitions: p0 yields its items and ends; p1 yields its first item, then
// nothing until release is closed, then the rest.
type idleSource struct {
	p0, p1  []ev
	release chan struct{}
}

func (s *idleSource) Parts(context.Context) ([]string, error) { return []string{"p0", "p1"}, nil }

func (s *idleSource) Build(_ context.Context, part string, _ *int) (dataflow.StatefulSource[ev, int], error) {
	if part == "p0" {
		return &idlePart{items: s.p0}, nil
	}
	return &idlePart{items: s.p1, hold: 1, release: s.release}, nil
}

type idlePart struct {
	items   []ev
	pos     int
	hold    int // the position at which it waits for release (0: never)
	release chan struct{}
}

func (p *idlePart) Next(context.Context) ([]ev, error) {
	if p.pos == len(p.items) {
		return nil, io.EOF
	}
	if p.hold > 0 && p.pos == p.hold {
		select {
		case <-p.release:
		default:
			return nil, nil
		}
	}
	end := len(p.items)
	if p.hold > p.pos {
		end = p.hold
	}
	out := slices.Clone(p.items[p.pos:end])
	p.pos = end
	return out, nil
}

func (p *idlePart) Snapshot() int                     { return p.pos }
func (p *idlePart) Commit(context.Context, int) error { return nil }
func (p *idlePart) Close() error                      { return nil }

// TestIdlePartition: the worker of p1 reads z@0 and then nothing for a while; the other worker
// reads a@2, a@25, a@40 and ends. Without an idle timeout p1 holds the watermark at 0, so the
// a@1 it reads at last is on time in [0,10). With one, p1 is left out once idle, the windows
// close on p0's watermark (the test waits for [0,10) to be emitted before releasing p1), and
// a@1 is late.
func TestIdlePartition(t *testing.T) {
	for _, tc := range []struct {
		name           string
		idle           time.Duration
		results, lates []string
	}{
		{name: "no idle timeout", results: []string{"a [0,10) [1 11]", "a [20,30) [2]", "a [40,50) [3]", "z [0,10) [10]"}},
		{name: "idle timeout", idle: 20 * time.Millisecond,
			results: []string{"a [0,10) [1]", "a [20,30) [2]", "a [40,50) [3]", "z [0,10) [10]"},
			lates:   []string{"a [0,10) 11"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src := &idleSource{
				p0:      []ev{e("a", 2, 1), e("a", 25, 2), e("a", 40, 3)},
				p1:      []ev{e("z", 0, 10), e("a", 1, 11)},
				release: make(chan struct{}),
			}
			var once sync.Once
			release := func() { once.Do(func() { close(src.release) }) }
			f := dataflow.New("t")
			in := operators.Input(f, "in", dataflow.FromPartitioned[ev, int](src))
			// Without an idle timeout nothing closes while p1 waits: release it once p0's last
			// item is read. With one, release it once [0,10) of a is emitted.
			in = operators.Inspect("read", in, func(x ev) {
				if x.V == 3 && tc.idle == 0 {
					release()
				}
			})
			keyed := operators.KeyOn("key", in, func(x ev) string { return x.Key })
			clock := dataflow.EventClock(func(x ev) time.Time { return ms(x.T) }, 0).WithIdleTimeout(tc.idle)
			res := windows.Apply("win", keyed, clock, windows.Tumbling(10*time.Millisecond, ms(0)), windows.Logic[ev, []int, []int]{
				Add:   func(acc []int, x ev) []int { return append(acc, x.V) },
				Close: func(_ string, _ windows.Window, acc []int) []int { return slices.Clone(acc) },
			})
			results := operators.Inspect("seen", res.Results, func(r windows.Result[[]int]) {
				if r.Key == "a" && r.Window.Start.UnixMilli() == 0 {
					release()
				}
			})
			rs, ls := flowtest.NewSink[string](), flowtest.NewSink[string]()
			operators.Output("results", operators.Map("show", results, show), rs.Output())
			operators.Output("late", operators.Map("show-late", res.Late, showLate), ls.Output())
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if err := dataflow.Run(ctx, f, dataflow.Options{Workers: 2, EpochInterval: 2 * time.Millisecond, Logger: quiet}); err != nil {
				t.Fatalf("Run: %v", err)
			}
			same(t, "results", sorted(rs.Items()), tc.results)
			same(t, "late", sorted(ls.Items()), tc.lates)
		})
	}
}
