package file_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/epochflow/epochflow/connectors/conformance"
	"github.com/epochflow/epochflow/connectors/file"
	"github.com/epochflow/epochflow/dataflow"
)

// The line source keeps its offsets in the snapshot: exactly once, nothing to acknowledge.
// It reads two files (two partitions).
func TestSourceConformance(t *testing.T) {
	conformance.TestSource(t, conformance.SourceKit[string, int64]{
		Setup: func(t *testing.T) conformance.SourceSystem[string, int64] {
			dir := t.TempDir()
			paths := []string{filepath.Join(dir, "a.txt"), filepath.Join(dir, "b.txt")}
			return conformance.SourceSystem[string, int64]{
				New: func() dataflow.PartitionedSource[string, int64] { return file.NewLineSource(paths...) },
				Produce: func(ids []string) {
					for i, p := range paths {
						var b strings.Builder
						for j := i; j < len(ids); j += len(paths) {
							b.WriteString(ids[j] + "\n")
						}
						if err := os.WriteFile(p, []byte(b.String()), 0o644); err != nil {
							t.Fatal(err)
						}
					}
				},
			}
		},
		ID:        func(line string) string { return line },
		Guarantee: conformance.ExactlyOnce,
	})
}

// The line sink truncates to the committed length on resume: exactly once at the end, but a
// reader of the file may see lines of epochs not committed yet.
func TestSinkConformance(t *testing.T) {
	conformance.TestSink(t, conformance.SinkKit[string, int64]{
		Setup: func(t *testing.T) conformance.SinkSystem[string, int64] {
			path := filepath.Join(t.TempDir(), "out.txt")
			return conformance.SinkSystem[string, int64]{
				New:  func() dataflow.PartitionedSink[string, int64] { return file.NewLineSink[string](path, nil) },
				Item: func(id string) string { return id },
				Visible: func() []string {
					b, err := os.ReadFile(path)
					if os.IsNotExist(err) {
						return nil
					}
					if err != nil {
						t.Fatal(err)
					}
					return strings.Fields(string(b))
				},
			}
		},
		Guarantee:    conformance.ExactlyOnce,
		VisibleEarly: true,
	})
}
