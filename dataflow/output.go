package dataflow

import (
	"context"
	"errors"
	"fmt"

	"github.com/epochflow/epochflow/dataflow/internal/engine"
)

// Output adds a step that writes every item of s to sink.
//
// Epochs: at the end of every epoch each partition's Snapshot (its pre-commit) is called; once
// the epoch is committed, Commit. EOF: nothing more is written; partitions are closed when the
// run ends.
func Output[T any](name string, s Stream[T], sink Sink[T]) {
	if !s.valid() {
		return
	}
	if sink.build == nil {
		s.flow.fail(fmt.Errorf("step %q: the sink is a zero dataflow.Sink; build one with ToPartitioned or ToDynamic", name))
		return
	}
	in := s.edge()
	if sink.route != nil {
		route := sink.route
		pool := newBatchPool[T](exchangeBatch)
		in.NewRouter = func(self, total int, shared any) engine.Router {
			pick := route(shared)
			return newRouter(total, pool, func(item T) (int, error) { return pick(item, total) })
		}
		in.Codec = itemBatchCodec[T]()
	}
	s.flow.add(name, &engine.Step{Kind: "sink", Inputs: []engine.Edge{in}, Outputs: 0, Setup: sink.setup, New: sink.build})
}

// ToPartitioned turns a PartitionedSink into a Sink for Output.
func ToPartitioned[T, S any](sink PartitionedSink[T, S]) Sink[T] {
	if sink == nil {
		return Sink[T]{}
	}
	return Sink[T]{
		setup: func(ctx context.Context, workers int) (any, error) {
			return listParts(withWorkerCount(ctx, workers), sink.Parts)
		},
		route: func(shared any) func(T, int) (int, error) {
			n := len(shared.([]string))
			return func(item T, total int) (int, error) {
				i := sink.PartFor(item, n)
				if i < 0 || i >= n {
					return 0, fmt.Errorf("PartFor returned partition %d for item %s, want 0..%d", i, FormatItem(item), n-1)
				}
				return i % total, nil
			}
		},
		build: func(env *engine.Env, shared any) (engine.Node, error) {
			parts := shared.([]string)
			if len(parts) == 0 {
				return nil, errors.New("the sink has no partitions")
			}
			resume, dropped, err := restoredParts[S](env, parts, isConsumers(sink))
			if err != nil {
				return nil, err
			}
			n := &partSinkNode[T, S]{env: env, sink: sink, nparts: len(parts), codec: DefaultCodec[S](), dropped: dropped}
			for i, key := range parts {
				if i%env.Workers != env.Worker {
					continue
				}
				p, err := sink.Build(env.Ctx, key, resume[key])
				if err != nil {
					n.Close()
					return nil, fmt.Errorf("partition %q: %w", key, err)
				}
				if p == nil {
					n.Close()
					return nil, fmt.Errorf("partition %q: Build returned a nil partition", key)
				}
				part := &sinkPart[T, S]{key: key, index: i, sink: p}
				if r := resume[key]; r != nil {
					part.snaps = []snap[S]{{epoch: env.StartEpoch - 1, state: *r}}
				}
				n.parts = append(n.parts, part)
			}
			return n, nil
		},
	}
}

// ToDynamic turns a DynamicSink into a Sink for Output: each worker writes its own items.
func ToDynamic[T any](sink DynamicSink[T]) Sink[T] {
	if sink == nil {
		return Sink[T]{}
	}
	return Sink[T]{
		build: func(env *engine.Env, _ any) (engine.Node, error) {
			s, err := sink.Build(env.Ctx, Worker{Index: env.Worker, Count: env.Workers})
			if err != nil {
				return nil, err
			}
			if s == nil {
				return nil, errors.New("the sink's Build returned a nil WorkerSink")
			}
			return &dynSinkNode[T]{env: env, sink: s}, nil
		},
	}
}

type sinkPart[T, S any] struct {
	key   string
	index int
	sink  StatefulSink[T, S]
	snaps []snap[S]
	buf   []T
}

type partSinkNode[T, S any] struct {
	env     *engine.Env
	dropped []string
	codec   Codec[S]
	sink    PartitionedSink[T, S]
	nparts  int
	parts   []*sinkPart[T, S]
}

func (n *partSinkNode[T, S]) OnBatch(_ int, _ uint64, batch any) error {
	items := batch.([]T)
	if len(n.parts) == 1 {
		p := n.parts[0]
		if err := p.sink.Write(n.env.Ctx, items); err != nil {
			return fmt.Errorf("partition %q: %w", p.key, err)
		}
		return nil
	}
	for _, item := range items {
		i := n.sink.PartFor(item, n.nparts)
		var dst *sinkPart[T, S]
		for _, p := range n.parts {
			if p.index == i {
				dst = p
			}
		}
		if dst == nil {
			return fmt.Errorf("item %s routed to a worker that does not own partition %d", FormatItem(item), i)
		}
		dst.buf = append(dst.buf, item)
	}
	for _, p := range n.parts {
		if len(p.buf) == 0 {
			continue
		}
		err := p.sink.Write(n.env.Ctx, p.buf)
		p.buf = p.buf[:0]
		if err != nil {
			return fmt.Errorf("partition %q: %w", p.key, err)
		}
	}
	return nil
}

func (n *partSinkNode[T, S]) OnEOF(uint64) error { return nil }

// ConsumesBatches tells the engine that sinks keep no batch (their contract says so).
func (n *partSinkNode[T, S]) ConsumesBatches() {}

func (n *partSinkNode[T, S]) OnClose(epoch uint64) error {
	dropParts(n.env, epoch, &n.dropped)
	for _, p := range n.parts {
		s, err := p.sink.Snapshot()
		if err != nil {
			return fmt.Errorf("partition %q: snapshot: %w", p.key, err)
		}
		p.snaps = append(p.snaps, snap[S]{epoch, s})
		if err := savePart(n.env, n.codec, epoch, p.key, s); err != nil {
			return err
		}
	}
	return nil
}

func (n *partSinkNode[T, S]) Commit(ctx context.Context, epoch uint64) error {
	for _, p := range n.parts {
		if err := commitUpTo(ctx, &p.snaps, epoch, p.sink.Commit); err != nil {
			return fmt.Errorf("partition %q: commit: %w", p.key, err)
		}
	}
	return nil
}

func (n *partSinkNode[T, S]) Close() error {
	var errs []error
	for _, p := range n.parts {
		if err := p.sink.Close(); err != nil {
			errs = append(errs, fmt.Errorf("partition %q: close: %w", p.key, err))
		}
	}
	return errors.Join(errs...)
}

type dynSinkNode[T any] struct {
	env  *engine.Env
	sink WorkerSink[T]
}

func (n *dynSinkNode[T]) OnBatch(_ int, _ uint64, batch any) error {
	return n.sink.Write(n.env.Ctx, batch.([]T))
}
func (n *dynSinkNode[T]) OnEOF(uint64) error   { return nil }
func (n *dynSinkNode[T]) ConsumesBatches()     {}
func (n *dynSinkNode[T]) OnClose(uint64) error { return nil }
func (n *dynSinkNode[T]) Close() error         { return n.sink.Close() }
