package main

import (
	"bufio"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/epochflow/epochflow/internal/exampletest"
)

// killKeys is the number of distinct words of TestWordcount1MKeysSurvivesKill9:
// EPOCHFLOW_TEST_KILL_KEYS, 1,000,000 by default.
func killKeys(t *testing.T) int {
	t.Helper()
	v := os.Getenv("EPOCHFLOW_TEST_KILL_KEYS")
	if v == "" {
		return 1_000_000
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1000 {
		t.Fatalf("EPOCHFLOW_TEST_KILL_KEYS=%q: want a number of keys, at least 1000", v)
	}
	return n
}

// writeDistinct writes 2×keys words: every word of a vocabulary of keys words once (shuffled),
// then keys words drawn at random from it, in lines of 1 to 20 words; it returns the
// "word<TAB>count" lines a count must write, sorted.
func writeDistinct(t *testing.T, path string, keys int, seed uint64) []string {
	t.Helper()
	r := rand.New(rand.NewPCG(seed, 11))
	counts := make([]int, keys)
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	w := bufio.NewWriter(f)
	perm := r.Perm(keys)
	for i := 0; i < 2*keys; {
		n := 1 + r.IntN(20)
		for j := 0; j < n && i < 2*keys; j++ {
			k := r.IntN(keys)
			if i < keys {
				k = perm[i]
			}
			if j > 0 {
				w.WriteByte(' ')
			}
			fmt.Fprintf(w, "k%d", k)
			counts[k]++
			i++
		}
		w.WriteByte('\n')
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	want := make([]string, keys)
	for k, n := range counts {
		want[k] = fmt.Sprintf("k%d\t%d", k, n)
	}
	sort.Strings(want)
	return want
}

var committedRE = regexp.MustCompile(`epoch_committed=(\d+)`)

// The word count of 1,000,000 distinct words (EPOCHFLOW_TEST_KILL_KEYS) killed with SIGKILL at
// 20 random moments and restarted each time on the same recovery store (with 1 to 3 workers)
// writes exactly the plain count in the end: every word once, with its count. The moments
// are random in two kinds, half each: a random delay after the start (while the store opens
// and the state loads, or in the first epochs), and a random delay after the run has
// committed an epoch the earlier runs had not (seen in its progress lines), so that kills
// land while later epochs are written to the store.
func TestWordcount1MKeysSurvivesKill9(t *testing.T) {
	keys := killKeys(t)
	bin := buildBinary(t)
	dir := t.TempDir()
	input := filepath.Join(dir, "input.txt")
	want := writeDistinct(t, input, keys, uint64(time.Now().UnixNano()))
	out := filepath.Join(dir, "out.txt")
	rec := filepath.Join(dir, "store")
	run := func(workers int, stderr *watchWriter) *exec.Cmd {
		cmd := flowCommand(bin, "-input", input, "-output", out, "-recovery", rec,
			"-epoch-interval", "200ms", "-status-interval", "50ms", "-workers", strconv.Itoa(workers))
		cmd.Stderr = stderr
		return cmd
	}
	r := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 5))
	var committed uint64 // the newest committed epoch a progress line has shown
	kills, finished, afterCommit := 0, 0, 0
	for kills < 20 {
		stderr := newWatchWriter("msg=running")
		cmd := run(1+r.IntN(3), stderr)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		wait := make(chan error, 1)
		go func() { wait <- cmd.Wait() }()
		// The condition to wait for: the start, or a commit newer than any seen so far.
		var cond <-chan struct{} = stderr.seen
		kind := r.IntN(2)
		if kind == 1 {
			cond = stderr.when(func(s string) bool {
				for _, m := range committedRE.FindAllStringSubmatch(s, -1) {
					if e, _ := strconv.ParseUint(m[1], 10, 64); e > committed {
						return true
					}
				}
				return false
			})
		}
		var err error
		ended := false
		select {
		case err = <-wait:
			ended = true
		case <-cond:
			delay := time.Duration(r.Int64N(int64(400 * time.Millisecond)))
			select {
			case err = <-wait:
				ended = true
			case <-time.After(delay):
				cmd.Process.Signal(syscall.SIGKILL)
				<-wait
				kills++
				if kind == 1 {
					afterCommit++
				}
			}
		}
		for _, m := range committedRE.FindAllStringSubmatch(stderr.String(), -1) {
			e, _ := strconv.ParseUint(m[1], 10, 64)
			committed = max(committed, e)
		}
		if ended {
			if err != nil {
				t.Fatalf("run after %d kills: %v\n%s", kills, err, stderr.String())
			}
			// It finished before the kill: check it, then start over on a fresh store and
			// output, to land the remaining kills in a run.
			finished++
			if d := exampletest.Diff(exampletest.SortedLines(t, out), want); d != "" {
				t.Fatalf("after %d kills, a run that finished wrote: %s", kills, d)
			}
			os.RemoveAll(rec)
			os.Remove(out)
			committed = 0
		}
	}
	stderr := newWatchWriter("msg=running")
	if err := run(2, stderr).Run(); err != nil {
		t.Fatalf("last run: %v\n%s", err, stderr.String())
	}
	if d := exampletest.Diff(exampletest.SortedLines(t, out), want); d != "" {
		t.Fatalf("after %d kills: %s", kills, d)
	}
	t.Logf("%d keys: %d kills (%d after a new commit), %d runs finished before their kill; the newest committed epoch seen: %d",
		keys, kills, afterCommit, finished, committed)
}
