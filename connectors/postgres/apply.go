package postgres

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
)

// execer is what the writes run on (a connection inside BEGIN ... PREPARE TRANSACTION).
type execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// copier runs COPY ... FROM STDIN on the connection of the execer, inside its transaction.
type copier func(ctx context.Context, r io.Reader, sql string) (pgconn.CommandTag, error)

// table is what the sink knows of a target table.
type table struct {
	name   string // as the rows name it
	ident  string // "schema"."table"
	cols   []column
	byName map[string]int
	key    []int // indexes of the key columns in cols, in key order
	sql    map[string]string
}

type column struct {
	name  string
	ident string
	oid   uint32
	typ   string // format_type with the typmod, for error messages
	// cast is the column's type without its typmod ("pg_catalog"."varchar"; for a domain, the
	// base type of its chain of domains), for the casts of
	// the text values: an explicit cast to varchar(5) or char(1) would cut a longer value to
	// fit, where the assignment to the column that follows the cast to the base type refuses
	// it, as an INSERT of the value would.
	cast string
}

// catalog looks tables up on one connection and caches them.
type catalog struct {
	conn   *pgx.Conn
	keys   map[string][]string
	tables map[string]*table
}

func newCatalog(conn *pgx.Conn, keys map[string][]string) *catalog {
	return &catalog{conn: conn, keys: keys, tables: map[string]*table{}}
}

func quote(s string) string { return `"` + strings.ReplaceAll(s, `"`, `""`) + `"` }

func (c *catalog) table(ctx context.Context, name string) (*table, error) {
	if t := c.tables[name]; t != nil {
		return t, nil
	}
	var oid uint32
	var schema, rel string
	err := c.conn.QueryRow(ctx, `SELECT c.oid, n.nspname, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE c.oid = to_regclass($1)`, name).Scan(&oid, &schema, &rel)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("table %q does not exist in the target database", name)
	}
	if err != nil {
		return nil, fmt.Errorf("looking up table %q: %w", name, err)
	}
	t := &table{name: name, ident: quote(schema) + "." + quote(rel), byName: map[string]int{}, sql: map[string]string{}}
	// The cast's type is the column's, or for a domain the type it is based on at the end of
	// the chain (a domain over varchar(5) takes the typmod with it into an explicit cast).
	rows, err := c.conn.Query(ctx, `SELECT a.attname, a.atttypid, format_type(a.atttypid, a.atttypmod), tn.nspname, ty.typname
		FROM pg_attribute a
		CROSS JOIN LATERAL (WITH RECURSIVE b(oid, depth) AS (
			SELECT a.atttypid, 0
			UNION ALL SELECT d.typbasetype, b.depth + 1 FROM b JOIN pg_type d ON d.oid = b.oid WHERE d.typtype = 'd'
		) SELECT oid FROM b ORDER BY depth DESC LIMIT 1) base
		JOIN pg_type ty ON ty.oid = base.oid JOIN pg_namespace tn ON tn.oid = ty.typnamespace
		WHERE a.attrelid = $1 AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated = '' ORDER BY a.attnum`, oid)
	if err != nil {
		return nil, fmt.Errorf("looking up the columns of table %s: %w", t.ident, err)
	}
	for rows.Next() {
		var col column
		var typSchema, typName string
		if err := rows.Scan(&col.name, &col.oid, &col.typ, &typSchema, &typName); err != nil {
			rows.Close()
			return nil, err
		}
		col.cast = quote(typSchema) + "." + quote(typName)
		col.ident = quote(col.name)
		t.byName[col.name] = len(t.cols)
		t.cols = append(t.cols, col)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("looking up the columns of table %s: %w", t.ident, err)
	}
	// The key: the configured columns (which a unique index must cover, for ON CONFLICT), else
	// the primary key.
	var keyNames []string
	if k, ok := c.keys[name]; ok {
		keyNames = k
		var unique bool
		err := c.conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = $1 AND i.indisunique AND i.indpred IS NULL
			AND (SELECT array_agg(a.attname::text ORDER BY a.attname) FROM pg_attribute a WHERE a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey))
			    = (SELECT array_agg(x ORDER BY x) FROM unnest($2::text[]) x))`, oid, k).Scan(&unique)
		if err != nil {
			return nil, fmt.Errorf("checking the key of table %s: %w", t.ident, err)
		}
		if !unique {
			return nil, fmt.Errorf("table %s has no unique index on exactly the key columns %v that Config.Keys gives", t.ident, k)
		}
	} else {
		rows, err := c.conn.Query(ctx, `SELECT a.attname FROM pg_index i, unnest(i.indkey) WITH ORDINALITY AS k(attnum, pos)
			JOIN pg_attribute a ON a.attnum = k.attnum WHERE i.indrelid = $1 AND i.indisprimary AND a.attrelid = $1 ORDER BY k.pos`, oid)
		if err != nil {
			return nil, fmt.Errorf("looking up the primary key of table %s: %w", t.ident, err)
		}
		keyNames, err = pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return nil, fmt.Errorf("looking up the primary key of table %s: %w", t.ident, err)
		}
		if len(keyNames) == 0 {
			return nil, fmt.Errorf("table %s has no primary key: the sink needs a key (add a primary key, or name the columns of a unique index in Config.Keys[%q])", t.ident, name)
		}
	}
	for _, k := range keyNames {
		i, ok := t.byName[k]
		if !ok {
			return nil, fmt.Errorf("table %s has no key column %q", t.ident, k)
		}
		t.key = append(t.key, i)
	}
	c.tables[name] = t
	return t, nil
}

// enc is a row with its values in PostgreSQL's text format, ready for the statements.
type enc struct {
	t    *table
	op   Op
	cols []int // indexes into t.cols
	vals []pgtype.Text
	key  string // the key values, joined: what the batch collapses on
	// oldKey, for an Update that changes the key: the old key values, in key order.
	oldKey []pgtype.Text
}

// describe returns "op table key=..." for error messages.
func (e *enc) describe() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s", e.op, e.t.ident)
	for _, k := range e.t.key {
		if v, ok := e.value(k); ok {
			fmt.Fprintf(&b, " %s=%s", e.t.cols[k].name, v.String)
		}
	}
	if e.oldKey != nil {
		b.WriteString(" (key was")
		for i, k := range e.t.key {
			fmt.Fprintf(&b, " %s=%s", e.t.cols[k].name, e.oldKey[i].String)
		}
		b.WriteString(")")
	}
	return b.String()
}

func (e *enc) value(col int) (pgtype.Text, bool) {
	for i, c := range e.cols {
		if c == col {
			return e.vals[i], true
		}
	}
	return pgtype.Text{}, false
}

// keyOf returns the key values (in key order) from cols/vals, and the collapse key.
func keyOf(t *table, cols []int, vals []pgtype.Text, what string) ([]pgtype.Text, string, error) {
	out := make([]pgtype.Text, len(t.key))
	var b strings.Builder
	for i, k := range t.key {
		found := false
		for j, c := range cols {
			if c == k {
				out[i] = vals[j]
				found = true
				break
			}
		}
		if !found {
			return nil, "", fmt.Errorf("the %s lacks key column %q of table %s", what, t.cols[k].name, t.ident)
		}
		if !out[i].Valid {
			return nil, "", fmt.Errorf("the %s has NULL in key column %q of table %s", what, t.cols[k].name, t.ident)
		}
		b.WriteString(strconv.Itoa(len(out[i].String)))
		b.WriteByte(':')
		b.WriteString(out[i].String)
	}
	return out, b.String(), nil
}

// makeEnc builds an enc from text values (Write encodes Row values first; the log holds text).
func makeEnc(t *table, op Op, names []string, vals []pgtype.Text, keyNames []string, keyVals []pgtype.Text, describe func() string) (enc, error) {
	e := enc{t: t, op: op, vals: vals}
	if op == Truncate {
		return e, nil
	}
	if op < Insert || op > Truncate {
		return e, fmt.Errorf("row %s: unknown operation %d", describe(), op)
	}
	if len(names) != len(vals) {
		return e, fmt.Errorf("row %s: %d columns but %d values", describe(), len(names), len(vals))
	}
	e.cols = make([]int, len(names))
	for i, n := range names {
		c, ok := t.byName[n]
		if !ok {
			return e, fmt.Errorf("row %s: table %s has no column %q", describe(), t.ident, n)
		}
		e.cols[i] = c
	}
	var err error
	if keyNames != nil && (op == Update || op == Delete) {
		kc := make([]int, len(keyNames))
		for i, n := range keyNames {
			c, ok := t.byName[n]
			if !ok {
				return e, fmt.Errorf("row %s: table %s has no column %q (in KeyColumns)", describe(), t.ident, n)
			}
			kc[i] = c
		}
		old, oldKey, err := keyOf(t, kc, keyVals, "row's Key")
		if err != nil {
			return e, fmt.Errorf("row %s: %w", describe(), err)
		}
		if op == Delete {
			e.key = oldKey
			e.cols, e.vals = t.key, old
			return e, nil
		}
		_, newKey, err := keyOf(t, e.cols, e.vals, "row")
		if err != nil || newKey != oldKey {
			e.oldKey = old // the key changes (or the new values do not repeat it)
			return e, nil
		}
	}
	_, e.key, err = keyOf(t, e.cols, e.vals, "row")
	if err != nil {
		return e, fmt.Errorf("row %s: %w", describe(), err)
	}
	return e, nil
}

// applier applies rows in order inside one transaction, collapsing the operations on each key
// into one and running one statement per table, operation and set of columns.
type applier struct {
	// careful runs every statement in a savepoint and, when the server refuses a group of
	// rows, finds the row (see diagnose).
	careful bool
	ctx     context.Context
	q       execer
	copy    copier
	order   []*table
	byT     map[*table]map[string]*enc
	tOrder  map[*table][]string
}

func newApplier(ctx context.Context, q execer, copy copier) *applier {
	return &applier{ctx: ctx, q: q, copy: copy, byT: map[*table]map[string]*enc{}, tOrder: map[*table][]string{}}
}

func merge(a, b *enc) *enc {
	out := &enc{t: a.t, op: a.op, key: a.key}
	out.cols = append([]int(nil), a.cols...)
	out.vals = append([]pgtype.Text(nil), a.vals...)
	for i, c := range b.cols {
		found := false
		for j, oc := range out.cols {
			if oc == c {
				out.vals[j] = b.vals[i]
				found = true
				break
			}
		}
		if !found {
			out.cols = append(out.cols, c)
			out.vals = append(out.vals, b.vals[i])
		}
	}
	return out
}

func (a *applier) add(e *enc) error {
	if e.op == Truncate {
		if err := a.flush(); err != nil {
			return err
		}
		if _, err := a.q.Exec(a.ctx, "TRUNCATE "+e.t.ident); err != nil {
			return fmt.Errorf("truncate %s: %w", e.t.ident, err)
		}
		return nil
	}
	if e.oldKey != nil {
		if err := a.flush(); err != nil {
			return err
		}
		return a.updateByOldKey(e)
	}
	m := a.byT[e.t]
	if m == nil {
		m = map[string]*enc{}
		a.byT[e.t] = m
		a.order = append(a.order, e.t)
	}
	prev := m[e.key]
	if prev == nil {
		m[e.key] = e
		a.tOrder[e.t] = append(a.tOrder[e.t], e.key)
		return nil
	}
	full := len(e.cols) == len(e.t.cols)
	var next *enc
	switch e.op {
	case Delete:
		next = e
	case Insert:
		switch prev.op {
		case Delete:
			if full {
				next = &enc{t: e.t, op: Upsert, cols: e.cols, vals: e.vals, key: e.key}
			}
		case Insert, Upsert:
			return fmt.Errorf("row %s: inserts a key that an earlier row of the same epoch wrote (duplicate key)", e.describe())
		}
	case Upsert:
		switch prev.op {
		case Insert, Upsert:
			next = merge(prev, e)
		case Delete:
			if full {
				next = e
			}
		}
	case Update:
		switch prev.op {
		case Insert, Upsert, Update:
			next = merge(prev, e)
		case Delete:
			next = prev // updating a deleted row changes nothing
		}
	}
	if next == nil { // no single operation has the effect of both: write what came before
		if err := a.flush(); err != nil {
			return err
		}
		return a.add(e)
	}
	m[e.key] = next
	return nil
}

// flush runs the collapsed operations: per table, the deletes, then inserts, upserts and
// updates grouped by their columns. Each key has one operation, so their order does not
// matter.
func (a *applier) flush() error {
	for _, t := range a.order {
		m := a.byT[t]
		groups := map[string][]*enc{}
		var gorder []string
		for _, k := range a.tOrder[t] {
			e := m[k]
			sig := e.op.String()
			if e.op != Delete {
				for _, c := range e.cols {
					sig += "," + strconv.Itoa(c)
				}
			}
			if groups[sig] == nil {
				gorder = append(gorder, sig)
			}
			groups[sig] = append(groups[sig], e)
		}
		// Deletes first: a key deleted and another inserted never collide on a unique index.
		for pass := 0; pass < 2; pass++ {
			for _, sig := range gorder {
				g := groups[sig]
				if (g[0].op == Delete) != (pass == 0) {
					continue
				}
				if err := a.run(t, sig, g); err != nil {
					return err
				}
			}
		}
	}
	a.order = a.order[:0]
	clear(a.byT)
	clear(a.tOrder)
	return nil
}

// run executes one statement for a group of rows of the same table, operation and columns:
// COPY for inserts, else the values passed as one text array per column.
func (a *applier) run(t *table, sig string, g []*enc) error {
	e0 := g[0]
	cols := e0.cols
	if e0.op == Delete {
		cols = t.key
	}
	q, ok := t.sql[sig]
	if !ok {
		q = buildSQL(t, e0.op, cols)
		t.sql[sig] = q
	}
	if q == "" {
		return nil // an update of key columns only: nothing to set
	}
	if a.careful {
		if err := a.bisect(t, q, cols, g, false); err != nil {
			return fmt.Errorf("%s of %d rows into %s: %w", e0.op, len(g), t.ident, err)
		}
		return nil
	}
	if err := a.exec(t, q, cols, g); err != nil {
		return &stmtError{fmt.Errorf("%s of %d rows into %s (the first: %s): %w", e0.op, len(g), t.ident, e0.describe(), err)}
	}
	return nil
}

// exec runs the statement q of a group: COPY for inserts, else with the values as text arrays.
func (a *applier) exec(t *table, q string, cols []int, g []*enc) error {
	if g[0].op == Insert {
		return a.copyIn(q, cols, g)
	}
	args := make([]any, len(cols))
	for i := range cols {
		arr := make([]pgtype.Text, len(g))
		for j, e := range g {
			if e.op == Delete {
				v, _ := e.value(t.key[i])
				arr[j] = v
			} else {
				arr[j] = e.vals[i]
			}
		}
		args[i] = arr
	}
	_, err := a.q.Exec(a.ctx, q, args...)
	return err
}

// copyIn writes a group of inserts with COPY in text format (the values already are text):
// one round trip, and the server parses each value once, with no arrays to build and unnest.
func (a *applier) copyIn(q string, cols []int, g []*enc) error {
	var buf bytes.Buffer
	for _, e := range g {
		for i := range cols {
			if i > 0 {
				buf.WriteByte('\t')
			}
			copyText(&buf, e.vals[i])
		}
		buf.WriteByte('\n')
	}
	_, err := a.copy(a.ctx, &buf, q)
	return err
}

// stmtError is a statement of the applier that the server refused: the rows, not the
// connection, are at fault, and a careful replay (diagnose) can find the row.
type stmtError struct{ err error }

func (e *stmtError) Error() string { return e.err.Error() }
func (e *stmtError) Unwrap() error { return e.err }

// diagnose finds the row behind a refused statement (orig, a *stmtError): it replays the rows
// that apply adds to the applier in a transaction of its own on conn, with every statement in
// a savepoint, halving a refused group until one row is left, and rolls the transaction back.
// It returns the error of that row, naming it, its column and value where the server's error
// does not, or orig when the replay finds nothing (or cannot run). It runs only after a
// failure: the statements of the normal path use no savepoints (subtransactions).
func diagnose(ctx context.Context, conn *pgx.Conn, apply func(a *applier) error, orig error) error {
	if conn.IsClosed() {
		return orig
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		return orig
	}
	defer tx.Rollback(context.Background())
	a := newApplier(ctx, tx, tx.Conn().PgConn().CopyFrom)
	a.careful = true
	err = apply(a)
	var found *rowError
	if errors.As(err, &found) {
		return err
	}
	return orig
}

// rowError is the error of one row that diagnose found.
type rowError struct{ err error }

func (e *rowError) Error() string { return e.err.Error() }
func (e *rowError) Unwrap() error { return e.err }

// savepoint runs f inside a savepoint, rolled back if f fails.
func (a *applier) savepoint(name string, f func() error) error {
	if _, err := a.q.Exec(a.ctx, "SAVEPOINT "+name); err != nil {
		return err
	}
	err := f()
	if err != nil {
		if _, rerr := a.q.Exec(a.ctx, "ROLLBACK TO SAVEPOINT "+name); rerr != nil {
			return errors.Join(err, rerr)
		}
	}
	if _, rerr := a.q.Exec(a.ctx, "RELEASE SAVEPOINT "+name); rerr != nil && err == nil {
		return rerr
	}
	return err
}

// bisect runs a group in a savepoint; if the server refuses it, it runs each half in turn
// the same way, down to the one row that the server refuses (after the rows before it).
// fails says that the group is known to be refused (the rest of a refused group whose first
// half passed): it is not run whole again.
func (a *applier) bisect(t *table, q string, cols []int, g []*enc, fails bool) error {
	if !fails || len(g) == 1 {
		err := a.savepoint("epochflow_group", func() error { return a.exec(t, q, cols, g) })
		var pgErr *pgconn.PgError
		if err == nil || !errors.As(err, &pgErr) {
			return err
		}
		if len(g) == 1 {
			return a.rowError(t, g[0], pgErr)
		}
	}
	h := len(g) / 2
	if err := a.bisect(t, q, cols, g[:h], false); err != nil {
		return err
	}
	return a.bisect(t, q, cols, g[h:], true)
}

// rowError describes the server's refusal of row e: its operation, table and key, and the
// column and value at fault, named by the server or found by probing the row's values.
func (a *applier) rowError(t *table, e *enc, pgErr *pgconn.PgError) error {
	col := -1
	if c, ok := t.byName[pgErr.ColumnName]; ok && pgErr.ColumnName != "" {
		col = c
	} else if strings.HasPrefix(pgErr.Code, "22") { // data exception: a value the column cannot hold
		col = a.probe(t, e, pgErr.Code)
	}
	if col < 0 {
		return &rowError{fmt.Errorf("row %s: %w", e.describe(), pgErr)}
	}
	v, _ := e.value(col)
	val := "NULL"
	if v.Valid {
		s := v.String
		if len(s) > 60 {
			s = s[:60] + "..."
		}
		val = strconv.Quote(s)
	}
	return &rowError{fmt.Errorf("row %s: column %q (%s) cannot hold the value %s: %w", e.describe(), t.cols[col].name, t.cols[col].typ, val, pgErr)}
}

// probe finds which value of e the server refuses with SQLSTATE code: it assigns each value
// alone to the column of an empty copy of the table (a temporary table without constraints,
// its columns of the same types), inside a savepoint. It returns -1 if none is refused so.
func (a *applier) probe(t *table, e *enc, code string) int {
	found := -1
	a.savepoint("epochflow_probe", func() error {
		if _, err := a.q.Exec(a.ctx, "CREATE TEMPORARY TABLE epochflow_probe ON COMMIT DROP AS SELECT * FROM "+t.ident+" WITH NO DATA"); err != nil {
			return err
		}
		for i, c := range e.cols {
			if !e.vals[i].Valid {
				continue
			}
			q := "INSERT INTO pg_temp.epochflow_probe (" + t.cols[c].ident + ") VALUES ($1::text::" + t.cols[c].cast + ")"
			err := a.savepoint("epochflow_value", func() error {
				_, err := a.q.Exec(a.ctx, q, e.vals[i])
				return err
			})
			var pgErr *pgconn.PgError
			if errors.As(err, &pgErr) && pgErr.Code == code {
				found = c
				break
			}
		}
		return errors.New("rolled back") // the probe table goes with the savepoint
	})
	return found
}

// copyText appends v in COPY's text format: \N for NULL, and backslash, newline, carriage
// return and tab escaped.
func copyText(buf *bytes.Buffer, v pgtype.Text) {
	if !v.Valid {
		buf.WriteString(`\N`)
		return
	}
	s := v.String
	for {
		i := strings.IndexAny(s, "\\\n\r\t")
		if i < 0 {
			buf.WriteString(s)
			return
		}
		buf.WriteString(s[:i])
		switch s[i] {
		case '\\':
			buf.WriteString(`\\`)
		case '\n':
			buf.WriteString(`\n`)
		case '\r':
			buf.WriteString(`\r`)
		case '\t':
			buf.WriteString(`\t`)
		}
		s = s[i+1:]
	}
}

func buildSQL(t *table, op Op, cols []int) string {
	var b strings.Builder
	unnest := func() {
		b.WriteString("unnest(")
		for i := range cols {
			if i > 0 {
				b.WriteString(", ")
			}
			fmt.Fprintf(&b, "$%d::text[]", i+1)
		}
		b.WriteString(") AS u(")
		for i := range cols {
			if i > 0 {
				b.WriteString(", ")
			}
			fmt.Fprintf(&b, "c%d", i)
		}
		b.WriteString(")")
	}
	pos := func(col int) int {
		for i, c := range cols {
			if c == col {
				return i
			}
		}
		return -1
	}
	isKey := func(col int) bool {
		for _, k := range t.key {
			if k == col {
				return true
			}
		}
		return false
	}
	keyMatch := func() {
		for i, k := range t.key {
			if i > 0 {
				b.WriteString(" AND ")
			}
			fmt.Fprintf(&b, "t.%s = u.c%d::%s", t.cols[k].ident, pos(k), t.cols[k].cast)
		}
	}
	colList := func() {
		for i, c := range cols {
			if i > 0 {
				b.WriteString(", ")
			}
			b.WriteString(t.cols[c].ident)
		}
	}
	switch op {
	case Insert:
		fmt.Fprintf(&b, "COPY %s (", t.ident)
		colList()
		b.WriteString(") FROM STDIN")
	case Delete:
		fmt.Fprintf(&b, "DELETE FROM %s AS t USING ", t.ident)
		unnest()
		b.WriteString(" WHERE ")
		keyMatch()
	case Upsert:
		fmt.Fprintf(&b, "INSERT INTO %s (", t.ident)
		colList()
		b.WriteString(") SELECT ")
		for i, c := range cols {
			if i > 0 {
				b.WriteString(", ")
			}
			fmt.Fprintf(&b, "u.c%d::%s", i, t.cols[c].cast)
		}
		b.WriteString(" FROM ")
		unnest()
		b.WriteString(" ON CONFLICT (")
		for i, k := range t.key {
			if i > 0 {
				b.WriteString(", ")
			}
			b.WriteString(t.cols[k].ident)
		}
		b.WriteString(") DO ")
		n := 0
		for _, c := range cols {
			if isKey(c) {
				continue
			}
			if n == 0 {
				b.WriteString("UPDATE SET ")
			} else {
				b.WriteString(", ")
			}
			fmt.Fprintf(&b, "%s = EXCLUDED.%s", t.cols[c].ident, t.cols[c].ident)
			n++
		}
		if n == 0 {
			b.WriteString("NOTHING")
		}
	case Update:
		fmt.Fprintf(&b, "UPDATE %s AS t SET ", t.ident)
		n := 0
		for i, c := range cols {
			if isKey(c) {
				continue
			}
			if n > 0 {
				b.WriteString(", ")
			}
			fmt.Fprintf(&b, "%s = u.c%d::%s", t.cols[c].ident, i, t.cols[c].cast)
			n++
		}
		if n == 0 {
			return ""
		}
		b.WriteString(" FROM ")
		unnest()
		b.WriteString(" WHERE ")
		keyMatch()
	}
	return b.String()
}

// updateByOldKey runs an update that changes the key (or names the row by KeyColumns): one
// statement for one row.
func (a *applier) updateByOldKey(e *enc) error {
	t := e.t
	var b strings.Builder
	args := make([]any, 0, len(e.cols)+len(t.key))
	fmt.Fprintf(&b, "UPDATE %s SET ", t.ident)
	for i, c := range e.cols {
		if i > 0 {
			b.WriteString(", ")
		}
		args = append(args, e.vals[i])
		fmt.Fprintf(&b, "%s = $%d::text::%s", t.cols[c].ident, len(args), t.cols[c].cast)
	}
	b.WriteString(" WHERE ")
	for i, k := range t.key {
		if i > 0 {
			b.WriteString(" AND ")
		}
		args = append(args, e.oldKey[i])
		fmt.Fprintf(&b, "%s = $%d::text::%s", t.cols[k].ident, len(args), t.cols[k].cast)
	}
	if len(e.cols) == 0 {
		return nil
	}
	if err := a.replaceTarget(e); err != nil {
		return err
	}
	if a.careful {
		err := a.savepoint("epochflow_group", func() error {
			_, err := a.q.Exec(a.ctx, b.String(), args...)
			return err
		})
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) {
			return a.rowError(t, e, pgErr)
		}
		return err
	}
	if _, err := a.q.Exec(a.ctx, b.String(), args...); err != nil {
		return &stmtError{fmt.Errorf("update of %s (%s): %w", t.ident, e.describe(), err)}
	}
	return nil
}

// replaceTarget prepares an update that moves a row to another key: if rows exist at both
// the old and the new key, the one at the new key goes, so the moved row replaces it, as an
// upsert would. That never happens to changes applied once, in order; it happens when changes
// are applied again over newer rows (pgrepl's initial copy replays the changes committed
// between the slot's position and the copy's snapshot), and then the later changes bring the
// row up to date.
func (a *applier) replaceTarget(e *enc) error {
	t := e.t
	newKey := make([]pgtype.Text, len(t.key))
	same := true
	for i, k := range t.key {
		v, ok := e.value(k)
		if !ok {
			return nil // the key is not set: the row keeps its key
		}
		newKey[i] = v
		if v != e.oldKey[i] {
			same = false
		}
	}
	if same {
		return nil
	}
	var b strings.Builder
	args := make([]any, 0, 2*len(t.key))
	match := func(alias string, vals []pgtype.Text) {
		for i, k := range t.key {
			if i > 0 {
				b.WriteString(" AND ")
			}
			args = append(args, vals[i])
			fmt.Fprintf(&b, "%s%s = $%d::text::%s", alias, t.cols[k].ident, len(args), t.cols[k].cast)
		}
	}
	fmt.Fprintf(&b, "DELETE FROM %s AS n WHERE ", t.ident)
	match("n.", newKey)
	fmt.Fprintf(&b, " AND EXISTS (SELECT 1 FROM %s AS o WHERE ", t.ident)
	match("o.", e.oldKey)
	b.WriteString(")")
	if _, err := a.q.Exec(a.ctx, b.String(), args...); err != nil {
		return fmt.Errorf("update of %s (%s), clearing its new key: %w", t.ident, e.describe(), err)
	}
	return nil
}
