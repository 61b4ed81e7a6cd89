package main

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/epochflow/epochflow/connectors/pgrepl"
	"github.com/epochflow/epochflow/connectors/postgres"
	"github.com/jackc/pgx/v5"
)

// The checks of this file run before pg-cdc creates anything (the target table, the
// publication, the replication slot): a first run that fails once its slot exists has to drop
// the slot again, and a run killed in between (kill -9, a crash) would leave it holding the
// source server's WAL for good. What they cannot check is left to the steps that use it: that
// the source's user may replicate (managed servers grant that through roles of their own; a
// slot that cannot be created leaves nothing behind) and the values of the rows (a value the
// target column cannot hold fails the epoch that writes it, after the slot exists).

// srcTable is the source table, as the checks found it.
type srcTable struct {
	oid          uint32
	schema, name string
	ident        string // quoted schema.name
	kind         string // pg_class.relkind
	cols         []srcColumn
}

// srcColumn is a column of the source table.
type srcColumn struct {
	name, typ          string
	notNull, generated bool
}

// checkSource checks the source server and table: wal_level = logical, the table exists, its
// user may read it (for -copy-existing), and the publication covers it or may be created.
func checkSource(ctx context.Context, o options, src *pgx.Conn) (*srcTable, error) {
	var walLevel, user string
	if err := src.QueryRow(ctx, "SELECT current_setting('wal_level'), current_user").Scan(&walLevel, &user); err != nil {
		return nil, fmt.Errorf("-source: %w", err)
	}
	if walLevel != "logical" {
		return nil, fmt.Errorf("-source: the source server has wal_level = %s, and logical replication needs wal_level = logical: "+
			"set wal_level = logical in its postgresql.conf and restart it", walLevel)
	}
	st := &srcTable{}
	var canSelect, owner bool
	err := src.QueryRow(ctx, `SELECT c.oid, n.nspname, c.relname, c.relkind::text, has_table_privilege(c.oid, 'SELECT'), pg_has_role(c.relowner, 'USAGE')
		FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = to_regclass($1)`, o.table).
		Scan(&st.oid, &st.schema, &st.name, &st.kind, &canSelect, &owner)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("-table: table %q does not exist in the source database", o.table)
	}
	if err != nil {
		return nil, fmt.Errorf("-table %q: %w", o.table, err)
	}
	st.ident = pgrepl.QuoteIdent(st.schema) + "." + pgrepl.QuoteIdent(st.name)
	if o.copyExisting && !canSelect {
		return nil, fmt.Errorf("-source: user %q may not read table %s, which the initial copy (-copy-existing) needs: "+
			"GRANT SELECT ON %s TO %s, or pass -copy-existing=false", user, st.ident, st.ident, pgrepl.QuoteIdent(user))
	}
	rows, err := src.Query(ctx, `SELECT attname, format_type(atttypid, atttypmod), attnotnull, attgenerated <> '' FROM pg_attribute
		WHERE attrelid = $1 AND attnum > 0 AND NOT attisdropped ORDER BY attnum`, st.oid)
	if err != nil {
		return nil, fmt.Errorf("-table %q: %w", o.table, err)
	}
	st.cols, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (c srcColumn, err error) {
		return c, r.Scan(&c.name, &c.typ, &c.notNull, &c.generated)
	})
	if err != nil {
		return nil, fmt.Errorf("-table %q: %w", o.table, err)
	}

	var pubExists, covered, canCreate bool
	err = src.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = $1),
			EXISTS (SELECT 1 FROM pg_publication_tables pt WHERE pt.pubname = $1
				AND to_regclass(quote_ident(pt.schemaname) || '.' || quote_ident(pt.tablename)) = $2::oid::regclass),
			has_database_privilege(current_database(), 'CREATE')`, o.publication, st.oid).Scan(&pubExists, &covered, &canCreate)
	if err != nil {
		return nil, fmt.Errorf("-publication %q: %w", o.publication, err)
	}
	create := fmt.Sprintf("CREATE PUBLICATION %s FOR TABLE %s", pgrepl.QuoteIdent(o.publication), st.ident)
	switch {
	case pubExists && !covered && st.kind != "p": // (a partitioned table's partitions may be listed instead: the source checks those)
		return nil, fmt.Errorf("-publication: publication %q does not cover table %s: add it (ALTER PUBLICATION %s ADD TABLE %s), or name another -publication",
			o.publication, st.ident, pgrepl.QuoteIdent(o.publication), st.ident)
	case !pubExists && !canCreate:
		return nil, fmt.Errorf("-publication: publication %q does not exist, and user %q of -source may not create it (that needs the CREATE privilege on the database): "+
			"create it (%s) as a user who may, or GRANT CREATE ON DATABASE %s TO %s",
			o.publication, user, create, pgrepl.QuoteIdent(databaseOf(ctx, src)), pgrepl.QuoteIdent(user))
	case !pubExists && !owner:
		return nil, fmt.Errorf("-publication: publication %q does not exist, and user %q of -source may not create it for table %s, which it does not own: "+
			"create it (%s) as the table's owner", o.publication, user, st.ident, create)
	}
	return st, nil
}

func databaseOf(ctx context.Context, c *pgx.Conn) string {
	var db string
	c.QueryRow(ctx, "SELECT current_database()").Scan(&db)
	return db
}

// checkTarget checks the target server: max_prepared_transactions > 0 (each epoch is a
// prepared transaction) and that its user may use the sink's log table or create it.
func checkTarget(ctx context.Context, tgt *pgx.Conn) error {
	var mpt int
	var user string
	var logExists, logRights, canCreateLog bool
	var schema *string
	err := tgt.QueryRow(ctx, `SELECT current_setting('max_prepared_transactions')::int, current_user, current_schema(),
			to_regclass($1) IS NOT NULL,
			coalesce(has_table_privilege(to_regclass($1), 'SELECT') AND has_table_privilege(to_regclass($1), 'INSERT')
				AND has_table_privilege(to_regclass($1), 'DELETE'), false),
			coalesce(has_schema_privilege(current_schema(), 'CREATE'), false)`, postgres.DefaultLogTable).
		Scan(&mpt, &user, &schema, &logExists, &logRights, &canCreateLog)
	if err != nil {
		return fmt.Errorf("-target: %w", err)
	}
	if mpt == 0 {
		return errors.New("-target: the target server has max_prepared_transactions = 0, and pg-cdc writes each epoch in a prepared transaction (two-phase commit): " +
			"set max_prepared_transactions to at least 10 (for example 20) in its postgresql.conf and restart it")
	}
	switch {
	case logExists && !logRights:
		return fmt.Errorf("-target: user %q may not use the sink's log table %s: GRANT SELECT, INSERT, DELETE ON %s TO %s",
			user, postgres.DefaultLogTable, postgres.DefaultLogTable, pgrepl.QuoteIdent(user))
	case !logExists && schema == nil:
		return fmt.Errorf("-target: no schema of user %q's search_path exists, so the sink's log table %s has nowhere to go: create one, or set the search_path",
			user, postgres.DefaultLogTable)
	case !logExists && !canCreateLog:
		return fmt.Errorf("-target: user %q may not create the sink's log table %s in schema %q: GRANT CREATE ON SCHEMA %s TO %s",
			user, postgres.DefaultLogTable, *schema, pgrepl.QuoteIdent(*schema), pgrepl.QuoteIdent(user))
	}
	return nil
}

// checkTargetTable checks a target table that exists: it has every column of the source table
// (that pgoutput streams: generated columns are not), a primary key, no NOT NULL column
// without a default that the source lacks (every insert would fail), and the target's user may
// read and write it (and empty it, for -copy-existing and the source's truncates).
func checkTargetTable(ctx context.Context, o options, tgt *pgx.Conn, st *srcTable) error {
	type tgtColumn struct {
		name      string
		notNull   bool
		filled    bool // it has a default, or is an identity or generated column
		generated bool
	}
	rows, err := tgt.Query(ctx, `SELECT attname, attnotnull, atthasdef OR attidentity <> '' OR attgenerated <> '', attgenerated <> ''
		FROM pg_attribute WHERE attrelid = to_regclass($1) AND attnum > 0 AND NOT attisdropped ORDER BY attnum`, st.ident)
	if err != nil {
		return fmt.Errorf("-target: looking up the columns of table %s: %w", st.ident, err)
	}
	cols, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (c tgtColumn, err error) {
		return c, r.Scan(&c.name, &c.notNull, &c.filled, &c.generated)
	})
	if err != nil {
		return fmt.Errorf("-target: looking up the columns of table %s: %w", st.ident, err)
	}
	have := map[string]tgtColumn{}
	for _, c := range cols {
		have[c.name] = c
	}
	source := map[string]bool{}
	for _, c := range st.cols {
		if c.generated {
			continue
		}
		source[c.name] = true
		tc, ok := have[c.name]
		if !ok {
			return fmt.Errorf("-target: table %s lacks column %q (%s) of the source table, whose values pg-cdc copies: "+
				"add it (ALTER TABLE %s ADD COLUMN %s %s)", st.ident, c.name, c.typ, st.ident, pgrepl.QuoteIdent(c.name), c.typ)
		}
		if tc.generated {
			return fmt.Errorf("-target: column %q of table %s is a generated column, and pg-cdc writes the source's values into it: make it a plain column",
				c.name, st.ident)
		}
	}
	for _, c := range cols {
		if !source[c.name] && c.notNull && !c.filled {
			return fmt.Errorf("-target: table %s has column %q, NOT NULL without a default, which the source table lacks, so that no row could be inserted: "+
				"give it a default (ALTER TABLE %s ALTER %s SET DEFAULT ...) or drop the column", st.ident, c.name, st.ident, pgrepl.QuoteIdent(c.name))
		}
	}
	var hasKey bool
	var user string
	var may []bool
	privs := []string{"SELECT", "INSERT", "UPDATE", "DELETE", "TRUNCATE"}
	err = tgt.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_index WHERE indrelid = to_regclass($1) AND indisprimary), current_user,
		array(SELECT has_table_privilege(to_regclass($1), p) FROM unnest($2::text[]) WITH ORDINALITY AS x(p, i) ORDER BY i)`, st.ident, privs).
		Scan(&hasKey, &user, &may)
	if err != nil {
		return fmt.Errorf("-target: checking table %s: %w", st.ident, err)
	}
	if !hasKey {
		return fmt.Errorf("-target: table %s has no primary key, which pg-cdc needs to apply updates and deletes: add the source table's", st.ident)
	}
	for i, ok := range may {
		if !ok && (privs[i] != "TRUNCATE" || o.copyExisting) {
			return fmt.Errorf("-target: user %q may not %s table %s, which pg-cdc needs: GRANT %s ON %s TO %s",
				user, privs[i], st.ident, strings.Join(privs, ", "), st.ident, pgrepl.QuoteIdent(user))
		}
	}
	return nil
}
