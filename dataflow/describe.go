package dataflow

// Description is a flow's graph, as /dataflow serves it (in JSON) for tools and people.
type Description struct {
	Flow  string     `json:"flow"`
	Steps []StepInfo `json:"steps"`
	Edges []EdgeInfo `json:"edges"`
}

// StepInfo is one step of a Description.
type StepInfo struct {
	ID string `json:"id"`
	// Kind is what the step does: source, sink, transform, split, merge, redistribute,
	// stateful or combine.
	Kind    string `json:"kind"`
	Outputs int    `json:"outputs"` // output ports (0 for a sink)
}

// EdgeInfo is one stream of a Description, from an output port of a step to an input of
// another.
type EdgeInfo struct {
	From string `json:"from"`
	Port int    `json:"port"` // the output port of From
	To   string `json:"to"`
	// Exchange tells whether items cross between workers on this edge (a keyed step,
	// Redistribute, a partitioned sink); on the others they stay on the worker that has them.
	Exchange bool `json:"exchange"`
}

// Describe returns the flow's graph: its steps in the order they were added, and its edges.
func (f *Flow) Describe() Description {
	d := Description{Flow: f.name, Steps: []StepInfo{}, Edges: []EdgeInfo{}}
	for _, s := range f.graph.Steps {
		d.Steps = append(d.Steps, StepInfo{ID: s.ID, Kind: s.Kind, Outputs: s.Outputs})
		for _, in := range s.Inputs {
			d.Edges = append(d.Edges, EdgeInfo{From: in.From.ID, Port: in.Port, To: s.ID,
				Exchange: in.NewRouter != nil || in.Balance})
		}
	}
	return d
}
