package flowtest

import (
	"context"
	"fmt"
	"slices"
	"sync"

	"github.com/epochflow/epochflow/dataflow"
)

// TwoPhaseSink is a transactional sink, as a database with prepared transactions is: what is
// written goes into an open transaction, Snapshot prepares it, and Commit makes prepared
// transactions visible. On resume, prepared transactions of committed snapshots are committed
// and the rest rolled back. A TwoPhaseSink outlives runs of a flow, so a test can crash a run
// and check that, in the end, every item is visible exactly once.
type TwoPhaseSink[T any] struct {
	mu       sync.Mutex
	key      func(T) string
	seen     map[string]bool
	visible  []T
	prepared map[uint64][]T
	open     []T
	seq      uint64
	// OnCommit, if set, is called with the items a Commit just made visible.
	OnCommit func([]T)
}

// NewTwoPhaseSink returns an empty sink. With a key function it is idempotent, as a table with
// a primary key written with upserts is: an item whose key is already visible is not added
// again. That is how an exactly-once sink stays exact behind an at-least-once source (a queue
// redelivers a message whose epoch committed but whose ack a crash lost). Without one (nil)
// every committed item is added.
func NewTwoPhaseSink[T any](key func(T) string) *TwoPhaseSink[T] {
	return &TwoPhaseSink[T]{key: key, seen: map[string]bool{}, prepared: map[uint64][]T{}}
}

// Output returns the sink for dataflow.Output or operators.Output: one partition.
func (s *TwoPhaseSink[T]) Output() dataflow.Sink[T] { return dataflow.ToPartitioned[T, uint64](s) }

// Visible returns the items of committed transactions, in commit order.
func (s *TwoPhaseSink[T]) Visible() []T {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]T(nil), s.visible...)
}

// Durable tells whether item is visible, or prepared in a transaction numbered at most upTo
// (the sink's transactions are numbered by its snapshots, which on one partition are the
// epochs: so a test passes the committed epoch).
func (s *TwoPhaseSink[T]) Durable(match func(T) bool, upTo uint64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if slices.ContainsFunc(s.visible, match) {
		return true
	}
	for seq, items := range s.prepared {
		if seq <= upTo && slices.ContainsFunc(items, match) {
			return true
		}
	}
	return false
}

// Prepared returns how many prepared transactions wait for Commit.
func (s *TwoPhaseSink[T]) Prepared() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.prepared)
}

// Parts implements dataflow.PartitionedSink.
func (s *TwoPhaseSink[T]) Parts(context.Context) ([]string, error) { return []string{"tx"}, nil }

// PartFor implements dataflow.PartitionedSink.
func (s *TwoPhaseSink[T]) PartFor(T, int) int { return 0 }

// Build implements dataflow.PartitionedSink: it finishes what a crashed run left, committing
// the prepared transactions up to resume and rolling back the others and the open one.
func (s *TwoPhaseSink[T]) Build(_ context.Context, _ string, resume *uint64) (dataflow.StatefulSink[T, uint64], error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var upTo uint64
	if resume != nil {
		upTo = *resume
	}
	s.commitLocked(upTo)
	clear(s.prepared) // later than the resume point: rolled back
	s.open = nil
	s.seq = upTo
	return (*twoPhasePart[T])(s), nil
}

func (s *TwoPhaseSink[T]) commitLocked(upTo uint64) []T {
	var seqs []uint64
	for seq := range s.prepared {
		if seq <= upTo {
			seqs = append(seqs, seq)
		}
	}
	slices.Sort(seqs)
	var done []T
	for _, seq := range seqs {
		for _, item := range s.prepared[seq] {
			if s.key != nil {
				k := s.key(item)
				if s.seen[k] {
					continue
				}
				s.seen[k] = true
			}
			done = append(done, item)
		}
		delete(s.prepared, seq)
	}
	s.visible = append(s.visible, done...)
	return done
}

type twoPhasePart[T any] TwoPhaseSink[T]

func (p *twoPhasePart[T]) Write(_ context.Context, batch []T) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.open = append(p.open, batch...)
	return nil
}

func (p *twoPhasePart[T]) Snapshot() (uint64, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.seq++
	p.prepared[p.seq] = p.open
	p.open = nil
	return p.seq, nil
}

func (p *twoPhasePart[T]) Commit(_ context.Context, seq uint64) error {
	p.mu.Lock()
	if seq > p.seq {
		p.mu.Unlock()
		return fmt.Errorf("flowtest two-phase sink: commit of transaction %d, but only %d were prepared", seq, p.seq)
	}
	done := (*TwoPhaseSink[T])(p).commitLocked(seq)
	onCommit := p.OnCommit
	p.mu.Unlock()
	if onCommit != nil && len(done) > 0 {
		onCommit(done)
	}
	return nil
}

func (p *twoPhasePart[T]) Close() error { return nil }
