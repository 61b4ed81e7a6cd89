package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/epochflow/epochflow/internal/exampletest"
)

// writeText writes words words (lines of 1..20 words, random white space) drawn from a
// vocabulary of vocab words.
func writeText(t *testing.T, path string, words, vocab int, seed uint64) {
	t.Helper()
	r := rand.New(rand.NewPCG(seed, 7))
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	w := bufio.NewWriter(f)
	spaces := []string{" ", "  ", "\t", " \t "}
	for i := 0; i < words; {
		n := 1 + r.IntN(20)
		for j := 0; j < n && i < words; j++ {
			if j > 0 {
				w.WriteString(spaces[r.IntN(len(spaces))])
			}
			fmt.Fprintf(w, "w%d", int(r.ExpFloat64()*float64(vocab)/6)%vocab)
			i++
		}
		w.WriteString("\n")
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	f.Close()
}

// coreutilsCounts runs tr | sort | uniq -c and returns "word\tcount" lines, sorted.
func coreutilsCounts(t *testing.T, input string) []string {
	t.Helper()
	cmd := exec.Command("sh", "-c", "tr -s '[:space:]' '\\n' < \"$1\" | sort | uniq -c", "sh", input)
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	out, err := cmd.Output()
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(l)
		if len(f) != 2 {
			continue // the empty word tr makes of leading white space
		}
		lines = append(lines, f[1]+"\t"+f[0])
	}
	sort.Strings(lines)
	return lines
}

// The example's counts equal those of tr | sort | uniq -c on a 1 MB text, with 1, 2 and 4
// workers, and through standard input and output too.
func TestWordcountMatchesCoreutils(t *testing.T) {
	bin := buildBinary(t)
	dir := t.TempDir()
	input := filepath.Join(dir, "input.txt")
	writeText(t, input, 190_000, 5_000, 1) // about 1 MB
	if st, _ := os.Stat(input); st.Size() < 1<<20 {
		t.Fatalf("input is %d bytes, want at least 1 MB", st.Size())
	}
	want := coreutilsCounts(t, input)
	for _, workers := range []int{1, 2, 4} {
		out := filepath.Join(dir, fmt.Sprintf("out-%d.txt", workers))
		cmd := flowCommand(bin, "-input", input, "-output", out, "-workers", strconv.Itoa(workers))
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("workers=%d: %v\n%s", workers, err, b)
		}
		if d := exampletest.Diff(exampletest.SortedLines(t, out), want); d != "" {
			t.Errorf("workers=%d: %s", workers, d)
		}
	}
	in, err := os.Open(input)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	cmd := flowCommand(bin, "-workers", "2")
	cmd.Stdin = in
	var stdout bytes.Buffer
	cmd.Stdout = &stdout
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	got := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	sort.Strings(got)
	if d := exampletest.Diff(got, want); d != "" {
		t.Errorf("stdin to stdout: %s", d)
	}
}

// Killed with SIGKILL at 30 random moments and restarted each time with the same recovery
// store, the example still writes exactly the crash-free counts: the same words, the same
// counts, no line twice.
func TestWordcountSurvivesKill9(t *testing.T) {
	bin := buildBinary(t)
	dir := t.TempDir()
	input := filepath.Join(dir, "input.txt")
	writeText(t, input, 2_000_000, 10_000, 2)
	run := func(out, rec string, workers int) *exec.Cmd {
		cmd := flowCommand(bin, "-input", input, "-output", out, "-recovery", rec,
			"-epoch-interval", "50ms", "-workers", strconv.Itoa(workers), "-log-level", "warn")
		cmd.Stderr = os.Stderr
		return cmd
	}
	clean := filepath.Join(dir, "clean.txt")
	start := time.Now()
	if err := run(clean, filepath.Join(dir, "clean-store"), 2).Run(); err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	want := exampletest.SortedLines(t, clean)
	if d := exampletest.Diff(want, coreutilsCounts(t, input)); d != "" {
		t.Fatalf("crash-free run: %s", d)
	}

	out := filepath.Join(dir, "out.txt")
	rec := filepath.Join(dir, "store")
	r := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 3))
	kills, finished := 0, false
	for kills < 30 {
		cmd := run(out, rec, 1+r.IntN(3))
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		wait := make(chan error, 1)
		go func() { wait <- cmd.Wait() }()
		// A random moment of the run; runs that resume have less left to do, so some kills
		// land early, while it opens the store and reads the snapshots.
		at := time.Duration(r.Int64N(int64(took)))
		select {
		case err := <-wait:
			if err != nil {
				t.Fatalf("run %d: %v", kills, err)
			}
			finished = true
		case <-time.After(at):
			cmd.Process.Signal(syscall.SIGKILL)
			<-wait
			kills++
		}
		if finished {
			// It finished before the kill: start over on a fresh store and a new output
			// file, to land the remaining kills in a run.
			os.RemoveAll(rec)
			finished = false
			if d := exampletest.Diff(exampletest.SortedLines(t, out), want); d != "" {
				t.Fatalf("after %d kills, a run that finished wrote: %s", kills, d)
			}
			os.Remove(out)
		}
	}
	if err := run(out, rec, 2).Run(); err != nil {
		t.Fatal(err)
	}
	if d := exampletest.Diff(exampletest.SortedLines(t, out), want); d != "" {
		t.Fatalf("after %d kills: %s", kills, d)
	}
	t.Logf("%d kills; a crash-free run took %v", kills, took)
}

// SIGTERM stops the example gracefully: it exits 0 with its epoch committed, and the next run
// resumes from the store and writes exactly the right counts.
func TestWordcountSIGTERMStopsAndResumes(t *testing.T) {
	bin := buildBinary(t)
	dir := t.TempDir()
	input := filepath.Join(dir, "input.txt")
	writeText(t, input, 2_000_000, 10_000, 3)
	want := coreutilsCounts(t, input)
	out := filepath.Join(dir, "out.txt")
	rec := filepath.Join(dir, "store")
	args := []string{"-input", input, "-output", out, "-recovery", rec, "-epoch-interval", "50ms", "-workers", "2"}

	// The signal must land while the flow runs: a run that finished first (a fast machine)
	// is thrown away and the next one is signalled sooner. The delay counts from the
	// "running" line, so a slow start (a loaded CI machine) does not eat it.
	var stderr bytes.Buffer
	for _, delay := range []time.Duration{300 * time.Millisecond, 150 * time.Millisecond, 60 * time.Millisecond, 20 * time.Millisecond, 0} {
		os.RemoveAll(rec)
		os.Remove(out)
		w := newWatchWriter("msg=running")
		cmd := flowCommand(bin, args...)
		cmd.Stderr = w
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		wait := make(chan error, 1)
		go func() { wait <- cmd.Wait() }()
		var err error
		select {
		case <-w.seen:
			time.Sleep(delay)
			cmd.Process.Signal(syscall.SIGTERM)
			err = <-wait
		case err = <-wait:
		}
		stderr.Reset()
		stderr.WriteString(w.String())
		if err != nil {
			t.Fatalf("after SIGTERM: %v, want exit 0\n%s", err, stderr.String())
		}
		// A signal that lands as the sources end finds nothing left to stop: the run
		// finishes ("stopping", then "finished"), and the next one is signalled sooner.
		if strings.Contains(stderr.String(), "stopping") && !strings.Contains(stderr.String(), `msg="finished`) {
			break
		}
	}
	if !strings.Contains(stderr.String(), "stopping") || strings.Contains(stderr.String(), `msg="finished`) {
		t.Fatalf("every run finished before SIGTERM took effect; stderr of the last:\n%s", stderr.String())
	}
	if !strings.Contains(stderr.String(), `msg="stopped by a signal: what was written up to the last committed epoch is final`) ||
		!strings.Contains(stderr.String(), "committed_epoch=") {
		t.Errorf("the stopped run's closing line does not say what it kept:\n%s", stderr.String())
	}
	stderr.Reset()
	cmd := flowCommand(bin, args...)
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("resumed run: %v\n%s", err, stderr.String())
	}
	if !strings.Contains(stderr.String(), "resuming from the recovery store") {
		t.Errorf("the second run did not resume:\n%s", stderr.String())
	}
	if d := exampletest.Diff(exampletest.SortedLines(t, out), want); d != "" {
		t.Fatalf("after a stop and a resume: %s", d)
	}
}

// A second run on a recovery store that a running process holds is refused with a message
// that says so (it would overwrite the first run's epochs); the first run is unharmed.
func TestSecondRunOnAStoreInUseIsRefused(t *testing.T) {
	bin := buildBinary(t)
	dir := t.TempDir()
	rec := filepath.Join(dir, "store")
	first := flowCommand(bin, "-recovery", rec, "-output", filepath.Join(dir, "out1.txt"))
	stdin, err := first.StdinPipe() // the first run reads stdin, which stays open
	if err != nil {
		t.Fatal(err)
	}
	firstErr := newWatchWriter("msg=running") // logged once the store is open and locked
	first.Stderr = firstErr
	if err := first.Start(); err != nil {
		t.Fatal(err)
	}
	defer first.Process.Kill()
	select {
	case <-firstErr.seen:
	case <-time.After(30 * time.Second):
		t.Fatalf("the first run did not start within 30 s:\n%s", firstErr.String())
	}
	second := flowCommand(bin, "-recovery", rec, "-input", "sample.txt", "-output", filepath.Join(dir, "out2.txt"))
	out, err := second.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "in use") || !strings.Contains(string(out), rec) {
		t.Fatalf("second run on a store in use: %v\n%s", err, out)
	}
	io.WriteString(stdin, "a b a\n")
	stdin.Close()
	if err := first.Wait(); err != nil {
		t.Fatalf("first run: %v\n%s", err, firstErr.String())
	}
	if d := exampletest.Diff(exampletest.SortedLines(t, filepath.Join(dir, "out1.txt")), []string{"a\t2", "b\t1"}); d != "" {
		t.Fatalf("first run wrote: %s", d)
	}
}

// watchWriter collects what a process writes and closes seen when a line containing want
// has been written; it is safe for the process's copying goroutine and the test to share.
type watchWriter struct {
	mu    sync.Mutex
	buf   bytes.Buffer
	want  string
	seen  chan struct{}
	done  bool
	conds []watchCond
}

// watchCond is a condition of when: a test of what is written, and the channel to close.
type watchCond struct {
	test func(string) bool
	ch   chan struct{}
}

// when returns a channel that is closed once a write from now on passes test (which sees
// each write's text on its own: the process writes whole lines).
func (w *watchWriter) when(test func(string) bool) <-chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	ch := make(chan struct{})
	w.conds = append(w.conds, watchCond{test: test, ch: ch})
	return ch
}

func newWatchWriter(want string) *watchWriter {
	return &watchWriter{want: want, seen: make(chan struct{})}
}

func (w *watchWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	if !w.done && strings.Contains(w.buf.String(), w.want) {
		w.done = true
		close(w.seen)
	}
	kept := w.conds[:0]
	for _, c := range w.conds {
		if c.test(string(p)) {
			close(c.ch)
		} else {
			kept = append(kept, c)
		}
	}
	w.conds = kept
	return len(p), nil
}

func (w *watchWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

// flowCommand is exec.Command for a run of the example that is killed if it has not ended
// after 3 minutes: a run that hangs fails its test, with the error of the killed run, instead
// of stalling the package until the test binary's own timeout.
func flowCommand(bin string, args ...string) *exec.Cmd {
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(3*time.Minute, cancel)
	return exec.CommandContext(ctx, bin, args...)
}
