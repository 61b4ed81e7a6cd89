package flowtest

import (
	"context"
	"sync"

	"github.com/epochflow/epochflow/dataflow"
)

// Sink collects every item written to it. It is a partitioned sink with one partition, so all
// items are written on one worker, in the order that worker received them; it records the epoch
// each item was written in (the number of epoch ends seen before it, plus one) and which epochs
// were committed.
type Sink[T any] struct {
	mu        sync.Mutex
	items     []T
	epochs    []uint64
	epoch     uint64
	committed uint64
	closed    int
}

// NewSink returns an empty sink.
func NewSink[T any]() *Sink[T] { return &Sink[T]{epoch: 1} }

// Output returns the sink for dataflow.Output or operators.Output.
func (s *Sink[T]) Output() dataflow.Sink[T] { return dataflow.ToPartitioned[T, uint64](s) }

// Items returns a copy of the items written so far, in order.
func (s *Sink[T]) Items() []T {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]T(nil), s.items...)
}

// ByEpoch returns the items written so far grouped by the epoch they were written in.
func (s *Sink[T]) ByEpoch() map[uint64][]T {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[uint64][]T{}
	for i, it := range s.items {
		out[s.epochs[i]] = append(out[s.epochs[i]], it)
	}
	return out
}

// Committed returns the newest epoch whose Commit the sink has seen (0 for none).
func (s *Sink[T]) Committed() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.committed
}

// Closed tells how many times the sink's partition was closed.
func (s *Sink[T]) Closed() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

// Parts implements dataflow.PartitionedSink.
func (s *Sink[T]) Parts(context.Context) ([]string, error) { return []string{"sink"}, nil }

// PartFor implements dataflow.PartitionedSink: every item goes to the one partition.
func (s *Sink[T]) PartFor(T, int) int { return 0 }

// Build implements dataflow.PartitionedSink. The state is the last epoch ended.
func (s *Sink[T]) Build(_ context.Context, _ string, resume *uint64) (dataflow.StatefulSink[T, uint64], error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if resume != nil {
		s.epoch = *resume + 1
	}
	return (*sinkPart[T])(s), nil
}

type sinkPart[T any] Sink[T]

func (p *sinkPart[T]) Write(_ context.Context, batch []T) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.items = append(p.items, batch...)
	for range batch {
		p.epochs = append(p.epochs, p.epoch)
	}
	return nil
}

func (p *sinkPart[T]) Snapshot() (uint64, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	e := p.epoch
	p.epoch++
	return e, nil
}

func (p *sinkPart[T]) Commit(_ context.Context, epoch uint64) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.committed = max(p.committed, epoch)
	return nil
}

func (p *sinkPart[T]) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed++
	return nil
}
