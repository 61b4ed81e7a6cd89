package main

import (
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/epochflow/epochflow/internal/exampletest"
)

// resumedRE finds the committed epoch a run resumed after.
var resumedRE = regexp.MustCompile(`msg="resuming from the recovery store".* committed_epoch=(\d+)`)

// Rescaling: a flow stopped with SIGTERM on 3 processes resumes on 2, is stopped again and
// resumes on 1 process (no -addresses); another stopped on 1 process resumes on 3. State is
// routed by key over the new number of workers and the file partitions are reassigned; the
// final output is exactly the crash-free one.
func TestClusterRescales(t *testing.T) {
	bin := buildBinary(t)
	dir := t.TempDir()
	input := filepath.Join(dir, "input.txt")
	writeText(t, input, 6_000_000, 10_000, 23)
	want := coreutilsCounts(t, input)
	absent := filepath.Join(dir, "absent", "store")
	r := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 29))

	// stage runs the flow on n processes (alone, without -addresses, when n is 1) on store
	// rec; with stop, it stops it with SIGTERM (to a random process) once process 0 has
	// committed an epoch past the one it resumed after. It returns process 0's log.
	stage := func(n int, out, rec string, stop bool) string {
		var procs []*proc
		victim := -1
		if n == 1 {
			procs = []*proc{startProc(t, bin, nil, nil, "-input", input, "-output", out, "-recovery", rec, "-workers", "2",
				"-epoch-interval", "50ms", "-status-interval", "50ms")}
		} else {
			procs = recoveryCluster(t, bin, freeAddrs(t, n), input, out, rec, absent)
		}
		if stop {
			var after uint64
			procs[0].waitLog(t, "msg=running", 1, time.Minute)
			if m := resumedRE.FindStringSubmatch(procs[0].stderr.String()); m != nil {
				after, _ = strconv.ParseUint(m[1], 10, 64)
			}
			procs[0].waitCommitted(t, after+2, time.Minute)
			victim = r.IntN(n)
			procs[victim].cmd.Process.Signal(syscall.SIGTERM)
		}
		finishCluster(t, procs, "a stage of "+strconv.Itoa(n)+" processes")
		log := procs[0].stderr.String()
		if stop && !strings.Contains(log, "stopped by a signal") {
			t.Fatalf("the run on %d processes finished before SIGTERM took effect: give the test a bigger input\n%s", n, log)
		}
		// Each process says what stopped it: the signal, or the signal to the process named.
		for i, p := range procs {
			want := `msg="stopped by a signal:`
			if i != victim {
				want = fmt.Sprintf(`msg="stopped with the cluster, as process %d was stopped by a signal:`, victim)
			}
			if stop && !strings.Contains(p.stderr.String(), want) {
				t.Errorf("process %d of %d (process %d got SIGTERM) does not log %q; its log:\n%s", i, n, victim, want, p.stderr.String())
			}
		}
		return log
	}
	for _, chain := range [][]int{{3, 2, 1}, {1, 3}} {
		name := strconv.Itoa(chain[0])
		for _, n := range chain[1:] {
			name += "to" + strconv.Itoa(n)
		}
		t.Run(name, func(t *testing.T) {
			out := filepath.Join(dir, name+".txt")
			rec := filepath.Join(dir, name+"-store")
			for i, n := range chain {
				log := stage(n, out, rec, i < len(chain)-1)
				if i > 0 && !resumedRE.MatchString(log) {
					t.Errorf("the run on %d processes did not resume from the store:\n%s", n, log)
				}
			}
			if d := exampletest.Diff(exampletest.SortedLines(t, out), want); d != "" {
				t.Fatalf("after %v processes: %s", chain, d)
			}
		})
	}
}
