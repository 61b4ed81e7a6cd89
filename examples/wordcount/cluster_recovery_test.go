package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/epochflow/epochflow/internal/exampletest"
	"github.com/epochflow/epochflow/internal/pgtest"
)

// clusterPeerTimeout is -peer-timeout of the clusters these tests run.
const clusterPeerTimeout = 2 * time.Second

// stopBound is how long after a peer's death the others may take to exit: the peer timeout,
// and slack for a loaded machine.
const stopBound = clusterPeerTimeout + 5*time.Second

// recoveryCluster starts wordcount on len(addrs) processes with the recovery store rec, which
// only process 0 gets: the others are given a directory that does not exist, which they
// must not need (they get the state from process 0 and send it their snapshots).
func recoveryCluster(t *testing.T, bin string, addrs []string, input, out, rec, absent string) []*proc {
	t.Helper()
	var procs []*proc
	for p := range addrs {
		store := rec
		if p != 0 {
			store = absent
		}
		procs = append(procs, startProc(t, bin, []string{secretEnv}, nil, clusterArgs(addrs, p, "-input", input,
			"-output", out, "-recovery", store, "-peer-timeout", clusterPeerTimeout.String(), "-status-interval", "50ms")...))
	}
	return procs
}

// waitCommitted waits until the process's progress lines show epoch e or a later one committed.
func (p *proc) waitCommitted(t *testing.T, e uint64, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		for _, m := range committedRE.FindAllStringSubmatch(p.stderr.String(), -1) {
			if c, _ := strconv.ParseUint(m[1], 10, 64); c >= e {
				return
			}
		}
		select {
		case <-p.done:
			t.Fatalf("%s ended before committing epoch %d; its log:\n%s", p.cmd.Args, e, p.stderr.String())
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not commit epoch %d within %v; its log:\n%s", p.cmd.Args, e, within, p.stderr.String())
		}
	}
}

// finishCluster waits for every process to exit 0.
func finishCluster(t *testing.T, procs []*proc, what string) {
	t.Helper()
	for i, p := range procs {
		if code := p.waitExit(t, 3*time.Minute); code != 0 {
			t.Fatalf("%s: process %d: exit %d\n%s", what, i, code, p.stderr.String())
		}
	}
}

// A cluster of 3 processes with a recovery directory: one random process (process 0
// included) killed with SIGKILL at 20 random moments; the others stop by themselves within
// the peer timeout's bound, naming it; all are started again, resume from process 0's store,
// and the final output is exactly the crash-free one.
func TestClusterSurvivesKill9WithADirectory(t *testing.T) {
	dir := t.TempDir()
	n := 0
	testClusterSurvivesKills(t, func() string {
		n++
		return filepath.Join(dir, fmt.Sprint("store", n))
	})
}

// The same with a PostgreSQL store on a throwaway server.
func TestClusterSurvivesKill9WithPostgres(t *testing.T) {
	pg, err := pgtest.Start()
	if err != nil {
		t.Fatal(err) // never skip: the tests need the PostgreSQL server binaries
	}
	defer pg.Stop()
	dsn, err := pg.CreateDB(context.Background(), "cluster_kill")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	testClusterSurvivesKills(t, func() string {
		n++
		u, err := url.Parse(dsn)
		if err != nil {
			t.Fatal(err)
		}
		q := u.Query()
		q.Set("schema", fmt.Sprint("counts", n))
		u.RawQuery = q.Encode()
		return u.String()
	})
}

func testClusterSurvivesKills(t *testing.T, newStore func() string) {
	bin := buildBinary(t)
	dir := t.TempDir()
	input := filepath.Join(dir, "input.txt")
	writeText(t, input, 5_000_000, 10_000, 11)
	want := coreutilsCounts(t, input)
	absent := filepath.Join(dir, "absent", "store")
	addrs := freeAddrs(t, 3)

	// A crash-free run on the cluster sets the time scale of the kills.
	clean := filepath.Join(dir, "clean.txt")
	start := time.Now()
	finishCluster(t, recoveryCluster(t, bin, addrs, input, clean, newStore(), absent), "crash-free run")
	took := time.Since(start)
	if d := exampletest.Diff(exampletest.SortedLines(t, clean), want); d != "" {
		t.Fatalf("crash-free run on 3 processes: %s", d)
	}

	out := filepath.Join(dir, "out.txt")
	rec := newStore()
	r := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 13))
	kills, finished, resumed := 0, 0, 0
	for kills < 20 {
		procs := recoveryCluster(t, bin, addrs, input, out, rec, absent)
		for _, p := range procs {
			p.waitLog(t, "connected to every peer", 1, time.Minute)
		}
		if strings.Contains(procs[0].stderr.String(), "resuming from the recovery store") {
			resumed++
		}
		victim := r.IntN(len(procs))
		at := time.Duration(r.Int64N(int64(took)))
		select {
		case <-procs[victim].done:
		case <-time.After(at):
		}
		killed := time.Now()
		procs[victim].cmd.Process.Signal(syscall.SIGKILL)
		<-procs[victim].done
		if procs[victim].cmd.ProcessState.ExitCode() == 0 {
			// It finished before the kill: check the output, then start over on a fresh
			// store and output, to land the remaining kills in a run.
			finishCluster(t, procs, fmt.Sprintf("a run that finished after %d kills", kills))
			finished++
			if d := exampletest.Diff(exampletest.SortedLines(t, out), want); d != "" {
				t.Fatalf("after %d kills, a run that finished wrote: %s", kills, d)
			}
			rec = newStore()
			os.Remove(out)
			continue
		}
		kills++
		for i, p := range procs {
			if i == victim {
				continue
			}
			code := p.waitExit(t, time.Minute)
			if took := p.ended.Sub(killed); took > stopBound {
				t.Errorf("kill %d: process %d took %v to stop after process %d was killed, the bound is %v",
					kills, i, took, victim, stopBound)
			}
			if code != 0 && !strings.Contains(p.stderr.String(), fmt.Sprintf("process %d (", victim)) {
				t.Errorf("kill %d: process %d's error does not name process %d:\n%s", kills, i, victim, p.stderr.String())
			}
		}
	}
	finishCluster(t, recoveryCluster(t, bin, addrs, input, out, rec, absent), "the last run")
	if d := exampletest.Diff(exampletest.SortedLines(t, out), want); d != "" {
		t.Fatalf("after %d kills: %s", kills, d)
	}
	if _, err := os.Stat(filepath.Dir(absent)); !os.IsNotExist(err) {
		t.Errorf("the processes other than process 0 touched their -recovery directory: %v", err)
	}
	t.Logf("%d kills, %d runs resumed from a committed epoch, %d finished before their kill; a crash-free run took %v",
		kills, resumed, finished, took)
}
