package dataflow_test

import (
	"context"
	"errors"
	"io"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/epochflow/epochflow/dataflow"
)

// pushPart is a source partition that data is pushed into from another goroutine, as a
// broker connector's background receiver does: push appends and signals through Wait.
type pushPart struct {
	mu    sync.Mutex
	queue []time.Time
	ended bool
	ready chan struct{}
}

func newPushPart() *pushPart { return &pushPart{ready: make(chan struct{}, 1)} }

func (p *pushPart) push(t time.Time) {
	p.mu.Lock()
	p.queue = append(p.queue, t)
	p.mu.Unlock()
	select {
	case p.ready <- struct{}{}:
	default:
	}
}

func (p *pushPart) Next(context.Context) ([]time.Time, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.queue) > 0 {
		b := p.queue
		p.queue = nil
		return b, nil
	}
	if p.ended {
		return nil, io.EOF
	}
	return nil, nil
}

func (p *pushPart) Wait() <-chan struct{} { return p.ready }
func (p *pushPart) Close() error          { return nil }

type endedSource struct{}

func (endedSource) Next(context.Context) ([]time.Time, error) { return nil, io.EOF }
func (endedSource) Close() error                              { return nil }

func cpuTime(t *testing.T) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		t.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// latencySink records, for every item (its send time), how long it took to arrive.
type latencySink struct {
	mu  sync.Mutex
	got []time.Duration
	c   chan struct{}
}

func (s *latencySink) Build(context.Context, dataflow.Worker) (dataflow.WorkerSink[time.Time], error) {
	return s, nil
}
func (s *latencySink) Write(_ context.Context, b []time.Time) error {
	now := time.Now()
	s.mu.Lock()
	for _, t := range b {
		s.got = append(s.got, now.Sub(t))
	}
	s.mu.Unlock()
	for range b {
		s.c <- struct{}{}
	}
	return nil
}
func (s *latencySink) Close() error { return nil }

// An idle flow parks its workers: ten seconds without data cost almost no CPU, and an item
// that then arrives at the parked source reaches the sink within milliseconds.
func TestIdleFlowBurnsNothingAndWakesFast(t *testing.T) {
	p := newPushPart()
	wrapped := dynamicFunc[time.Time](func(_ context.Context, w dataflow.Worker) (dataflow.WorkerSource[time.Time], error) {
		if w.Index == 0 {
			return p, nil
		}
		return endedSource{}, nil
	})
	sink := &latencySink{c: make(chan struct{}, 100)}
	f := dataflow.New("idle")
	in := dataflow.Input(f, "in", dataflow.FromDynamic[time.Time](wrapped))
	moved := dataflow.Redistribute("spread", in)
	dataflow.Output("out", moved, dataflow.ToDynamic[time.Time](sink))

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- dataflow.Run(ctx, f, dataflow.Options{Workers: 2, EpochInterval: time.Second})
	}()
	time.Sleep(200 * time.Millisecond) // let it start
	before := cpuTime(t)
	time.Sleep(10 * time.Second)
	used := cpuTime(t) - before
	t.Logf("CPU used by an idle flow in 10 s: %v", used)
	if used > 100*time.Millisecond {
		t.Errorf("idle flow used %v of CPU in 10 s, want < 100ms", used)
	}

	for range 20 {
		time.Sleep(20 * time.Millisecond) // the worker parks again
		p.push(time.Now())
		select {
		case <-sink.c:
		case <-time.After(5 * time.Second):
			t.Fatal("item never reached the sink")
		}
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Run: %v", err)
	}
	sink.mu.Lock()
	lat := slices.Clone(sink.got)
	sink.mu.Unlock()
	slices.Sort(lat)
	t.Logf("wake-up latency: min %v, median %v, max %v", lat[0], lat[len(lat)/2], lat[len(lat)-1])
	// Typically well under a millisecond; the bound leaves room for a loaded machine and still
	// fails a source that is polled (at the 1 s epoch interval) instead of woken.
	if lat[len(lat)/2] > 50*time.Millisecond {
		t.Errorf("median latency from a parked source to the sink is %v, want < 50ms", lat[len(lat)/2])
	}
}

type dynamicFunc[T any] func(context.Context, dataflow.Worker) (dataflow.WorkerSource[T], error)

func (f dynamicFunc[T]) Build(ctx context.Context, w dataflow.Worker) (dataflow.WorkerSource[T], error) {
	return f(ctx, w)
}
