package recovery

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
)

// The crash tests run this test binary again as a child process (selected by these variables)
// that commits to a store and dies without closing it.
const (
	crashDirEnv  = "EPOCHFLOW_RECOVERY_TEST_CRASH_DIR"
	crashModeEnv = "EPOCHFLOW_RECOVERY_TEST_CRASH_MODE"
	crashKeys    = 200
)

func TestMain(m *testing.M) {
	if dir := os.Getenv(crashDirEnv); dir != "" {
		crashChild(dir, os.Getenv(crashModeEnv))
		os.Exit(3) // not reached
	}
	code := m.Run()
	for _, dir := range damageStores.dirs {
		os.RemoveAll(dir)
	}
	os.Exit(code)
}

// crashChild commits epochs 1, 2, ... to the store in dir, each writing every key with the
// epoch as its state and printing "committed E" once Commit returned. In mode "exit" it exits
// after epoch 3 without closing the store; in mode "kill" it SIGKILLs itself after epoch 3; in
// mode "loop" it goes on until the parent kills it, mid-commit more often than not.
func crashChild(dir, mode string) {
	ctx := context.Background()
	fail := func(err error) {
		fmt.Fprintln(os.Stderr, "crash child:", err)
		os.Exit(2)
	}
	s, err := OpenSQLite(ctx, dir, SQLiteOptions{})
	if err != nil {
		fail(err)
	}
	r, err := s.Begin(ctx, Execution{Flow: "crash", Steps: []string{"s"}, Workers: 1})
	if err != nil {
		fail(err)
	}
	for e := r.Committed + 1; ; e++ {
		snaps := make([]Snapshot, crashKeys)
		for k := range snaps {
			snaps[k] = snap("s", fmt.Sprintf("k%03d", k), e, strconv.FormatUint(e, 10))
		}
		if err := s.Commit(ctx, Epoch{Epoch: e, Frontiers: []uint64{e}, Snapshots: snaps}); err != nil {
			fail(err)
		}
		fmt.Printf("committed %d\n", e)
		if e == r.Committed+3 {
			switch mode {
			case "exit":
				os.Exit(0)
			case "kill":
				p, err := os.FindProcess(os.Getpid())
				if err != nil {
					fail(err)
				}
				p.Kill()
				select {}
			}
		}
	}
}

// crash runs the child in mode on dir and returns the last epoch it reported committed.
func crash(t *testing.T, dir, mode string) uint64 {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), crashDirEnv+"="+dir, crashModeEnv+"="+mode)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var last uint64
	lines := 0
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		lines++
		e, err := strconv.ParseUint(strings.TrimPrefix(sc.Text(), "committed "), 10, 64)
		if err != nil {
			t.Fatalf("child printed %q", sc.Text())
		}
		last = e
		if mode == "loop" && lines == 15 {
			cmd.Process.Kill()
			break
		}
	}
	err = cmd.Wait()
	switch mode {
	case "exit":
		if err != nil {
			t.Fatalf("child: %v\n%s", err, stderr.String())
		}
	default:
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != -1 {
			t.Fatalf("child: %v, want killed by a signal\n%s", err, stderr.String())
		}
	}
	return last
}

func TestCrash(t *testing.T) {
	for _, mode := range []string{"exit", "kill", "loop"} {
		t.Run(mode, func(t *testing.T) {
			dir := t.TempDir()
			last := crash(t, dir, mode)
			if mode != "loop" && last != 3 {
				t.Fatalf("child committed up to %d, want 3", last)
			}
			// Once more, resuming from what the first child left.
			last = crash(t, dir, mode)

			s := open(t, dir, SQLiteOptions{})
			r := begin(t, s, "crash", 1, "s")
			if r.Execution != 3 || r.Committed < last || (mode != "loop" && r.Committed != last) {
				t.Fatalf("Begin after two crashes = %+v; the last child reported epoch %d committed", r, last)
			}
			// Each commit rewrote every key: all or nothing of the last one is there.
			got := loadAll(t, s, "s")
			if len(got) != crashKeys {
				t.Fatalf("Load returned %d keys, want %d", len(got), crashKeys)
			}
			for k, g := range got {
				if g.Epoch != r.Committed || g.State != strconv.FormatUint(r.Committed, 10) {
					t.Fatalf("key %s = %+v, want the committed epoch %d's state", k, g, r.Committed)
				}
			}
			if rs := rows(t, s); len(rs) != crashKeys {
				t.Errorf("%d rows, want %d (older snapshots collected)", len(rs), crashKeys)
			}
		})
	}
}
