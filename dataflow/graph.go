package dataflow

import (
	"fmt"
	"strings"
)

// Mermaid returns the flow as a Mermaid flowchart: one box per step, an arrow per stream, and
// arrows that cross workers (exchanges) labelled "exchange".
func (f *Flow) Mermaid() string {
	var b strings.Builder
	b.WriteString("flowchart TD\n")
	for i, s := range f.graph.Steps {
		fmt.Fprintf(&b, "  s%d[\"%s\"]\n", i, s.ID)
	}
	index := map[string]int{}
	for i, s := range f.graph.Steps {
		index[s.ID] = i
	}
	for i, s := range f.graph.Steps {
		for _, in := range s.Inputs {
			if in.NewRouter != nil || in.Balance {
				fmt.Fprintf(&b, "  s%d -- exchange --> s%d\n", index[in.From.ID], i)
			} else {
				fmt.Fprintf(&b, "  s%d --> s%d\n", index[in.From.ID], i)
			}
		}
	}
	return b.String()
}
