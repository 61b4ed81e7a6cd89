package dataflow

import (
	"context"
	"log/slog"
	"time"

	"github.com/epochflow/epochflow/dataflow/internal/engine"
)

type workersKey struct{}

// WorkerCount returns the total number of workers of the run, from the context the engine
// passes to Parts of a PartitionedSource or PartitionedSink (0 from any other context). A
// connector whose partitions are consumers rather than data (a queue read by one consumer per
// worker) lists that many.
func WorkerCount(ctx context.Context) int {
	n, _ := ctx.Value(workersKey{}).(int)
	return n
}

func withWorkerCount(ctx context.Context, n int) context.Context {
	return context.WithValue(ctx, workersKey{}, n)
}

type epochIntervalKey struct{}

// EpochInterval returns the run's epoch interval from the context the engine passes to a
// connector (Parts, Build, Next, Write, Commit), or 0 from any other context. A connector
// whose system bounds how long an epoch may stay open (a transaction timeout) checks it at
// start.
func EpochInterval(ctx context.Context) time.Duration {
	d, _ := ctx.Value(epochIntervalKey{}).(time.Duration)
	return d
}

type loggerKey struct{}

// Logger returns the run's logger from the context the engine passes to a connector (Parts,
// Build, Next, Write, Commit), or slog.Default() from any other context. Connectors log
// through it, so that the program's -log-level applies to them.
func Logger(ctx context.Context) *slog.Logger {
	if l, ok := ctx.Value(loggerKey{}).(*slog.Logger); ok {
		return l
	}
	return slog.Default()
}

// PartitionedSource is a source made of named partitions, each with its own resume state S: a
// file, a queue consumer, a replication slot. Every partition lives on exactly one worker.
//
// Parts is called once per run, before any worker starts. Build is called on the worker that
// owns the partition, with the state the partition's Snapshot returned at the end of the last
// committed epoch, or nil on a fresh start.
type PartitionedSource[T, S any] interface {
	// Parts returns the keys of all partitions, in a deterministic order. Partition i is owned
	// by worker i % workers.
	Parts(ctx context.Context) ([]string, error)
	// Build opens one partition, resuming after resume when it is not nil.
	Build(ctx context.Context, part string, resume *S) (StatefulSource[T, S], error)
}

// StatefulSource is one open partition of a PartitionedSource. The engine calls its methods from
// the partition's worker only, never concurrently.
//
// The commit contract, which a connector author can rely on:
//  1. Commit(ctx, s) is called only after the epoch whose end produced s (by Snapshot) is
//     committed cluster-wide: everything the flow did with the items read up to that point is
//     durable and written by every sink.
//  2. It is subsuming: a Commit for epoch e covers every earlier epoch; calls for some epochs may
//     be skipped.
//  3. It may repeat: after a resume, Commit(resumeState) is called once before the first Next,
//     since a commit may have been lost in a crash. It must be idempotent.
//  4. It runs on the partition's worker and must return quickly: network I/O belongs on the
//     connector's own goroutine, and its failures are retried and reported (a later Next or
//     Commit returns the error), never dropped.
type StatefulSource[T, S any] interface {
	// Next returns the items available now. It never blocks long: with nothing to read it
	// returns an empty batch, and the engine asks again when Waiter or Awaker says so (or after
	// a short back-off if the source implements neither). It returns io.EOF when the partition
	// has ended; a batch returned together with io.EOF is still processed.
	Next(ctx context.Context) ([]T, error)
	// Snapshot returns the state to resume from after everything Next has returned so far. It
	// is called at the end of every epoch. Keep it small: a position, not the items in flight.
	Snapshot() S
	// Commit tells the partition that the epoch of state is committed (see the contract above).
	Commit(ctx context.Context, state S) error
	// Close releases the partition. It is called once, at the end of the run, also after a
	// failure.
	Close() error
}

// DynamicSource is a source without partitions or resume state: every worker reads its own
// share (a socket, a generator). Nothing is replayed after a crash.
type DynamicSource[T any] interface {
	// Build opens the source on one worker.
	Build(ctx context.Context, w Worker) (WorkerSource[T], error)
}

// WorkerSource is a DynamicSource opened on one worker. It follows the rules of
// StatefulSource's Next and Close.
type WorkerSource[T any] interface {
	Next(ctx context.Context) ([]T, error)
	Close() error
}

// Waiter is implemented by sources whose data arrives from elsewhere (a broker, a background
// goroutine). After Next returned an empty batch, the worker sleeps until the channel Wait
// returns becomes ready (a send or a close), so an idle flow uses no CPU and data that arrives
// is read at once. A buffered channel of size 1 with non-blocking sends is the usual way.
type Waiter interface {
	Wait() <-chan struct{}
}

// Awaker is implemented by sources that know when to be asked again: after every Next, the
// engine does not call Next again before NextAwake (the zero time means at once).
type Awaker interface {
	NextAwake() time.Time
}

// Worker says which worker a step runs on.
type Worker struct {
	Index int // 0 .. Count-1, across the whole cluster
	Count int // total number of workers
}

// Source is what Input reads. Make one with FromPartitioned or FromDynamic; connectors return
// one ready made. The zero Source is invalid.
type Source[T any] struct {
	setup func(ctx context.Context, workers int) (any, error)
	build func(env *engine.Env, shared any) (engine.Node, error)
}
