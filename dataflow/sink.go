package dataflow

import (
	"context"

	"github.com/epochflow/epochflow/dataflow/internal/engine"
)

// PartitionedSink is a sink made of named partitions, each with its own state S: a file, a
// table shard, a topic partition. Every partition lives on exactly one worker, and every item
// is routed to the worker of the partition PartFor picks.
type PartitionedSink[T, S any] interface {
	// Parts returns the keys of all partitions, in a deterministic order. Partition i is owned
	// by worker i % workers.
	Parts(ctx context.Context) ([]string, error)
	// PartFor returns the index (0 .. parts-1) of the partition item goes to.
	PartFor(item T, parts int) int
	// Build opens one partition, resuming from resume when it is not nil.
	Build(ctx context.Context, part string, resume *S) (StatefulSink[T, S], error)
}

// StatefulSink is one open partition of a PartitionedSink. The engine calls its methods from the
// partition's worker only, never concurrently. Commit follows the contract described on
// StatefulSource.
type StatefulSink[T, S any] interface {
	// Write writes a batch. The batch belongs to the engine: copy what you keep.
	Write(ctx context.Context, batch []T) error
	// Snapshot is the pre-commit, called at the end of every epoch: when it returns nil,
	// everything written so far must be durable or prepared, and the state it returns must be
	// enough to resume (or to finish a prepared write) after a crash. An error (a failed flush
	// or PREPARE) stops the flow: the epoch is never committed.
	Snapshot() (S, error)
	// Commit tells the partition that the epoch of state is committed: make its writes final
	// (visible) if they are not yet.
	Commit(ctx context.Context, state S) error
	// Close releases the partition. It is called once, at the end of the run, also after a
	// failure.
	Close() error
}

// DynamicSink is a sink without partitions or state: every worker writes its own items.
type DynamicSink[T any] interface {
	// Build opens the sink on one worker.
	Build(ctx context.Context, w Worker) (WorkerSink[T], error)
}

// WorkerSink is a DynamicSink opened on one worker. Write must return only once the batch is
// written (or safely handed to the system it writes to): an epoch counts as finished when every
// Write of it has returned.
type WorkerSink[T any] interface {
	Write(ctx context.Context, batch []T) error
	Close() error
}

// Sink is what Output writes to. Make one with ToPartitioned or ToDynamic; connectors return one
// ready made. The zero Sink is invalid.
type Sink[T any] struct {
	setup func(ctx context.Context, workers int) (any, error)
	// route, when set, returns the worker an item must be written on.
	route func(shared any) func(item T, total int) (int, error)
	build func(env *engine.Env, shared any) (engine.Node, error)
}
