package dataflow_test

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/epochflow/epochflow/dataflow"
)

// stamp is an item of the watermark tests: the partition that read it and its event time (ms).
type stamp struct {
	Part string
	T    int64
}

// scriptedSource has named partitions, all read by one worker in a run with one worker.
type scriptedSource struct {
	names []string
	parts map[string]dataflow.StatefulSource[stamp, int]
}

func (s scriptedSource) Parts(context.Context) ([]string, error) { return s.names, nil }

func (s scriptedSource) Build(_ context.Context, part string, _ *int) (dataflow.StatefulSource[stamp, int], error) {
	return s.parts[part], nil
}

// listPart yields its batches one per Next; with release set it waits for it to be closed
// before the batch numbered hold.
type listPart struct {
	name    string
	batches [][]int64
	pos     int
	hold    int
	release <-chan struct{}
}

func (p *listPart) Next(context.Context) ([]stamp, error) {
	if p.pos == len(p.batches) {
		return nil, io.EOF
	}
	if p.release != nil && p.pos == p.hold {
		select {
		case <-p.release:
		default:
			return nil, nil
		}
	}
	var out []stamp
	for _, t := range p.batches[p.pos] {
		out = append(out, stamp{Part: p.name, T: t})
	}
	p.pos++
	return out, nil
}

func (p *listPart) Snapshot() int                     { return p.pos }
func (p *listPart) Commit(context.Context, int) error { return nil }
func (p *listPart) Close() error                      { return nil }

// streamPart yields one item every millisecond, 10 ms of event time apart from from on, until
// stop is closed; then it ends. After n items it calls atN once.
type streamPart struct {
	name string
	next int64
	n    int
	atN  func()
	stop <-chan struct{}
	done int
}

func (p *streamPart) Next(context.Context) ([]stamp, error) {
	select {
	case <-p.stop:
		return nil, io.EOF
	default:
	}
	p.done++
	if p.done == p.n && p.atN != nil {
		p.atN()
	}
	t := p.next
	p.next += 10
	return []stamp{{Part: p.name, T: t}}, nil
}

func (p *streamPart) NextAwake() time.Time              { return time.Now().Add(time.Millisecond) }
func (p *streamPart) Snapshot() int                     { return p.done }
func (p *streamPart) Commit(context.Context, int) error { return nil }
func (p *streamPart) Close() error                      { return nil }

// keyByPart keys the stamps by their partition's name (step "key").
func keyByPart(in dataflow.Stream[stamp]) dataflow.Stream[dataflow.KV[stamp]] {
	return keyByPartAs("key", in)
}

// keyByPartAs is keyByPart in a step of the given name.
func keyByPartAs(name string, in dataflow.Stream[stamp]) dataflow.Stream[dataflow.KV[stamp]] {
	return dataflow.Transform(name, in, func(b []stamp) ([]dataflow.KV[stamp], error) {
		out := make([]dataflow.KV[stamp], len(b))
		for i, s := range b {
			out[i] = dataflow.KV[stamp]{Key: s.Part, Value: s}
		}
		return out, nil
	})
}

// watermarkFlow runs src on one worker through an event-time step keyed by partition, with
// the given idle timeout, and returns what it saw in order: "PART@T late" or "PART@T on time"
// per item, and "wake PART" when the watermark reached wakeAt for a key that asked for it.
// onWake is called at each wake-up.
func watermarkFlow(t *testing.T, src scriptedSource, idle time.Duration, wakeAt int64, onWake func()) []string {
	t.Helper()
	var mu sync.Mutex
	var seen []string
	note := func(s string) {
		mu.Lock()
		seen = append(seen, s)
		mu.Unlock()
	}
	f := dataflow.New("wm")
	in := dataflow.Input(f, "in", dataflow.FromPartitioned[stamp, int](src))
	keyed := keyByPart(in)
	clock := dataflow.EventClock(func(s stamp) time.Time { return time.UnixMilli(s.T) }, 0).WithIdleTimeout(idle)
	out := dataflow.StatefulTime("time", keyed, clock, dataflow.TimedLogic[stamp, bool, string]{
		OnItem: func(_ string, woke *bool, _ bool, s stamp, at, wm time.Time, _ *dataflow.Emitter[string]) (bool, error) {
			if at.Before(wm) {
				note(fmt.Sprintf("%s@%d late", s.Part, s.T))
			} else {
				note(fmt.Sprintf("%s@%d on time", s.Part, s.T))
			}
			return true, nil
		},
		WakeAt: func(_ string, woke *bool) time.Time {
			if *woke {
				return time.Time{}
			}
			return time.UnixMilli(wakeAt)
		},
		OnWatermark: func(key string, woke *bool, _ time.Time, _ *dataflow.Emitter[string]) (bool, error) {
			*woke = true
			note("wake " + key)
			if onWake != nil {
				onWake()
			}
			return true, nil
		},
	})
	dataflow.Output("out", out, dataflow.ToDynamic[dataflow.KV[string]](&discard[dataflow.KV[string]]{}))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := dataflow.Run(ctx, f, dataflow.Options{Workers: 1, EpochInterval: 5 * time.Millisecond}); err != nil {
		t.Fatalf("Run: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	return slices.Clone(seen)
}

// One worker reads two partitions, the first 1000 ms of event time ahead of the second, which
// it reads all at once before the second's first item: the worker's watermark follows the
// slower partition, so none of its items is late (with one watermark per worker, the first
// partition's would make them all late), and the wake-up at 1000 comes only once the slow
// partition has passed it, at its end.
func TestWatermarkFollowsSlowerPartition(t *testing.T) {
	fast := &listPart{name: "fast", batches: [][]int64{{1000, 1030, 1060, 1090}}}
	var slowBatches [][]int64
	for ts := int64(0); ts <= 100; ts += 10 {
		slowBatches = append(slowBatches, []int64{ts})
	}
	slow := &listPart{name: "slow", batches: slowBatches}
	src := scriptedSource{names: []string{"fast", "slow"}, parts: map[string]dataflow.StatefulSource[stamp, int]{"fast": fast, "slow": slow}}
	seen := watermarkFlow(t, src, 0, 1000, nil)
	var want []string
	for _, ts := range []int64{1000, 1030, 1060, 1090} {
		want = append(want, fmt.Sprintf("fast@%d on time", ts))
	}
	for ts := int64(0); ts <= 100; ts += 10 {
		want = append(want, fmt.Sprintf("slow@%d on time", ts))
	}
	want = append(want, "wake fast", "wake slow")
	// The items in the order read, then the wake-ups, in key order.
	if !slices.Equal(seen, want) {
		t.Errorf("seen:\n%q\nwant:\n%q", seen, want)
	}
}

// One worker reads a partition that keeps reading and one that reads an item at 0 and then
// nothing until it is released. Without an idle timeout the quiet partition holds the
// watermark at 0: nothing wakes until it has read its last item (at 5, on time). With one,
// it is left out once idle, the watermark follows the busy partition past 1000 while the quiet
// one still waits (the wake-up releases it), and its item at 5 is then late.
func TestIdlePartitionStopsHoldingTheWatermark(t *testing.T) {
	for _, idle := range []time.Duration{0, 20 * time.Millisecond} {
		t.Run(fmt.Sprint("idle=", idle), func(t *testing.T) {
			release, stop := make(chan struct{}), make(chan struct{})
			var once sync.Once
			free := func() {
				once.Do(func() {
					close(release)
					close(stop)
				})
			}
			quiet := &listPart{name: "quiet", batches: [][]int64{{0}, {5}}, hold: 1, release: release}
			busy := &streamPart{name: "busy", next: 10, stop: stop}
			onWake := free
			if idle == 0 {
				// Nothing can wake while quiet holds the watermark: release it after 200
				// items of the busy partition (to 2000 ms of event time).
				busy.n, busy.atN, onWake = 200, free, nil
			}
			src := scriptedSource{names: []string{"busy", "quiet"}, parts: map[string]dataflow.StatefulSource[stamp, int]{"busy": busy, "quiet": quiet}}
			seen := watermarkFlow(t, src, idle, 1000, onWake)
			at := func(s string) int {
				i := slices.Index(seen, s)
				if i < 0 {
					t.Fatalf("%q not seen in %q", s, seen)
				}
				return i
			}
			for _, s := range seen {
				if s != "quiet@5 late" && strings.HasSuffix(s, " late") {
					t.Errorf("%s: only quiet@5 may be late", s)
				}
			}
			at("quiet@0 on time")
			if idle == 0 {
				if at("quiet@5 on time") > at("wake busy") {
					t.Errorf("the watermark passed 1000 before the quiet partition's last item: %q", seen)
				}
				return
			}
			if at("wake busy") > at("quiet@5 late") {
				t.Errorf("the quiet partition's item came before the wake-up: %q", seen)
			}
		})
	}
}

// An item's stamp reaches only the worker of its key, so a watermark that only a stamp carried
// must still be marked to every worker at the end of its batch. Two workers, one partition:
// key b (on one worker) asks to wake at 50; the next batch holds a@100 then a@90, whose stamp
// carries the watermark 100 to a's worker only, and the batch after waits until b has woken.
// b must wake from that batch's end, not from a later batch (without the mark it would wait
// forever, and a snapshot taken meanwhile would hold two watermarks).
func TestStampedWatermarkIsMarkedToEveryWorker(t *testing.T) {
	keyOn := func(w int) string {
		for i := 0; ; i++ {
			if k := fmt.Sprint("k", i); dataflow.WorkerForKey(k, 2) == w {
				return k
			}
		}
	}
	a, b := keyOn(0), keyOn(1)
	release := make(chan struct{})
	part := &listPart{name: "p", batches: [][]int64{{0}, {100, 90}, {200}}, hold: 2, release: release}
	src := scriptedSource{names: []string{"p"}, parts: map[string]dataflow.StatefulSource[stamp, int]{"p": part}}
	f := dataflow.New("wm")
	in := dataflow.Input(f, "in", dataflow.FromPartitioned[stamp, int](src))
	keyed := dataflow.Transform("key", in, func(batch []stamp) ([]dataflow.KV[stamp], error) {
		out := make([]dataflow.KV[stamp], len(batch))
		for i, s := range batch {
			k := a
			if s.T == 0 {
				k = b
			}
			out[i] = dataflow.KV[stamp]{Key: k, Value: s}
		}
		return out, nil
	})
	clock := dataflow.EventClock(func(s stamp) time.Time { return time.UnixMilli(s.T) }, 0)
	var once sync.Once
	woke := make(chan int64, 4)
	out := dataflow.StatefulTime("time", keyed, clock, dataflow.TimedLogic[stamp, bool, string]{
		OnItem: func(string, *bool, bool, stamp, time.Time, time.Time, *dataflow.Emitter[string]) (bool, error) {
			return true, nil
		},
		WakeAt: func(key string, done *bool) time.Time {
			if key != b || *done {
				return time.Time{}
			}
			return time.UnixMilli(50)
		},
		OnWatermark: func(_ string, done *bool, wm time.Time, _ *dataflow.Emitter[string]) (bool, error) {
			*done = true
			woke <- wm.UnixMilli()
			once.Do(func() { close(release) })
			return true, nil
		},
	})
	dataflow.Output("out", out, dataflow.ToDynamic[dataflow.KV[string]](&discard[dataflow.KV[string]]{}))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := dataflow.Run(ctx, f, dataflow.Options{Workers: 2, EpochInterval: 5 * time.Millisecond}); err != nil {
		t.Fatalf("Run: %v (b never woke while the source held its last batch: the watermark 100 did not reach b's worker)", err)
	}
	if wm := <-woke; wm != 100 {
		t.Errorf("b woke at the watermark %d, want 100 (the end of the second batch)", wm)
	}
}
