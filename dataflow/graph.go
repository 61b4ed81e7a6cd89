package dataflow

import (
	"fmt"
	"strings"
)

// Mermaid returns the flow as a Mermaid flowchart: one box per step, an arrow per stream, and
// arrows that cross workers (exchanges) labelled "exchange".
func (f *Flow) Mermaid() string { return f.Describe().Mermaid() }

// Mermaid returns the described flow as a Mermaid flowchart, as Flow.Mermaid does: one box per
// step (s0, s1, ... in the order of Steps), an arrow per edge, labelled "exchange" when it
// crosses workers. An edge naming a step that Steps does not list gets a box of its own.
func (d Description) Mermaid() string {
	var b strings.Builder
	b.WriteString("flowchart TD\n")
	index := map[string]int{}
	box := func(id string) int {
		if i, ok := index[id]; ok {
			return i
		}
		i := len(index)
		index[id] = i
		fmt.Fprintf(&b, "  s%d[\"%s\"]\n", i, id)
		return i
	}
	for _, s := range d.Steps {
		box(s.ID)
	}
	for _, e := range d.Edges {
		from, to := box(e.From), box(e.To)
		if e.Exchange {
			fmt.Fprintf(&b, "  s%d -- exchange --> s%d\n", from, to)
		} else {
			fmt.Fprintf(&b, "  s%d --> s%d\n", from, to)
		}
	}
	return b.String()
}
