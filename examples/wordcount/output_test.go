package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/epochflow/epochflow/internal/exampletest"
)

// exitCode returns the exit status of a finished command (0 for a nil error).
func exitCode(t *testing.T, err error) int {
	t.Helper()
	if err == nil {
		return 0
	}
	ee, ok := err.(*exec.ExitError)
	if !ok {
		t.Fatal(err)
	}
	return ee.ExitCode()
}

// A run with -recovery resumed from another working directory, with the same relative -output,
// is refused (exit 1) with an error naming the partition the store holds and the one the run
// lists, instead of resuming onto the other directory's file; both files are left as they were.
func TestResumeFromAnotherDirectoryIsRefused(t *testing.T) {
	bin := buildBinary(t)
	dir := t.TempDir()
	dirA, dirB := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	for _, d := range []string{dirA, dirB} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	input := filepath.Join(dir, "input.txt")
	writeText(t, input, 20_000, 500, 4)
	args := []string{"-input", input, "-output", "out.txt", "-recovery", filepath.Join(dir, "store"), "-epoch-interval", "20ms", "-log-level", "warn"}
	first := flowCommand(bin, args...)
	first.Dir = dirA
	if b, err := first.CombinedOutput(); err != nil {
		t.Fatalf("run in %s: %v\n%s", dirA, err, b)
	}
	outA, outB := filepath.Join(dirA, "out.txt"), filepath.Join(dirB, "out.txt")
	wroteA, err := os.ReadFile(outA)
	if err != nil {
		t.Fatal(err)
	}
	// Another file of the same name in the other directory, longer than what the run wrote
	// (a resume onto it would cut it to the committed length and write on).
	other := strings.Repeat("another file's line\n", 2*len(wroteA)/20+1)
	if err := os.WriteFile(outB, []byte(other), 0o644); err != nil {
		t.Fatal(err)
	}
	second := flowCommand(bin, args...)
	second.Dir = dirB
	b, err := second.CombinedOutput()
	if code := exitCode(t, err); code != 1 {
		t.Fatalf("resume from %s: exit %d, want 1\n%s", dirB, code, b)
	}
	for _, want := range []string{strconv.Quote(outA), strconv.Quote(outB), "working directory", "new recovery directory"} {
		if !strings.Contains(string(b), want) {
			t.Errorf("the refusal does not say %s:\n%s", want, b)
		}
	}
	if now, _ := os.ReadFile(outB); string(now) != other {
		t.Errorf("the refused resume changed %s (%d bytes, were %d)", outB, len(now), len(other))
	}
	if now, _ := os.ReadFile(outA); string(now) != string(wroteA) {
		t.Errorf("the refused resume changed %s", outA)
	}
}

// A second run without -recovery on the output of a first one is refused (exit 1) naming the
// file and -output-exists, and leaves it as it was; with -output-exists replace it runs.
func TestFreshRunRefusesEarlierCounts(t *testing.T) {
	bin := buildBinary(t)
	out := filepath.Join(t.TempDir(), "out.txt")
	if b, err := flowCommand(bin, "-input", "sample.txt", "-output", out).CombinedOutput(); err != nil {
		t.Fatalf("first run: %v\n%s", err, b)
	}
	want := exampletest.SortedLines(t, out)
	b, err := flowCommand(bin, "-input", "sample.txt", "-output", out).CombinedOutput()
	if code := exitCode(t, err); code != 1 || !strings.Contains(string(b), out) || !strings.Contains(string(b), "-output-exists replace") {
		t.Fatalf("second run: exit %d, want 1 with an error naming %s and -output-exists\n%s", code, out, b)
	}
	if d := exampletest.Diff(exampletest.SortedLines(t, out), want); d != "" {
		t.Fatalf("the refused run changed the output: %s", d)
	}
	if b, err := flowCommand(bin, "-input", "sample.txt", "-output", out, "-output-exists", "replace").CombinedOutput(); err != nil {
		t.Fatalf("run with -output-exists replace: %v\n%s", err, b)
	}
	if d := exampletest.Diff(exampletest.SortedLines(t, out), want); d != "" {
		t.Fatalf("after -output-exists replace: %s", d)
	}
}
