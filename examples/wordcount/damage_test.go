package main

import (
	"bytes"
	"database/sql"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"

	_ "modernc.org/sqlite" // to find a chunk of the store to damage

	"github.com/epochflow/epochflow/internal/exampletest"
	"github.com/epochflow/epochflow/recovery"
)

var writtenRE = regexp.MustCompile(`items_written=(\d+)`)

// A run with -recovery killed with SIGKILL while it writes its counts, its store then damaged
// (a few bytes of garbage in the middle of a chunk of the count step's state): the resume is
// refused with exit 1 and an error that names the store's file, the step and what to do, and
// leaves the output as it was. The backup of the store taken after the kill, restored as the
// error says, resumes to exactly the counts of a plain run: no line twice, none truncated.
func TestDamagedStoreIsRefused(t *testing.T) {
	bin := buildBinary(t)
	dir := t.TempDir()
	input := filepath.Join(dir, "input.txt")
	want := writeDistinct(t, input, 150_000, 9)
	out := filepath.Join(dir, "out.txt")
	rec := filepath.Join(dir, "store")
	storeFile := filepath.Join(rec, recovery.FileName)
	args := []string{"-input", input, "-output", out, "-recovery", rec,
		"-epoch-interval", "100ms", "-status-interval", "50ms", "-workers", "2"}

	// The kill lands once the sink has written counts (they are written at the end of the
	// input, in the last epochs) and an epoch with state is committed (the store's commits
	// may lag behind the reading), or else the run has finished first.
	stderr := newWatchWriter("msg=running")
	writing := stderr.when(func(s string) bool {
		w, c := writtenRE.FindStringSubmatch(s), committedRE.FindStringSubmatch(s)
		if w == nil || c == nil {
			return false
		}
		written, _ := strconv.Atoi(w[1])
		committed, _ := strconv.Atoi(c[1])
		return written > 0 && committed > 0
	})
	cmd := flowCommand(bin, args...)
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	wait := make(chan error, 1)
	go func() { wait <- cmd.Wait() }()
	select {
	case <-writing:
		cmd.Process.Signal(syscall.SIGKILL)
		<-wait
	case err := <-wait:
		if err != nil {
			t.Fatalf("first run: %v\n%s", err, stderr.String())
		}
		t.Logf("the first run finished before the kill: the test damages a finished run's store")
	}
	backup := filepath.Join(dir, "backup")
	copyDir(t, rec, backup)

	step, off := damageChunk(t, storeFile)
	before, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var resumed bytes.Buffer
	cmd = flowCommand(bin, args...)
	cmd.Stderr = &resumed
	err = cmd.Run()
	if code := exitCode(t, err); code != 1 {
		t.Fatalf("resume from a store damaged at offset %d: exit %d, want 1\n%s", off, code, resumed.String())
	}
	for _, want := range []string{
		"recovery store is damaged: " + storeFile,
		"loading the state of step " + strconv.Quote(step),
		"restore a backup of the directory " + rec,
		"start over with a new recovery directory",
		"refused the recovery store: nothing was read or written", // the closing line, not "resumes after"
	} {
		if !strings.Contains(resumed.String(), want) {
			t.Errorf("the refused resume's error lacks %q:\n%s", want, resumed.String())
		}
	}
	if i := strings.LastIndex(resumed.String(), "\nepochflow: "); i >= 0 {
		t.Logf("killed with %d bytes of output; the resume was refused: %s", len(before), strings.TrimSpace(resumed.String()[i:]))
	}
	if after, err := os.ReadFile(out); err != nil || !bytes.Equal(after, before) {
		t.Errorf("the refused resume changed the output (%d bytes before, %d after, %v)", len(before), len(after), err)
	}

	// What the error says to do: restore the backup, and resume.
	if err := os.RemoveAll(rec); err != nil {
		t.Fatal(err)
	}
	copyDir(t, backup, rec)
	resumed.Reset()
	cmd = flowCommand(bin, args...)
	cmd.Stderr = &resumed
	if err := cmd.Run(); err != nil {
		t.Fatalf("resume from the restored backup: %v\n%s", err, resumed.String())
	}
	if d := exampletest.Diff(exampletest.SortedLines(t, out), want); d != "" {
		t.Fatalf("after the kill, the refused resume and a resume from the backup: %s", d)
	}
}

// damageChunk writes a few bytes of garbage in the middle of the middle chunk of the store's
// largest step, and returns that step and the garbage's offset in the file. It first moves
// the commits that the -wal file holds into the file (as the next open would), so that the
// chunk's bytes in the file are the ones a resume reads; then it finds them by their
// contents.
func damageChunk(t *testing.T, storeFile string) (string, int64) {
	t.Helper()
	db, err := sql.Open("sqlite", storeFile)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec(`PRAGMA wal_checkpoint(TRUNCATE)`); err != nil {
		t.Fatal(err)
	}
	var step string
	if err := db.QueryRow(`SELECT step FROM runs GROUP BY step ORDER BY SUM(bytes) DESC LIMIT 1`).Scan(&step); err != nil {
		t.Fatalf("the store has no runs: %v", err)
	}
	var chunks [][]byte
	rows, err := db.Query(`SELECT data FROM chunks JOIN runs ON runs.id = chunks.run WHERE runs.step = ? ORDER BY runs.hi, chunks.seq`, step)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var data []byte
		if err := rows.Scan(&data); err != nil {
			t.Fatal(err)
		}
		chunks = append(chunks, data)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	rows.Close()
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(storeFile + "-wal"); err == nil {
		t.Fatalf("the -wal file is still there after the checkpoint: the chunk found in %s may not be the one a resume reads", storeFile)
	}
	file, err := os.ReadFile(storeFile)
	if err != nil {
		t.Fatal(err)
	}
	chunk := chunks[len(chunks)/2]
	// 64 bytes from the chunk's middle, found once in the file (a chunk of more than a page
	// spans pages that each begin with a pointer: a piece across two pages is not found).
	for at := len(chunk) / 2; at+64 <= len(chunk); at += 64 {
		piece := chunk[at : at+64]
		if i := bytes.Index(file, piece); i >= 0 && bytes.LastIndex(file, piece) == i {
			off := int64(i + 28)
			f, err := os.OpenFile(storeFile, os.O_WRONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if _, err := f.WriteAt([]byte("garbage!"), off); err != nil {
				t.Fatal(err)
			}
			if err := f.Close(); err != nil {
				t.Fatal(err)
			}
			t.Logf("damaged chunk %d of %d of step %q (%d bytes) at offset %d of %d", len(chunks)/2, len(chunks), step, len(chunk), off, len(file))
			return step, off
		}
	}
	t.Fatalf("found no piece of the middle chunk of step %q once in %s", step, storeFile)
	return "", 0
}

// copyDir copies the regular files of directory from into directory to, which it creates.
func copyDir(t *testing.T, from, to string) {
	t.Helper()
	if err := os.MkdirAll(to, 0o755); err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir(from)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if !e.Type().IsRegular() {
			continue
		}
		b, err := os.ReadFile(filepath.Join(from, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(to, e.Name()), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
