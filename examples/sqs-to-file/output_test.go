package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/epochflow/epochflow/internal/sqstest"
)

// A second run with a new -recovery on the output of a first one is refused (exit 1) naming the
// file and -output-exists, before it deletes any message: the file keeps the first run's lines
// and the queue the second batch. With -output-exists append, the next run adds that batch.
func TestFreshRunKeepsEarlierOutput(t *testing.T) {
	t.Parallel()
	bin := buildBinary(t)
	queue := emu.MustQueue(t, "exists", sqstest.QueueOptions{Visibility: 3 * time.Second})
	want := sendNumbered(t, queue, 50)
	dir := t.TempDir()
	out := filepath.Join(dir, "out.txt")
	if err := command(bin, queue, out, filepath.Join(dir, "rec1"), 2*time.Second).Run(); err != nil {
		t.Fatalf("first run: %v", err)
	}
	checkOutput(t, out, queue, want)
	first, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	more := make([]string, 50)
	for i := range more {
		more[i] = fmt.Sprintf("m%05d", i)
	}
	if err := emu.SendBodies(context.Background(), queue, "g", more...); err != nil {
		t.Fatal(err)
	}

	second := command(bin, queue, out, filepath.Join(dir, "rec2"), 2*time.Second)
	var stderr bytes.Buffer
	second.Stderr = &stderr
	err = second.Run()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 {
		t.Fatalf("second run on the first one's output: %v, want exit 1\n%s", err, stderr.String())
	}
	for _, want := range []string{out, "-output-exists replace", "-output-exists append"} {
		if !strings.Contains(stderr.String(), want) {
			t.Errorf("the refusal does not say %q:\n%s", want, stderr.String())
		}
	}
	if now, err := os.ReadFile(out); err != nil || !bytes.Equal(now, first) {
		t.Fatalf("the refused run changed the output (%d bytes, were %d): %v", len(now), len(first), err)
	}
	if vis, inFlight, err := emu.Counts(queue); err != nil || vis+inFlight != len(more) {
		t.Fatalf("after the refused run the queue holds %d visible and %d in-flight messages (%v), want the %d sent for it",
			vis, inFlight, err, len(more))
	}

	third := command(bin, queue, out, filepath.Join(dir, "rec3"), 5*time.Second)
	third.Args = append(third.Args, "-output-exists", "append")
	if err := third.Run(); err != nil {
		t.Fatalf("run with -output-exists append: %v", err)
	}
	checkOutput(t, out, queue, append(want, more...))
}
