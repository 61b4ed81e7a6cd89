package main

import (
	"context"
	"database/sql"
	"fmt"
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
	makeStoreWith(t, func(clock func() time.Time) (recovery.Store, error) {
		return recovery.OpenSQLite(context.Background(), dir, recovery.SQLiteOptions{Now: clock})
	})
}

// makeStoreWith creates the store of makeStore with open.
func makeStoreWith(t *testing.T, open func(clock func() time.Time) (recovery.Store, error)) {
	t.Helper()
	ctx := context.Background()
	now := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	clock := func() time.Time { return now }
	for x, workers := range []int{2, 3} {
		s, err := open(clock)
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
schema version   3
verification     ok
flow             wordcount
committed epoch  2 at 2030-01-02T03:04:06.500Z by execution 1

EXECUTION  STARTED                   WORKERS  FLOW       FRONTIERS  STEPS
1          2030-01-02T03:04:05.000Z  2        wordcount  2,3        count,"sum words"
2          2030-01-02T04:04:06.500Z  3        wordcount  -          count,"sum words"
`+wrap(frontiersHelp, 96)+`

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
	want := "store            " + filepath.Join(dir, recovery.FileName) + "\nschema version   3\nverification     ok\ncommitted epoch  none\n\nno executions\n\nno state\n"
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

// A store whose rows were changed behind its back: inspect prints what it holds, says that
// it is damaged and why, and exits 1.
func TestInspectDamaged(t *testing.T) {
	dir := t.TempDir()
	makeStore(t, dir)
	db, err := sql.Open("sqlite", filepath.Join(dir, recovery.FileName))
	if err != nil {
		t.Fatal(err)
	}
	// apple's state 12345 becomes 54321 in the chunk that holds it.
	if _, err := db.Exec(`UPDATE chunks SET data = CAST(replace(data, CAST('12345' AS BLOB), CAST('54321' AS BLOB)) AS BLOB)`); err != nil {
		t.Fatal(err)
	}
	db.Close()
	var stdout, stderr strings.Builder
	code := run(context.Background(), []string{"recovery", "inspect", dir}, &stdout, &stderr)
	if code != 1 || !strings.Contains(stderr.String(), "is damaged: do not resume from it") {
		t.Errorf("exit %d, stderr %q; want 1 and the store named damaged", code, stderr.String())
	}
	for _, want := range []string{
		"verification     damaged: recovery store is damaged: " + filepath.Join(dir, recovery.FileName) + `: step "count": run 1 (epochs 1 to 2): chunk 0 of 1 has checksum`,
		"restore a backup of the directory " + dir,
		"committed epoch  2",
		"count        2     6      2",
	} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("stdout does not contain %q:\n%s", want, stdout.String())
		}
	}

	// Garbage over the file's schema page: refused at open, with the reason.
	b, err := os.ReadFile(filepath.Join(dir, recovery.FileName))
	if err != nil {
		t.Fatal(err)
	}
	copy(b[100:], strings.Repeat("garbage!", 50))
	if err := os.WriteFile(filepath.Join(dir, recovery.FileName), b, 0o644); err != nil {
		t.Fatal(err)
	}
	stdout.Reset()
	stderr.Reset()
	code = run(context.Background(), []string{"recovery", "inspect", dir}, &stdout, &stderr)
	if code != 1 || !strings.Contains(stderr.String(), "recovery store is damaged: "+filepath.Join(dir, recovery.FileName)) {
		t.Errorf("inspect of a store with a damaged schema page: exit %d, stdout %q, stderr %q; want 1 and damaged", code, stdout.String(), stderr.String())
	}
}

// makeCompactedStore creates a store in dir of flow "wordcount" (one execution, 2 workers)
// with a backup window of 3 s and 12 commits a second apart: commit 1 writes all 40 keys of
// step "count", each later one the next 4 of them, and commit 11 deletes key k37 (a
// tombstone, inside the window); step "read" has one partition, /data/in.txt, whose byte
// offset each commit advances by 100. Compaction leaves "count" in several runs with the
// window's backups. It returns the states Load returns for "count" (the newest of every key
// that is not deleted).
func makeCompactedStore(t *testing.T, dir string) map[string][]byte {
	t.Helper()
	ctx := context.Background()
	now := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	s, err := recovery.OpenSQLite(ctx, dir, recovery.SQLiteOptions{BackupInterval: 3 * time.Second, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Begin(ctx, recovery.Execution{Flow: "wordcount", Steps: []string{"count", "read"}, Workers: 2}); err != nil {
		t.Fatal(err)
	}
	const keys = 40
	live := map[string][]byte{}
	for e := uint64(1); e <= 12; e++ {
		now = now.Add(time.Second)
		snaps := []recovery.Snapshot{{Step: "read", Key: "/data/in.txt", Epoch: e, State: encode(t, int64(100*e))}}
		lo, n := 0, keys
		if e > 1 {
			lo, n = int(e-2)*4, 4
		}
		for i := lo; i < lo+n; i++ {
			key := fmt.Sprintf("k%02d", i%keys)
			if e == 11 && key == "k37" {
				snaps = append(snaps, recovery.Snapshot{Step: "count", Key: key, Epoch: e, Deleted: true})
				delete(live, key)
				continue
			}
			state := []byte(strings.Repeat("x", int(e)))
			snaps = append(snaps, recovery.Snapshot{Step: "count", Key: key, Epoch: e, State: state})
			live[key] = state
		}
		if err := s.Commit(ctx, recovery.Epoch{Epoch: e, Frontiers: []uint64{e + 1, e + 1}, Snapshots: snaps}); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	return live
}

// inspect of a store that compaction has worked on (several commits, several runs of a step
// with a backup window's snapshots and a tombstone in them) prints the state Load returns:
// the keys and bytes of the newest snapshot of each live key, the snapshots kept, and the
// newest position of a partition.
func TestInspectCompacted(t *testing.T) {
	dir := t.TempDir()
	live := makeCompactedStore(t, dir)
	var bytes int
	for _, st := range live {
		bytes += len(st)
	}
	// What the store holds, read from its runs table: more than one run of "count", and
	// more snapshots than keys (the window's backups, the tombstone).
	db, err := sql.Open("sqlite", filepath.Join(dir, recovery.FileName))
	if err != nil {
		t.Fatal(err)
	}
	var runs, rows, readRows int
	err = db.QueryRow(`SELECT COUNT(*), SUM(entries) FROM runs WHERE step = 'count'`).Scan(&runs, &rows)
	if err == nil {
		err = db.QueryRow(`SELECT SUM(entries) FROM runs WHERE step = 'read'`).Scan(&readRows)
	}
	db.Close()
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := live["k37"]; ok || len(live) != 39 {
		t.Fatalf("%d live keys, k37 among them: the tombstone was not written", len(live))
	}
	if runs < 2 || rows <= len(live)+1 {
		t.Fatalf("step count has %d snapshots in %d runs, want more than %d in several: the test no longer covers a merge of runs", rows, runs, len(live)+1)
	}

	var stdout, stderr strings.Builder
	if code := run(context.Background(), []string{"recovery", "inspect", dir}, &stdout, &stderr); code != 0 || stderr.Len() > 0 {
		t.Fatalf("exit %d, stderr %q", code, stderr.String())
	}
	got := stdout.String()
	want := `store            ` + filepath.Join(dir, recovery.FileName) + `
schema version   3
verification     ok
flow             wordcount
committed epoch  12 at 2030-01-02T03:04:17.000Z by execution 1

EXECUTION  STARTED                   WORKERS  FLOW       FRONTIERS  STEPS
1          2030-01-02T03:04:05.000Z  2        wordcount  13,13      count,read
` + wrap(frontiersHelp, 96) + `

STEP   KEYS  BYTES  ROWS
`
	if !strings.HasPrefix(got, want) {
		t.Fatalf("inspect printed\n%s\nwant it to start with\n%s", got, want)
	}
	// The step table's rows, then the positions table after an empty line.
	table, _, _ := strings.Cut(got[len(want):], "\n\n")
	wantTable := []string{
		fmt.Sprintf("count %d %d %d", len(live), bytes, rows),
		fmt.Sprintf("read 1 2 %d", readRows), // 1200 is a 2-byte varint
	}
	if lines := strings.Split(table, "\n"); len(lines) != len(wantTable) {
		t.Errorf("the step table has rows %q, want %q", lines, wantTable)
	} else {
		for i, l := range lines {
			if f := strings.Join(strings.Fields(l), " "); f != wantTable[i] {
				t.Errorf("step table row %q, want %q", f, wantTable[i])
			}
		}
	}
	if row := "/data/in.txt  12     byte offset 1200:"; !strings.Contains(got, row) {
		t.Errorf("inspect does not print the newest position, %q:\n%s", row, got)
	}
}
