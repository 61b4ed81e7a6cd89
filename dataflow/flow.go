// Package dataflow builds and runs epochflow dataflows: a Flow of named steps connected by typed
// Streams, the source and sink contracts connectors implement, and Run and Main, which execute a
// flow on W workers, cut its input into epochs, snapshot every source, stateful step and sink at
// each epoch's end, and call Commit on sources and sinks once an epoch is committed.
//
// Most users build flows with the operators package; this package holds the primitives those
// operators are made of (Transform, Stateful, Merge, Split, Redistribute, Input, Output), for
// authors of new operators; and the clocks and the event-time stateful step (Clock,
// StatefulTime) that the windows package is built on.
package dataflow

import (
	"errors"
	"fmt"
	"strings"

	"github.com/epochflow/epochflow/dataflow/internal/engine"
)

// Flow is a dataflow under construction: a graph of named steps. Build it with operators, then
// hand it to Run or Main. A mistake found while building (a duplicate step id, a stream of
// another flow) is recorded in the flow and returned by Err, Run and Main; operators called
// after it do nothing.
type Flow struct {
	name  string
	graph engine.Graph
	ids   map[string]*engine.Step
	err   error
}

// New returns an empty flow. Its name is the first part of every step id.
func New(name string) *Flow {
	f := &Flow{name: name, ids: map[string]*engine.Step{}}
	if err := checkName(name); err != nil {
		f.err = fmt.Errorf("flow name: %w", err)
	}
	return f
}

// Name returns the flow's name.
func (f *Flow) Name() string { return f.name }

// Err returns the first mistake made while building the flow, or nil.
func (f *Flow) Err() error { return f.err }

// StepIDs returns the ids of the flow's steps in the order they were added.
func (f *Flow) StepIDs() []string {
	ids := make([]string, len(f.graph.Steps))
	for i, s := range f.graph.Steps {
		ids[i] = s.ID
	}
	return ids
}

func checkName(name string) error {
	if name == "" {
		return errors.New("empty name")
	}
	if strings.ContainsAny(name, " \t\n\"") {
		return fmt.Errorf("name %q contains white space or a quote", name)
	}
	if strings.HasPrefix(name, ".") || strings.HasSuffix(name, ".") || strings.Contains(name, "..") {
		return fmt.Errorf("name %q has an empty part between dots", name)
	}
	return nil
}

// Fail records err as a mistake in building the flow, for operators that find their
// configuration invalid: Err, Run and Main return the first one recorded, and later steps are
// not added. A nil err is ignored.
func (f *Flow) Fail(err error) {
	if f != nil && err != nil {
		f.fail(err)
	}
}

// fail records the first build error.
func (f *Flow) fail(err error) {
	if f.err == nil {
		f.err = err
	}
}

// add adds a step named name (nested under the flow's name) and returns it, or nil after
// recording an error.
func (f *Flow) add(name string, s *engine.Step) *engine.Step {
	if f.err != nil {
		return nil
	}
	if err := checkName(name); err != nil {
		f.fail(fmt.Errorf("step name: %w", err))
		return nil
	}
	s.ID = f.name + "." + name
	if _, dup := f.ids[s.ID]; dup {
		f.fail(fmt.Errorf("step id %q is used twice: every step needs its own name", s.ID))
		return nil
	}
	if err := f.graph.Add(s); err != nil {
		f.fail(err)
		return nil
	}
	f.ids[s.ID] = s
	return s
}
