package main

import (
	"bufio"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/epochflow/epochflow/internal/exampletest"
)

// Sizes: CLICKS_EVENTS (default 1,000,000) and CLICKS_KILLS
// (default 20): about a minute with -race on a quiet machine; smaller values for quick runs.
func sizeKnob(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// flowCommand is exec.Command for a run that is killed if it has not ended after 3 minutes.
func flowCommand(bin string, args ...string) *exec.Cmd {
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(3*time.Minute, cancel)
	return exec.CommandContext(ctx, bin, args...)
}

type gen struct {
	at   time.Time
	user string
}

// writeClicks writes n clicks of users users on a clock that moves 0..20 ms per click, each
// behind the clock by less than wait: the disorder stays within the wait.
func writeClicks(t *testing.T, path string, n, users int, wait time.Duration, seed uint64) []gen {
	t.Helper()
	r := rand.New(rand.NewPCG(seed, 11))
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	w := bufio.NewWriter(f)
	clock := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	out := make([]gen, n)
	for i := range out {
		clock = clock.Add(time.Duration(r.IntN(21)) * time.Millisecond)
		at := clock.Add(-time.Duration(r.Int64N(int64(wait))))
		out[i] = gen{at: at, user: fmt.Sprint("u", int(r.ExpFloat64()*float64(users)/5)%users)}
		fmt.Fprintf(w, "%s\t%s\n", at.Format(time.RFC3339Nano), out[i].user)
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	f.Close()
	return out
}

func line(user string, start, end time.Time, n int) string {
	return fmt.Sprintf("%s\t%s\t%s\t%d", user, start.Format(time.RFC3339Nano), end.Format(time.RFC3339Nano), n)
}

// plainTumbling, plainSliding and plainSessions compute the expected lines with plain loops.
func plainTumbling(clicks []gen, length time.Duration) []string {
	counts := map[string]int{}
	for _, c := range clicks {
		start := time.Unix(0, c.at.UnixNano()-c.at.UnixNano()%int64(length)).UTC()
		counts[line(c.user, start, start.Add(length), 0)]++
	}
	return fill(counts)
}

func plainSliding(clicks []gen, length, slide time.Duration) []string {
	counts := map[string]int{}
	for _, c := range clicks {
		t := c.at.UnixNano()
		for s := t - t%int64(slide); s > t-int64(length); s -= int64(slide) {
			start := time.Unix(0, s).UTC()
			counts[line(c.user, start, start.Add(length), 0)]++
		}
	}
	return fill(counts)
}

func plainSessions(clicks []gen, gap time.Duration) []string {
	byUser := map[string][]time.Time{}
	for _, c := range clicks {
		byUser[c.user] = append(byUser[c.user], c.at)
	}
	var out []string
	for user, ts := range byUser {
		slices.SortFunc(ts, func(a, b time.Time) int { return a.Compare(b) })
		start, last, n := ts[0], ts[0], 1
		for _, t := range ts[1:] {
			if t.Sub(last) < gap {
				last, n = t, n+1
				continue
			}
			out = append(out, line(user, start, last.Add(gap), n))
			start, last, n = t, t, 1
		}
		out = append(out, line(user, start, last.Add(gap), n))
	}
	slices.Sort(out)
	return out
}

// fill turns "user\tstart\tend\t0" keys with their counts into sorted lines.
func fill(counts map[string]int) []string {
	var out []string
	for k, n := range counts {
		out = append(out, strings.TrimSuffix(k, "0")+strconv.Itoa(n))
	}
	slices.Sort(out)
	return out
}

// The example's tumbling, sliding and session counts equal plain loops' over a generated file
// whose disorder stays within -wait, with 1, 2 and 4 workers; no click is late.
func TestClicksMatchPlainCounts(t *testing.T) {
	bin := buildBinary(t)
	dir := t.TempDir()
	input := filepath.Join(dir, "clicks.tsv")
	clicks := writeClicks(t, input, sizeKnob("CLICKS_EVENTS", 1_000_000), 1000, 2*time.Second, 1)
	for _, tc := range []struct {
		name string
		args []string
		want []string
	}{
		{"tumbling", []string{"-window", "1m"}, plainTumbling(clicks, time.Minute)},
		{"sliding", []string{"-window", "1m", "-slide", "20s"}, plainSliding(clicks, time.Minute, 20*time.Second)},
		{"session", []string{"-session-gap", "5s"}, plainSessions(clicks, 5*time.Second)},
	} {
		for _, workers := range []int{1, 2, 4} {
			out := filepath.Join(dir, fmt.Sprintf("%s-%d.tsv", tc.name, workers))
			late := filepath.Join(dir, fmt.Sprintf("%s-%d.late", tc.name, workers))
			args := append([]string{"-input", input, "-output", out, "-late", late, "-wait", "2s",
				"-workers", strconv.Itoa(workers), "-log-level", "warn"}, tc.args...)
			if b, err := flowCommand(bin, args...).CombinedOutput(); err != nil {
				t.Fatalf("%s, workers=%d: %v\n%s", tc.name, workers, err, b)
			}
			if d := exampletest.Diff(exampletest.SortedLines(t, out), tc.want); d != "" {
				t.Errorf("%s, workers=%d: %s", tc.name, workers, d)
			}
			if l := exampletest.SortedLines(t, late); len(l) != 0 {
				t.Errorf("%s, workers=%d: %d late clicks, want none (first %q)", tc.name, workers, len(l), l[0])
			}
		}
	}
}

// Killed with SIGKILL at random moments and restarted each time on the same recovery store
// (with 1 to 3 workers), the example writes exactly the plain session counts: every window's
// line once.
func TestClicksSurviveKill9(t *testing.T) {
	bin := buildBinary(t)
	dir := t.TempDir()
	input := filepath.Join(dir, "clicks.tsv")
	clicks := writeClicks(t, input, sizeKnob("CLICKS_EVENTS", 1_000_000), 1000, 2*time.Second, 2)
	want := plainSessions(clicks, 5*time.Second)
	run := func(out, rec string, workers int) *exec.Cmd {
		cmd := flowCommand(bin, "-input", input, "-output", out, "-recovery", rec, "-session-gap", "5s", "-wait", "2s",
			"-epoch-interval", "50ms", "-workers", strconv.Itoa(workers), "-log-level", "warn")
		cmd.Stderr = os.Stderr
		return cmd
	}
	start := time.Now()
	if err := run(filepath.Join(dir, "clean.tsv"), filepath.Join(dir, "clean-store"), 2).Run(); err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	if d := exampletest.Diff(exampletest.SortedLines(t, filepath.Join(dir, "clean.tsv")), want); d != "" {
		t.Fatalf("crash-free run: %s", d)
	}
	out, rec := filepath.Join(dir, "out.tsv"), filepath.Join(dir, "store")
	r := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 3))
	kills := 0
	for kills < sizeKnob("CLICKS_KILLS", 20) {
		cmd := run(out, rec, 1+r.IntN(3))
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		wait := make(chan error, 1)
		go func() { wait <- cmd.Wait() }()
		select {
		case err := <-wait:
			if err != nil {
				t.Fatalf("run after %d kills: %v", kills, err)
			}
			// It finished before the kill: check it, then start over to land the rest.
			if d := exampletest.Diff(exampletest.SortedLines(t, out), want); d != "" {
				t.Fatalf("after %d kills, a run that finished wrote: %s", kills, d)
			}
			os.RemoveAll(rec)
			os.Remove(out)
		case <-time.After(time.Duration(r.Int64N(int64(took)))):
			cmd.Process.Signal(syscall.SIGKILL)
			<-wait
			kills++
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
