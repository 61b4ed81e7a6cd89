// Package engine runs a dataflow graph on W workers: batches, exchanges between workers, epochs,
// barrier alignment, frontiers and the commit notification. It is untyped: the typed layer in
// package dataflow builds the graph and implements the nodes.
package engine

import (
	"context"
	"fmt"
)

// Graph is the untyped description of a flow: steps in the order they were added, which is a
// topological order because a step can only consume streams that already exist.
type Graph struct {
	Steps []*Step
}

// Step is one node of the graph.
type Step struct {
	ID string
	// Kind names what the step does (source, transform, stateful, sink...), for descriptions
	// of the graph; the engine does not use it.
	Kind    string
	Inputs  []Edge
	Outputs int
	// Source marks a step whose node implements SourceNode.
	Source bool
	// KeepsOrigin marks a step whose node emits, from OnBatch, only items of the batch it is
	// handling, and nothing from OnEOF, OnTime or OnEpochEnd (a transform, a split, a merge):
	// what it emits comes from the source partition its input batch came from. A step fed
	// from sources only through such steps and local edges can tell, with Env.Origin, which
	// partition each batch comes from.
	KeepsOrigin bool
	// Setup, if set, runs once per Run before any worker starts; its result is handed to New on
	// every worker (for example a source's partition list).
	Setup func(ctx context.Context, workers int) (any, error)
	// New builds the step's node on one worker.
	New func(env *Env, shared any) (Node, error)

	index int
	depth int
}

// Edge is one input of a step.
type Edge struct {
	From *Step
	Port int
	// NewRouter, if set, makes this an exchange: items cross to the worker the router picks.
	// Without it the edge is local (a plain function call on the same worker).
	NewRouter func(self, total int, shared any) Router
	// Balance makes this an exchange that sends each batch whole to the worker with the
	// shortest backlog of this edge (ties in turn), so a slower worker gets less. No router.
	// In a cluster it balances among the workers of the sending process.
	Balance bool
	// Codec encodes the batches of an exchange (NewRouter) that cross to another process of a
	// cluster. A run on several processes refuses an exchange without one.
	Codec BatchCodec
}

// BatchCodec encodes the batches of one exchange edge for another process.
type BatchCodec interface {
	// AppendBatch appends the encoding of batch to dst.
	AppendBatch(dst []byte, batch any) ([]byte, error)
	// DecodeBatch decodes a batch that AppendBatch encoded.
	DecodeBatch(data []byte) (any, error)
	// Check reports why the items cannot cross processes (nil when they can).
	Check() error
}

// Router splits batches of one exchange edge by destination worker. One router exists per
// (edge, sending worker) and is used by that worker only.
type Router interface {
	// Route appends every item of batch to the buffer of its destination worker.
	Route(batch any) error
	// Pending returns how many items are buffered for dest.
	Pending(dest int) int
	// Take returns the buffered items for dest as a new batch and empties the buffer.
	Take(dest int) any
	// Recycle takes back a batch made by Take once its receiver is done with it. It may be
	// called from any worker's goroutine.
	Recycle(batch any)
}

// Add appends a step, checking that its inputs belong to this graph.
func (g *Graph) Add(s *Step) error {
	for _, in := range s.Inputs {
		if in.From == nil || in.From.index >= len(g.Steps) || g.Steps[in.From.index] != in.From {
			return fmt.Errorf("step %q: an input stream belongs to another flow", s.ID)
		}
		if in.Port < 0 || in.Port >= in.From.Outputs {
			return fmt.Errorf("step %q: input port %d of %q does not exist", s.ID, in.Port, in.From.ID)
		}
	}
	s.index = len(g.Steps)
	g.Steps = append(g.Steps, s)
	return nil
}

// plan is the compiled graph shared by all workers of a run.
type plan struct {
	steps    []*Step
	edges    []planEdge // every input edge, numbered
	inEdges  [][]int    // step -> edge numbers of its inputs, by port
	outEdges [][][]int  // step -> port -> edge numbers that consume it
	groups   [][]int    // depth -> steps in topological order
	channels [][]int    // depth -> exchange edges that feed steps of that depth
	maxDepth int
}

type planEdge struct {
	from, fromPort int
	to, toPort     int
	depth          int // depth of the receiving step
	channel        bool
	balance        bool
	newRouter      func(self, total int, shared any) Router
	codec          BatchCodec
}

// compile computes depths (the number of channels on the longest path from a source) and turns
// a local edge that joins two depths into a forward channel, so that every step's inputs are
// aligned in one group.
func compile(g *Graph) (*plan, error) {
	p := &plan{steps: g.Steps}
	n := len(g.Steps)
	p.inEdges = make([][]int, n)
	p.outEdges = make([][][]int, n)
	for i, s := range g.Steps {
		p.outEdges[i] = make([][]int, s.Outputs)
		if len(s.Inputs) == 0 && !s.Source {
			return nil, fmt.Errorf("step %q has no input", s.ID)
		}
		d := 0
		for _, in := range s.Inputs {
			dd := in.From.depth
			if in.NewRouter != nil || in.Balance {
				dd++
			}
			d = max(d, dd)
		}
		s.depth = d
		p.maxDepth = max(p.maxDepth, d)
		for port, in := range s.Inputs {
			e := planEdge{from: in.From.index, fromPort: in.Port, to: i, toPort: port, depth: d,
				newRouter: in.NewRouter, balance: in.Balance, codec: in.Codec, channel: in.NewRouter != nil || in.Balance}
			if !e.channel && in.From.depth < d {
				e.channel = true // forward channel: to self only
			}
			id := len(p.edges)
			p.edges = append(p.edges, e)
			p.inEdges[i] = append(p.inEdges[i], id)
			p.outEdges[in.From.index][in.Port] = append(p.outEdges[in.From.index][in.Port], id)
		}
	}
	p.groups = make([][]int, p.maxDepth+1)
	p.channels = make([][]int, p.maxDepth+1)
	for i, s := range g.Steps {
		p.groups[s.depth] = append(p.groups[s.depth], i)
	}
	for id, e := range p.edges {
		if e.channel {
			p.channels[e.depth] = append(p.channels[e.depth], id)
		}
	}
	return p, nil
}
