package dataflow

import (
	"fmt"

	"github.com/epochflow/epochflow/dataflow/internal/engine"
)

// Transform adds a stateless step that turns every batch of in into a batch of the output. fn
// must not modify its input batch, and hands over the batch it returns (it may return its
// input when Out is In and nothing changes). What it returns is taken to come from the source
// partition of its input batch (an event-time Clock downstream tracks the watermark per
// partition), so fn must not hold items back to return them with a later batch. An error stops
// the flow, naming the step; return errors made with ItemErr (or use ForEach) to name the item
// too.
//
// State: none. Epochs: output items keep the epoch of their input. EOF: the output ends when in
// ends.
func Transform[In, Out any](name string, in Stream[In], fn func(batch []In) ([]Out, error)) Stream[Out] {
	if !in.valid() {
		return Stream[Out]{}
	}
	s := in.flow.add(name, &engine.Step{Kind: "transform", Inputs: []engine.Edge{in.edge()}, Outputs: 1, KeepsOrigin: true,
		New: func(env *engine.Env, _ any) (engine.Node, error) {
			return &transformNode[In, Out]{env: env, fn: fn}, nil
		}})
	if s == nil {
		return Stream[Out]{}
	}
	return Stream[Out]{flow: in.flow, step: s}
}

type transformNode[In, Out any] struct {
	env *engine.Env
	fn  func([]In) ([]Out, error)
}

func (n *transformNode[In, Out]) OnBatch(_ int, epoch uint64, batch any) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = PanicErr(p)
		}
	}()
	out, err := n.fn(batch.([]In))
	if err != nil {
		return userErr(err)
	}
	if len(out) == 0 {
		return nil
	}
	return n.env.Emit(0, epoch, out)
}

func (n *transformNode[In, Out]) OnEOF(uint64) error   { return nil }
func (n *transformNode[In, Out]) OnClose(uint64) error { return nil }
func (n *transformNode[In, Out]) Close() error         { return nil }

// TransformInto is Transform for steps that care about allocation: fn appends the output of a
// batch to out (an empty slice whose memory may be reused from an earlier batch) and returns
// it. fn must not keep or modify its input batch. The engine reuses the output's memory when
// every consumer is done with it once it returns, so a chain of TransformInto steps allocates
// nothing per batch.
//
// State: none. Epochs: output items keep the epoch of their input. EOF: the output ends when in
// ends.
func TransformInto[In, Out any](name string, in Stream[In], fn func(batch []In, out []Out) ([]Out, error)) Stream[Out] {
	if !in.valid() {
		return Stream[Out]{}
	}
	s := in.flow.add(name, &engine.Step{Kind: "transform", Inputs: []engine.Edge{in.edge()}, Outputs: 1, KeepsOrigin: true,
		New: func(env *engine.Env, _ any) (engine.Node, error) {
			return &intoNode[In, Out]{env: env, fn: fn}, nil
		}})
	if s == nil {
		return Stream[Out]{}
	}
	return Stream[Out]{flow: in.flow, step: s}
}

type intoNode[In, Out any] struct {
	env *engine.Env
	fn  func([]In, []Out) ([]Out, error)
	buf []Out
}

func (n *intoNode[In, Out]) OnBatch(_ int, epoch uint64, batch any) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = PanicErr(p)
		}
	}()
	out, err := n.fn(batch.([]In), n.buf[:0])
	if err != nil {
		return userErr(err)
	}
	if len(out) == 0 {
		n.buf = out
		return nil
	}
	err = n.env.Emit(0, epoch, out)
	if n.env.Reusable(0) {
		n.buf = out
	} else {
		n.buf = nil
	}
	return err
}

// ConsumesBatches: fn may not keep its input.
func (n *intoNode[In, Out]) ConsumesBatches()     {}
func (n *intoNode[In, Out]) OnEOF(uint64) error   { return nil }
func (n *intoNode[In, Out]) OnClose(uint64) error { return nil }
func (n *intoNode[In, Out]) Close() error         { return nil }

// Split adds a stateless step that sends every item of in to the first stream when pred
// returns true and to the second otherwise.
//
// State: none. Epochs: items keep their epoch. EOF: both outputs end when in ends.
func Split[T any](name string, in Stream[T], pred func(T) (bool, error)) (Stream[T], Stream[T]) {
	if !in.valid() {
		return Stream[T]{}, Stream[T]{}
	}
	s := in.flow.add(name, &engine.Step{Kind: "split", Inputs: []engine.Edge{in.edge()}, Outputs: 2, KeepsOrigin: true,
		New: func(env *engine.Env, _ any) (engine.Node, error) {
			return &splitNode[T]{env: env, pred: pred}, nil
		}})
	if s == nil {
		return Stream[T]{}, Stream[T]{}
	}
	return Stream[T]{flow: in.flow, step: s, port: 0}, Stream[T]{flow: in.flow, step: s, port: 1}
}

type splitNode[T any] struct {
	env  *engine.Env
	pred func(T) (bool, error)
}

func (n *splitNode[T]) OnBatch(_ int, epoch uint64, batch any) error {
	var yes, no []T
	err := ForEach(batch.([]T), func(item T) error {
		ok, err := n.pred(item)
		if err != nil {
			return err
		}
		if ok {
			yes = append(yes, item)
		} else {
			no = append(no, item)
		}
		return nil
	})
	if err != nil {
		return err
	}
	if len(yes) > 0 {
		if err := n.env.Emit(0, epoch, yes); err != nil {
			return err
		}
	}
	if len(no) > 0 {
		return n.env.Emit(1, epoch, no)
	}
	return nil
}

func (n *splitNode[T]) OnEOF(uint64) error   { return nil }
func (n *splitNode[T]) OnClose(uint64) error { return nil }
func (n *splitNode[T]) Close() error         { return nil }

// Merge adds a step whose output carries every item of every input.
//
// State: none. Epochs: an epoch ends on the output when it has ended on every input. EOF: the
// output ends when every input has ended.
func Merge[T any](name string, ins ...Stream[T]) Stream[T] {
	if len(ins) == 0 {
		return Stream[T]{}
	}
	f := ins[0].flow
	edges := make([]engine.Edge, len(ins))
	for i, in := range ins {
		if !in.valid() {
			return Stream[T]{}
		}
		if in.flow != f {
			f.fail(fmt.Errorf("step %q: input %d belongs to flow %q, not %q", name, i, in.flow.name, f.name))
			return Stream[T]{}
		}
		edges[i] = in.edge()
	}
	return passThrough[T](f, name, "merge", edges)
}

// Redistribute adds a step that spreads the items of in over all workers, to share out the
// work of a source with few partitions (one file, one queue) or of workers that run at
// different speeds: each batch goes whole to the worker with the fewest batches of this step
// waiting (in turn among equals), so a busy or slow worker gets less.
//
// State: none. Epochs: items keep their epoch. EOF: the output ends when in ends.
func Redistribute[T any](name string, in Stream[T]) Stream[T] {
	if !in.valid() {
		return Stream[T]{}
	}
	e := in.edge()
	e.Balance = true
	return passThrough[T](in.flow, name, "redistribute", []engine.Edge{e})
}

func passThrough[T any](f *Flow, name, kind string, edges []engine.Edge) Stream[T] {
	s := f.add(name, &engine.Step{Kind: kind, Inputs: edges, Outputs: 1, KeepsOrigin: true,
		New: func(env *engine.Env, _ any) (engine.Node, error) { return &passNode{env: env}, nil }})
	if s == nil {
		return Stream[T]{}
	}
	return Stream[T]{flow: f, step: s}
}

type passNode struct{ env *engine.Env }

func (n *passNode) OnBatch(_ int, epoch uint64, batch any) error { return n.env.Emit(0, epoch, batch) }
func (n *passNode) OnEOF(uint64) error                           { return nil }
func (n *passNode) OnClose(uint64) error                         { return nil }
func (n *passNode) Close() error                                 { return nil }
