package file_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/epochflow/epochflow/connectors/file"
	"github.com/epochflow/epochflow/dataflow"
	"github.com/epochflow/epochflow/recovery"
)

// copyFlow copies the lines of in to out.
func copyFlow(in, out string, opts ...file.SinkOption) *dataflow.Flow {
	f := dataflow.New("copy")
	dataflow.Output("write", dataflow.Input(f, "read", file.Lines(in)), file.WriteLines(out, opts...))
	return f
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// A fresh run (no recovery state) on an output file that holds data refuses it by default,
// with an error naming the file and the choices, and leaves it untouched; told so, it replaces
// it or appends to it. A missing or an empty file is written; no start marker is left behind.
func TestFreshRunRefusesAFileWithData(t *testing.T) {
	dir := t.TempDir()
	in := write(t, filepath.Join(dir, "in.txt"), "a\nb\n")
	out := filepath.Join(dir, "out.txt")
	marker := out + ".epochflow-start"

	write(t, out, "precious\n")
	err := run(t, copyFlow(in, out), 2)
	if !errors.Is(err, file.ErrNotEmpty) {
		t.Fatalf("fresh run on a file with data: %v, want ErrNotEmpty", err)
	}
	for _, want := range []string{out, "9 bytes", "recovery directory", "remove the file", "file.OnExisting(file.Replace)", "file.OnExisting(file.Append)"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the refusal does not say %q: %v", want, err)
		}
	}
	if got := readFile(t, out); got != "precious\n" {
		t.Fatalf("the refused run changed the file to %q", got)
	}
	if exists(marker) {
		t.Errorf("the refused run left a start marker")
	}

	// A program names its flag instead of the Go option.
	err = run(t, copyFlow(in, out, file.ExistsFlag("-output-exists")), 1)
	if !errors.Is(err, file.ErrNotEmpty) || !strings.Contains(err.Error(), "-output-exists replace") ||
		!strings.Contains(err.Error(), "-output-exists append") || strings.Contains(err.Error(), "OnExisting") {
		t.Fatalf("refusal with ExistsFlag: %v", err)
	}

	if err := run(t, copyFlow(in, out, file.OnExisting(file.Append)), 2); err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, out); got != "precious\na\nb\n" {
		t.Fatalf("append: %q", got)
	}
	if err := run(t, copyFlow(in, out, file.OnExisting(file.Replace)), 2); err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, out); got != "a\nb\n" {
		t.Fatalf("replace: %q", got)
	}

	// Appending to a file whose last line has no line end would join two lines.
	write(t, out, "no line end")
	err = run(t, copyFlow(in, out, file.OnExisting(file.Append)), 1)
	if err == nil || !strings.Contains(err.Error(), out) || !strings.Contains(err.Error(), "line end") {
		t.Fatalf("append to a file without a last line end: %v", err)
	}
	if got := readFile(t, out); got != "no line end" {
		t.Fatalf("the refused append changed the file to %q", got)
	}

	for name, prepare := range map[string]func(){
		"empty":   func() { write(t, out, "") },
		"missing": func() { os.Remove(out) },
	} {
		prepare()
		if err := run(t, copyFlow(in, out), 1); err != nil {
			t.Fatalf("%s file: %v", name, err)
		}
		if got := readFile(t, out); got != "a\nb\n" {
			t.Fatalf("%s file: %q", name, got)
		}
	}
	if exists(marker) {
		t.Errorf("a run that committed left its start marker")
	}

	// The choice parses as a flag does.
	var m file.IfExists
	for _, v := range []file.IfExists{file.Refuse, file.Replace, file.Append} {
		if err := m.Set(v.String()); err != nil || m != v {
			t.Errorf("Set(%q): %v, %v", v.String(), m, err)
		}
	}
	if err := m.Set("overwrite"); err == nil {
		t.Error("Set(overwrite): no error")
	}
}

// A fresh run that dies after writing and before its first commit leaves output that no
// recovery state describes; the next run, on the same store or a new one, cuts it back to where
// that run started (keeping what an append started after) instead of refusing the file or
// appending after the uncommitted lines. The result is exactly once.
func TestCrashBeforeTheFirstCommit(t *testing.T) {
	var lines []string
	var b strings.Builder
	for i := range 5000 {
		lines = append(lines, fmt.Sprintf("line %d", i))
		b.WriteString(lines[i] + "\n")
	}
	for _, c := range []struct {
		name     string
		before   string // the file before the first run; "-" for none
		mode     file.IfExists
		newStore bool
	}{
		{"refuse/missing file", "-", file.Refuse, false},
		{"refuse/empty file/new store", "", file.Refuse, true},
		{"append", "old 1\nold 2\n", file.Append, false},
		{"append/new store", "old 1\nold 2\n", file.Append, true},
		{"replace", "old\n", file.Replace, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			in := write(t, filepath.Join(dir, "in.txt"), b.String())
			out := filepath.Join(dir, "out.txt")
			if c.before != "-" {
				write(t, out, c.before)
			}
			kept := c.before
			if c.mode != file.Append {
				kept = ""
			}
			runOnce := func(store string, hook func(string) bool) error {
				st, err := recovery.OpenSQLite(context.Background(), filepath.Join(dir, store), recovery.SQLiteOptions{})
				if err != nil {
					t.Fatal(err)
				}
				defer st.Close()
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				// One long epoch: everything is written, flushed and fsynced at its end, and the
				// crash comes before its commit record.
				return dataflow.Run(ctx, copyFlow(in, out, file.OnExisting(c.mode)), dataflow.Options{Workers: 2,
					EpochInterval: time.Minute, Recovery: st, CrashHook: hook,
					Logger: slog.New(slog.DiscardHandler)})
			}
			if err := runOnce("store", crashAt("before-commit-record", 1)); !errors.Is(err, dataflow.ErrCrashed) {
				t.Fatalf("first run: %v, want a crash", err)
			}
			if got := readFile(t, out); got != kept+b.String() {
				t.Fatalf("after the crash the file holds %d bytes, want the %d of the uncommitted run", len(got), len(kept+b.String()))
			}
			if !exists(out + ".epochflow-start") {
				t.Fatal("no start marker after the crash")
			}
			store := "store"
			if c.newStore {
				store = "store2"
			}
			if err := runOnce(store, func(string) bool { return false }); err != nil {
				t.Fatalf("run after the crash: %v", err)
			}
			if got := readFile(t, out); got != kept+b.String() {
				t.Fatalf("after the second run the file holds %d bytes, want %d", len(got), len(kept+b.String()))
			}
			if exists(out + ".epochflow-start") {
				t.Error("the start marker outlived the commit")
			}
		})
	}
}

// A start marker is trusted only for the file it was written for: after the file was replaced
// by another one, or cut below the marker's offset, a fresh run refuses the file instead of
// cutting it back.
func TestStartMarkerOfAnotherFile(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "out.txt")
	ctx := context.Background()
	crashed := func() {
		t.Helper()
		cctx, crash := context.WithCancelCause(ctx)
		p, err := file.NewLineSink[string](out, nil, file.OnExisting(file.Replace)).Build(cctx, out, nil)
		if err != nil {
			t.Fatal(err)
		}
		p.Write(ctx, []string{"uncommitted"})
		mustSnapshot(t, p)
		crash(dataflow.ErrCrashed)
	}
	crashed()
	if err := os.Remove(out); err != nil {
		t.Fatal(err)
	}
	write(t, out, "another file\n")
	if _, err := file.NewLineSink[string](out, nil).Build(ctx, out, nil); !errors.Is(err, file.ErrNotEmpty) {
		t.Fatalf("fresh run on a new file at the marker's path: %v, want ErrNotEmpty", err)
	}
	if got := readFile(t, out); got != "another file\n" {
		t.Fatalf("the file changed to %q", got)
	}

	// An append marker whose offset is beyond the file's end.
	write(t, out, "0123456789\n")
	cctx, crash := context.WithCancelCause(ctx)
	p, err := file.NewLineSink[string](out, nil, file.OnExisting(file.Append)).Build(cctx, out, nil)
	if err != nil {
		t.Fatal(err)
	}
	p.Write(ctx, []string{"x"})
	mustSnapshot(t, p)
	crash(dataflow.ErrCrashed)
	if err := os.Truncate(out, 4); err != nil {
		t.Fatal(err)
	}
	if _, err := file.NewLineSink[string](out, nil).Build(ctx, out, nil); !errors.Is(err, file.ErrNotEmpty) {
		t.Fatalf("fresh run on a file cut below the marker: %v, want ErrNotEmpty", err)
	}
	// A marker after an append names the older bytes even to a run that refuses.
	write(t, out, "0123456789\nx\n")
	_, err = file.NewLineSink[string](out, nil, file.ExistsFlag("-output-exists")).Build(ctx, out, nil)
	if !errors.Is(err, file.ErrNotEmpty) || !strings.Contains(err.Error(), "11 bytes from before") || !strings.Contains(err.Error(), "-output-exists append") {
		t.Fatalf("refusing run on an appended file with a marker: %v", err)
	}
}

// A sink locks its file: a second sink on the same file, in another flow or the same one, is
// refused with an error naming the file while the first holds it, and nothing of the file
// changes; once the first is closed the file is free.
func TestSecondWriterIsRefused(t *testing.T) {
	dir := t.TempDir()
	in := write(t, filepath.Join(dir, "in.txt"), "a\nb\n")
	out := filepath.Join(dir, "out.txt")
	ctx := context.Background()
	first, err := file.NewLineSink[string](out, nil).Build(ctx, out, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := first.Write(ctx, []string{"first"}); err != nil {
		t.Fatal(err)
	}
	if err := first.Commit(ctx, mustSnapshot(t, first)); err != nil {
		t.Fatal(err)
	}

	check := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, file.ErrInUse) || !strings.Contains(err.Error(), out) {
			t.Fatalf("%s: %v, want ErrInUse naming %s", what, err, out)
		}
		if got := readFile(t, out); got != "first\n" {
			t.Fatalf("%s changed the file to %q", what, got)
		}
	}
	_, err = file.NewLineSink[string](out, nil, file.OnExisting(file.Replace)).Build(ctx, out, nil)
	check("a second Build", err)
	check("a second flow", run(t, copyFlow(in, out, file.OnExisting(file.Append)), 2))
	// The same file under another spelling of its path.
	rel, err := filepath.Rel(mustGetwd(t), filepath.Join(dir, ".", "out.txt"))
	if err != nil {
		t.Fatal(err)
	}
	check("a second flow by a relative path", run(t, copyFlow(in, rel, file.OnExisting(file.Replace)), 1))

	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	if err := run(t, copyFlow(in, out, file.OnExisting(file.Append)), 2); err != nil {
		t.Fatalf("after the first sink closed: %v", err)
	}
	if got := readFile(t, out); got != "first\na\nb\n" {
		t.Fatalf("after the first sink closed: %q", got)
	}

	// Two sinks of one flow on one file.
	f := dataflow.New("twice")
	lines := dataflow.Input(f, "read", file.Lines(in))
	dataflow.Output("one", lines, file.WriteLines(out, file.OnExisting(file.Replace)))
	dataflow.Output("two", lines, file.WriteLines(out, file.OnExisting(file.Replace)))
	if err := run(t, f, 1); !errors.Is(err, file.ErrInUse) {
		t.Fatalf("two sinks of one flow on one file: %v, want ErrInUse", err)
	}
}

func mustGetwd(t *testing.T) string {
	t.Helper()
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	return wd
}

// Partitions are keyed by absolute, cleaned paths, sources' and sinks' alike: one file under two
// spellings is listed twice, and a run resumed from another working directory with the same
// relative paths is refused, naming the stored partition and the listed one, instead of
// resuming onto another file.
func TestPartitionsAreAbsolutePaths(t *testing.T) {
	dirA, dirB := t.TempDir(), t.TempDir()
	write(t, filepath.Join(dirA, "in.txt"), "x y\n")
	t.Chdir(dirA)
	ctx := context.Background()
	parts, err := file.NewLineSource("in.txt").Parts(ctx)
	if err != nil || !slices.Equal(parts, []string{filepath.Join(dirA, "in.txt")}) {
		t.Fatalf("Lines(in.txt).Parts in %s: %q, %v", dirA, parts, err)
	}
	parts, err = file.NewDirSource(".", "*.txt").Parts(ctx)
	if err != nil || !slices.Equal(parts, []string{filepath.Join(dirA, "in.txt")}) {
		t.Fatalf("Dir(.).Parts in %s: %q, %v", dirA, parts, err)
	}
	parts, err = file.NewLineSink[string]("sub/../out.txt", nil).Parts(ctx)
	if err != nil || !slices.Equal(parts, []string{filepath.Join(dirA, "out.txt")}) {
		t.Fatalf("LinesOut(sub/../out.txt).Parts in %s: %q, %v", dirA, parts, err)
	}
	if _, err := readAll(t, file.Lines("in.txt", "./in.txt"), 1); err == nil || !strings.Contains(err.Error(), "listed twice") {
		t.Fatalf("one file under two spellings: %v", err)
	}

	input := filepath.Join(dirA, "in.txt")
	storeDir := filepath.Join(t.TempDir(), "store")
	runIn := func() error {
		st, err := recovery.OpenSQLite(ctx, storeDir, recovery.SQLiteOptions{})
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
		return dataflow.Run(ctx, copyFlow(input, "out.txt"), dataflow.Options{Workers: 1, EpochInterval: time.Millisecond,
			Recovery: st, Logger: slog.New(slog.DiscardHandler)})
	}
	if err := runIn(); err != nil {
		t.Fatal(err)
	}
	precious := strings.Repeat("another file\n", 10) // longer than what the run wrote
	write(t, filepath.Join(dirB, "out.txt"), precious)
	t.Chdir(dirB)
	err = runIn()
	if err == nil {
		t.Fatalf("resume from another working directory: no error; %s holds %q", filepath.Join(dirB, "out.txt"), readFile(t, filepath.Join(dirB, "out.txt")))
	}
	for _, want := range []string{fmt.Sprintf("%q", filepath.Join(dirA, "out.txt")), fmt.Sprintf("%q", filepath.Join(dirB, "out.txt")), "working directory", "new recovery directory"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the refusal does not say %s: %v", want, err)
		}
	}
	if got := readFile(t, filepath.Join(dirB, "out.txt")); got != precious {
		t.Errorf("the refused resume changed %s to %q", filepath.Join(dirB, "out.txt"), got)
	}
	if got := readFile(t, filepath.Join(dirA, "out.txt")); got != "x y\n" {
		t.Errorf("the refused resume changed %s to %q", filepath.Join(dirA, "out.txt"), got)
	}
}

// A sink's partition is its file's path with symbolic links resolved: a resume through a
// symbolic link that now points elsewhere (a "current" link switched to another release) is
// refused, naming the file written and the file the link leads to now, instead of cutting
// that other file back to the committed length and writing on in it.
func TestResumeThroughARepointedLinkIsRefused(t *testing.T) {
	dirA, dirB, base := t.TempDir(), t.TempDir(), t.TempDir()
	input := write(t, filepath.Join(base, "in.txt"), "x y\n")
	link := filepath.Join(base, "current")
	if err := os.Symlink(dirA, link); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(link, "out.txt")
	ctx := context.Background()
	parts, err := file.NewLineSink[string](out, nil).Parts(ctx)
	if err != nil || !slices.Equal(parts, []string{filepath.Join(dirA, "out.txt")}) {
		t.Errorf("LinesOut(%s).Parts: %q, %v, want the file the link leads to", out, parts, err)
	}
	storeDir := filepath.Join(base, "store")
	runIt := func() error {
		st, err := recovery.OpenSQLite(ctx, storeDir, recovery.SQLiteOptions{})
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
		return dataflow.Run(ctx, copyFlow(input, out), dataflow.Options{Workers: 1, EpochInterval: time.Millisecond,
			Recovery: st, Logger: slog.New(slog.DiscardHandler)})
	}
	if err := runIt(); err != nil {
		t.Fatal(err)
	}
	precious := strings.Repeat("another release\n", 10)
	write(t, filepath.Join(dirB, "out.txt"), precious)
	if err := os.Remove(link); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(dirB, link); err != nil {
		t.Fatal(err)
	}
	err = runIt()
	if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("%q", filepath.Join(dirA, "out.txt"))) ||
		!strings.Contains(err.Error(), fmt.Sprintf("%q", filepath.Join(dirB, "out.txt"))) {
		t.Errorf("resume through the repointed link: %v, want a refusal naming both files", err)
	}
	if got := readFile(t, filepath.Join(dirB, "out.txt")); got != precious {
		t.Errorf("the resume changed %s to %q", filepath.Join(dirB, "out.txt"), got)
	}
}

// A start marker is not taken for a file that replaced the one it was written for after the
// process died, even when the new file got the old one's inode number (ext4 hands a freed
// inode number out again at once): a fresh run refuses that file instead of cutting it to 0.
func TestStartMarkerOfAFileWithAReusedInode(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "out.txt")
	ctx := context.Background()
	for i := range 5 {
		p, err := file.NewLineSink[string](out, nil, file.OnExisting(file.Replace)).Build(ctx, out, nil)
		if err != nil {
			t.Fatal(err)
		}
		p.Write(ctx, []string{"uncommitted"})
		mustSnapshot(t, p)
		fi, err := os.Stat(out)
		if err != nil {
			t.Fatal(err)
		}
		p.Close() // the process died: its file is closed, the marker stays
		if err := os.Remove(out); err != nil {
			t.Fatal(err)
		}
		precious := fmt.Sprintf("restored from a backup %d\n", i)
		write(t, out, precious)
		nfi, err := os.Stat(out)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := file.NewLineSink[string](out, nil).Build(ctx, out, nil); !errors.Is(err, file.ErrNotEmpty) {
			t.Errorf("fresh run on a new file at the marker's path (same inode number: %v): %v, want ErrNotEmpty", os.SameFile(fi, nfi), err)
		}
		if got := readFile(t, out); got != precious {
			t.Fatalf("the file changed to %q", got)
		}
		os.Remove(out + ".epochflow-start")
	}
}
