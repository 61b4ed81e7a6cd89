package recovery

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"
)

// applicationID marks an epochflow store in the SQLite header (PRAGMA application_id): "EPFL".
const applicationID = 0x4550464c

// schemaV1 is the layout of schema version 1, with which a new store starts before the
// migrations bring it to SchemaVersion (see initialize). Every epoch and time is an INTEGER; times are
// Unix nanoseconds (UTC). Frontiers are uint64 stored as the int64 with the same bits.
//
//   - meta: one row per setting; schema_version (this layout's version) and gc_horizon (the
//     newest epoch garbage collection has been run up to).
//   - executions: one row per Begin; steps is a JSON array of step ids.
//   - frontiers: each worker's frontier at its execution's last commit.
//   - commits: the committed epochs still inside the backup window (and the newest one
//     before it); the committed epoch is MAX(epoch). commits_committed_at finds the commits
//     that have left the window since the last collection without a scan.
//   - snapshots: state per (step, key, epoch); a NULL state is a tombstone.
//   - gc_pending: with a backup window, the (step, key) written at each epoch that garbage
//     collection has not reached yet (see SQLiteStore.collect).
var schemaV1 = []string{
	`CREATE TABLE meta (
		name  TEXT PRIMARY KEY,
		value ANY NOT NULL
	) STRICT`,
	`CREATE TABLE executions (
		execution  INTEGER PRIMARY KEY,
		flow       TEXT NOT NULL,
		steps      TEXT NOT NULL,
		workers    INTEGER NOT NULL,
		started_at INTEGER NOT NULL
	) STRICT`,
	`CREATE TABLE frontiers (
		execution INTEGER NOT NULL REFERENCES executions,
		worker    INTEGER NOT NULL,
		frontier  INTEGER NOT NULL,
		PRIMARY KEY (execution, worker)
	) STRICT, WITHOUT ROWID`,
	`CREATE TABLE commits (
		epoch        INTEGER PRIMARY KEY,
		execution    INTEGER NOT NULL REFERENCES executions,
		committed_at INTEGER NOT NULL
	) STRICT`,
	`CREATE TABLE snapshots (
		step  TEXT NOT NULL,
		key   TEXT NOT NULL,
		epoch INTEGER NOT NULL,
		state BLOB,
		PRIMARY KEY (step, key, epoch)
	) STRICT, WITHOUT ROWID`,
	`CREATE INDEX commits_committed_at ON commits (committed_at)`,
	`CREATE TABLE gc_pending (
		epoch INTEGER NOT NULL,
		step  TEXT NOT NULL,
		key   TEXT NOT NULL,
		PRIMARY KEY (epoch, step, key)
	) STRICT, WITHOUT ROWID`,
	`INSERT INTO meta (name, value) VALUES ('schema_version', 1), ('gc_horizon', 0)`,
	`PRAGMA application_id = ` + strconv.Itoa(applicationID),
}

// storeTables are the tables a SchemaVersion store must have.
var storeTables = []string{"chunks", "commits", "executions", "frontiers", "meta", "runs", "step_sums"}

// versionTables are the tables of each schema version: checkSchema refuses a store whose
// tables are not those of the version its meta table records (damage to that number would
// otherwise run a migration on a store of another version, or skip one).
var versionTables = map[int64][]string{
	1: {"commits", "executions", "frontiers", "gc_pending", "meta", "snapshots"},
	2: {"commits", "executions", "frontiers", "gc_pending", "meta", "snapshots", "step_sums"},
	3: storeTables,
}

// versionOf returns the schema version whose tables (of those that any version has) are
// exactly tables, 0 if there is none.
func versionOf(tables map[string]bool) int64 {
	for v, ts := range versionTables {
		same := true
		for _, other := range versionTables {
			for _, t := range other {
				if tables[t] != slices.Contains(ts, t) {
					same = false
				}
			}
		}
		if same {
			return v
		}
	}
	return 0
}

// storeColumns are the columns of each table of a SchemaVersion store, as checkSchema
// compares them with the file's (name, declared type, NOT NULL, position in the primary
// key): a damaged byte in the text of the schema can rename a column and still parse, which
// SQLite's checks do not see, and every query of that column would then fail.
var storeColumns = map[string][]string{
	"meta":       {"name TEXT notnull pk1", "value ANY notnull"},
	"executions": {"execution INTEGER pk1", "flow TEXT notnull", "steps TEXT notnull", "workers INTEGER notnull", "started_at INTEGER notnull"},
	"frontiers":  {"execution INTEGER notnull pk1", "worker INTEGER notnull pk2", "frontier INTEGER notnull"},
	"commits":    {"epoch INTEGER pk1", "execution INTEGER notnull", "committed_at INTEGER notnull"},
	"step_sums":  {"step TEXT notnull pk1", "rows INTEGER notnull", "sum INTEGER notnull", "epoch INTEGER notnull"},
	"runs":       {"id INTEGER pk1", "step TEXT notnull", "lo INTEGER notnull", "hi INTEGER notnull", "entries INTEGER notnull", "chunks INTEGER notnull", "bytes INTEGER notnull", "sum INTEGER notnull"},
	"chunks":     {"run INTEGER notnull pk1", "seq INTEGER notnull pk2", "entries INTEGER notnull", "crc INTEGER notnull", "data BLOB notnull"},
}

// storeIndexes are the columns of the explicit indexes of a SchemaVersion store, which
// checkSchema compares with the file's as it does the tables' columns.
var storeIndexes = map[string][]string{
	"commits_committed_at": {"committed_at"},
	"runs_step":            {"step", "hi"},
}

// checkColumns compares the columns of table (or, if index, of the index) in the file with
// want, and returns an error wrapping ErrDamaged if they differ.
func checkColumns(ctx context.Context, q querier, path, name string, index bool, want []string) error {
	query := `SELECT name, type, "notnull", pk FROM pragma_table_info(?)`
	if index {
		query = `SELECT name, '', 0, 0 FROM pragma_index_info(?) ORDER BY seqno`
	}
	rows, err := q.QueryContext(ctx, query, name)
	if err != nil {
		return readError(path, err)
	}
	var got []string
	for rows.Next() {
		var col, typ string
		var notNull bool
		var pk int
		if err := rows.Scan(&col, &typ, &notNull, &pk); err != nil {
			rows.Close()
			return readError(path, err)
		}
		c := col
		if typ != "" {
			c += " " + typ
		}
		if notNull {
			c += " notnull"
		}
		if pk > 0 {
			c += " pk" + strconv.Itoa(pk)
		}
		got = append(got, c)
	}
	if err := rows.Close(); err != nil {
		return readError(path, err)
	}
	if err := rows.Err(); err != nil {
		return readError(path, err)
	}
	if !slices.Equal(got, want) {
		what := "table"
		if index {
			what = "index"
		}
		return damaged(path, fmt.Sprintf("its schema gives %s %s the columns (%s), epochflow's are (%s)",
			what, name, strings.Join(got, ", "), strings.Join(want, ", ")))
	}
	return nil
}

// bigTables are the tables whose size grows with the state: the quick check of a read-only
// open skips them (Load verifies what it reads of them; Verify, and a read-write open, check
// the whole file).
var bigTables = []string{"chunks"}

// migrations[v] turns a store of schema version v into one of version v+1, inside the open
// transaction.
var migrations = map[int]func(ctx context.Context, tx *sql.Tx) error{
	1: migrateV1,
	2: migrateV2,
}

// stepSumsV2 is the table that schema version 2 adds: per step that has snapshot rows, how
// many it has (backups and tombstones included), the sum modulo 2^64 of their rowHash (stored
// as the int64 with the same bits) and the committed epoch that last changed them. Commit
// keeps it exact in its transaction; Load and StepIDs compare the rows they read with it.
const stepSumsV2 = `CREATE TABLE step_sums (
		step  TEXT PRIMARY KEY,
		rows  INTEGER NOT NULL,
		sum   INTEGER NOT NULL,
		epoch INTEGER NOT NULL
	) STRICT, WITHOUT ROWID`

// migrateV1 brings a store of schema version 1, which kept no sums, to version 2: it creates
// step_sums from the snapshot rows as they are. OpenSQLite has run SQLite's quick check on
// the whole file first: what the sums record is the state of a store that SQLite finds sound.
func migrateV1(ctx context.Context, tx *sql.Tx) error {
	if _, err := tx.ExecContext(ctx, stepSumsV2); err != nil {
		return err
	}
	committed, err := committedEpoch(ctx, tx)
	if err != nil {
		return err
	}
	rows, err := tx.QueryContext(ctx, `SELECT step, key, epoch, state, state IS NULL FROM snapshots ORDER BY step, key, epoch`)
	if err != nil {
		return err
	}
	defer rows.Close()
	sums := map[string]*stepSum{}
	var order []string
	for rows.Next() {
		var step, key string
		var epoch int64
		var state sql.RawBytes
		var dead bool
		if err := rows.Scan(&step, &key, &epoch, &state, &dead); err != nil {
			return err
		}
		sum := sums[step]
		if sum == nil {
			sum = &stepSum{}
			sums[step] = sum
			order = append(order, step)
		}
		sum.add(rowHash(step, key, uint64(epoch), state, dead))
	}
	if err := rows.Err(); err != nil {
		return err
	}
	for _, step := range order {
		if _, err := tx.ExecContext(ctx, `INSERT INTO step_sums (step, rows, sum, epoch) VALUES (?, ?, ?, ?)`,
			step, sums[step].rows, int64(sums[step].sum), int64(committed)); err != nil {
			return err
		}
	}
	return nil
}

// schemaV3 is what schema version 3 adds: the snapshots as sorted runs of chunks (runs.go)
// instead of a row per (step, key, epoch).
//
//   - runs: one row per run: its step, the oldest and newest epoch of its entries, its entry
//     count, chunk count, bytes (of its chunks' blobs) and the sum of its chunks' checksums
//     (as the int64 with the same bits). A step's runs, ordered by hi, hold disjoint epoch
//     ranges.
//   - chunks: the blobs of the runs, numbered from 0 in each run, each with its entry count
//     and its CRC-32C (runfmt.ChunkCRC).
//   - step_sums stays, with a new meaning for sum: per step, the entry count and the sum of
//     the checksum sums over all its runs (rows counts entries: snapshots, backups and
//     tombstones kept).
//
// Tables snapshots and gc_pending go: garbage collection is compaction (compact.go).
var schemaV3 = []string{
	`CREATE TABLE runs (
		id      INTEGER PRIMARY KEY,
		step    TEXT NOT NULL,
		lo      INTEGER NOT NULL,
		hi      INTEGER NOT NULL,
		entries INTEGER NOT NULL,
		chunks  INTEGER NOT NULL,
		bytes   INTEGER NOT NULL,
		sum     INTEGER NOT NULL
	) STRICT`,
	`CREATE UNIQUE INDEX runs_step ON runs (step, hi)`,
	`CREATE TABLE chunks (
		run     INTEGER NOT NULL,
		seq     INTEGER NOT NULL,
		entries INTEGER NOT NULL,
		crc     INTEGER NOT NULL,
		data    BLOB NOT NULL,
		PRIMARY KEY (run, seq)
	) STRICT, WITHOUT ROWID`,
}

// migrateV2 brings a store of schema version 2 to version 3: it writes each step's snapshot
// rows, as they are (backups and tombstones included), as one run, and drops the tables of
// version 2, and replaces each step's step_sums entry with the sums of its run. It checks
// that the rows are those step_sums records (their count and the sum of their rowHash) before
// (OpenSQLite has run SQLite's quick check on the whole file), so that no damage is carried
// into checksums that would bless it.
func migrateV2(ctx context.Context, tx *sql.Tx) error {
	for _, stmt := range schemaV3 {
		if _, err := tx.ExecContext(ctx, stmt); err != nil {
			return err
		}
	}
	st, err := prepare(ctx, tx)
	if err != nil {
		return err
	}
	defer st.close()
	rows, err := tx.QueryContext(ctx, `SELECT step, key, epoch, state, state IS NULL FROM snapshots ORDER BY step, key, epoch`)
	if err != nil {
		return err
	}
	defer rows.Close()
	var w *runWriter
	var id int64
	var hashes stepSum // the version 2 sums of the step being written
	end := func() error {
		if w == nil {
			return nil
		}
		r, _, err := w.finish()
		if err != nil {
			return err
		}
		recorded, _, err := readStepSum(ctx, tx, r.step)
		if err != nil {
			return err
		}
		if hashes != recorded {
			return fmt.Errorf("%w: step %q has %d snapshot rows (checksum %#x), step_sums records %d (%#x): restore a backup of the directory, or start over with a new recovery directory",
				ErrDamaged, r.step, hashes.rows, hashes.sum, recorded.rows, recorded.sum)
		}
		committed, err := committedEpoch(ctx, tx)
		if err != nil {
			return err
		}
		return writeStepSum(ctx, tx, r.step, committed, totals([]runInfo{r}))
	}
	for rows.Next() {
		var e item
		var step string
		var epoch int64
		if err := rows.Scan(&step, &e.Key, &epoch, &e.State, &e.Dead); err != nil {
			return err
		}
		e.Epoch = uint64(epoch)
		if e.Dead {
			e.State = nil
		} else if e.State == nil {
			e.State = []byte{}
		}
		if w == nil || w.info.step != step {
			if err := end(); err != nil {
				return err
			}
			id++
			w = newRunWriter(ctx, tx, st.insert, step, id)
			hashes = stepSum{}
		}
		hashes.add(rowHash(step, e.Key, e.Epoch, e.State, e.Dead))
		if err := w.add(&e); err != nil {
			return err
		}
	}
	if err := rows.Err(); err != nil {
		return err
	}
	if err := end(); err != nil {
		return err
	}
	rows.Close()
	// A step_sums entry without rows (its rows were all lost) is refused by StepIDs, as
	// before the migration.
	for _, stmt := range []string{`DROP TABLE snapshots`, `DROP TABLE gc_pending`} {
		if _, err := tx.ExecContext(ctx, stmt); err != nil {
			return err
		}
	}
	return nil
}

// querier is what checkSchema needs: a *sql.DB or a *sql.Tx.
type querier interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// checkSchema reads the store at path through q, writing nothing. It returns the schema
// version found, 0 if the database has no table at all (a new or never-initialised store),
// or an error that says what is wrong with the file and what to do.
func checkSchema(ctx context.Context, q querier, path string) (int, error) {
	rows, err := q.QueryContext(ctx, `SELECT name FROM sqlite_schema WHERE type = 'table'`)
	if err != nil {
		return 0, readError(path, err)
	}
	tables := map[string]bool{}
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			rows.Close()
			return 0, readError(path, err)
		}
		tables[name] = true
	}
	if err := rows.Close(); err != nil {
		return 0, readError(path, err)
	}
	if err := rows.Err(); err != nil {
		return 0, readError(path, err)
	}
	if len(tables) == 0 {
		return 0, nil
	}
	if !tables["meta"] {
		return 0, fmt.Errorf("%w: %s is an SQLite database without epochflow's meta table: move it away, or use another recovery directory", ErrNotStore, path)
	}
	// Of the same columns in every schema version.
	if err := checkColumns(ctx, q, path, "meta", false, storeColumns["meta"]); err != nil {
		return 0, err
	}
	var raw any
	err = q.QueryRowContext(ctx, `SELECT value FROM meta WHERE name = 'schema_version'`).Scan(&raw)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, fmt.Errorf("%w: %s has no schema_version in its meta table: it is corrupt or not an epochflow store; move it away, or use another recovery directory", ErrNotStore, path)
	}
	if err != nil {
		return 0, readError(path, err)
	}
	version, ok := raw.(int64)
	if !ok {
		return 0, fmt.Errorf("%w: %s has schema_version %v, not an integer: it is corrupt or not an epochflow store; move it away, or use another recovery directory", ErrNotStore, path, raw)
	}
	if err := checkVersion(path, version, SchemaVersion, migrations); err != nil {
		return 0, err
	}
	if version < SchemaVersion {
		// Migrated by OpenSQLite, tables included: the version's tables must be there, and
		// those that only other versions have must not.
		if has := versionOf(tables); has != version {
			why := fmt.Sprintf("its meta table records schema version %d, but its tables are not those of that version", version)
			if has != 0 {
				why = fmt.Sprintf("its meta table records schema version %d, but its tables are those of schema version %d", version, has)
			}
			return 0, damaged(path, why)
		}
		return int(version), nil
	}
	var missing []string
	for _, t := range storeTables {
		if !tables[t] {
			missing = append(missing, t)
		}
	}
	if len(missing) > 0 {
		return 0, fmt.Errorf("%w: recovery store %s lacks table(s) %s: it is corrupt; move it away, or use another recovery directory",
			ErrNotStore, path, strings.Join(missing, ", "))
	}
	for _, t := range storeTables {
		if err := checkColumns(ctx, q, path, t, false, storeColumns[t]); err != nil {
			return 0, err
		}
	}
	for _, ix := range slices.Sorted(maps.Keys(storeIndexes)) {
		if err := checkColumns(ctx, q, path, ix, true, storeIndexes[ix]); err != nil {
			return 0, err
		}
	}
	return int(version), nil
}

// checkVersion returns nil if a store of schema version can be used by a binary that knows
// version known, given the migrations it has, or else an error that says what to do.
func checkVersion(path string, version, known int64, migrations map[int]func(context.Context, *sql.Tx) error) error {
	switch {
	case version > known:
		return fmt.Errorf("%w: recovery store %s has schema version %d, this binary knows %d: use a newer binary, or another recovery directory "+
			"(if no newer binary wrote it, the number is damaged: %s)",
			ErrSchemaVersion, path, version, known, whatToDo(path))
	case version < 1:
		return fmt.Errorf("%w: %s has schema version %d, which no epochflow release wrote: it is corrupt or not an epochflow store; move it away, or use another recovery directory",
			ErrNotStore, path, version)
	}
	for v := version; v < known; v++ {
		if migrations[int(v)] == nil {
			return fmt.Errorf("%w: recovery store %s has schema version %d, older than this binary's %d, and this binary cannot migrate it: use the binary that wrote it, or another recovery directory",
				ErrSchemaVersion, path, version, known)
		}
	}
	return nil
}

// readError explains an error met while reading the store's schema.
func readError(path string, err error) error {
	var se *sqlite.Error
	if errors.As(err, &se) && se.Code()&0xff == sqlite3.SQLITE_NOTADB {
		// At open: the file may never have been a store.
		return fmt.Errorf("%w: %s is not an SQLite database or is corrupt (%w): move it away, or use another recovery directory", ErrNotStore, path, err)
	}
	if isCorrupt(err) {
		return damaged(path, fmt.Sprintf("SQLite cannot read its schema: %v", err))
	}
	return fmt.Errorf("recovery store %s: cannot read: %w", path, err)
}

// isCorrupt tells whether err is SQLite's SQLITE_CORRUPT or, after the store was opened,
// SQLITE_NOTADB (any extended code).
func isCorrupt(err error) bool {
	var se *sqlite.Error
	return errors.As(err, &se) && (se.Code()&0xff == sqlite3.SQLITE_CORRUPT || se.Code()&0xff == sqlite3.SQLITE_NOTADB)
}
