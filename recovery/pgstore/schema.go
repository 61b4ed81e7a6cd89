package pgstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/epochflow/epochflow/recovery"
)

// SchemaVersion is the version of the table layout this code reads and writes, recorded in
// the store's meta table. A store of another version is refused with an error wrapping
// recovery.ErrSchemaVersion: this code never reads or writes a layout it does not know.
const SchemaVersion = 1

// tables are the store's tables, all in its schema.
var tables = []string{"chunks", "commits", "executions", "frontiers", "meta", "runs", "step_sums"}

// schemaSQL creates the tables of a new store in schema %[1]s (quoted). Times are Unix
// nanoseconds; epochs and frontiers (uint64) are stored as the int64 with the same bits.
const schemaSQL = `
CREATE SCHEMA IF NOT EXISTS %[1]s;
CREATE TABLE %[1]s.meta (name text PRIMARY KEY, value bigint NOT NULL);
CREATE TABLE %[1]s.executions (
	execution integer PRIMARY KEY, flow text NOT NULL, steps text[] NOT NULL,
	workers integer NOT NULL, started_at bigint NOT NULL);
CREATE TABLE %[1]s.frontiers (
	execution integer NOT NULL, worker integer NOT NULL, frontier bigint NOT NULL,
	PRIMARY KEY (execution, worker));
CREATE TABLE %[1]s.commits (epoch bigint PRIMARY KEY, execution integer NOT NULL, committed_at bigint NOT NULL);
CREATE TABLE %[1]s.runs (
	id bigint PRIMARY KEY, step text NOT NULL, entries bigint NOT NULL, chunks integer NOT NULL,
	bytes bigint NOT NULL, sum bigint NOT NULL, epoch bigint NOT NULL);
CREATE INDEX runs_step ON %[1]s.runs (step, id);
CREATE TABLE %[1]s.chunks (
	run bigint NOT NULL, seq integer NOT NULL, entries integer NOT NULL, crc bigint NOT NULL,
	data bytea NOT NULL, PRIMARY KEY (run, seq));
ALTER TABLE %[1]s.chunks ALTER COLUMN data SET STORAGE EXTERNAL;
CREATE TABLE %[1]s.step_sums (step text PRIMARY KEY, entries bigint NOT NULL, sum bigint NOT NULL, epoch bigint NOT NULL);
INSERT INTO %[1]s.meta (name, value) VALUES ('schema_version', %[2]d), ('gc_horizon', 0);
`

// checkSchema checks the store's schema through c: a store of SchemaVersion with every table
// passes; a schema without tables is created if create (a read-write open: the writer's lock
// is held), else refused with recovery.ErrNoStore; anything else is refused.
func (s *Store) checkSchema(ctx context.Context, c *pgx.Conn, create bool) error {
	rows, err := c.Query(ctx, `SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = $1 AND c.relkind IN ('r', 'p', 'v', 'm', 'f') ORDER BY c.relname`, s.schema)
	if err != nil {
		return s.opError("reading the schema", err)
	}
	have, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return s.opError("reading the schema", err)
	}
	switch {
	case len(have) == 0 && !create:
		return fmt.Errorf("%w in %s", recovery.ErrNoStore, s.name)
	case len(have) == 0:
		q := fmt.Sprintf(schemaSQL, pgx.Identifier{s.schema}.Sanitize(), SchemaVersion)
		tx, err := c.Begin(ctx)
		if err != nil {
			return s.opError("creating the schema", err)
		}
		defer tx.Rollback(ctx)
		if _, err := tx.Exec(ctx, q); err != nil {
			return s.opError("creating the schema", err)
		}
		if err := tx.Commit(ctx); err != nil {
			return s.opError("creating the schema", err)
		}
		return nil
	case !slices.Contains(have, "meta"):
		return fmt.Errorf("%w: %s: the schema holds tables (%s) but not epochflow's meta table: use another schema",
			recovery.ErrNotStore, s.name, strings.Join(have, ", "))
	}
	var version int64
	err = c.QueryRow(ctx, `SELECT value FROM `+s.table("meta")+` WHERE name = 'schema_version'`).Scan(&version)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return fmt.Errorf("%w: %s: its meta table has no schema_version", recovery.ErrNotStore, s.name)
	case err != nil:
		return s.opError("reading the schema version", err)
	case version < 1:
		return fmt.Errorf("%w: %s has schema version %d, which no epochflow release wrote", recovery.ErrNotStore, s.name, version)
	case version != SchemaVersion:
		return fmt.Errorf("%w: recovery store %s has schema version %d, this binary knows %d: use a newer binary, or another schema",
			recovery.ErrSchemaVersion, s.name, version, SchemaVersion)
	}
	var missing []string
	for _, t := range tables {
		if !slices.Contains(have, t) {
			missing = append(missing, t)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("%w: %s lacks table(s) %s: it is damaged, or not a store", recovery.ErrNotStore, s.name, strings.Join(missing, ", "))
	}
	return nil
}
