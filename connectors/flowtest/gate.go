package flowtest

import (
	"context"
	"sync"

	"github.com/epochflow/epochflow/dataflow"
)

// GateSink is a dynamic sink that counts the items it is written and, until Open is called,
// blocks every Write: the epoch whose items it holds cannot finish, so nothing of it is
// committed. Tests of what a source does while a backlog waits (its lag, what it acknowledges)
// hold the flow with it.
type GateSink[T any] struct {
	open chan struct{}
	once sync.Once
	mu   sync.Mutex
	n    int
}

// NewGateSink returns a closed gate.
func NewGateSink[T any]() *GateSink[T] { return &GateSink[T]{open: make(chan struct{})} }

// Output returns the sink for dataflow.Output or operators.Output.
func (g *GateSink[T]) Output() dataflow.Sink[T] { return dataflow.ToDynamic[T](g) }

// Open lets every waiting and later Write through. It is idempotent.
func (g *GateSink[T]) Open() { g.once.Do(func() { close(g.open) }) }

// Count returns how many items Write was given, also those still held.
func (g *GateSink[T]) Count() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.n
}

// Build implements dataflow.DynamicSink: every worker writes to the same gate.
func (g *GateSink[T]) Build(context.Context, dataflow.Worker) (dataflow.WorkerSink[T], error) {
	return g, nil
}

// Write counts the batch, then waits for Open (or the end of the run).
func (g *GateSink[T]) Write(ctx context.Context, b []T) error {
	g.mu.Lock()
	g.n += len(b)
	g.mu.Unlock()
	select {
	case <-g.open:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Close does nothing.
func (g *GateSink[T]) Close() error { return nil }
