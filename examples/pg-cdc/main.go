// Command pg-cdc keeps a copy of a PostgreSQL table in another database, exactly once, with a
// logical replication slot as the source and two-phase commit into the target:
//
//	go run ./examples/pg-cdc -source URL -target URL -table NAME -slot NAME -publication NAME \
//	    -recovery PATH [-epoch-interval D] [-idle-exit D] [-copy-existing=false] [-target-exists replace] \
//	    [-heartbeat D] [-source-reconnect D]
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
// restarts; until the copy is committed the target holds part of the rows. A run without
// recovery state (a first run, or a new or lost -recovery directory) that finds rows in the
// target table refuses to start, before it creates the slot if that is missing, naming the
// table: run it with the -recovery directory that wrote them, empty the table, or pass
// -target-exists replace to let the copy replace them. With
// -copy-existing=false, rows that were in the table before the slot existed are not copied. A
// column added to the source table later must be added to the target table too, or the flow
// stops with an error naming it.
//
// Killed at any moment and restarted with the same -recovery directory, it carries on without
// losing or repeating a change. When the source server restarts (or its connection breaks), it
// reconnects with back-off for up to -source-reconnect (1 minute) and streams on from where it
// was, logging each attempt. A restart of the target server does not stop it either: the sink
// reconnects (for up to a minute) and writes the epoch's transaction again, or commits the
// prepared one. With -idle-exit D it exits 0 once no change has arrived for D
// (after committing everything); without it, it runs until SIGINT or SIGTERM.
//
// Before it creates anything (the target table, the publication, the slot) it checks what can
// be checked, and refuses to start with an error naming the flag: the source needs wal_level =
// logical, a user that may read the table (for -copy-existing) and a publication that covers
// the table or may be created; the target needs max_prepared_transactions > 0, and a target
// table that exists needs every column of the source table, a primary key, no NOT NULL column
// without a default that the source lacks, and a user that may read, write and empty it and
// use (or create) the sink's log table. A first run that fails after it created the
// publication or the slot (a source user without the REPLICATION privilege, which managed
// servers grant in ways of their own; a value the target column cannot hold) drops the slot
// and publication it created; once a run has committed, the slot stays (it
// holds the source server's WAL from its position on): drop it with SELECT
// pg_drop_replication_slot('NAME') and DROP PUBLICATION NAME when the copy is no longer wanted.
package main

import (
	"context"
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
	targetExists := flag.String("target-exists", targetFail, "what a run without recovery state whose initial copy would empty a target table that holds rows does: fail (refuse to start) or replace (empty it and copy)")
	heartbeat := flag.Duration("heartbeat", 0, "write a logical message into the source's WAL this often, so that the slot advances through a transaction of its own at least that often (0: none; the slot follows the server's WAL without it)")
	sourceReconnect := flag.Duration("source-reconnect", pgrepl.DefaultReconnectTimeout, "how long to keep reconnecting to the source after its replication connection was lost (a server restart), before failing (0: fail at once)")
	dataflow.Usage("pg-cdc keeps a copy of a PostgreSQL table in another database, exactly once, from a logical replication slot.",
		"pg-cdc -source postgres://postgres@127.0.0.1:5432/shop -target postgres://postgres@127.0.0.1:5433/copy -table orders -slot orders_copy -publication orders_pub -recovery state")
	dataflow.MainFunc(func() (*dataflow.Flow, error) {
		if dataflow.GraphOnly() { // -graph: no flag is required, and no database is asked
			return flowOf(options{table: *table}, *table), nil
		}
		return build(context.Background(), options{source: *source, target: *target, table: *table, slot: *slot,
			publication: *publication, idleExit: *idleExit, copyExisting: *copyExisting, targetExists: *targetExists,
			heartbeat: *heartbeat, sourceReconnect: *sourceReconnect})
	})
}

type options struct {
	source, target, table, slot, publication string
	idleExit, heartbeat, sourceReconnect     time.Duration
	copyExisting                             bool
	targetExists                             string
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
	if o.targetExists != targetFail && o.targetExists != targetReplace && o.targetExists != "" {
		return fmt.Errorf("invalid value %q for flag -target-exists: want %s or %s", o.targetExists, targetFail, targetReplace)
	}
	if o.sourceReconnect < 0 {
		return fmt.Errorf("invalid value %v for flag -source-reconnect: want 0 or a positive duration", o.sourceReconnect)
	}
	if o.heartbeat < 0 {
		return fmt.Errorf("invalid value %v for flag -heartbeat: want 0 or a positive duration", o.heartbeat)
	}
	return nil
}

// reconnectTimeout is pgrepl's Config.ReconnectTimeout for -source-reconnect: 0 fails at once.
func reconnectTimeout(d time.Duration) time.Duration {
	if d == 0 {
		return -1
	}
	return d
}

// sourceFlags are the flags that set the source's pgrepl.Config fields, for its errors.
var sourceFlags = map[string]string{"DSN": "-source", "Slot": "-slot", "Publication": "-publication", "Tables": "-table",
	"IdleEOF": "-idle-exit", "InitialCopy": "-copy-existing", "Heartbeat": "-heartbeat", "ReconnectTimeout": "-source-reconnect"}

// build checks the flags, creates the target table if it is missing, and returns the flow.
func build(ctx context.Context, o options) (*dataflow.Flow, error) {
	if err := o.check(); err != nil {
		return nil, err
	}
	ident, err := ensureTarget(ctx, o)
	if err != nil {
		return nil, err
	}
	return flowOf(o, ident), nil
}

// flowOf returns the flow for the options, writing to the target table ident.
func flowOf(o options, ident string) *dataflow.Flow {
	flow := dataflow.New("pg-cdc")
	changes := operators.Input(flow, "read", pgrepl.Changes(pgrepl.Config{
		DSN: o.source, Slot: o.slot, Publication: o.publication, Tables: []string{o.table},
		CreateSlot: true, CreatePublication: true, IdleEOF: o.idleExit, InitialCopy: o.copyExisting,
		Heartbeat: o.heartbeat, ReconnectTimeout: reconnectTimeout(o.sourceReconnect), FlagNames: sourceFlags,
	}))
	rows := operators.FlatMap("rows", changes, func(c pgrepl.Change) []postgres.Row { return postgres.FromChange(c, nil) })
	operators.Output("write", rows, sink(o, ident))
	return flow
}

// ensureTarget checks the source and the target (checkSource, checkTarget, checkTargetTable),
// then creates the target table, with the source table's schema, name, columns and primary
// key, when the target database does not have it, and returns its quoted name. It refuses an
// existing table with rows that a first run would empty (checkFresh). All of it happens before
// the flow runs, so before its source creates the replication slot.
func ensureTarget(ctx context.Context, o options) (string, error) {
	tgt, err := pgx.Connect(ctx, o.target)
	if err != nil {
		return "", fmt.Errorf("-target: %w", err)
	}
	defer tgt.Close(ctx)
	src, err := pgx.Connect(ctx, o.source)
	if err != nil {
		return "", fmt.Errorf("-source: %w", err)
	}
	defer src.Close(ctx)
	st, err := checkSource(ctx, o, src)
	if err != nil {
		return "", err
	}
	if err := checkTarget(ctx, tgt); err != nil {
		return "", err
	}
	ident := st.ident
	var exists bool
	if err := tgt.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", ident).Scan(&exists); err != nil {
		return "", fmt.Errorf("-target: %w", err)
	}
	if exists {
		if err := checkTargetTable(ctx, o, tgt, st); err != nil {
			return "", err
		}
		return ident, checkFresh(ctx, o, src, tgt, ident)
	}
	var cols []string
	for _, c := range st.cols {
		def := pgrepl.QuoteIdent(c.name) + " " + c.typ
		if c.notNull {
			def += " NOT NULL"
		}
		cols = append(cols, def)
	}
	keys, err := src.Query(ctx, `SELECT a.attname FROM pg_index i, unnest(i.indkey) WITH ORDINALITY AS k(attnum, pos)
		JOIN pg_attribute a ON a.attnum = k.attnum WHERE i.indrelid = $1 AND i.indisprimary AND a.attrelid = $1 ORDER BY k.pos`, st.oid)
	if err != nil {
		return "", err
	}
	key, err := pgx.CollectRows(keys, pgx.RowTo[string])
	if err != nil {
		return "", err
	}
	if len(key) == 0 {
		return "", fmt.Errorf("-table: table %s has no primary key, which the copy needs to apply updates and deletes", ident)
	}
	for i := range key {
		key[i] = pgrepl.QuoteIdent(key[i])
	}
	cols = append(cols, "PRIMARY KEY ("+strings.Join(key, ", ")+")")
	if _, err := tgt.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+pgrepl.QuoteIdent(st.schema)); err != nil {
		return "", fmt.Errorf("-target: %w", err)
	}
	if _, err := tgt.Exec(ctx, "CREATE TABLE IF NOT EXISTS "+ident+" (\n\t"+strings.Join(cols, ",\n\t")+"\n)"); err != nil {
		return "", fmt.Errorf("-target: creating table %s: %w", ident, err)
	}
	return ident, nil
}
