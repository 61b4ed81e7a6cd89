package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/epochflow/epochflow/recovery"
)

// makeStore creates a store in dir with two executions of flow "wordcount".
func makeStore(t *testing.T, dir string) {
	t.Helper()
	ctx := context.Background()
	now := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	clock := func() time.Time { return now }
	for x, workers := range []int{2, 3} {
		s, err := recovery.OpenSQLite(ctx, dir, recovery.SQLiteOptions{Now: clock})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Begin(ctx, recovery.Execution{Flow: "wordcount", Steps: []string{"count", "sum words"}, Workers: workers}); err != nil {
			t.Fatal(err)
		}
		if x == 0 {
			now = now.Add(1500 * time.Millisecond)
			snaps := []recovery.Snapshot{
				{Step: "count", Key: "apple", Epoch: 1, State: []byte("12345")},
				{Step: "count", Key: "pear", Epoch: 2, State: []byte("1")},
				{Step: "count", Key: "plum", Epoch: 2, Deleted: true},
				{Step: "sum words", Key: "", Epoch: 2, State: make([]byte, 1000)},
			}
			if err := s.Commit(ctx, recovery.Epoch{Epoch: 2, Frontiers: []uint64{2, 3}, Snapshots: snaps}); err != nil {
				t.Fatal(err)
			}
			now = now.Add(time.Hour)
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

func TestInspect(t *testing.T) {
	dir := t.TempDir()
	makeStore(t, dir)
	want := strings.ReplaceAll(`store            DIR/epochflow-0.sqlite3
schema version   1
flow             wordcount
committed epoch  2 at 2030-01-02T03:04:06.500Z by execution 1

EXECUTION  STARTED                   WORKERS  FLOW       FRONTIERS  STEPS
1          2030-01-02T03:04:05.000Z  2        wordcount  2,3        count,"sum words"
2          2030-01-02T04:04:06.500Z  3        wordcount  -          count,"sum words"

STEP         KEYS  BYTES  ROWS
count        2     6      2
"sum words"  1     1000   1
`, "DIR", dir)
	// The directory and the file in it give the same output.
	for _, path := range []string{dir, filepath.Join(dir, recovery.FileName)} {
		var stdout, stderr strings.Builder
		code := run(context.Background(), []string{"recovery", "inspect", path}, &stdout, &stderr)
		if code != 0 || stderr.Len() > 0 {
			t.Fatalf("inspect %s: exit %d, stderr %q", path, code, stderr.String())
		}
		if stdout.String() != want {
			t.Errorf("inspect %s printed\n%s\nwant\n%s", path, stdout.String(), want)
		}
	}
	// Inspecting left nothing behind: no -wal or -shm file, only the store and the lock file
	// of the run that wrote it.
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 2 || entries[0].Name() != recovery.FileName || entries[1].Name() != recovery.LockName {
		t.Errorf("after inspect the directory holds %v, want only %s and %s", entries, recovery.FileName, recovery.LockName)
	}
}

func TestInspectEmpty(t *testing.T) {
	dir := t.TempDir()
	s, err := recovery.OpenSQLite(context.Background(), dir, recovery.SQLiteOptions{})
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	var stdout, stderr strings.Builder
	if code := run(context.Background(), []string{"recovery", "inspect", dir}, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	want := "store            " + filepath.Join(dir, recovery.FileName) + "\nschema version   1\ncommitted epoch  none\n\nno executions\n\nno state\n"
	if stdout.String() != want {
		t.Errorf("inspect of an empty store printed\n%s\nwant\n%s", stdout.String(), want)
	}
}

func TestUsageAndErrors(t *testing.T) {
	dir := t.TempDir()
	garbage := filepath.Join(dir, "garbage")
	if err := os.MkdirAll(garbage, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(garbage, recovery.FileName), []byte(strings.Repeat("junk", 1000)), 0o644); err != nil {
		t.Fatal(err)
	}
	other := filepath.Join(dir, "other.txt")
	if err := os.WriteFile(other, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		args   []string
		code   int
		stdout string // a substring of standard output
		stderr string // a substring of standard error
	}{
		{nil, 2, "", "usage: epochflow recovery inspect PATH"},
		{[]string{"frobnicate"}, 2, "", `unknown command "frobnicate"`},
		{[]string{"recovery"}, 2, "", "want the subcommand inspect"},
		{[]string{"recovery", "list", dir}, 2, "", "want the subcommand inspect"},
		{[]string{"recovery", "inspect"}, 2, "", "usage:"},
		{[]string{"recovery", "inspect", ""}, 2, "", "usage:"},
		{[]string{"recovery", "inspect", dir, dir}, 2, "", "usage:"},
		{[]string{"-h"}, 0, "usage: epochflow recovery inspect PATH", ""},
		{[]string{"recovery", "inspect", filepath.Join(dir, "missing")}, 1, "", "missing does not exist"},
		{[]string{"recovery", "inspect", dir}, 1, "", "no recovery store at " + filepath.Join(dir, recovery.FileName)},
		{[]string{"recovery", "inspect", other}, 1, "", "is a file, not a recovery directory"},
		{[]string{"recovery", "inspect", garbage}, 1, "", "is not an SQLite database or is corrupt"},
	}
	for _, c := range cases {
		var stdout, stderr strings.Builder
		code := run(context.Background(), c.args, &stdout, &stderr)
		if code != c.code || !strings.Contains(stdout.String(), c.stdout) || !strings.Contains(stderr.String(), c.stderr) ||
			(c.stdout == "" && stdout.Len() > 0) || (c.stderr == "" && stderr.Len() > 0) {
			t.Errorf("epochflow %q: exit %d, stdout %q, stderr %q; want exit %d, stdout with %q, stderr with %q",
				c.args, code, stdout.String(), stderr.String(), c.code, c.stdout, c.stderr)
		}
	}
	// The refused inspects created nothing.
	if _, err := os.Stat(filepath.Join(dir, "missing")); err == nil {
		t.Error("inspect created the missing directory")
	}
	if _, err := os.Stat(filepath.Join(dir, recovery.FileName)); err == nil {
		t.Error("inspect created a store")
	}
}
