package main

import (
	"context"
	"fmt"
	"net/url"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/epochflow/epochflow/internal/exampletest"
	"github.com/epochflow/epochflow/internal/pgtest"
)

// Fencing, with a recovery directory: a process stopped with SIGSTOP for longer than the peer
// timeout makes the others stop, naming it; all are started again as a new execution while
// the stopped one is resumed with SIGCONT. The stale process commits nothing and its data is
// refused: a stale non-leader only has its streams of the old execution (whose peers are
// gone), and the new process of its number waits for its address; a stale process 0 keeps the
// store's lock, so no newer execution can begin (its new process 0 is refused, ErrInUse)
// until it has failed, and the stale one never announces a commit to the new processes (its
// streams are taken; a second is refused). The output stays exact.
func TestClusterFencesAStoppedProcess(t *testing.T) {
	for _, victim := range []int{1, 0} {
		t.Run(fmt.Sprint("process", victim), func(t *testing.T) {
			dir := t.TempDir()
			testFencing(t, filepath.Join(dir, "store"), victim)
		})
	}
}

// The same for process 0 with a PostgreSQL store (its advisory lock and execution check).
func TestClusterFencesAStoppedLeaderWithPostgres(t *testing.T) {
	pg, err := pgtest.Start()
	if err != nil {
		t.Fatal(err) // never skip: the tests need the PostgreSQL server binaries
	}
	defer pg.Stop()
	dsn, err := pg.CreateDB(context.Background(), "cluster_fence")
	if err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("schema", "counts")
	u.RawQuery = q.Encode()
	testFencing(t, u.String(), 0)
}

func testFencing(t *testing.T, rec string, victim int) {
	bin := buildBinary(t)
	dir := t.TempDir()
	input := filepath.Join(dir, "input.txt")
	writeText(t, input, 5_000_000, 10_000, 17)
	want := coreutilsCounts(t, input)
	absent := filepath.Join(dir, "absent", "store")
	out := filepath.Join(dir, "out.txt")
	addrs := freeAddrs(t, 3)

	old := recoveryCluster(t, bin, addrs, input, out, rec, absent)
	for _, p := range old {
		p.waitLog(t, "connected to every peer", 1, time.Minute)
	}
	old[0].waitCommitted(t, 2, time.Minute)
	stale := old[victim]
	if err := stale.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	for i, p := range old {
		if i == victim {
			continue
		}
		code := p.waitExit(t, time.Minute)
		if code == 0 {
			// The flow finished before the signal: nothing to fence.
			stale.cmd.Process.Signal(syscall.SIGCONT)
			t.Fatalf("process %d finished before process %d was stopped: give the test a bigger input", i, victim)
		}
		if took := p.ended.Sub(stopped); took > stopBound {
			t.Errorf("process %d took %v to stop after process %d was stopped, the bound is %v", i, took, victim, stopBound)
		}
		if log := p.stderr.String(); !strings.Contains(log, fmt.Sprintf("process %d (", victim)) {
			t.Errorf("process %d's error does not name process %d:\n%s", i, victim, log)
		}
	}

	// A new execution, while the stale process still holds its address (and, process 0, the
	// store).
	fresh := make([]*proc, len(addrs))
	for p := range addrs {
		if p == victim {
			continue
		}
		store := absent
		if p == 0 {
			store = rec
		}
		fresh[p] = startProc(t, bin, []string{secretEnv}, nil, clusterArgs(addrs, p, "-input", input, "-output", out,
			"-recovery", store, "-peer-timeout", clusterPeerTimeout.String())...)
	}
	start := func() *proc {
		store := absent
		if victim == 0 {
			store = rec
		}
		return startProc(t, bin, []string{secretEnv}, nil, clusterArgs(addrs, victim, "-input", input, "-output", out,
			"-recovery", store, "-peer-timeout", clusterPeerTimeout.String())...)
	}
	fresh[victim] = start()
	if victim == 0 {
		// The stale process 0 holds the store: the new one is refused, and no newer
		// execution begins while the stale one could still commit.
		if code := fresh[0].waitExit(t, time.Minute); code == 0 || !strings.Contains(fresh[0].stderr.String(), "in use") {
			t.Fatalf("a new process 0 ran beside the stale one that holds the store: exit %d\n%s", code, fresh[0].stderr.String())
		}
	} else {
		fresh[victim].waitLog(t, "waiting for this process's address to be free", 1, time.Minute)
	}
	if err := stale.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	if code := stale.waitExit(t, time.Minute); code == 0 {
		t.Fatalf("the stale process %d exited 0 after SIGCONT\n%s", victim, stale.stderr.String())
	}
	if log := stale.stderr.String(); strings.Contains(log, "refused a second stream") {
		t.Logf("the stale process refused a new process's stream")
	}
	if victim == 0 {
		fresh[0] = start() // the stale one is gone: the new execution begins
	}
	finishCluster(t, fresh, "the new execution")
	if !strings.Contains(fresh[0].stderr.String(), "resuming from the recovery store") {
		t.Errorf("the new execution did not resume from the epochs committed before the stop:\n%s", fresh[0].stderr.String())
	}
	if d := exampletest.Diff(exampletest.SortedLines(t, out), want); d != "" {
		t.Fatalf("after fencing process %d: %s", victim, d)
	}
}
