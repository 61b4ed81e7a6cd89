package pgrepl

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
)

// copyTables is the initial copy (Config.InitialCopy), run by the replication goroutine before
// replication starts: a Truncate of Config.Tables, then every row of them, read in one
// REPEATABLE READ READ ONLY transaction (one snapshot, taken after the slot exists), queued as
// an Insert; both with FromCopy set; then a position marker at the replication start LSN ends the copy (Next clears
// State.Copying on it). Values are read in text format and decoded as the stream's are.
func (p *partition) copyTables(ctx context.Context) error {
	conn, err := pgx.Connect(ctx, p.cfg.DSN)
	if err != nil {
		return fmt.Errorf("connecting: %w", err)
	}
	defer conn.Close(context.Background())
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return err
	}
	defer tx.Rollback(context.Background())
	rels := make([]*Relation, len(p.cfg.Tables))
	partitioned := make([]bool, len(p.cfg.Tables))
	for i, t := range p.cfg.Tables {
		if rels[i], partitioned[i], err = p.copyRelation(ctx, tx, t); err != nil {
			return err
		}
	}
	// The copy replaces what a consumer holds of the tables: rows an earlier copy (of a run
	// that stopped before its copy was committed) wrote and that are gone from the tables
	// since would otherwise stay.
	p.enqueue(Change{Kind: Truncate, Truncated: rels, FromCopy: true}, true)
	for i, rel := range rels {
		if err := p.copyRows(ctx, tx, rel, partitioned[i]); err != nil {
			return fmt.Errorf("table %s: %w", rel.Name(), err)
		}
	}
	p.enqueue(Change{LSN: p.start}, false)
	return nil
}

// copyRelation describes table t as pgoutput would: its columns (not dropped ones, in order)
// and which of them form the replica identity; and says whether it is a partitioned table.
func (p *partition) copyRelation(ctx context.Context, tx pgx.Tx, t string) (*Relation, bool, error) {
	rel := &Relation{}
	var ident, kind string
	err := tx.QueryRow(ctx, `SELECT c.oid, n.nspname, c.relname, c.relreplident::text, c.relkind::text FROM pg_class c
		JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = to_regclass($1)`, t).Scan(&rel.ID, &rel.Schema, &rel.Table, &ident, &kind)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, false, fmt.Errorf("table %q does not exist", t)
	}
	if err != nil {
		return nil, false, fmt.Errorf("looking up table %q: %w", t, err)
	}
	rel.ReplicaIdentity = ReplicaIdentity(ident[0])
	// The key columns: those of the primary key (DEFAULT) or of the replica identity index
	// (USING INDEX); every column for FULL; none for NOTHING.
	rows, err := tx.Query(ctx, `SELECT a.attname, a.atttypid, a.atttypmod,
			CASE $2::text
				WHEN 'f' THEN true
				WHEN 'n' THEN false
				ELSE EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = a.attrelid
					AND (CASE $2::text WHEN 'i' THEN i.indisreplident ELSE i.indisprimary END)
					AND a.attnum = ANY (i.indkey))
			END
		FROM pg_attribute a WHERE a.attrelid = $1 AND a.attnum > 0 AND NOT a.attisdropped
			AND a.attgenerated = '' ORDER BY a.attnum`, rel.ID, ident)
	if err != nil {
		return nil, false, fmt.Errorf("table %s: reading its columns: %w", rel.Name(), err)
	}
	for rows.Next() {
		var c Column
		if err := rows.Scan(&c.Name, &c.Type, &c.TypeMod, &c.Key); err != nil {
			rows.Close()
			return nil, false, err
		}
		c.TypeName = p.typeName(c.Type)
		rel.Columns = append(rel.Columns, c)
	}
	if err := rows.Err(); err != nil {
		return nil, false, fmt.Errorf("table %s: reading its columns: %w", rel.Name(), err)
	}
	return rel, kind == "p", nil
}

// copyRows queues every row of rel, waiting while the queue is full. The rows of a
// partitioned table are those of all its partitions, copied as the table's (the publication
// streams their changes as the table's too: prepare requires publish_via_partition_root); those
// of any other table are its own, not its inheritance children's (the stream has those as
// their own tables' changes).
func (p *partition) copyRows(ctx context.Context, tx pgx.Tx, rel *Relation, partitioned bool) error {
	if len(rel.Columns) == 0 {
		return nil
	}
	cols := make([]string, len(rel.Columns))
	for i, c := range rel.Columns {
		cols[i] = QuoteIdent(c.Name)
	}
	from := " FROM ONLY "
	if partitioned {
		from = " FROM "
	}
	q := "SELECT " + strings.Join(cols, ", ") + from + rel.Name()
	// Text format, as pgoutput sends values, so that both decode alike.
	rr := tx.Conn().PgConn().ExecParams(ctx, q, nil, nil, nil, []int16{0})
	for rr.NextRow() {
		vals := make([]any, len(rel.Columns))
		for i, raw := range rr.Values() {
			if raw == nil {
				continue
			}
			v, err := p.dec.decode(rel.Columns[i].Type, raw)
			if err != nil {
				rr.Close()
				return fmt.Errorf("column %s (type %s): %w", QuoteIdent(rel.Columns[i].Name), typeLabel(rel.Columns[i]), err)
			}
			vals[i] = v
		}
		if err := p.waitRoom(ctx); err != nil {
			rr.Close()
			return err
		}
		p.enqueue(Change{Kind: Insert, Relation: rel, New: vals, FromCopy: true}, true)
	}
	_, err := rr.Close()
	return err
}

// waitRoom waits while the queue holds Config.MaxBuffered events.
func (p *partition) waitRoom(ctx context.Context) error {
	for {
		p.mu.Lock()
		full := len(p.queue) >= p.cfg.MaxBuffered
		p.mu.Unlock()
		if !full {
			return nil
		}
		select {
		case <-p.room:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
