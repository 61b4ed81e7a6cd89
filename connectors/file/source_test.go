package file_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/epochflow/epochflow/connectors/file"
	"github.com/epochflow/epochflow/dataflow"
)

// collect is a DynamicSink that keeps every item.
type collect[T any] struct {
	mu    sync.Mutex
	items []T
}

func (c *collect[T]) Build(context.Context, dataflow.Worker) (dataflow.WorkerSink[T], error) {
	return c, nil
}

func (c *collect[T]) Write(_ context.Context, b []T) error {
	c.mu.Lock()
	c.items = append(c.items, b...)
	c.mu.Unlock()
	return nil
}

func (c *collect[T]) Close() error { return nil }

func run(t *testing.T, f *dataflow.Flow, workers int) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return dataflow.Run(ctx, f, dataflow.Options{Workers: workers, EpochInterval: time.Millisecond})
}

// readAll runs a flow that reads src and returns what arrived.
func readAll(t *testing.T, src dataflow.Source[string], workers int) ([]string, error) {
	t.Helper()
	f := dataflow.New("read")
	sink := &collect[string]{}
	dataflow.Output("out", dataflow.Input(f, "in", src), dataflow.ToDynamic[string](sink))
	err := run(t, f, workers)
	return sink.items, err
}

func write(t *testing.T, path, content string) string {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// testFiles writes a set of files with awkward contents and returns their paths and their
// lines per file.
func testFiles(t *testing.T) (paths []string, want [][]string) {
	dir := t.TempDir()
	add := func(name, content string, lines ...string) {
		paths = append(paths, write(t, filepath.Join(dir, name), content))
		want = append(want, lines)
	}
	var many []string
	var b strings.Builder
	for i := range 5000 { // several batches
		l := fmt.Sprintf("many-%d", i)
		many = append(many, l)
		b.WriteString(l + "\n")
	}
	add("many.txt", b.String(), many...)
	add("empty.txt", "")
	add("nonl.txt", "one\ntwo", "one", "two")
	add("crlf.txt", "a\r\nb\r\n\r\nc\r", "a", "b", "", "c")
	long := strings.Repeat("x", 300<<10) // longer than the read buffer and a whole batch
	add("long.txt", "short\n"+long+"\n"+long+"y", "short", long, long+"y")
	add("blank.txt", "\n\n", "", "")
	return paths, want
}

func TestLinesWorkers(t *testing.T) {
	paths, want := testFiles(t)
	for _, workers := range []int{1, 2, 4} {
		t.Run(fmt.Sprint(workers), func(t *testing.T) {
			got, err := readAll(t, file.Lines(paths...), workers)
			if err != nil {
				t.Fatal(err)
			}
			checkLines(t, got, want)
		})
	}
}

// checkLines checks that got holds every line of want exactly once and in file order. Lines
// of different files are told apart by content, which testFiles keeps distinct except for
// blank lines, which are only counted.
func checkLines(t *testing.T, got []string, want [][]string) {
	t.Helper()
	var all []string
	for _, w := range want {
		all = append(all, w...)
	}
	if len(got) != len(all) {
		t.Fatalf("got %d lines, want %d", len(got), len(all))
	}
	s1, s2 := slices.Clone(got), slices.Clone(all)
	slices.Sort(s1)
	slices.Sort(s2)
	if !slices.Equal(s1, s2) {
		t.Fatalf("the lines differ from the files' lines")
	}
	fileOf := map[string]int{}
	for i, w := range want {
		for _, l := range w {
			if l != "" {
				fileOf[l] = i
			}
		}
	}
	seen := make([][]string, len(want))
	for _, l := range got {
		if l != "" {
			seen[fileOf[l]] = append(seen[fileOf[l]], l)
		}
	}
	for i, w := range want {
		nonEmpty := slices.DeleteFunc(slices.Clone(w), func(s string) bool { return s == "" })
		if !slices.Equal(seen[i], nonEmpty) {
			t.Fatalf("lines of file %d arrived out of order (%.60q...)", i, seen[i])
		}
	}
}

func TestDir(t *testing.T) {
	dir := t.TempDir()
	write(t, filepath.Join(dir, "b.txt"), "b1\nb2\n")
	write(t, filepath.Join(dir, "a.txt"), "a1\n")
	write(t, filepath.Join(dir, "c.log"), "c1\n")
	if err := os.Mkdir(filepath.Join(dir, "d.txt"), 0o755); err != nil {
		t.Fatal(err)
	}
	parts, err := file.NewDirSource(dir, "*.txt").Parts(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{filepath.Join(dir, "a.txt"), filepath.Join(dir, "b.txt")}; !slices.Equal(parts, want) {
		t.Fatalf("parts %q, want %q", parts, want)
	}
	for _, workers := range []int{1, 2, 4} {
		got, err := readAll(t, file.Dir(dir, "*.txt"), workers)
		if err != nil {
			t.Fatal(err)
		}
		slices.Sort(got)
		if want := []string{"a1", "b1", "b2"}; !slices.Equal(got, want) {
			t.Fatalf("%d workers: got %q, want %q", workers, got, want)
		}
	}
	got, err := readAll(t, file.Dir(dir, ""), 2)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 4 {
		t.Fatalf(`pattern "": got %q, want the 4 lines of every file`, got)
	}
}

func TestDirErrors(t *testing.T) {
	dir := t.TempDir()
	write(t, filepath.Join(dir, "a.txt"), "a\n")
	missing := filepath.Join(dir, "nope")
	for _, tc := range []struct {
		dir, pattern string
		want         []string
	}{
		{dir, "*.csv", []string{dir, `"*.csv"`, "no regular file"}},
		{missing, "*", []string{missing, "no such file"}},
		{dir, "[", []string{dir, `"["`, "syntax error"}},
	} {
		_, err := readAll(t, file.Dir(tc.dir, tc.pattern), 1)
		if err == nil {
			t.Fatalf("Dir(%q, %q): no error", tc.dir, tc.pattern)
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("Dir(%q, %q): error %q does not mention %q", tc.dir, tc.pattern, err, w)
			}
		}
	}
}

func TestLinesErrors(t *testing.T) {
	dir := t.TempDir()
	ok := write(t, filepath.Join(dir, "ok.txt"), "x\n")
	missing := filepath.Join(dir, "missing.txt")
	_, err := readAll(t, file.Lines(ok, missing), 2)
	if err == nil || !strings.Contains(err.Error(), missing) || !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("missing file: error %v, want one naming %s and wrapping os.ErrNotExist", err, missing)
	}
	_, err = readAll(t, file.Lines(dir), 1)
	if err == nil || !strings.Contains(err.Error(), dir) || !strings.Contains(err.Error(), "directory") {
		t.Fatalf("directory: error %v, want one naming %s as a directory", err, dir)
	}
	_, err = readAll(t, file.Lines(ok, ok), 1)
	if err == nil || !strings.Contains(err.Error(), "twice") {
		t.Fatalf("path listed twice: error %v", err)
	}
	if _, err = readAll(t, file.Lines(), 1); err == nil {
		t.Fatal("no path: no error")
	}
	if _, err := file.NewLineSource(missing).Build(context.Background(), missing, nil); err == nil || !strings.Contains(err.Error(), missing) {
		t.Fatalf("Build of a missing file: error %v, want one naming the path", err)
	}
}

func TestResumeMidFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "in.txt")
	var b strings.Builder
	for i := range 3000 {
		fmt.Fprintf(&b, "line %d\r\n", i)
	}
	write(t, path, b.String())
	src := file.NewLineSource(path)
	ctx := context.Background()

	// Resume at the offset the snapshot after the first batch returns.
	p, err := src.Build(ctx, path, nil)
	if err != nil {
		t.Fatal(err)
	}
	first, err := p.Next(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(first) == 0 || len(first) >= 3000 {
		t.Fatalf("first batch has %d lines, want a part of the file", len(first))
	}
	off := p.Snapshot()
	if want := int64(len(strings.Join(strings.SplitAfter(b.String(), "\n")[:len(first)], ""))); off != want {
		t.Fatalf("snapshot %d after %d lines, want %d", off, len(first), want)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	p, err = src.Build(ctx, path, &off)
	if err != nil {
		t.Fatal(err)
	}
	rest := drain(t, p)
	if got := append(first, rest...); len(got) != 3000 || got[len(first)] != fmt.Sprintf("line %d", len(first)) || got[2999] != "line 2999" {
		t.Fatalf("after resume at %d: %d lines in all, next %q", off, len(got), rest[0])
	}
	if got := p.Snapshot(); got != int64(b.Len()) {
		t.Fatalf("snapshot at the end %d, want the file size %d", got, b.Len())
	}
	if err := p.Commit(ctx, off); err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}

	// Resume at a hand-picked line end, and at the very end.
	off = int64(len("line 0\r\nline 1\r\n"))
	p, err = src.Build(ctx, path, &off)
	if err != nil {
		t.Fatal(err)
	}
	if got := drain(t, p); got[0] != "line 2" || len(got) != 2998 {
		t.Fatalf("resume at %d: first line %q, %d lines, want \"line 2\" and 2998", off, got[0], len(got))
	}
	p.Close()
	end := int64(b.Len())
	p, err = src.Build(ctx, path, &end)
	if err != nil {
		t.Fatal(err)
	}
	if got := drain(t, p); len(got) != 0 {
		t.Fatalf("resume at the end: got %d lines", len(got))
	}
	p.Close()

	// Resume beyond the end: the file changed.
	beyond := end + 10
	_, err = src.Build(ctx, path, &beyond)
	if err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), fmt.Sprint(end)) || !strings.Contains(err.Error(), fmt.Sprint(beyond)) {
		t.Fatalf("resume beyond the end: error %v, want one naming the path and both sizes", err)
	}
}

// drain calls Next until io.EOF and returns every line.
func drain(t *testing.T, p dataflow.StatefulSource[string, int64]) []string {
	t.Helper()
	var all []string
	for range 100000 {
		b, err := p.Next(context.Background())
		all = append(all, b...)
		if errors.Is(err, io.EOF) {
			if b, err := p.Next(context.Background()); len(b) != 0 || !errors.Is(err, io.EOF) {
				t.Fatalf("Next after io.EOF: %d lines, %v", len(b), err)
			}
			return all
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	t.Fatal("no io.EOF")
	return nil
}

func TestPartitionEdgeCases(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	long := strings.Repeat("é", 100<<10) // 200 KiB, more than the read buffer
	for _, tc := range []struct {
		content string
		want    []string
	}{
		{"", nil},
		{"\n", []string{""}},
		{"a", []string{"a"}},
		{"a\n", []string{"a"}},
		{"a\r", []string{"a"}},
		{"a\r\r\n", []string{"a\r"}},
		{"a\n\nb", []string{"a", "", "b"}},
		{long + "\n" + long, []string{long, long}},
	} {
		path := write(t, filepath.Join(dir, "f"), tc.content)
		p, err := file.NewLineSource(path).Build(ctx, path, nil)
		if err != nil {
			t.Fatal(err)
		}
		got := drain(t, p)
		if !slices.Equal(got, tc.want) {
			t.Errorf("%.20q: got %.40q, want %.40q", tc.content, got, tc.want)
		}
		if s := p.Snapshot(); s != int64(len(tc.content)) {
			t.Errorf("%.20q: snapshot at the end %d, want %d", tc.content, s, len(tc.content))
		}
		p.Close()
	}
}
