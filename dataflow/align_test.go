package dataflow_test

import (
	"cmp"
	"context"
	"io"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/epochflow/epochflow/dataflow"
)

// alignRun runs two workers, worker 0 reading the partition "fast" (n items 10 ms of event time
// apart, read as fast as the worker can) and worker 1 the partition "slow", through an
// event-time step keyed by partition with the given clock. It returns the largest lead of a
// "fast" item over the step's watermark when it came (its time minus the watermark), and calls
// onFast with the time of each "fast" item the step sees. With waitOther, "fast" starts once the
// step has seen an item of "slow" (so that the watermark has left the beginning of time).
func alignRun(t *testing.T, n int, other dataflow.StatefulSource[stamp, int], clock dataflow.Clock[stamp], waitOther bool, onFast func(int64), logger *slog.Logger) time.Duration {
	t.Helper()
	if w := dataflow.WorkerForKey("slow", 2); w != 0 {
		t.Fatalf("the key \"slow\" is worker %d's, the test needs worker 0's", w)
	}
	fast := &listPart{name: "fast"}
	otherSeen := make(chan struct{})
	var once sync.Once
	if waitOther {
		fast.release = otherSeen
	}
	for i := range n {
		fast.batches = append(fast.batches, []int64{int64(i) * 10})
	}
	src := scriptedSource{names: []string{"fast", "slow"},
		parts: map[string]dataflow.StatefulSource[stamp, int]{"fast": fast, "slow": other}}
	var mu sync.Mutex
	var lead time.Duration
	f := dataflow.New("align")
	in := dataflow.Input(f, "in", dataflow.FromPartitioned[stamp, int](src))
	keyed := keyByPart(in)
	out := dataflow.StatefulTime("time", keyed, clock, dataflow.TimedLogic[stamp, bool, string]{
		OnItem: func(_ string, _ *bool, _ bool, s stamp, at, wm time.Time, _ *dataflow.Emitter[string]) (bool, error) {
			if s.Part == "fast" {
				mu.Lock()
				if wm.After(dataflow.BeginningOfTime) {
					lead = max(lead, at.Sub(wm))
				}
				mu.Unlock()
				if onFast != nil {
					onFast(s.T)
				}
			} else {
				once.Do(func() { close(otherSeen) })
			}
			return false, nil
		},
	})
	dataflow.Output("out", out, dataflow.ToDynamic[dataflow.KV[string]](&discard[dataflow.KV[string]]{}))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := dataflow.Run(ctx, f, dataflow.Options{Workers: 2, EpochInterval: 20 * time.Millisecond, Logger: logger}); err != nil {
		t.Fatalf("Run: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	return lead
}

// pacedPart yields one item per every (1 ms when zero) of wall-clock time at most, 10 ms of
// event time apart from 0 on, and ends after n.
type pacedPart struct {
	name    string
	n, done int
	every   time.Duration
}

func (p *pacedPart) Next(context.Context) ([]stamp, error) {
	if p.done == p.n {
		return nil, io.EOF
	}
	t := int64(p.done) * 10
	p.done++
	return []stamp{{Part: p.name, T: t}}, nil
}

func (p *pacedPart) NextAwake() time.Time {
	return time.Now().Add(cmp.Or(p.every, time.Millisecond))
}

func (p *pacedPart) Snapshot() int                     { return p.done }
func (p *pacedPart) Commit(context.Context, int) error { return nil }
func (p *pacedPart) Close() error                      { return nil }

// Watermark alignment (Clock.MaxDrift): worker 0 can read its 3 s of event time at once (from
// when the step has seen worker 1's first item), worker 1 reads one item (10 ms of event time) per millisecond. Without alignment the items
// of worker 0 reach the step seconds ahead of its watermark (which follows worker 1); with a
// max drift of 100 ms, worker 0 waits for worker 1, and no item comes more than the drift (plus
// the batches on their way) ahead of the watermark. The step sees every item either way.
func TestMaxDriftHoldsTheFasterWorkerBack(t *testing.T) {
	const n = 300
	ts := func(s stamp) time.Time { return time.UnixMilli(s.T) }
	for _, drift := range []time.Duration{0, 100 * time.Millisecond} {
		seen := 0
		lead := alignRun(t, n, &pacedPart{name: "slow", n: n}, dataflow.EventClock(ts, 0).WithMaxDrift(drift), true, func(int64) { seen++ }, nil)
		t.Logf("max drift %v: the fast worker's items came up to %v ahead of the watermark", drift, lead)
		if seen != n {
			t.Fatalf("max drift %v: the step saw %d items of the fast partition, want %d", drift, seen, n)
		}
		switch {
		case drift == 0 && lead < time.Second:
			t.Fatalf("without alignment the fast worker led by %v only: the test shows nothing", lead)
		case drift > 0 && lead > drift+200*time.Millisecond:
			t.Fatalf("max drift %v: an item came %v ahead of the watermark", drift, lead)
		}
	}
}

// Alignment never stops the flow on a partition that reads nothing yet (the step's watermark
// is still at the beginning of time), nor on one that has read an item and then waits, once
// it is idle (IdleTimeout), nor on one that has ended: in each case the fast worker reads its
// whole partition, which the other partition waits for before it ends.
func TestMaxDriftLetsTheFastWorkerPassIdleAndEndedPartitions(t *testing.T) {
	const n = 300
	ts := func(s stamp) time.Time { return time.UnixMilli(s.T) }
	for _, tc := range []struct {
		name  string
		other func(release <-chan struct{}) *listPart
		idle  time.Duration
	}{
		{"nothing read yet", func(r <-chan struct{}) *listPart {
			return &listPart{name: "slow", batches: [][]int64{{0}}, hold: 0, release: r}
		}, 0},
		{"idle after an item", func(r <-chan struct{}) *listPart {
			return &listPart{name: "slow", batches: [][]int64{{0}, {n * 10}}, hold: 1, release: r}
		}, 20 * time.Millisecond},
		{"ended", func(<-chan struct{}) *listPart {
			return &listPart{name: "slow", batches: [][]int64{{0}, {10}}}
		}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			release := make(chan struct{})
			var once sync.Once
			alignRun(t, n, tc.other(release), dataflow.EventClock(ts, 0).WithMaxDrift(50*time.Millisecond).WithIdleTimeout(tc.idle), false,
				func(at int64) {
					if at == (n-1)*10 {
						once.Do(func() { close(release) })
					}
				}, nil)
		})
	}
}

// alignLog is a slog handler that keeps the records and closes release at the first record
// whose message starts with "watermark alignment".
type alignLog struct {
	mu      *sync.Mutex
	records *[]slog.Record
	once    *sync.Once
	release chan struct{}
}

func (h alignLog) Enabled(context.Context, slog.Level) bool { return true }
func (h alignLog) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h alignLog) WithGroup(string) slog.Handler            { return h }
func (h alignLog) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	*h.records = append(*h.records, r.Clone())
	h.mu.Unlock()
	if strings.HasPrefix(r.Message, "watermark alignment") {
		h.once.Do(func() { close(h.release) })
	}
	return nil
}

// A partition that has read an item and then sends nothing, without ending and without an
// idle timeout, holds the faster worker back for as long as it waits: the held worker says so
// (once the wait is long, here 100 ms), naming the step and the worker it waits for. The
// partition here goes on only once that has been logged, so the run ends only if it was.
func TestMaxDriftSaysWhomItWaitsFor(t *testing.T) {
	defer dataflow.SetAlignWarnAfter(100 * time.Millisecond)()
	var mu sync.Mutex
	var records []slog.Record
	h := alignLog{mu: &mu, records: &records, once: &sync.Once{}, release: make(chan struct{})}
	other := &listPart{name: "slow", batches: [][]int64{{0}, {10}}, hold: 1, release: h.release}
	ts := func(s stamp) time.Time { return time.UnixMilli(s.T) }
	alignRun(t, 300, other, dataflow.EventClock(ts, 0).WithMaxDrift(50*time.Millisecond), true, nil, slog.New(h))
	mu.Lock()
	defer mu.Unlock()
	for _, r := range records {
		if !strings.HasPrefix(r.Message, "watermark alignment") {
			continue
		}
		attrs := map[string]string{}
		r.Attrs(func(a slog.Attr) bool { attrs[a.Key] = a.Value.String(); return true })
		if attrs["step"] != "time" || attrs["worker"] != "0" || attrs["waiting_for_worker"] != "1" {
			t.Fatalf("the warning names step %q, worker %q waiting for worker %q; want time, 0 and 1 (%v)", attrs["step"], attrs["worker"], attrs["waiting_for_worker"], attrs)
		}
		return
	}
	t.Fatal("no warning logged")
}

// discardOutput ends a stream in a sink that keeps nothing.
func discardOutput[T any](name string, s dataflow.Stream[T]) {
	dataflow.Output(name, s, dataflow.ToDynamic[T](&discard[T]{}))
}

// Alignment holds back a step's own sources only, and a source may feed one aligned step: so
// two aligned steps over two sources, worker 0 ahead in one and worker 1 in the other, do not
// hold each other's workers back (when the gate held a whole worker, this run never ended).
func TestMaxDriftHoldsOnlyTheStepsSources(t *testing.T) {
	const n = 300
	ts := func(s stamp) time.Time { return time.UnixMilli(s.T) }
	fastPart := func(name string, release <-chan struct{}) *listPart {
		p := &listPart{name: name, release: release}
		for i := range n {
			p.batches = append(p.batches, []int64{int64(i) * 10})
		}
		return p
	}
	relX, relY := make(chan struct{}), make(chan struct{})
	var onceX, onceY sync.Once
	s1 := scriptedSource{names: []string{"a1", "b1"}, parts: map[string]dataflow.StatefulSource[stamp, int]{
		"a1": fastPart("a1", relX), "b1": &pacedPart{name: "b1", n: n}}}
	s2 := scriptedSource{names: []string{"a2", "b2"}, parts: map[string]dataflow.StatefulSource[stamp, int]{
		"a2": &pacedPart{name: "a2", n: n}, "b2": fastPart("b2", relY)}}
	f := dataflow.New("cross")
	in1 := dataflow.Input(f, "in1", dataflow.FromPartitioned[stamp, int](s1))
	in2 := dataflow.Input(f, "in2", dataflow.FromPartitioned[stamp, int](s2))
	var seen sync.Map
	step := func(name string, in dataflow.Stream[stamp], slow string, release func()) {
		var count atomic.Int64
		seen.Store(name, &count)
		keyed := keyByPartAs(name+".key", in)
		discardOutput(name+".out", dataflow.StatefulTime(name, keyed, dataflow.EventClock(ts, 0).WithMaxDrift(50*time.Millisecond),
			dataflow.TimedLogic[stamp, bool, string]{OnItem: func(_ string, _ *bool, _ bool, s stamp, _, _ time.Time, _ *dataflow.Emitter[string]) (bool, error) {
				count.Add(1)
				if s.Part == slow {
					release()
				}
				return false, nil
			}}))
	}
	step("x", in1, "b1", func() { onceX.Do(func() { close(relX) }) })
	step("y", in2, "a2", func() { onceY.Do(func() { close(relY) }) })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := dataflow.Run(ctx, f, dataflow.Options{Workers: 2, EpochInterval: 20 * time.Millisecond}); err != nil {
		t.Fatalf("Run: %v", err)
	}
	for _, name := range []string{"x", "y"} {
		c, _ := seen.Load(name)
		if got := c.(*atomic.Int64).Load(); got != 2*n {
			t.Errorf("step %s saw %d items, want %d", name, got, 2*n)
		}
	}
}

// A flow that alignment cannot serve is refused with an error naming the step: a step fed
// through an exchange (its items come from other workers' sources, which its worker cannot hold
// back: it could wait for ever), and a second aligned step over the same source (two gates
// could each hold back what the other waits for).
func TestMaxDriftRefusesWhatItCannotServe(t *testing.T) {
	ts := func(s stamp) time.Time { return time.UnixMilli(s.T) }
	clock := dataflow.EventClock(ts, 0).WithMaxDrift(time.Second)
	newSource := func() scriptedSource {
		return scriptedSource{names: []string{"p"}, parts: map[string]dataflow.StatefulSource[stamp, int]{
			"p": &listPart{name: "p", batches: [][]int64{{0}}}}}
	}
	logic := dataflow.TimedLogic[stamp, bool, string]{OnItem: func(string, *bool, bool, stamp, time.Time, time.Time, *dataflow.Emitter[string]) (bool, error) {
		return false, nil
	}}
	for _, tc := range []struct {
		name, want string
		build      func(f *dataflow.Flow)
	}{
		{"after an exchange", `time.clock"`, func(f *dataflow.Flow) {
			keyed := keyByPart(dataflow.Input(f, "in", dataflow.FromPartitioned[stamp, int](newSource())))
			passed := dataflow.Stateful("pass", keyed, dataflow.StatefulLogic[stamp, bool, stamp]{
				OnItem: func(_ string, _ *bool, _ bool, s stamp, out *dataflow.Emitter[stamp]) (bool, error) {
					out.Emit(s)
					return false, nil
				}})
			discardOutput("out", dataflow.StatefulTime("time", passed, clock, logic))
		}},
		{"two steps over one source", `already feeds another step`, func(f *dataflow.Flow) {
			keyed := keyByPart(dataflow.Input(f, "in", dataflow.FromPartitioned[stamp, int](newSource())))
			discardOutput("out1", dataflow.StatefulTime("time1", keyed, clock, logic))
			discardOutput("out2", dataflow.StatefulTime("time2", keyed, clock, logic))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := dataflow.New("refused")
			tc.build(f)
			err := dataflow.Run(context.Background(), f, dataflow.Options{Workers: 2, EpochInterval: 20 * time.Millisecond})
			if err == nil || !strings.Contains(err.Error(), "watermark alignment") || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Run: %v; want an error about watermark alignment with %s", err, tc.want)
			}
		})
	}
}

// A partition held back by alignment is not idle for another event-time step that reads the
// same source: step "x" (aligned, 50 ms) holds worker 0's fast partition back for about 20 ms
// at a time (the slow one reads an item per 20 ms), longer than step "y"'s idle timeout
// (10 ms). Step "y" reads the same items with another time, by which worker 0 is 10 s behind;
// were its partition taken for idle while held back, y's watermark would jump to worker 1's,
// and worker 0's next items would be late. None is.
func TestHeldPartitionsAreNotIdle(t *testing.T) {
	const n = 60
	fast := &listPart{name: "fast"}
	for i := range n {
		fast.batches = append(fast.batches, []int64{int64(i) * 10})
	}
	src := scriptedSource{names: []string{"fast", "slow"},
		parts: map[string]dataflow.StatefulSource[stamp, int]{"fast": fast, "slow": &pacedPart{name: "slow", n: n / 3, every: 20 * time.Millisecond}}}
	f := dataflow.New("held")
	keyed := keyByPart(dataflow.Input(f, "in", dataflow.FromPartitioned[stamp, int](src)))
	discardOutput("x.out", dataflow.StatefulTime("x", keyed, dataflow.EventClock(func(s stamp) time.Time { return time.UnixMilli(s.T) }, 0).WithMaxDrift(50*time.Millisecond),
		dataflow.TimedLogic[stamp, bool, string]{OnItem: func(string, *bool, bool, stamp, time.Time, time.Time, *dataflow.Emitter[string]) (bool, error) {
			return false, nil
		}}))
	// y's time: the fast partition's items a tenth of x's, the slow one's 10 s ahead (so that
	// the slow one's own idle spells make nothing late).
	yTime := func(s stamp) time.Time {
		if s.Part == "fast" {
			return time.UnixMilli(s.T / 10)
		}
		return time.UnixMilli(10_000 + s.T)
	}
	var late, seen atomic.Int64
	discardOutput("y.out", dataflow.StatefulTime("y", keyed, dataflow.EventClock(yTime, 0).WithIdleTimeout(10*time.Millisecond),
		dataflow.TimedLogic[stamp, bool, string]{OnItem: func(_ string, _ *bool, _ bool, s stamp, at, wm time.Time, _ *dataflow.Emitter[string]) (bool, error) {
			seen.Add(1)
			if at.Before(wm) {
				late.Add(1)
			}
			return false, nil
		}}))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := dataflow.Run(ctx, f, dataflow.Options{Workers: 2, EpochInterval: 20 * time.Millisecond}); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if seen.Load() != n+n/3 || late.Load() != 0 {
		t.Fatalf("step y saw %d items, %d of them late; want %d, none late", seen.Load(), late.Load(), n+n/3)
	}
}
