package stdio

import (
	"bytes"
	"strings"
	"sync"
	"testing"

	"github.com/epochflow/epochflow/connectors/conformance"
	"github.com/epochflow/epochflow/dataflow"
)

// lockedBuffer is a bytes.Buffer that the kit may read while workers write to it.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) lines() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Fields(l.b.String())
}

// The printer writes at once and keeps no state: after a crash and a resume every item has
// been printed at least once (a replayed epoch prints again).
func TestSinkConformance(t *testing.T) {
	conformance.TestDynamicSink(t, conformance.DynamicSinkKit[string]{
		Setup: func(t *testing.T) conformance.DynamicSinkSystem[string] {
			var out lockedBuffer
			return conformance.DynamicSinkSystem[string]{
				New: func() dataflow.DynamicSink[string] {
					return &printer[string]{name: "conformance", w: &out, mu: new(sync.Mutex)}
				},
				Item:    func(id string) string { return id },
				Visible: out.lines,
			}
		},
	})
}

// LinesFrom reads its reader once, on worker 0, and ends with it.
func TestSourceConformance(t *testing.T) {
	conformance.TestDynamicSource(t, conformance.DynamicSourceKit[string]{
		Setup: func(t *testing.T) conformance.DynamicSourceSystem[string] {
			var in string
			return conformance.DynamicSourceSystem[string]{
				New: func() dataflow.DynamicSource[string] {
					return &lineSource{name: "conformance", r: strings.NewReader(in)}
				},
				Produce: func(ids []string) {
					if len(ids) > 0 {
						in = strings.Join(ids, "\n") + "\n"
					}
				},
			}
		},
		ID: func(line string) string { return line },
	})
}
