package file_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/epochflow/epochflow/connectors/file"
	"github.com/epochflow/epochflow/dataflow"
)

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestCopyWorkers copies files to one file through a flow and checks every line is there once.
func TestCopyWorkers(t *testing.T) {
	paths, want := testFiles(t)
	var all []string
	for _, w := range want {
		all = append(all, w...)
	}
	slices.Sort(all)
	for _, workers := range []int{1, 2, 4} {
		t.Run(fmt.Sprint(workers), func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "out.txt")
			write(t, out, strings.Repeat("stale content\n", 100)) // a fresh run told to replace it truncates it
			f := dataflow.New("copy")
			dataflow.Output("write", dataflow.Input(f, "read", file.Lines(paths...)), file.WriteLines(out, file.OnExisting(file.Replace)))
			if err := run(t, f, workers); err != nil {
				t.Fatal(err)
			}
			content := readFile(t, out)
			if !strings.HasSuffix(content, "\n") {
				t.Fatalf("the output does not end with a newline")
			}
			got := strings.Split(strings.TrimSuffix(content, "\n"), "\n")
			slices.Sort(got)
			if !slices.Equal(got, all) {
				t.Fatalf("the output holds %d lines, want the %d input lines once each", len(got), len(all))
			}
		})
	}
}

func TestLinesOutFormat(t *testing.T) {
	dir := t.TempDir()
	in := write(t, filepath.Join(dir, "in.txt"), "a\nbb\nccc\n")
	outKV := filepath.Join(dir, "kv.txt")
	outDefault := filepath.Join(dir, "default.txt")
	f := dataflow.New("fmt")
	lines := dataflow.Input(f, "read", file.Lines(in))
	kv := dataflow.Transform("len", lines, func(b []string) ([]dataflow.KV[int], error) {
		out := make([]dataflow.KV[int], len(b))
		for i, s := range b {
			out[i] = dataflow.KV[int]{Key: s, Value: len(s)}
		}
		return out, nil
	})
	dataflow.Output("kv", kv, file.LinesOut(outKV, func(kv dataflow.KV[int]) string {
		return fmt.Sprintf("%s=%d", kv.Key, kv.Value)
	}))
	dataflow.Output("default", kv, file.LinesOut[dataflow.KV[int]](outDefault, nil))
	if err := run(t, f, 2); err != nil {
		t.Fatal(err)
	}
	if got, want := readFile(t, outKV), "a=1\nbb=2\nccc=3\n"; got != want {
		t.Errorf("custom format: %q, want %q", got, want)
	}
	if got, want := readFile(t, outDefault), "{a 1}\n{bb 2}\n{ccc 3}\n"; got != want {
		t.Errorf("default format: %q, want %q", got, want)
	}
}

func TestSinkCrashAndResume(t *testing.T) {
	path := filepath.Join(t.TempDir(), "out.txt")
	ctx := context.Background()
	sink := file.NewLineSink[string](path, nil)
	if parts, err := sink.Parts(ctx); err != nil || !slices.Equal(parts, []string{path}) {
		t.Fatalf("Parts: %q, %v", parts, err)
	}
	for _, n := range []int{1, 2, 7} {
		if got := sink.PartFor("x", n); got != 0 {
			t.Fatalf("PartFor(_, %d) = %d, want 0", n, got)
		}
	}
	long := strings.Repeat("L", 200<<10) // more than the write buffer

	p, err := sink.Build(ctx, path, nil)
	if err != nil {
		t.Fatal(err)
	}
	batch := []string{"a", long, "b"}
	if err := p.Write(ctx, batch); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(batch, []string{"a", long, "b"}) {
		t.Fatal("Write modified its batch")
	}
	s1 := mustSnapshot(t, p)
	want1 := "a\n" + long + "\nb\n"
	if s1 != int64(len(want1)) || readFile(t, path) != want1 {
		t.Fatalf("after the first snapshot: offset %d, file of %d bytes; want %d", s1, len(readFile(t, path)), len(want1))
	}
	if err := p.Commit(ctx, s1); err != nil {
		t.Fatal(err)
	}
	// An epoch that is snapshotted but never committed, and one that is not even snapshotted.
	if err := p.Write(ctx, []string{"c", "d"}); err != nil {
		t.Fatal(err)
	}
	if s2 := mustSnapshot(t, p); s2 != s1+4 {
		t.Fatalf("second snapshot %d, want %d", s2, s1+4)
	}
	if err := p.Write(ctx, []string{"e"}); err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil { // the "crash" left everything on disk
		t.Fatal(err)
	}
	if got := readFile(t, path); got != want1+"c\nd\ne\n" {
		t.Fatalf("before the resume: %d bytes", len(got))
	}

	// Resume from the committed snapshot: the rest is cut away and written again.
	p, err = sink.Build(ctx, path, &s1)
	if err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, path); got != want1 {
		t.Fatalf("after Build with resume %d the file holds %d bytes, want it truncated to the snapshot", s1, len(got))
	}
	if err := p.Commit(ctx, s1); err != nil { // the repeated commit after a resume
		t.Fatal(err)
	}
	if err := p.Write(ctx, []string{"c", "d2"}); err != nil {
		t.Fatal(err)
	}
	s3 := mustSnapshot(t, p)
	if s3 != s1+5 {
		t.Fatalf("snapshot after resume %d, want %d", s3, s1+5)
	}
	if s := mustSnapshot(t, p); s != s3 {
		t.Fatalf("snapshot without writes moved from %d to %d", s3, s)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if got := readFile(t, path); got != want1+"c\nd2\n" {
		t.Fatalf("after the resumed run: %q...", got[len(want1):])
	}

	// A resume offset beyond the end: the file was changed behind the flow's back.
	if err := os.Truncate(path, 3); err != nil {
		t.Fatal(err)
	}
	_, err = sink.Build(ctx, path, &s1)
	if err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), " 3 bytes") || !strings.Contains(err.Error(), fmt.Sprint(s1)) {
		t.Fatalf("resume beyond the end: error %v, want one naming the path and both sizes", err)
	}

	// A fresh start told to replace the file truncates it to zero.
	p, err = file.NewLineSink[string](path, nil, file.OnExisting(file.Replace)).Build(ctx, path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, path); got != "" {
		t.Fatalf("a fresh start left %q", got)
	}
	if s := mustSnapshot(t, p); s != 0 {
		t.Fatalf("snapshot of an empty file: %d", s)
	}
	p.Close()
}

func TestSinkCrashBeforeFlush(t *testing.T) {
	// Lines written after the last snapshot may never reach the file (the process died with
	// them in its buffer); the resume must still work.
	path := filepath.Join(t.TempDir(), "out.txt")
	ctx := context.Background()
	sink := file.NewLineSink[int](path, nil)
	crashed, crash := context.WithCancelCause(ctx)
	p, err := sink.Build(crashed, path, nil)
	if err != nil {
		t.Fatal(err)
	}
	p.Write(ctx, []int{1, 2, 3})
	s := mustSnapshot(t, p)
	p.Write(ctx, []int{4})     // buffered only; p is abandoned without Close
	crash(dataflow.ErrCrashed) // as the engine's crash hook ends a run: its lock goes with it
	p2, err := sink.Build(ctx, path, &s)
	if err != nil {
		t.Fatal(err)
	}
	p2.Write(ctx, []int{4, 5})
	mustSnapshot(t, p2)
	if err := p2.Close(); err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, path); got != "1\n2\n3\n4\n5\n" {
		t.Fatalf("got %q", got)
	}
}

func TestSinkErrors(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	if _, err := file.NewLineSink[string]("", nil).Parts(ctx); err == nil {
		t.Fatal("empty path: no error")
	}
	bad := filepath.Join(dir, "no-such-dir", "out.txt")
	f := dataflow.New("bad")
	lines := dataflow.Input(f, "read", file.Lines(write(t, filepath.Join(dir, "in"), "x\n")))
	dataflow.Output("write", lines, file.WriteLines(bad))
	err := run(t, f, 1)
	if err == nil || !strings.Contains(err.Error(), bad) {
		t.Fatalf("unwritable path: error %v, want one naming %s", err, bad)
	}
}

// mustSnapshot takes a sink partition's snapshot and fails the test on error.
func mustSnapshot[T any](t *testing.T, p dataflow.StatefulSink[T, int64]) int64 {
	t.Helper()
	s, err := p.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	return s
}
