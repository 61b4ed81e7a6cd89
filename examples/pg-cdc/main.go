// Command pg-cdc keeps a copy of a PostgreSQL table in another database, exactly once, with a
// logical replication slot as the source and two-phase commit into the target:
//
//	go run ./examples/pg-cdc -source URL -target URL -table NAME -slot NAME -publication NAME \
//	    -recovery PATH [-epoch-interval D] [-idle-exit D] [-copy-existing=false]
//
// It creates the publication (FOR TABLE NAME) and the slot (pgoutput) in the source database
// if they are missing, and the target table if it is missing: same schema and name, the
// source's columns (names and types) and primary key, nothing else (no defaults, other
// indexes or constraints). A first run (no recovery state) copies the rows the source table
// holds (-copy-existing, on by default; pgrepl.Config.InitialCopy), then every change
// committed in the source table after the slot was created is applied to the target (inserts
// and updates as upserts, deletes, truncates; changes that the copy already saw are applied
// again, which upserts make harmless), and each epoch's rows and changes become visible in the
// target in one transaction once the epoch is committed. The copy starts by emptying the
// target table, and a run killed during the copy copies again (from an empty table) when it
// restarts; until the copy is committed the target holds part of the rows. With
// -copy-existing=false, rows that were in the table before the slot existed are not copied. A
// column added to the source table later must be added to the target table too, or the flow
// stops with an error naming it.
//
// Killed at any moment and restarted with the same -recovery directory, it carries on without
// losing or repeating a change. With -idle-exit D it exits 0 once no change has arrived for D
// (after committing everything); without it, it runs until SIGINT or SIGTERM. It never drops
// the slot: drop it with SELECT pg_drop_replication_slot('NAME') when the copy is no longer
// wanted. The source needs wal_level = logical; the target max_prepared_transactions > 0.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"strings"
	"time"

	"github.com/epochflow/epochflow/connectors/pgrepl"
	"github.com/epochflow/epochflow/connectors/postgres"
	"github.com/epochflow/epochflow/dataflow"
	"github.com/epochflow/epochflow/operators"
	"github.com/jackc/pgx/v5"
)

func main() {
	source := flag.String("source", "", "connection URL of the source database (wal_level = logical)")
	target := flag.String("target", "", "connection URL of the target database (max_prepared_transactions > 0)")
	table := flag.String("table", "", "the table to copy, \"table\" or \"schema.table\"")
	slot := flag.String("slot", "", "the logical replication slot (created if missing)")
	publication := flag.String("publication", "", "the publication (created FOR TABLE -table if missing)")
	idleExit := flag.Duration("idle-exit", 0, "exit 0 once no change has arrived for this long (0: run until signalled)")
	copyExisting := flag.Bool("copy-existing", true, "on a first run, copy the rows the table already holds before streaming its changes")
	dataflow.MainFunc(func() (*dataflow.Flow, error) {
		return build(context.Background(), options{source: *source, target: *target, table: *table, slot: *slot,
			publication: *publication, idleExit: *idleExit, copyExisting: *copyExisting})
	})
}

type options struct {
	source, target, table, slot, publication string
	idleExit                                 time.Duration
	copyExisting                             bool
}

func (o options) check() error {
	for _, f := range []struct{ name, v string }{{"source", o.source}, {"target", o.target}, {"table", o.table},
		{"slot", o.slot}, {"publication", o.publication}} {
		if f.v == "" {
			return fmt.Errorf("flag -%s is required", f.name)
		}
	}
	if o.idleExit < 0 {
		return fmt.Errorf("invalid value %v for flag -idle-exit: want 0 or a positive duration", o.idleExit)
	}
	return nil
}

// build checks the flags, creates the target table if it is missing, and returns the flow.
func build(ctx context.Context, o options) (*dataflow.Flow, error) {
	if err := o.check(); err != nil {
		return nil, err
	}
	if err := ensureTarget(ctx, o); err != nil {
		return nil, err
	}
	flow := dataflow.New("pg-cdc")
	changes := operators.Input(flow, "read", pgrepl.Changes(pgrepl.Config{
		DSN: o.source, Slot: o.slot, Publication: o.publication, Tables: []string{o.table},
		CreateSlot: true, CreatePublication: true, IdleEOF: o.idleExit, InitialCopy: o.copyExisting,
	}))
	rows := operators.FlatMap("rows", changes, func(c pgrepl.Change) []postgres.Row { return postgres.FromChange(c, nil) })
	operators.Output("write", rows, postgres.Rows(postgres.Config{DSN: o.target, Name: "pg-cdc:" + o.slot}))
	return flow, nil
}

// ensureTarget creates the target table, with the source table's schema, name, columns and
// primary key, when the target database does not have it.
func ensureTarget(ctx context.Context, o options) error {
	tgt, err := pgx.Connect(ctx, o.target)
	if err != nil {
		return fmt.Errorf("-target: %w", err)
	}
	defer tgt.Close(ctx)
	src, err := pgx.Connect(ctx, o.source)
	if err != nil {
		return fmt.Errorf("-source: %w", err)
	}
	defer src.Close(ctx)
	var oid uint32
	var schema, name string
	err = src.QueryRow(ctx, `SELECT c.oid, n.nspname, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE c.oid = to_regclass($1)`, o.table).Scan(&oid, &schema, &name)
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("-table: table %q does not exist in the source database", o.table)
	}
	if err != nil {
		return fmt.Errorf("-table %q: %w", o.table, err)
	}
	ident := pgrepl.QuoteIdent(schema) + "." + pgrepl.QuoteIdent(name)
	var exists bool
	if err := tgt.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", ident).Scan(&exists); err != nil {
		return fmt.Errorf("-target: %w", err)
	}
	if exists {
		return nil // the sink checks its columns and key as it writes
	}
	rows, err := src.Query(ctx, `SELECT attname, format_type(atttypid, atttypmod), attnotnull FROM pg_attribute
		WHERE attrelid = $1 AND attnum > 0 AND NOT attisdropped ORDER BY attnum`, oid)
	if err != nil {
		return fmt.Errorf("-table %q: %w", o.table, err)
	}
	var cols []string
	for rows.Next() {
		var col, typ string
		var notNull bool
		if err := rows.Scan(&col, &typ, &notNull); err != nil {
			return err
		}
		def := pgrepl.QuoteIdent(col) + " " + typ
		if notNull {
			def += " NOT NULL"
		}
		cols = append(cols, def)
	}
	if err := rows.Err(); err != nil {
		return err
	}
	keys, err := src.Query(ctx, `SELECT a.attname FROM pg_index i, unnest(i.indkey) WITH ORDINALITY AS k(attnum, pos)
		JOIN pg_attribute a ON a.attnum = k.attnum WHERE i.indrelid = $1 AND i.indisprimary AND a.attrelid = $1 ORDER BY k.pos`, oid)
	if err != nil {
		return err
	}
	key, err := pgx.CollectRows(keys, pgx.RowTo[string])
	if err != nil {
		return err
	}
	if len(key) == 0 {
		return fmt.Errorf("-table: table %s has no primary key, which the copy needs to apply updates and deletes", ident)
	}
	for i := range key {
		key[i] = pgrepl.QuoteIdent(key[i])
	}
	cols = append(cols, "PRIMARY KEY ("+strings.Join(key, ", ")+")")
	if _, err := tgt.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+pgrepl.QuoteIdent(schema)); err != nil {
		return fmt.Errorf("-target: %w", err)
	}
	if _, err := tgt.Exec(ctx, "CREATE TABLE IF NOT EXISTS "+ident+" (\n\t"+strings.Join(cols, ",\n\t")+"\n)"); err != nil {
		return fmt.Errorf("-target: creating table %s: %w", ident, err)
	}
	return nil
}
