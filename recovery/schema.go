package recovery

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"
)

// applicationID marks an epochflow store in the SQLite header (PRAGMA application_id): "EPFL".
const applicationID = 0x4550464c

// schemaV1 is the layout of SchemaVersion 1. Every epoch and time is an INTEGER; times are
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

// tablesV1 are the tables a SchemaVersion 1 store must have.
var tablesV1 = []string{"commits", "executions", "frontiers", "gc_pending", "meta", "snapshots"}

// migrations[v] turns a store of schema version v into one of version v+1, inside the open
// transaction. None exist yet: version 1 is the first.
var migrations = map[int]func(ctx context.Context, tx *sql.Tx) error{}

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
		return int(version), nil // migrated by OpenSQLite, tables included
	}
	var missing []string
	for _, t := range tablesV1 {
		if !tables[t] {
			missing = append(missing, t)
		}
	}
	if len(missing) > 0 {
		return 0, fmt.Errorf("%w: recovery store %s lacks table(s) %s: it is corrupt; move it away, or use another recovery directory",
			ErrNotStore, path, strings.Join(missing, ", "))
	}
	return int(version), nil
}

// checkVersion returns nil if a store of schema version can be used by a binary that knows
// version known, given the migrations it has, or else an error that says what to do.
func checkVersion(path string, version, known int64, migrations map[int]func(context.Context, *sql.Tx) error) error {
	switch {
	case version > known:
		return fmt.Errorf("%w: recovery store %s has schema version %d, this binary knows %d: use a newer binary, or another recovery directory",
			ErrSchemaVersion, path, version, known)
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
	if errors.As(err, &se) {
		switch se.Code() & 0xff {
		case sqlite3.SQLITE_NOTADB, sqlite3.SQLITE_CORRUPT:
			return fmt.Errorf("%w: %s is not an SQLite database or is corrupt (%w): move it away, or use another recovery directory", ErrNotStore, path, err)
		}
	}
	return fmt.Errorf("recovery store %s: cannot read: %w", path, err)
}
