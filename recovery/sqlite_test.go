package recovery

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestBeginResume(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	clk := newClock()
	s := open(t, dir, SQLiteOptions{Now: clk.Now})
	if got, want := s.Path(), filepath.Join(dir, FileName); got != want {
		t.Errorf("Path() = %q, want %q", got, want)
	}
	r := begin(t, s, "wordcount", 2, "split", "count")
	if want := (Resume{Execution: 1}); !reflect.DeepEqual(r, want) {
		t.Errorf("fresh Begin = %+v, want %+v", r, want)
	}
	if c, err := s.Committed(ctx); err != nil || c != (CommitInfo{}) {
		t.Errorf("fresh Committed() = %+v, %v; want zero", c, err)
	}
	if ids, err := s.StepIDs(ctx); err != nil || len(ids) != 0 {
		t.Errorf("fresh StepIDs() = %q, %v; want none", ids, err)
	}
	if infos, err := s.Steps(ctx); err != nil || len(infos) != 0 {
		t.Errorf("fresh Steps() = %v, %v; want none", infos, err)
	}
	commit(t, s, 2, 1, snap("count", "a", 1, "1"))
	clk.Advance(time.Second)
	if err := s.Commit(ctx, Epoch{Epoch: 3, Frontiers: []uint64{3, math.MaxUint64}}); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if _, err := s.Begin(ctx, Execution{Flow: "wordcount", Workers: 1}); err == nil {
		t.Error("Begin on a closed store: no error")
	}

	clk.Advance(time.Minute)
	s = open(t, dir, SQLiteOptions{Now: clk.Now})
	r = begin(t, s, "wordcount", 3, "count")
	want := Resume{Execution: 2, Committed: 3, Flow: "wordcount", Steps: []string{"split", "count"}, Workers: 2}
	if !reflect.DeepEqual(r, want) {
		t.Errorf("second Begin = %+v, want %+v", r, want)
	}
	c, err := s.Committed(ctx)
	if err != nil {
		t.Fatal(err)
	}
	start := newClock().Now()
	if want := (CommitInfo{Epoch: 3, Execution: 1, At: start.Add(time.Second)}); c != want {
		t.Errorf("Committed() = %+v, want %+v", c, want)
	}
	xs, err := s.Executions(ctx)
	if err != nil {
		t.Fatal(err)
	}
	wantXs := []ExecutionInfo{
		{Execution: 1, Flow: "wordcount", Steps: []string{"split", "count"}, Workers: 2, Started: start, Frontiers: []uint64{3, math.MaxUint64}},
		{Execution: 2, Flow: "wordcount", Steps: []string{"count"}, Workers: 3, Started: start.Add(time.Second + time.Minute)},
	}
	if !reflect.DeepEqual(xs, wantXs) {
		t.Errorf("Executions() =\n%+v\nwant\n%+v", xs, wantXs)
	}
	if got := loadAll(t, s, "count"); !reflect.DeepEqual(got, map[string]entry{"a": {1, "1"}}) {
		t.Errorf("Load = %v", got)
	}

	// A third execution without steps, then a fourth: Steps is empty, not nil.
	begin(t, s, "wordcount", 1)
	if r := begin(t, s, "wordcount", 1); r.Steps == nil || len(r.Steps) != 0 || r.Execution != 4 {
		t.Errorf("Begin after an execution without steps = %+v, want Execution 4 and empty Steps", r)
	}
}

func TestBeginErrors(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s := open(t, dir, SQLiteOptions{})
	begin(t, s, "alpha", 1)
	commit(t, s, 1, 1, snap("s", "k", 1, "v"))
	s.Close()
	before := files(t, dir)

	s = open(t, dir, SQLiteOptions{})
	_, err := s.Begin(ctx, Execution{Flow: "beta", Workers: 1})
	if !errors.Is(err, ErrOtherFlow) || !strings.Contains(err.Error(), `flow "alpha", not "beta"`) || !strings.Contains(err.Error(), s.Path()) {
		t.Errorf("Begin of another flow: %v; want ErrOtherFlow naming both flows and the store", err)
	}
	for _, e := range []Execution{{Flow: "", Workers: 1}, {Flow: "alpha", Workers: 0}} {
		if _, err := s.Begin(ctx, e); err == nil {
			t.Errorf("Begin(%+v): no error", e)
		}
	}
	if xs, err := s.Executions(ctx); err != nil || len(xs) != 1 {
		t.Errorf("Executions() after refused Begins = %d executions, %v; want 1", len(xs), err)
	}
	s.Close()
	if after := files(t, dir); !reflect.DeepEqual(before, after) {
		t.Errorf("refused Begins changed the store's files")
	}
}

func TestCommitErrors(t *testing.T) {
	ctx := context.Background()
	s := open(t, t.TempDir(), SQLiteOptions{})
	if err := s.Commit(ctx, Epoch{Epoch: 1}); err == nil || !strings.Contains(err.Error(), "before Begin") {
		t.Errorf("Commit before Begin: %v", err)
	}
	begin(t, s, "f", 2)
	commit(t, s, 2, 5, snap("s", "k", 5, "five"))
	wantRows := rows(t, s)

	cases := []struct {
		name string
		e    Epoch
		is   error  // nil: any error
		msg  string // a substring of the error
	}{
		{"epoch 0", Epoch{Epoch: 0, Frontiers: []uint64{0, 0}}, ErrEpochOrder, "not in [1, 2^63-1]"},
		{"epoch beyond int64", Epoch{Epoch: math.MaxInt64 + 1, Frontiers: []uint64{0, 0}}, ErrEpochOrder, "not in"},
		{"same epoch", Epoch{Epoch: 5, Frontiers: []uint64{5, 5}}, ErrEpochOrder, "already committed"},
		{"older epoch", Epoch{Epoch: 4, Frontiers: []uint64{5, 5}}, ErrEpochOrder, "already committed"},
		{"snapshot after epoch", Epoch{Epoch: 6, Frontiers: []uint64{6, 6}, Snapshots: []Snapshot{snap("s", "k", 7, "x")}}, ErrEpochOrder, `key "k" has epoch 7`},
		{"snapshot at committed epoch", Epoch{Epoch: 6, Frontiers: []uint64{6, 6}, Snapshots: []Snapshot{snap("s", "j", 6, "x"), snap("s", "k", 5, "x")}}, ErrEpochOrder, "at or before the committed epoch 5"},
		{"snapshot epoch 0", Epoch{Epoch: 6, Frontiers: []uint64{6, 6}, Snapshots: []Snapshot{snap("s", "k", 0, "x")}}, ErrEpochOrder, "has epoch 0"},
		{"too few frontiers", Epoch{Epoch: 6, Frontiers: []uint64{6}}, nil, "1 frontiers for 2 workers"},
		{"duplicate snapshot", Epoch{Epoch: 6, Frontiers: []uint64{6, 6}, Snapshots: []Snapshot{snap("s", "a", 6, "x"), snap("s", "k", 6, "x"), tomb("s", "k", 6)}}, nil, `key "k" epoch 6 appears twice`},
		{"canceled", Epoch{Epoch: 6, Frontiers: []uint64{6, 6}}, context.Canceled, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ctx := ctx
			if c.is == context.Canceled {
				var cancel context.CancelFunc
				ctx, cancel = context.WithCancel(ctx)
				cancel()
			}
			err := s.Commit(ctx, c.e)
			if err == nil || (c.is != nil && !errors.Is(err, c.is)) || !strings.Contains(err.Error(), c.msg) {
				t.Fatalf("Commit(%+v) = %v; want an error wrapping %v containing %q", c.e, err, c.is, c.msg)
			}
			if !strings.Contains(err.Error(), s.Path()) {
				t.Errorf("error %q does not name the store", err)
			}
			if ci, err := s.Committed(ctx); err == nil && ci.Epoch != 5 {
				t.Errorf("committed epoch is %d after a refused Commit, want 5", ci.Epoch)
			}
			if got := rows(t, s); !reflect.DeepEqual(got, wantRows) {
				t.Errorf("rows after a refused Commit = %v, want %v", got, wantRows)
			}
		})
	}
	// The store is still usable.
	commit(t, s, 2, 6, snap("s", "k", 6, "six"))
	if got := loadAll(t, s, "s"); !reflect.DeepEqual(got, map[string]entry{"k": {6, "six"}}) {
		t.Errorf("Load = %v", got)
	}
}

func TestLoadMany(t *testing.T) {
	ctx := context.Background()
	s := open(t, t.TempDir(), SQLiteOptions{})
	begin(t, s, "f", 1)
	const keys = 5000 // several of Load's batches
	steps := []string{"a", "b", "c"}
	state := func(step string, k int, e uint64) string { return fmt.Sprintf("%s-%d-%d", step, k, e) }
	for e := uint64(1); e <= 2; e++ {
		var snaps []Snapshot
		for _, st := range steps {
			for k := range keys {
				if k%3 == 0 && e == 2 {
					snaps = append(snaps, tomb(st, fmt.Sprintf("k%05d", k), e))
				} else if k%2 == 0 || e == 1 {
					snaps = append(snaps, snap(st, fmt.Sprintf("k%05d", k), e, state(st, k, e)))
				}
			}
		}
		commit(t, s, 1, e, snaps...)
	}
	type live struct {
		k int
		e uint64
	}
	want := map[string]live{}
	for k := range keys {
		switch {
		case k%3 == 0:
		case k%2 == 0:
			want[fmt.Sprintf("k%05d", k)] = live{k, 2}
		default:
			want[fmt.Sprintf("k%05d", k)] = live{k, 1}
		}
	}
	// What Load yields, concurrently, and StepIDs are the contract's (storetest's LoadMany,
	// which TestStoreContract runs on this store); here, what the SQLite store keeps of it.
	infos, err := s.Steps(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var bytes int64
	for _, w := range want {
		bytes += int64(len(state("a", w.k, w.e)))
	}
	if len(infos) != len(steps) {
		t.Fatalf("Steps() = %+v", infos)
	}
	for i, st := range steps {
		// Rows counts every entry kept: until a compaction, the replaced ones too (the
		// second commit's run is smaller than the first's, so it was not merged yet).
		if want := (StepInfo{Step: st, Keys: len(want), Bytes: bytes, Rows: keys + 2*keys/3}); infos[i] != want {
			t.Errorf("Steps()[%d] = %+v, want %+v", i, infos[i], want)
		}
	}
	// With BackupInterval 0, a compaction leaves only the live keys' newest snapshots.
	compactAll(t, s)
	if infos, err = s.Steps(ctx); err != nil {
		t.Fatal(err)
	}
	for i, st := range steps {
		if want := (StepInfo{Step: st, Keys: len(want), Bytes: bytes, Rows: len(want)}); infos[i] != want {
			t.Errorf("after compaction, Steps()[%d] = %+v, want %+v", i, infos[i], want)
		}
	}
}

func TestGarbageCollection(t *testing.T) {
	type step struct {
		advance time.Duration // before the commit
		epoch   uint64
		snaps   []Snapshot
		rows    []row // after the commit
	}
	live := func(k string, e uint64) row { return row{"s", k, e, false} }
	dead := func(k string, e uint64) row { return row{"s", k, e, true} }
	cases := []struct {
		name   string
		backup time.Duration
		steps  []step
	}{
		{"no window keeps the newest", 0, []step{
			{0, 1, []Snapshot{snap("s", "k", 1, "a"), snap("s", "j", 1, "a")}, []row{live("j", 1), live("k", 1)}},
			{0, 2, []Snapshot{snap("s", "k", 2, "b")}, []row{live("j", 1), live("k", 2)}},
			{0, 5, []Snapshot{snap("s", "k", 3, "c"), snap("s", "k", 5, "d")}, []row{live("j", 1), live("k", 5)}},
		}},
		{"no window drops tombstones", 0, []step{
			{0, 1, []Snapshot{snap("s", "k", 1, "a")}, []row{live("k", 1)}},
			{0, 2, []Snapshot{tomb("s", "k", 2)}, nil},
			{0, 3, []Snapshot{tomb("s", "k", 3)}, nil},
			{0, 5, []Snapshot{snap("s", "k", 4, "b"), tomb("s", "k", 5)}, nil},
			{0, 7, []Snapshot{tomb("s", "k", 6), snap("s", "k", 7, "c")}, []row{live("k", 7)}},
		}},
		{"window keeps replaced snapshots until it passes", 10 * time.Second, []step{
			{0, 1, []Snapshot{snap("s", "k", 1, "a")}, []row{live("k", 1)}},
			{time.Second, 2, []Snapshot{snap("s", "k", 2, "b")}, []row{live("k", 1), live("k", 2)}},
			{5 * time.Second, 3, []Snapshot{snap("s", "k", 3, "c")}, []row{live("k", 1), live("k", 2), live("k", 3)}},
			// t=11s: epoch 2 (committed at 1s) is older than the window.
			{5 * time.Second, 4, nil, []row{live("k", 2), live("k", 3)}},
			{4 * time.Second, 5, nil, []row{live("k", 2), live("k", 3)}}, // t=15s: epoch 3 (6s) is not
			{time.Second, 6, nil, []row{live("k", 3)}},                   // t=16s: it is
			{time.Hour, 7, nil, []row{live("k", 3)}},
		}},
		{"window keeps tombstones until it passes", 10 * time.Second, []step{
			{0, 1, []Snapshot{snap("s", "k", 1, "a")}, []row{live("k", 1)}},
			{time.Second, 2, []Snapshot{tomb("s", "k", 2)}, []row{live("k", 1), dead("k", 2)}},
			{9 * time.Second, 3, nil, []row{live("k", 1), dead("k", 2)}},
			{time.Second, 4, nil, nil},
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			clk := newClock()
			s := open(t, t.TempDir(), SQLiteOptions{BackupInterval: c.backup, Now: clk.Now})
			begin(t, s, "f", 1)
			for _, st := range c.steps {
				clk.Advance(st.advance)
				commit(t, s, 1, st.epoch, st.snaps...)
				// The commit may leave collectable entries to a later compaction, never
				// collect one that must stay; a compaction collects exactly what may go.
				got := rows(t, s)
				for _, r := range st.rows {
					if !slices.Contains(got, r) {
						t.Fatalf("after commit %d: rows %v, want at least %v", st.epoch, got, st.rows)
					}
				}
				compactAll(t, s)
				if got := rows(t, s); !reflect.DeepEqual(got, st.rows) {
					t.Fatalf("after commit %d and a compaction: rows %v, want %v", st.epoch, got, st.rows)
				}
			}
		})
	}

	// Without a window only the newest commit is kept in the commits table.
	s := open(t, t.TempDir(), SQLiteOptions{})
	begin(t, s, "f", 1)
	for e := uint64(1); e <= 5; e++ {
		commit(t, s, 1, e)
	}
	var n int
	if err := s.db.QueryRow(`SELECT COUNT(*) FROM commits`).Scan(&n); err != nil || n != 1 {
		t.Errorf("commits rows = %d, %v; want 1", n, err)
	}
}

func TestReadOnly(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	w := open(t, dir, SQLiteOptions{})
	begin(t, w, "f", 1)
	commit(t, w, 1, 1, snap("s", "k", 1, "v1"))

	r := open(t, dir, SQLiteOptions{ReadOnly: true})
	if _, err := r.Begin(ctx, Execution{Flow: "f", Workers: 1}); !errors.Is(err, ErrReadOnly) {
		t.Errorf("Begin on a read-only store: %v", err)
	}
	if err := r.Commit(ctx, Epoch{Epoch: 2, Frontiers: []uint64{2}}); !errors.Is(err, ErrReadOnly) {
		t.Errorf("Commit on a read-only store: %v", err)
	}
	// The reader sees what the writer commits while both are open.
	commit(t, w, 1, 2, snap("s", "k", 2, "v2"))
	if c, err := r.Committed(ctx); err != nil || c.Epoch != 2 {
		t.Errorf("read-only Committed() = %+v, %v", c, err)
	}
	if got := loadAll(t, r, "s"); !reflect.DeepEqual(got, map[string]entry{"k": {2, "v2"}}) {
		t.Errorf("read-only Load = %v", got)
	}

	// A read-only open of a store no process has open writes nothing, not even -wal and
	// -shm files.
	r.Close()
	w.Close() // the last connection to close removes the -wal and -shm files
	before := files(t, dir)
	if _, ok := before[filepath.Join(dir, LockName)]; len(before) != 2 || !ok {
		t.Fatalf("files after closing the store: %v, want the store and the lock file", before)
	}
	r = open(t, dir, SQLiteOptions{ReadOnly: true})
	if got := loadAll(t, r, "s"); !reflect.DeepEqual(got, map[string]entry{"k": {2, "v2"}}) {
		t.Errorf("read-only Load of a closed store = %v", got)
	}
	if _, err := r.Executions(ctx); err != nil {
		t.Error(err)
	}
	r.Close()
	if after := files(t, dir); !reflect.DeepEqual(before, after) {
		t.Errorf("a read-only open changed the directory: %d files before, %d after", len(before), len(after))
	}

	missing := filepath.Join(t.TempDir(), "missing")
	if _, err := OpenSQLite(ctx, missing, SQLiteOptions{ReadOnly: true}); !errors.Is(err, ErrNoStore) {
		t.Errorf("read-only open of a missing store: %v", err)
	}
	if _, err := os.Stat(missing); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("read-only open created %s", missing)
	}
}

func TestOpenRefusals(t *testing.T) {
	ctx := context.Background()
	// store creates a valid store in dir with one commit, then runs edit on its database.
	store := func(edit string) func(t *testing.T, dir string) {
		return func(t *testing.T, dir string) {
			s := open(t, dir, SQLiteOptions{})
			begin(t, s, "f", 1)
			commit(t, s, 1, 1, snap("s", "k", 1, "v"))
			s.Close()
			if edit == "" {
				return
			}
			db, err := sql.Open("sqlite", filepath.Join(dir, FileName))
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			if _, err := db.Exec(edit); err != nil {
				t.Fatal(err)
			}
		}
	}
	cases := []struct {
		name  string
		setup func(t *testing.T, dir string)
		dir   func(dir string) string // the directory to open, if not dir
		opts  SQLiteOptions
		is    error
		msg   string
	}{
		{"newer schema", store(`UPDATE meta SET value = 7 WHERE name = 'schema_version'`), nil, SQLiteOptions{},
			ErrSchemaVersion, "has schema version 7, this binary knows 3: use a newer binary, or another recovery directory"},
		{"newer schema, store open elsewhere", func(t *testing.T, dir string) {
			// The writer stays open (until the test ends), so the -wal file exists and holds the edit.
			s := open(t, dir, SQLiteOptions{})
			begin(t, s, "f", 1)
			commit(t, s, 1, 1, snap("s", "k", 1, "v"))
			if _, err := s.db.Exec(`UPDATE meta SET value = 7 WHERE name = 'schema_version'`); err != nil {
				t.Fatal(err)
			}
			if _, err := os.Stat(filepath.Join(dir, FileName+"-wal")); err != nil {
				t.Fatal(err)
			}
		}, nil, SQLiteOptions{}, ErrSchemaVersion, "has schema version 7"},
		{"newer schema read-only", store(`UPDATE meta SET value = 7 WHERE name = 'schema_version'`), nil, SQLiteOptions{ReadOnly: true},
			ErrSchemaVersion, "has schema version 7, this binary knows 3"},
		{"schema version 0", store(`UPDATE meta SET value = 0 WHERE name = 'schema_version'`), nil, SQLiteOptions{},
			ErrNotStore, "schema version 0, which no epochflow release wrote"},
		{"schema version not a number", store(`UPDATE meta SET value = 'one' WHERE name = 'schema_version'`), nil, SQLiteOptions{},
			ErrNotStore, "not an integer"},
		{"no schema version", store(`DELETE FROM meta WHERE name = 'schema_version'`), nil, SQLiteOptions{},
			ErrNotStore, "has no schema_version"},
		{"missing table", store(`DROP TABLE chunks`), nil, SQLiteOptions{},
			ErrNotStore, "lacks table(s) chunks: it is corrupt"},
		{"another database", func(t *testing.T, dir string) {
			db, err := sql.Open("sqlite", filepath.Join(dir, FileName))
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			if _, err := db.Exec(`CREATE TABLE users (name TEXT)`); err != nil {
				t.Fatal(err)
			}
		}, nil, SQLiteOptions{}, ErrNotStore, "without epochflow's meta table"},
		{"garbage", func(t *testing.T, dir string) {
			b := make([]byte, 8192)
			for i := range b {
				b[i] = byte(i*7 + i/3)
			}
			if err := os.WriteFile(filepath.Join(dir, FileName), b, 0o644); err != nil {
				t.Fatal(err)
			}
		}, nil, SQLiteOptions{}, ErrNotStore, "is not an SQLite database or is corrupt"},
		{"garbage read-only", func(t *testing.T, dir string) {
			if err := os.WriteFile(filepath.Join(dir, FileName), []byte(strings.Repeat("not sqlite ", 1000)), 0o644); err != nil {
				t.Fatal(err)
			}
		}, nil, SQLiteOptions{ReadOnly: true}, ErrNotStore, "file is not a database"},
		{"damaged table", func(t *testing.T, dir string) {
			store("")(t, dir)
			damagePage(t, dir, "executions")
		}, nil, SQLiteOptions{}, ErrDamaged, "free space corruption (in executions)"},
		{"damaged table read-only", func(t *testing.T, dir string) {
			store("")(t, dir)
			damagePage(t, dir, "commits")
		}, nil, SQLiteOptions{ReadOnly: true}, ErrDamaged, "(in commits); the flow cannot resume from it: restore a backup of the directory"},
		{"store is a directory", func(t *testing.T, dir string) {
			if err := os.Mkdir(filepath.Join(dir, FileName), 0o755); err != nil {
				t.Fatal(err)
			}
		}, nil, SQLiteOptions{}, ErrNotStore, "is not a regular file"},
		{"directory under a file", func(t *testing.T, dir string) {
			if err := os.WriteFile(filepath.Join(dir, "file"), []byte("x"), 0o644); err != nil {
				t.Fatal(err)
			}
		}, func(dir string) string { return filepath.Join(dir, "file", "sub") }, SQLiteOptions{}, nil, "cannot create recovery directory"},
		{"read-only without store", func(t *testing.T, dir string) {}, nil, SQLiteOptions{ReadOnly: true}, ErrNoStore, ""},
		{"negative backup interval", store(""), nil, SQLiteOptions{BackupInterval: -time.Second}, nil, "negative BackupInterval"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			c.setup(t, dir)
			before := files(t, dir)
			open := dir
			if c.dir != nil {
				open = c.dir(dir)
			}
			s, err := OpenSQLite(ctx, open, c.opts)
			if err == nil {
				s.Close()
				t.Fatalf("OpenSQLite succeeded")
			}
			if (c.is != nil && !errors.Is(err, c.is)) || !strings.Contains(err.Error(), c.msg) || !strings.Contains(err.Error(), open) {
				t.Errorf("OpenSQLite: %v\nwant an error wrapping %v, naming %s, containing %q", err, c.is, open, c.msg)
			}
			after := files(t, dir)
			// Readers take their read marks in the -shm file (an index SQLite rebuilds from the
			// database and the -wal file): it is no part of the store's content.
			delete(before, filepath.Join(dir, FileName+"-shm"))
			delete(after, filepath.Join(dir, FileName+"-shm"))
			if !reflect.DeepEqual(before, after) {
				for name, b := range before {
					if a, ok := after[name]; !ok || a != b {
						t.Errorf("a refused open changed %s (len %d -> %d, still there: %v)", name, len(b), len(a), ok)
					}
				}
				for name := range after {
					if _, ok := before[name]; !ok {
						t.Errorf("a refused open created %s", name)
					}
				}
			}
		})
	}
}

func TestVersionCheck(t *testing.T) {
	// checkVersion with a newer "known" version tells an older store it cannot migrate
	// from one it can.
	migrate := func(context.Context, *sql.Tx) error { return nil }
	cases := []struct {
		version, known int64
		migrations     map[int]func(context.Context, *sql.Tx) error
		is             error
		msg            string
	}{
		{1, 1, nil, nil, ""},
		{3, 1, nil, ErrSchemaVersion, "has schema version 3, this binary knows 1: use a newer binary"},
		{1, 3, nil, ErrSchemaVersion, "has schema version 1, older than this binary's 3, and this binary cannot migrate it"},
		{1, 3, map[int]func(context.Context, *sql.Tx) error{1: migrate}, ErrSchemaVersion, "cannot migrate"},
		{1, 3, map[int]func(context.Context, *sql.Tx) error{1: migrate, 2: migrate}, nil, ""},
		{0, 3, nil, ErrNotStore, "no epochflow release wrote"},
		{-1, 1, nil, ErrNotStore, "no epochflow release wrote"},
	}
	for _, c := range cases {
		err := checkVersion("/x/"+FileName, c.version, c.known, c.migrations)
		if (c.is == nil) != (err == nil) || (err != nil && (!errors.Is(err, c.is) || !strings.Contains(err.Error(), c.msg))) {
			t.Errorf("checkVersion(%d, known %d, %d migrations) = %v, want %v containing %q", c.version, c.known, len(c.migrations), err, c.is, c.msg)
		}
	}
}

func TestSpecialDirectoryNames(t *testing.T) {
	for _, name := range []string{"with space", "hash#and?query", "percent%20", "ünïcode"} {
		dir := filepath.Join(t.TempDir(), name, "deeper")
		s := open(t, dir, SQLiteOptions{})
		begin(t, s, "f", 1)
		commit(t, s, 1, 1, snap("s", "k", 1, name))
		s.Close()
		if _, err := os.Stat(filepath.Join(dir, FileName)); err != nil {
			t.Errorf("%q: %v", name, err)
		}
		s = open(t, dir, SQLiteOptions{ReadOnly: true})
		if got := loadAll(t, s, "s"); !reflect.DeepEqual(got, map[string]entry{"k": {1, name}}) {
			t.Errorf("%q: Load = %v", name, got)
		}
	}
}

func TestRelativeDirectory(t *testing.T) {
	t.Chdir(t.TempDir())
	s := open(t, "rel", SQLiteOptions{})
	if !filepath.IsAbs(s.Path()) {
		t.Errorf("Path() = %q, want an absolute path", s.Path())
	}
	if _, err := os.Stat(filepath.Join("rel", FileName)); err != nil {
		t.Error(err)
	}
}

func TestDurabilitySettings(t *testing.T) {
	// Every pooled connection runs with synchronous=FULL on a WAL database.
	ctx := context.Background()
	s := open(t, t.TempDir(), SQLiteOptions{})
	var conns []*sql.Conn
	for range 3 {
		c, err := s.db.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
		var sync int
		var mode string
		if err := c.QueryRowContext(ctx, `PRAGMA synchronous`).Scan(&sync); err != nil {
			t.Fatal(err)
		}
		if err := c.QueryRowContext(ctx, `PRAGMA journal_mode`).Scan(&mode); err != nil {
			t.Fatal(err)
		}
		if sync != 2 || mode != "wal" {
			t.Errorf("connection: synchronous=%d journal_mode=%s, want 2 (FULL) and wal", sync, mode)
		}
	}
	for _, c := range conns {
		c.Close()
	}
}

// A second read-write open of a directory is refused while the first is open (in this
// process here; flock also holds across processes), and works once the first is closed. A
// read-only open (inspect) still works while the store is in use.
func TestSecondWriterIsRefused(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	w := open(t, dir, SQLiteOptions{})
	if _, err := w.Begin(ctx, Execution{Flow: "f", Workers: 1}); err != nil {
		t.Fatal(err)
	}
	before := files(t, dir)
	delete(before, filepath.Join(dir, FileName+"-shm"))
	_, err := OpenSQLite(ctx, dir, SQLiteOptions{})
	if !errors.Is(err, ErrInUse) || !strings.Contains(err.Error(), dir) || !strings.Contains(err.Error(), "another recovery directory") {
		t.Fatalf("second open: %v, want ErrInUse naming %s and what to do", err, dir)
	}
	after := files(t, dir)
	delete(after, filepath.Join(dir, FileName+"-shm"))
	if !reflect.DeepEqual(before, after) {
		t.Error("a refused second open changed the store's files")
	}
	r := open(t, dir, SQLiteOptions{ReadOnly: true})
	if _, err := r.Executions(ctx); err != nil {
		t.Errorf("read-only open of a store in use: %v", err)
	}
	r.Close()
	w.Close()
	w2 := open(t, dir, SQLiteOptions{})
	defer w2.Close()
	if ex, err := w2.Executions(ctx); err != nil || len(ex) != 1 {
		t.Errorf("after the first store closed: executions %v, %v", ex, err)
	}
}

// damagePage overwrites the first free block pointer of the root page of table in the store
// in dir, which SQLite's quick check reports as free space corruption.
func damagePage(t *testing.T, dir, table string) {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+filepath.Join(dir, FileName)+"?mode=ro")
	if err != nil {
		t.Fatal(err)
	}
	var root, pageSize int64
	if err := db.QueryRow(`SELECT rootpage FROM sqlite_schema WHERE name = ?`, table).Scan(&root); err != nil {
		t.Fatal(err)
	}
	if err := db.QueryRow(`PRAGMA page_size`).Scan(&pageSize); err != nil {
		t.Fatal(err)
	}
	db.Close()
	overwrite(t, dir, (root-1)*pageSize+1, []byte{0xff, 0xff})
}
