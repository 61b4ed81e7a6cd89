package recovery

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

// v1Fixture is a store of schema version 1 written by the code of that version (before
// step_sums): flow "wordcount", 2 workers, epochs 1 to 3 committed with a backup window of
// an hour, garbage collection up to epoch 2; it keeps a backup (plum at 1), an empty state
// (fig at 2) and a tombstone (fig at 3).
const v1Fixture = "testdata/v1/" + FileName

// v2Fixture is a store of schema version 2 written by the code of that version: v1Fixture
// migrated to version 2, then execution 2 (1 worker, steps count, split and sum) committed
// epoch 4 (kiwi and a tombstone of apple in count, 300 keys w000 to w299 in sum, whose state
// is their number) and, a second later, epoch 5 (kiwi and w007 again), with a backup window
// of an hour: every replaced snapshot of epochs 1 to 5 is still there.
const v2Fixture = "testdata/v2/" + FileName

// copyFixture copies v1Fixture into a new directory.
func copyFixture(t *testing.T) string {
	t.Helper()
	return copyFixtureOf(t, v1Fixture)
}

// copyFixtureOf copies a fixture store into a new directory.
func copyFixtureOf(t *testing.T, fixture string) string {
	t.Helper()
	b, err := os.ReadFile(fixture)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, FileName), b, 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// A store of schema version 1 is migrated by a read-write open, and read as it was written:
// the same resume, the same state, now verified.
func TestMigrateV1(t *testing.T) {
	ctx := context.Background()
	dir := copyFixture(t)

	// A read-only open (inspect) does not migrate: it refuses and says how.
	if _, err := OpenSQLite(ctx, dir, SQLiteOptions{ReadOnly: true}); !errors.Is(err, ErrSchemaVersion) ||
		!strings.Contains(err.Error(), fmt.Sprintf("has schema version 1: open it read-write with this binary to migrate it to %d", SchemaVersion)) {
		t.Errorf("read-only open of a version 1 store: %v", err)
	}

	s := open(t, dir, SQLiteOptions{})
	var version int
	if err := s.db.QueryRow(`SELECT value FROM meta WHERE name = 'schema_version'`).Scan(&version); err != nil || version != SchemaVersion {
		t.Fatalf("schema_version after the migration = %d, %v; want %d", version, err, SchemaVersion)
	}
	ids, err := s.StepIDs(ctx)
	if err != nil || !reflect.DeepEqual(ids, []string{"count", "split"}) {
		t.Fatalf("StepIDs() = %q, %v", ids, err)
	}
	r := begin(t, s, "wordcount", 1, "count", "split")
	if want := (Resume{Execution: 2, Committed: 3, Flow: "wordcount", Steps: []string{"count", "split"}, Workers: 2}); !reflect.DeepEqual(r, want) {
		t.Errorf("Begin = %+v, want %+v", r, want)
	}
	wantCount := map[string]entry{"apple": {2, "10"}, "plum": {3, "30"}}
	if got := loadAll(t, s, "count"); !reflect.DeepEqual(got, wantCount) {
		t.Errorf("Load(count) = %v, want %v", got, wantCount)
	}
	if got := loadAll(t, s, "split"); !reflect.DeepEqual(got, map[string]entry{"": {1, ""}}) {
		t.Errorf("Load(split) = %v", got)
	}
	if err := s.Verify(ctx); err != nil {
		t.Errorf("Verify() after the migration: %v", err)
	}
	// The migrated sums are those the commits keep: a commit that collects the backup and
	// the tombstone, and a reopen, still verify.
	commit(t, s, 1, 4, snap("count", "plum", 4, "40"), tomb("count", "apple", 4))
	s.Close()
	s = open(t, dir, SQLiteOptions{})
	if got := loadAll(t, s, "count"); !reflect.DeepEqual(got, map[string]entry{"plum": {4, "40"}}) {
		t.Errorf("Load(count) after a commit = %v", got)
	}
	if err := s.Verify(ctx); err != nil {
		t.Errorf("Verify() after a commit: %v", err)
	}
}

// A damaged store of schema version 1 is not migrated (its sums would bless the damage): it
// is refused, and stays at version 1.
func TestMigrateDamagedV1(t *testing.T) {
	ctx := context.Background()
	dir := copyFixture(t)
	path := filepath.Join(dir, FileName)
	damagePage(t, dir, "snapshots")
	before := files(t, dir)

	_, err := OpenSQLite(ctx, dir, SQLiteOptions{})
	if !errors.Is(err, ErrDamaged) || !strings.Contains(err.Error(), "before migrating it from schema version 1") ||
		!strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "snapshots") {
		t.Fatalf("open of a damaged version 1 store: %v\nwant ErrDamaged naming the file and the table, before migrating", err)
	}
	if after := files(t, dir); !reflect.DeepEqual(before, after) {
		t.Errorf("the refused open changed the directory")
	}
	db, err := sql.Open("sqlite", "file:"+path+"?mode=ro")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var version int
	if err := db.QueryRow(`SELECT value FROM meta WHERE name = 'schema_version'`).Scan(&version); err != nil || version != 1 {
		t.Errorf("schema_version after the refused migration = %d, %v; want 1", version, err)
	}
}

// v2Rows are the snapshot rows of v2Fixture, and v2Load what Load returns for its steps.
func v2Rows() ([]row, map[string]map[string]entry) {
	rs := []row{{"count", "apple", 2, false}, {"count", "apple", 4, true}, {"count", "kiwi", 4, false}, {"count", "kiwi", 5, false},
		{"count", "plum", 3, false}, {"split", "", 1, false}}
	sum := map[string]entry{}
	for k := range 300 {
		key := fmt.Sprintf("w%03d", k)
		rs = append(rs, row{"sum", key, 4, false})
		sum[key] = entry{4, fmt.Sprint(k)}
		if k == 7 {
			rs = append(rs, row{"sum", key, 5, false})
			sum[key] = entry{5, "seven"}
		}
	}
	return rs, map[string]map[string]entry{
		"count": {"kiwi": {5, "6"}, "plum": {3, "30"}},
		"split": {"": {1, ""}},
		"sum":   sum,
	}
}

// A store of schema version 2 is migrated by a read-write open to runs of chunks holding the
// same snapshots, backups and tombstones included: the same resume, verified, and commits
// go on from it.
func TestMigrateV2(t *testing.T) {
	ctx := context.Background()
	dir := copyFixtureOf(t, v2Fixture)
	if _, err := OpenSQLite(ctx, dir, SQLiteOptions{ReadOnly: true}); !errors.Is(err, ErrSchemaVersion) ||
		!strings.Contains(err.Error(), "has schema version 2: open it read-write with this binary to migrate it to 3") {
		t.Errorf("read-only open of a version 2 store: %v", err)
	}
	s := open(t, dir, SQLiteOptions{BackupInterval: time.Hour})
	var version int
	if err := s.db.QueryRow(`SELECT value FROM meta WHERE name = 'schema_version'`).Scan(&version); err != nil || version != SchemaVersion {
		t.Fatalf("schema_version after the migration = %d, %v; want %d", version, err, SchemaVersion)
	}
	wantRows, wantLoad := v2Rows()
	if got := rows(t, s); !reflect.DeepEqual(got, wantRows) {
		t.Errorf("entries after the migration =\n%v\nwant the version 2 rows\n%v", got, wantRows)
	}
	ids, err := s.StepIDs(ctx)
	if err != nil || !reflect.DeepEqual(ids, []string{"count", "split", "sum"}) {
		t.Fatalf("StepIDs() = %q, %v", ids, err)
	}
	r := begin(t, s, "wordcount", 1, "count", "split", "sum")
	if r.Execution != 3 || r.Committed != 5 || r.Workers != 1 {
		t.Errorf("Begin = %+v, want execution 3 resuming after epoch 5 of 1 worker", r)
	}
	for _, id := range ids {
		if got := loadAll(t, s, id); !reflect.DeepEqual(got, wantLoad[id]) {
			t.Errorf("Load(%s) = %v, want %v", id, got, wantLoad[id])
		}
	}
	if err := s.Verify(ctx); err != nil {
		t.Errorf("Verify() after the migration: %v", err)
	}
	if _, err := s.db.Exec(`SELECT 1 FROM snapshots`); err == nil {
		t.Error("the snapshots table of version 2 is still there")
	}
	commit(t, s, 1, 6, snap("sum", "w007", 6, "7"), tomb("count", "plum", 6))
	s.Close()
	s = open(t, dir, SQLiteOptions{})
	wantLoad["sum"]["w007"] = entry{6, "7"}
	delete(wantLoad["count"], "plum")
	for _, id := range ids {
		if got := loadAll(t, s, id); !reflect.DeepEqual(got, wantLoad[id]) {
			t.Errorf("after a commit, Load(%s) = %v, want %v", id, got, wantLoad[id])
		}
	}
	if err := s.Verify(ctx); err != nil {
		t.Errorf("Verify() after a commit: %v", err)
	}
}

// A version 2 store whose rows were changed behind its back (which SQLite's check cannot see)
// is not migrated: its rows would become runs whose checksums bless the change. It is
// refused, and stays at version 2.
func TestMigrateEditedV2(t *testing.T) {
	ctx := context.Background()
	dir := copyFixtureOf(t, v2Fixture)
	editStore(t, dir, `UPDATE snapshots SET state = CAST('78' AS BLOB) WHERE step = 'sum' AND key = 'w077'`)
	_, err := OpenSQLite(ctx, dir, SQLiteOptions{})
	if !errors.Is(err, ErrDamaged) || !strings.Contains(err.Error(), `step "sum" has 301 snapshot rows`) ||
		!strings.Contains(err.Error(), filepath.Join(dir, FileName)) || !strings.Contains(err.Error(), "migrating from schema version 2") {
		t.Fatalf("open of an edited version 2 store: %v\nwant ErrDamaged naming the file and the step, while migrating", err)
	}
	db, err := sql.Open("sqlite", "file:"+filepath.Join(dir, FileName)+"?mode=ro")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var version int
	if err := db.QueryRow(`SELECT value FROM meta WHERE name = 'schema_version'`).Scan(&version); err != nil || version != 2 {
		t.Errorf("schema_version after the refused migration = %d, %v; want 2", version, err)
	}
}
