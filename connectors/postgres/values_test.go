package postgres

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
)

// A value that the target column cannot hold (too long for varchar(5) or char(1), beyond
// numeric(5,2)) fails the epoch, whatever writes it: an insert (COPY), an upsert (how pg-cdc
// writes its initial copy and streamed inserts), an update, an update that changes the key, and
// rows applied from the log table. The error names the table, the column and the key of the
// row that failed (row 377 of 500, not the first of the batch), and no value is cut to fit.
func TestValueTheColumnCannotHoldFails(t *testing.T) {
	const n, bad = 500, 377
	row := func(op Op, k int, col string, v any) Row {
		r := Row{Table: "t", Op: op, Columns: []string{"k", "v", "c", "n"}, Values: []any{k, "ok", "y", "1.5"}}
		if op == Update {
			r.Columns, r.Values = []string{"k", col}, []any{k, v}
			return r
		}
		for i, c := range r.Columns {
			if c == col {
				r.Values[i] = v
			}
		}
		return r
	}
	batch := func(op Op, col string, v any) []Row {
		rows := make([]Row, 0, n)
		for k := 1; k <= n; k++ {
			if k == bad {
				rows = append(rows, row(op, k, col, v))
			} else {
				rows = append(rows, row(op, k, col, map[string]any{"v": "fine", "c": "z", "n": "2.25"}[col]))
			}
		}
		return rows
	}
	cases := []struct {
		name, col, typ string
		v              any
		existing       bool // the rows are there before (committed in an epoch of their own)
		rows           func() []Row
	}{
		{name: "insert", col: "v", typ: "character varying(5)", v: "copied-long-name"},
		{name: "upsert", col: "v", typ: "character varying(5)", v: "copied-long-name"},
		{name: "upsert_existing", col: "v", typ: "character varying(5)", v: "copied-long-name", existing: true},
		{name: "update", col: "v", typ: "character varying(5)", v: "copied-long-name", existing: true},
		{name: "char", col: "c", typ: "character(1)", v: "xy", existing: true},
		{name: "numeric", col: "n", typ: "numeric(5,2)", v: "12345.6"},
		{name: "numeric_update", col: "n", typ: "numeric(5,2)", v: 1e6, existing: true},
		{name: "key_change", col: "v", typ: "character varying(5)", v: "copied-long-name", existing: true, rows: func() []Row {
			return []Row{{Table: "t", Op: Update, Columns: []string{"k", "v"}, Values: []any{bad + 10_000, "copied-long-name"},
				KeyColumns: []string{"k"}, Key: []any{bad}}}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dsn, conn := newDB(t)
			exec(t, conn, "CREATE TABLE t (k int PRIMARY KEY, v varchar(5), c char(1), n numeric(5,2))")
			p := open(t, Config{DSN: dsn, Name: "values-" + tc.name}, nil)
			defer rollbackPrepared(t, conn)
			defer p.Close()
			ctx := context.Background()
			if tc.existing {
				commitEpoch(t, p, batch(Insert, "", nil))
				eventually(t, "the first epoch's commit", func() bool { return dump(t, conn, "SELECT count(*) FROM t")[0] == fmt.Sprint(n) })
				eventually(t, "the first epoch's commit", func() bool { return len(prepared(t, conn)) == 0 })
			}
			var rows []Row
			switch {
			case tc.rows != nil:
				rows = tc.rows()
			case strings.HasPrefix(tc.name, "insert"):
				rows = batch(Insert, tc.col, tc.v)
			case strings.HasPrefix(tc.name, "upsert"):
				rows = batch(Upsert, tc.col, tc.v)
			case tc.existing:
				rows = batch(Update, tc.col, tc.v)
			default:
				rows = batch(Upsert, tc.col, tc.v)
			}
			if err := p.Write(ctx, rows); err != nil {
				t.Fatal(err)
			}
			_, err := p.Snapshot()
			checkValueError(t, err, tc.col, tc.typ)
			if got := dump(t, conn, "SELECT count(*) FROM t WHERE length(v) > 4 AND v <> 'fine' OR c = 'x' OR n > 999"); got[0] != "0" {
				t.Fatalf("%s rows hold a value cut to fit", got[0])
			}
		})
	}
	// Rows written to the log table (an earlier prepared transaction still waits for its
	// commit) fail when the committer applies them, with the same error.
	t.Run("logged", func(t *testing.T) {
		dsn, conn := newDB(t)
		exec(t, conn, "CREATE TABLE t (k int PRIMARY KEY, v varchar(5), c char(1), n numeric(5,2))")
		p := open(t, Config{DSN: dsn, Name: "values-logged"}, nil)
		defer rollbackPrepared(t, conn)
		defer p.Close()
		ctx := context.Background()
		if err := p.Write(ctx, []Row{row(Insert, 100_000, "", nil)}); err != nil {
			t.Fatal(err)
		}
		if _, err := p.Snapshot(); err != nil {
			t.Fatal(err)
		}
		if err := p.Write(ctx, batch(Upsert, "v", "copied-long-name")); err != nil {
			t.Fatal(err)
		}
		seq, err := p.Snapshot()
		if err != nil {
			t.Fatal(err)
		}
		p.mu.Lock()
		logged := len(p.pending) == 2 && p.pending[1].logged
		p.mu.Unlock()
		if !logged {
			t.Fatal("the second epoch's rows did not go to the log table")
		}
		if err := p.Commit(ctx, seq); err != nil {
			t.Fatal(err)
		}
		eventually(t, "the committer's failure", func() bool { return p.failed() != nil })
		checkValueError(t, p.failed(), "v", "character varying(5)")
		if got := dump(t, conn, "SELECT count(*) FROM t WHERE v = 'copie'"); got[0] != "0" {
			t.Fatalf("%s rows hold a value cut to fit", got[0])
		}
	})
}

func checkValueError(t *testing.T, err error, col, typ string) {
	t.Helper()
	if err == nil {
		t.Fatal("the epoch with a value its column cannot hold was prepared")
	}
	msg := err.Error()
	for _, want := range []string{`"public"."t"`, fmt.Sprintf("column %q (%s)", col, typ), " k=377", `sink "values-`} {
		if !strings.Contains(msg, want) {
			t.Errorf("the error does not name %s: %v", want, err)
		}
	}
	if strings.Contains(msg, " k=1 ") || strings.Contains(msg, " k=1:") {
		t.Errorf("the error names the first row of the batch: %v", err)
	}
	t.Log(msg)
}

// rollbackPrepared rolls back what a failed test left prepared in conn's database (global
// ids are global to the cluster: another test's sink of the same name would collide).
func rollbackPrepared(t *testing.T, conn *pgx.Conn) {
	for _, g := range prepared(t, conn) {
		conn.Exec(context.Background(), "ROLLBACK PREPARED "+literal(g))
	}
}

// The row named is the first one of the epoch that the server refuses, wherever it is in its
// statement's rows (the first, the last, one of several).
func TestRefusedRowFound(t *testing.T) {
	dsn, conn := newDB(t)
	exec(t, conn, "CREATE TABLE t (k int PRIMARY KEY, v varchar(5))")
	ctx := context.Background()
	for i, bad := range [][]int{{1}, {1000}, {2, 999}, {600, 601, 602}, {333}} {
		p := open(t, Config{DSN: dsn, Name: fmt.Sprint("found", i)}, nil)
		rows := make([]Row, 1000)
		for k := range rows {
			rows[k] = kv("t", Upsert, k+1, "fine")
		}
		for _, k := range bad {
			rows[k-1] = kv("t", Upsert, k, "copied-long-name")
		}
		if err := p.Write(ctx, rows); err != nil {
			t.Fatal(err)
		}
		_, err := p.Snapshot()
		if err == nil || !strings.Contains(err.Error(), fmt.Sprintf(" k=%d: column \"v\"", bad[0])) {
			t.Errorf("bad rows %v: %v, want an error naming k=%d", bad, err, bad[0])
		}
		p.Close()
	}
	rollbackPrepared(t, conn)
}

// A column whose type is a domain over a type with a typmod (a domain over a domain too) is
// cast to the domain's base type and assigned, so a value too long for it fails as it does
// for varchar(5) itself: an explicit cast to the domain cuts the value to fit.
func TestDomainColumnCannotHoldFails(t *testing.T) {
	dsn, conn := newDB(t)
	exec(t, conn, "CREATE DOMAIN short AS varchar(5)")
	exec(t, conn, "CREATE DOMAIN shorter AS short")
	exec(t, conn, "CREATE TABLE t (k int PRIMARY KEY, v short, w shorter)")
	ctx := context.Background()
	for i, tc := range []struct {
		op  Op
		col string
	}{{Upsert, "v"}, {Upsert, "w"}, {Update, "v"}} {
		p := open(t, Config{DSN: dsn, Name: fmt.Sprint("domain", i)}, nil)
		if tc.op == Update {
			commitEpoch(t, p, []Row{{Table: "t", Op: Insert, Columns: []string{"k", "v", "w"}, Values: []any{377, "ok", "ok"}}})
			eventually(t, "the first epoch's commit", func() bool { return len(prepared(t, conn)) == 0 })
		}
		if err := p.Write(ctx, []Row{{Table: "t", Op: tc.op, Columns: []string{"k", tc.col}, Values: []any{377, "copied-long-name"}}}); err != nil {
			t.Fatal(err)
		}
		_, err := p.Snapshot()
		if err == nil || !strings.Contains(err.Error(), " k=377") || !strings.Contains(err.Error(), fmt.Sprintf("column %q", tc.col)) {
			t.Errorf("%s of a value too long for domain column %s: %v, want an error naming the row and the column", tc.op, tc.col, err)
		}
		p.Close()
		rollbackPrepared(t, conn)
		if got := dump(t, conn, "SELECT count(*) FROM t WHERE v = 'copie' OR w = 'copie'"); got[0] != "0" {
			t.Fatalf("%s rows hold a value cut to fit", got[0])
		}
		exec(t, conn, "DELETE FROM t")
	}
}
