package spool

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/epochflow/epochflow/connectors/conformance"
	"github.com/epochflow/epochflow/dataflow"
)

// visibleFiles returns the bodies of the files of dir that readers see (not hidden).
func visibleFiles(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, string(b))
	}
	return out
}

// The guide's connector keeps the contract, as the kit checks it: the source deletes a file
// only at the commit of the epoch that read it and resumes after the last committed name
// (exactly once); the sink's files appear at their epoch's commit, once.
func TestSourceConformance(t *testing.T) {
	conformance.TestSource(t, conformance.SourceKit[Message, string]{
		Setup: func(t *testing.T) conformance.SourceSystem[Message, string] {
			dir := t.TempDir()
			return conformance.SourceSystem[Message, string]{
				New: func() dataflow.PartitionedSource[Message, string] {
					return &source{cfg: SourceConfig{Dir: dir, Poll: 10 * time.Millisecond, IdleExit: 300 * time.Millisecond}}
				},
				Produce: func(ids []string) {
					for i, id := range ids {
						tmp := filepath.Join(dir, fmt.Sprintf(".tmp-%d", i))
						if err := os.WriteFile(tmp, []byte(id), 0o644); err != nil {
							t.Fatal(err)
						}
						if err := os.Rename(tmp, filepath.Join(dir, fmt.Sprintf("%010d", i))); err != nil {
							t.Fatal(err)
						}
					}
				},
				Remaining: func() int { return len(visibleFiles(t, dir)) },
			}
		},
		ID:        func(m Message) string { return string(m.Body) },
		Guarantee: conformance.ExactlyOnce,
	})
}

func TestSinkConformance(t *testing.T) {
	conformance.TestSink(t, conformance.SinkKit[string, uint64]{
		Setup: func(t *testing.T) conformance.SinkSystem[string, uint64] {
			dir := t.TempDir()
			return conformance.SinkSystem[string, uint64]{
				New: func() dataflow.PartitionedSink[string, uint64] {
					return &sink[string]{dir: dir, encode: func(s string) []byte { return []byte(s) }}
				},
				Item:    func(id string) string { return id },
				Visible: func() []string { return visibleFiles(t, dir) },
			}
		},
		Guarantee: conformance.ExactlyOnce,
	})
}
