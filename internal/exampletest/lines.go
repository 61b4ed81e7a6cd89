package exampletest

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
)

// SortedLines returns the lines of the file at path, sorted (none for an empty file).
func SortedLines(t testing.TB, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) == 0 {
		return nil
	}
	lines := strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
	slices.Sort(lines)
	return lines
}

// Diff describes the first difference between got and want (their lengths, or the first line
// that differs), "" when they are equal.
func Diff(got, want []string) string {
	if len(got) != len(want) {
		return fmt.Sprintf("%d lines, want %d", len(got), len(want))
	}
	for i := range got {
		if got[i] != want[i] {
			return fmt.Sprintf("line %d: %q, want %q", i, got[i], want[i])
		}
	}
	return ""
}
