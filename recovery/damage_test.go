package recovery

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"pgregory.net/rapid"
)

// damageKeys is how many keys step "big" of the damage tests' store holds: about 0.8 MB of
// file (the report damaged 42 bytes of a 1.5 MB store of 40,000 keys; under the race
// detector, SQLite reads 40,000 keys too slowly for the suite's time limit); propertyKeys
// is that of the property test's store, which it damages 100 times.
const (
	damageKeys   = 10_000
	propertyKeys = 2_000
)

// damageStores are the stores the damage tests corrupt copies of, by their number of keys,
// with what Load must return; removed by TestMain.
var damageStores struct {
	sync.Mutex
	dirs map[int]string // stores no process has open (no -wal file)
	want map[int]map[string]map[string]entry
}

// damageTemplate returns a store directory of two steps, "big" with damageKeys keys and
// "small" with 50, rewritten over four commits with a backup window of an hour: the first
// three commits' replaced snapshots are collected by the fourth, two hours later (which
// frees pages), and the fourth's tombstones and the snapshots it replaced stay. It also
// returns what Load returns for each step.
func damageTemplate(t testing.TB, keys int) (string, map[string]map[string]entry) {
	t.Helper()
	damageStores.Lock()
	defer damageStores.Unlock()
	if dir, ok := damageStores.dirs[keys]; ok {
		return dir, damageStores.want[keys]
	}
	dir, err := os.MkdirTemp("", "epochflow-damage-")
	if err != nil {
		t.Fatal(err)
	}
	if damageStores.dirs == nil {
		damageStores.dirs = map[int]string{}
		damageStores.want = map[int]map[string]map[string]entry{}
	}
	damageStores.dirs[keys] = dir
	if err := fillDamageTemplate(dir, keys); err != nil {
		t.Fatal(err)
	}
	want, err := loadEverything(dir)
	if err != nil {
		t.Fatal(err)
	}
	damageStores.want[keys] = want
	return dir, want
}

func fillDamageTemplate(dir string, keys int) error {
	// Chunks of 8 KiB: the big step's runs have a dozen of them or more.
	defer func(n int) { chunkTarget = n }(chunkTarget)
	chunkTarget = 8 << 10
	ctx := context.Background()
	clk := newClock()
	s, err := OpenSQLite(ctx, dir, SQLiteOptions{BackupInterval: time.Hour, Now: clk.Now})
	if err != nil {
		return err
	}
	defer s.Close()
	if _, err := s.Begin(ctx, Execution{Flow: "damage", Steps: []string{"big", "small"}, Workers: 1}); err != nil {
		return err
	}
	for e := uint64(1); e <= 4; e++ {
		if e == 4 {
			clk.Advance(2 * time.Hour)
		}
		var snaps []Snapshot
		for k := range keys {
			if e == 1 || k%int(e) == 0 {
				snaps = append(snaps, snap("big", fmt.Sprintf("k%05d", k), e, fmt.Sprint(k*10+int(e))))
			}
		}
		for k := range 50 {
			if (k+int(e))%4 == 0 {
				snaps = append(snaps, tomb("small", fmt.Sprint("s", k), e))
			} else {
				snaps = append(snaps, snap("small", fmt.Sprint("s", k), e, strings.Repeat("x", k*10)))
			}
		}
		if err := s.Commit(ctx, Epoch{Epoch: e, Frontiers: []uint64{e}, Snapshots: snaps}); err != nil {
			return err
		}
	}
	return s.Close()
}

// loadEverything opens the store in dir and loads every step of it.
func loadEverything(dir string) (map[string]map[string]entry, error) {
	ctx := context.Background()
	s, err := OpenSQLite(ctx, dir, SQLiteOptions{})
	if err != nil {
		return nil, err
	}
	defer s.Close()
	if _, err := s.Begin(ctx, Execution{Flow: "damage", Steps: []string{"big", "small"}, Workers: 1}); err != nil {
		return nil, err
	}
	ids, err := s.StepIDs(ctx)
	if err != nil {
		return nil, err
	}
	out := map[string]map[string]entry{}
	for _, id := range ids {
		m := map[string]entry{}
		if err := s.Load(ctx, id, func(key string, epoch uint64, state []byte) error {
			m[key] = entry{epoch, string(state)}
			return nil
		}); err != nil {
			return nil, err
		}
		out[id] = m
	}
	return out, nil
}

// copyStore copies the store file of the directory from into a new directory.
func copyStore(t testing.TB, from string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(from, FileName))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, FileName), b, 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// overwrite writes garbage at offset off of the store file in dir.
func overwrite(t fataler, dir string, off int64, garbage []byte) {
	t.Helper()
	f, err := os.OpenFile(filepath.Join(dir, FileName), os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(garbage, off); err != nil {
		t.Fatal(err)
	}
}

// resumeOutcome resumes the (possibly damaged) store in dir as the engine does and checks
// that the outcome is a refusal (an error wrapping ErrDamaged, or ErrNotStore,
// ErrSchemaVersion or ErrOtherFlow where damage changed what those check, naming the store's
// file) or every step's complete, correct state. It returns the refusal, if any.
func resumeOutcome(t fataler, dir string, want map[string]map[string]entry) error {
	t.Helper()
	got, err := loadEverything(dir)
	if err != nil {
		// ErrSchemaVersion: damage made the recorded version newer than this binary's;
		// ErrOtherFlow: it changed the flow's name in the executions table (whose rows, as
		// those of the other small tables, have no checksums).
		if !errors.Is(err, ErrDamaged) && !errors.Is(err, ErrNotStore) && !errors.Is(err, ErrSchemaVersion) && !errors.Is(err, ErrOtherFlow) {
			t.Fatal(fmt.Sprintf("refused with an error wrapping none of ErrDamaged, ErrNotStore, ErrSchemaVersion and ErrOtherFlow: %v", err))
		}
		if !strings.Contains(err.Error(), filepath.Join(dir, FileName)) {
			t.Fatal(fmt.Sprintf("refusal does not name the store's file: %v", err))
		}
		return err
	}
	for step, w := range want {
		if g := got[step]; !reflect.DeepEqual(g, w) {
			t.Fatal(fmt.Sprintf("the damaged store resumed: Load(%q) returned %d keys without an error, want %d keys or a refusal (%d differ)",
				step, len(g), len(w), differing(g, w)))
		}
	}
	if len(got) != len(want) {
		t.Fatal(fmt.Sprintf("the damaged store resumed with steps %v, want %d steps", reflect.ValueOf(got).MapKeys(), len(want)))
	}
	return nil
}

func differing(a, b map[string]entry) int {
	n := 0
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			n++
		}
	}
	for k := range b {
		if _, ok := a[k]; !ok {
			n++
		}
	}
	return n
}

// 42 bytes of garbage at several places in the middle of a store: every resume is refused
// or complete, never partial. (Before the store verified itself, Load returned part of the
// big step without an error for most of these positions.)
func TestDamagedStoreIsRefused(t *testing.T) {
	template, want := damageTemplate(t, damageKeys)
	fi, err := os.Stat(filepath.Join(template, FileName))
	if err != nil {
		t.Fatal(err)
	}
	garbage := []byte(strings.Repeat("garbage!", 6)[:42])
	refused := 0
	for _, frac := range []float64{0.1, 0.25, 0.4, 0.5, 0.6, 0.75, 0.9} {
		// At the start of a page (its header) and inside one (its cells).
		for _, inPage := range []int64{0, 1000} {
			off := int64(float64(fi.Size())*frac)/4096*4096 + inPage
			t.Run(fmt.Sprintf("offset=%d", off), func(t *testing.T) {
				dir := copyStore(t, template)
				overwrite(t, dir, off, garbage)
				if err := resumeOutcome(t, dir, want); err != nil {
					refused++
					t.Logf("refused: %v", err)
				}
			})
		}
	}
	if refused == 0 {
		t.Errorf("no damage was refused: the test damages nothing")
	}
}

// Random garbage of random length at random offsets: every resume is refused or complete.
func TestDamageProperty(t *testing.T) {
	template, want := damageTemplate(t, propertyKeys)
	fi, err := os.Stat(filepath.Join(template, FileName))
	if err != nil {
		t.Fatal(err)
	}
	base := t.TempDir()
	rapid.Check(t, func(rt *rapid.T) {
		off := rapid.Int64Range(0, fi.Size()-1).Draw(rt, "offset")
		garbage := rapid.SliceOfN(rapid.Byte(), 1, 64).Draw(rt, "garbage")
		dir, err := os.MkdirTemp(base, "")
		if err != nil {
			rt.Fatal(err)
		}
		defer os.RemoveAll(dir)
		b, err := os.ReadFile(filepath.Join(template, FileName))
		if err != nil {
			rt.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, FileName), b, 0o644); err != nil {
			rt.Fatal(err)
		}
		overwrite(rt, dir, off, garbage)
		resumeOutcome(rt, dir, want)
	})
}

// editStore runs SQL on the store in dir behind its back, as an operator's sqlite3 shell might.
func editStore(t *testing.T, dir string, stmts ...string) {
	t.Helper()
	db, err := sql.Open("sqlite", filepath.Join(dir, FileName))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for _, s := range stmts {
		if _, err := db.Exec(s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
}

// Rows deleted or changed behind the store's back, which SQLite's checks cannot see: Load
// refuses the step whose rows differ from what its commits recorded, naming it and the file.
func TestEditedStoreIsRefused(t *testing.T) {
	template, want := damageTemplate(t, damageKeys)
	// The oldest run of a step, and its first chunk.
	const bigRun = `(SELECT id FROM runs WHERE step = 'big' ORDER BY hi LIMIT 1)`
	const smallRun = `(SELECT id FROM runs WHERE step = 'small' ORDER BY hi LIMIT 1)`
	cases := []struct {
		name string
		edit []string
		step string // the step Load refuses
		msg  string
	}{
		{"chunk deleted", []string{`DELETE FROM chunks WHERE run = ` + bigRun + ` AND seq = 1`}, "big", "chunks, its commit recorded"},
		{"last chunk deleted", []string{`DELETE FROM chunks WHERE run = ` + bigRun + ` AND seq = (SELECT MAX(seq) FROM chunks WHERE run = ` + bigRun + `)`}, "big", "chunks, its commit recorded"},
		{"chunk altered", []string{`UPDATE chunks SET data = CAST(substr(data, 1, 100) || x'ff' || substr(data, 102) AS BLOB) WHERE run = ` + bigRun + ` AND seq = 2`}, "big", "checksum"},
		{"chunk checksum altered", []string{`UPDATE chunks SET crc = crc + 1 WHERE run = ` + bigRun + ` AND seq = 0`}, "big", "checksum"},
		{"chunk entry count altered", []string{`UPDATE chunks SET entries = entries + 1 WHERE run = ` + smallRun + ` AND seq = 0`}, "small", "entries, its commit recorded"},
		{"chunks swapped", []string{
			`UPDATE chunks SET seq = -1 WHERE run = ` + bigRun + ` AND seq = 0`,
			`UPDATE chunks SET seq = 0 WHERE run = ` + bigRun + ` AND seq = 1`,
			`UPDATE chunks SET seq = 1 WHERE run = ` + bigRun + ` AND seq = -1`}, "big", "checksum"},
		{"chunk added", []string{`INSERT INTO chunks SELECT run, seq + 1000, entries, crc, data FROM chunks WHERE run = ` + smallRun + ` AND seq = 0`}, "small", "chunks, its commit recorded"},
		{"run entry count altered", []string{`UPDATE runs SET entries = entries - 1 WHERE step = 'small'`}, "small", "commits (the last of epoch 4) recorded"},
		{"run checksum altered", []string{`UPDATE runs SET sum = sum + 1 WHERE step = 'small'`}, "small", "checksum"},
		{"run and its bookkeeping altered alike", []string{`UPDATE runs SET sum = sum + 1 WHERE step = 'small'`, `UPDATE step_sums SET sum = sum + 1 WHERE step = 'small'`}, "small", "checksum differs"},
		{"run moved to another step", []string{`UPDATE runs SET step = 'other' WHERE step = 'big'`}, "big", ""},
		{"every run of a step deleted", []string{`DELETE FROM runs WHERE step = 'small'`}, "small", ""},
		{"its bookkeeping deleted", []string{`DELETE FROM step_sums WHERE step = 'small'`}, "small", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := copyStore(t, template)
			editStore(t, dir, c.edit...)
			err := resumeOutcome(t, dir, want)
			if err == nil {
				t.Fatal("the edited store resumed with the state it had before the edit")
			}
			if !errors.Is(err, ErrDamaged) || !strings.Contains(err.Error(), fmt.Sprintf("%q", c.step)) || !strings.Contains(err.Error(), c.msg) {
				t.Errorf("refusal: %v\nwant ErrDamaged naming step %q, containing %q", err, c.step, c.msg)
			}
			for _, what := range []string{"restore a backup", "new recovery directory"} {
				if !strings.Contains(err.Error(), what) {
					t.Errorf("refusal does not say %q: %v", what, err)
				}
			}
		})
	}
}

// A damaged byte in the text of the schema can rename a column (or an index's column) and
// still parse, which no SQLite check sees; one in the meta table can change the schema
// version. The open is refused, naming the file, what is wrong and what to do, instead of a
// resume that fails on "no such column" (TestDamageProperty found one in step_sums) or a
// migration of a store of another version.
func TestSchemaDamageIsRefused(t *testing.T) {
	template, _ := damageTemplate(t, propertyKeys)
	rename := func(name, from, to string) []string {
		return []string{`PRAGMA writable_schema = ON`,
			fmt.Sprintf(`UPDATE sqlite_schema SET sql = replace(sql, '%s', '%s') WHERE name = '%s'`, from, to, name)}
	}
	version := func(v int) []string {
		return []string{fmt.Sprintf(`UPDATE meta SET value = %d WHERE name = 'schema_version'`, v)}
	}
	for _, c := range []struct {
		name string
		edit []string
		is   error
		want string
	}{
		{"step_sums column", rename("step_sums", "epoch", "epocx"), ErrDamaged, "table step_sums the columns"},
		{"meta column", rename("meta", "value", "valuf"), ErrDamaged, "table meta the columns"},
		{"chunks column", rename("chunks", "crc", "crx"), ErrDamaged, "table chunks the columns"},
		{"index column", rename("runs_step", "hi", "lo"), ErrDamaged, "index runs_step the columns"},
		{"older version", version(2), ErrDamaged, "records schema version 2, but its tables are those of schema version 3"},
		{"oldest version", version(1), ErrDamaged, "records schema version 1, but its tables are those of schema version 3"},
		{"newer version", version(37), ErrSchemaVersion, "if no newer binary wrote it, the number is damaged"},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := copyStore(t, template)
			editStore(t, dir, c.edit...)
			for _, ro := range []bool{false, true} {
				s, err := OpenSQLite(context.Background(), dir, SQLiteOptions{ReadOnly: ro})
				if err == nil {
					s.Close()
					t.Fatalf("OpenSQLite(ReadOnly: %v) of the damaged store succeeded", ro)
				}
				if !errors.Is(err, c.is) {
					t.Errorf("OpenSQLite(ReadOnly: %v): %v, want an error wrapping %v", ro, err, c.is)
				}
				for _, want := range []string{filepath.Join(dir, FileName), c.want, "restore a backup of the directory " + dir, "new recovery directory"} {
					if !strings.Contains(err.Error(), want) {
						t.Errorf("OpenSQLite(ReadOnly: %v): %v\nwant an error containing %q", ro, err, want)
					}
				}
			}
		})
	}
}

// Damage to the schema's page that hides every table (its cell count zeroed) makes the file
// look like an empty database, in which a read-write open would create a new store over the
// old one's pages, and a resume would start over with no state (TestDamageProperty found it):
// SQLite's quick check finds the pages that belong to no table, and the open is refused
// without writing anything.
func TestHiddenSchemaIsRefused(t *testing.T) {
	template, _ := damageTemplate(t, propertyKeys)
	dir := copyStore(t, template)
	path := filepath.Join(dir, FileName)
	overwrite(t, dir, 100+3, []byte{0, 0}) // page 1's cell count: sqlite_schema's rows
	damaged, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, ro := range []bool{false, true} {
		s, err := OpenSQLite(context.Background(), dir, SQLiteOptions{ReadOnly: ro})
		if err == nil {
			s.Close()
			t.Fatalf("OpenSQLite(ReadOnly: %v) of a store whose schema's rows are hidden succeeded", ro)
		}
		if !errors.Is(err, ErrDamaged) {
			t.Errorf("OpenSQLite(ReadOnly: %v): %v, want an error wrapping ErrDamaged", ro, err)
		}
		for _, want := range []string{path, "quick check", "restore a backup of the directory " + dir} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("OpenSQLite(ReadOnly: %v): %v\nwant an error containing %q", ro, err, want)
			}
		}
	}
	if after, err := os.ReadFile(path); err != nil || !bytes.Equal(after, damaged) {
		t.Errorf("the refused open changed the store's file (%v)", err)
	}
}

// Damage that no chunk shows, in the list of free pages (which the next commit would allocate
// from, over live pages): a read-write open, as a run does, is refused by SQLite's quick check
// of the whole file, with an error that names the file and what to do, and writes nothing to
// it; Verify (recovery inspect, which opens read-only) finds it too.
func TestFreeListDamageIsFound(t *testing.T) {
	template, _ := damageTemplate(t, damageKeys)
	dir := copyStore(t, template)
	path := filepath.Join(dir, FileName)
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	pageSize := int64(b[16])<<8 | int64(b[17])
	trunk := int64(b[32])<<24 | int64(b[33])<<16 | int64(b[34])<<8 | int64(b[35])
	if trunk == 0 {
		t.Fatal("the template store has no free pages")
	}
	overwrite(t, dir, (trunk-1)*pageSize+4, []byte{0, 0, 0x0f, 0xff}) // its count of leaf pages
	damaged, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}

	s, err := OpenSQLite(context.Background(), dir, SQLiteOptions{})
	if err == nil {
		s.Close()
		t.Fatal("OpenSQLite of a store with a damaged free list succeeded: the run would resume and its next commit allocate from the damaged list")
	}
	for _, want := range []string{path, "quick check", "Freelist", "the flow cannot resume from it", "restore a backup of the directory " + dir, "new recovery directory"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("OpenSQLite of a store with a damaged free list: %v\nwant an error containing %q", err, want)
		}
	}
	if !errors.Is(err, ErrDamaged) {
		t.Errorf("OpenSQLite: %v, want an error wrapping ErrDamaged", err)
	}
	if after, err := os.ReadFile(path); err != nil || !bytes.Equal(after, damaged) {
		t.Errorf("the refused open changed the store's file (%v)", err)
	}
	for _, name := range []string{FileName + "-wal", FileName + "-shm", LockName} {
		if _, err := os.Lstat(filepath.Join(dir, name)); err == nil {
			t.Errorf("the refused open created %s", name)
		}
	}

	ro := open(t, dir, SQLiteOptions{ReadOnly: true})
	if err := ro.Verify(context.Background()); !errors.Is(err, ErrDamaged) || !strings.Contains(err.Error(), "Freelist") {
		t.Errorf("Verify() of a store with a damaged free list: %v; want ErrDamaged from the quick check", err)
	}
}
