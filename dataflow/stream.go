package dataflow

import "github.com/epochflow/epochflow/dataflow/internal/engine"

// Stream is the typed output of a step. Steps consume streams; one stream may feed any number
// of steps, and each sees every item. A zero Stream (returned after a build error) makes every
// operator that takes it do nothing.
type Stream[T any] struct {
	flow *Flow
	step *engine.Step
	port int
}

// Flow returns the flow the stream belongs to (nil for a zero Stream).
func (s Stream[T]) Flow() *Flow { return s.flow }

// StepID returns the id of the step that produces the stream.
func (s Stream[T]) StepID() string {
	if s.step == nil {
		return ""
	}
	return s.step.ID
}

func (s Stream[T]) edge() engine.Edge { return engine.Edge{From: s.step, Port: s.port} }

// valid tells whether the stream can be used; a zero stream means an earlier step failed.
func (s Stream[T]) valid() bool { return s.flow != nil && s.step != nil && s.flow.err == nil }

// KV is an item of a keyed stream: a string key and a value. Stateful steps keep state per key,
// and a keyed exchange sends every item of a key to the same worker.
type KV[V any] struct {
	Key   string
	Value V
}
