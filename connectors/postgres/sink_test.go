package postgres

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/epochflow/epochflow/internal/pgtest"
	"github.com/jackc/pgx/v5"
	"pgregory.net/rapid"
)

var cluster *pgtest.Cluster

func TestMain(m *testing.M) { pgtest.Main(m, &cluster) }

func newDB(t testing.TB) (string, *pgx.Conn) {
	t.Helper()
	ctx := context.Background()
	dsn, err := cluster.CreateDB(ctx, t.Name())
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return dsn, conn
}

func exec(t testing.TB, conn *pgx.Conn, sql string, args ...any) {
	t.Helper()
	if _, err := conn.Exec(context.Background(), sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

func open(t testing.TB, cfg Config, resume *uint64) *partition {
	t.Helper()
	p, err := NewSink(cfg).Build(context.Background(), "p0", resume)
	if err != nil {
		t.Fatal(err)
	}
	return p.(*partition)
}

// dump returns the table as sorted "k=v" lines.
func dump(t testing.TB, conn *pgx.Conn, q string) []string {
	t.Helper()
	rows, err := conn.Query(context.Background(), q)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for rows.Next() {
		vals, err := rows.Values()
		if err != nil {
			t.Fatal(err)
		}
		parts := make([]string, len(vals))
		for i, v := range vals {
			parts[i] = fmt.Sprint(v)
		}
		out = append(out, strings.Join(parts, " "))
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	sort.Strings(out)
	return out
}

func prepared(t testing.TB, conn *pgx.Conn) []string {
	t.Helper()
	return dump(t, conn, "SELECT gid FROM pg_prepared_xacts WHERE database = current_database()")
}

func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// commitEpoch writes rows as one epoch: Write, Snapshot (the prepare) and Commit.
func commitEpoch(t testing.TB, p *partition, rows []Row) {
	t.Helper()
	ctx := context.Background()
	if err := p.Write(ctx, rows); err != nil {
		t.Fatal(err)
	}
	seq, err := p.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Commit(ctx, seq); err != nil {
		t.Fatal(err)
	}
}

func kv(table string, op Op, k int, v any) Row {
	return Row{Table: table, Op: op, Columns: []string{"k", "v"}, Values: []any{k, v}}
}

// An epoch's rows are invisible until its Commit: Snapshot prepares a transaction named after
// the sink, partition and snapshot; Commit commits it. Several operations on one key collapse.
func TestPrepareThenCommit(t *testing.T) {
	dsn, conn := newDB(t)
	exec(t, conn, "CREATE TABLE t (k int PRIMARY KEY, v text)")
	p := open(t, Config{DSN: dsn, Name: "test.write"}, nil)
	defer p.Close()
	ctx := context.Background()
	if err := p.Write(ctx, []Row{kv("t", Insert, 1, "a"), kv("t", Insert, 2, "b"), kv("t", Update, 1, "a2"),
		kv("t", Upsert, 3, "c"), kv("t", Delete, 2, nil), kv("t", Insert, 2, "b2"), kv("t", Insert, 4, "d"), kv("t", Delete, 4, nil)}); err != nil {
		t.Fatal(err)
	}
	seq, err := p.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	if g := prepared(t, conn); len(g) != 1 || g[0] != "epochflow:test.write:p0:1" {
		t.Fatalf("prepared transactions %v", g)
	}
	if n := dump(t, conn, "SELECT count(*) FROM t"); n[0] != "0" {
		t.Fatalf("%s rows visible before the commit", n[0])
	}
	if err := p.Commit(ctx, seq); err != nil {
		t.Fatal(err)
	}
	want := []string{"1 a2", "2 b2", "3 c"}
	eventually(t, "the commit", func() bool { return fmt.Sprint(dump(t, conn, "SELECT k, v FROM t")) == fmt.Sprint(want) })
	if g := prepared(t, conn); len(g) != 0 {
		t.Fatalf("prepared transactions left: %v", g)
	}
	// An epoch without rows prepares nothing; its Commit is fine.
	seq, err = p.Snapshot()
	if err != nil || seq != 2 {
		t.Fatal(seq, err)
	}
	if err := p.Commit(ctx, seq); err != nil {
		t.Fatal(err)
	}
}

// Epochs that change the same rows while the earlier one still waits for its commit do not
// block (their rows go through the log table), and they apply in order.
func TestUncommittedEpochsOnSameRows(t *testing.T) {
	dsn, conn := newDB(t)
	exec(t, conn, "CREATE TABLE t (k int PRIMARY KEY, v text)")
	p := open(t, Config{DSN: dsn, Name: "w"}, nil)
	defer p.Close()
	ctx := context.Background()
	for e := 1; e <= 4; e++ {
		var rows []Row
		for k := 1; k <= 100; k++ {
			rows = append(rows, kv("t", Upsert, k, fmt.Sprintf("e%d", e)))
		}
		if e == 3 {
			rows = append(rows, kv("t", Delete, 7, nil))
		}
		if err := p.Write(ctx, rows); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { _, err := p.Snapshot(); done <- err }()
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(20 * time.Second):
			t.Fatalf("Snapshot of epoch %d blocked behind the uncommitted epochs", e)
		}
	}
	if g := prepared(t, conn); len(g) != 4 {
		t.Fatalf("prepared: %v", g)
	}
	if err := p.Commit(ctx, 2); err != nil {
		t.Fatal(err)
	}
	eventually(t, "epoch 2", func() bool { return fmt.Sprint(dump(t, conn, "SELECT v FROM t WHERE k = 1")) == "[e2]" })
	if err := p.Commit(ctx, 4); err != nil {
		t.Fatal(err)
	}
	eventually(t, "epoch 4", func() bool { return fmt.Sprint(dump(t, conn, "SELECT v FROM t WHERE k = 1")) == "[e4]" })
	if got := dump(t, conn, "SELECT count(*), min(v), max(v) FROM t"); got[0] != "100 e4 e4" {
		t.Fatalf("after epoch 4: %v", got)
	}
	if n := dump(t, conn, "SELECT count(*) FROM "+DefaultLogTable); n[0] != "0" {
		t.Fatalf("%s log rows left", n[0])
	}
}

// Build with a resume state commits the prepared transactions of snapshots up to it and rolls
// back the later ones; a fresh start rolls back all of them.
func TestRecoverPrepared(t *testing.T) {
	dsn, conn := newDB(t)
	exec(t, conn, "CREATE TABLE t (k int PRIMARY KEY, v text)")
	cfg := Config{DSN: dsn, Name: "rec"}
	p := open(t, cfg, nil)
	ctx := context.Background()
	for e := 1; e <= 3; e++ {
		if err := p.Write(ctx, []Row{kv("t", Upsert, e, "x"), kv("t", Upsert, 0, fmt.Sprint(e))}); err != nil {
			t.Fatal(err)
		}
		if _, err := p.Snapshot(); err != nil {
			t.Fatal(err)
		}
	}
	p.Close() // a crash: three prepared transactions, none committed
	if g := prepared(t, conn); len(g) != 3 {
		t.Fatalf("prepared: %v", g)
	}
	two := uint64(2)
	p = open(t, cfg, &two)
	if g := prepared(t, conn); len(g) != 0 {
		t.Fatalf("prepared after recovery: %v", g)
	}
	if got := dump(t, conn, "SELECT k, v FROM t"); fmt.Sprint(got) != "[0 2 1 x 2 x]" {
		t.Fatalf("after resuming at 2: %v", got)
	}
	if p.seq != 2 {
		t.Fatalf("seq %d after resume, want 2", p.seq)
	}
	if err := p.Write(ctx, []Row{kv("t", Upsert, 9, "y")}); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Snapshot(); err != nil {
		t.Fatal(err)
	}
	p.Close()
	p = open(t, cfg, nil) // a fresh start: nothing of ours is committed
	p.Close()
	if g := prepared(t, conn); len(g) != 0 {
		t.Fatalf("prepared after a fresh start: %v", g)
	}
	if got := dump(t, conn, "SELECT k FROM t"); len(got) != 3 {
		t.Fatalf("rows %v", got)
	}
}

// A random program of operations over a few keys, written over random epochs whose commits
// lag by random amounts, with crashes that resume from the last committed snapshot, leaves
// the table equal to a model that applies the committed epochs' rows in order.
func TestSinkModelProperty(t *testing.T) {
	dsn, conn := newDB(t)
	exec(t, conn, "CREATE TABLE m (k int PRIMARY KEY, a text, b int)")
	// A failed case may leave prepared transactions holding locks on m: the next case's
	// TRUNCATE then fails within 10 s instead of hanging, and rapid reports the first failure.
	exec(t, conn, "SET lock_timeout = '10s'")
	run := 0
	rapid.Check(t, func(rt *rapid.T) {
		run++
		exec(t, conn, "TRUNCATE m")
		cfg := Config{DSN: dsn, Name: fmt.Sprintf("model%d", run)}
		type val struct {
			a *string
			b *int
		}
		var epochs [][]Row          // rows of the epochs of the current run, by seq-1
		var snapModel []map[int]val // model after each epoch, by seq
		var committed uint64
		cur := map[int]val{}
		p := open(t, cfg, nil)
		defer func() { p.Close() }()
		ctx := context.Background()
		snapModel = append(snapModel, map[int]val{})
		steps := rapid.IntRange(1, 12).Draw(rt, "epochs")
		for e := 0; e < steps; e++ {
			var rows []Row
			for range rapid.IntRange(0, 15).Draw(rt, "rows") {
				k := rapid.IntRange(1, 6).Draw(rt, "k")
				v, exists := cur[k]
				ops := []Op{Upsert, Update, Delete}
				if !exists {
					ops = append(ops, Insert)
				}
				op := rapid.SampledFrom(ops).Draw(rt, "op")
				var a *string
				if rapid.Bool().Draw(rt, "anull") {
					s := rapid.StringMatching(`[a-z'"\\{},]{0,5}`).Draw(rt, "a")
					a = &s
				}
				b := rapid.IntRange(-3, 3).Draw(rt, "b")
				switch op {
				case Insert, Upsert:
					if rapid.Bool().Draw(rt, "partial") && op == Upsert {
						rows = append(rows, Row{Table: "m", Op: op, Columns: []string{"k", "b"}, Values: []any{k, b}})
						if !exists {
							v = val{}
						}
						v.b = &b
					} else {
						rows = append(rows, Row{Table: "m", Op: op, Columns: []string{"k", "a", "b"}, Values: []any{k, a, b}})
						v = val{a: a, b: &b}
					}
					cur[k] = v
				case Update:
					rows = append(rows, Row{Table: "m", Op: Update, Columns: []string{"b", "k"}, Values: []any{b, k}})
					if exists {
						v.b = &b
						cur[k] = v
					}
				case Delete:
					rows = append(rows, Row{Table: "m", Op: Delete, Columns: []string{"k"}, Values: []any{k}})
					delete(cur, k)
				}
			}
			if err := p.Write(ctx, rows); err != nil {
				rt.Fatal(err)
			}
			seq, err := p.Snapshot()
			if err != nil {
				rt.Fatal(err)
			}
			epochs = append(epochs, rows)
			snap := map[int]val{}
			for k, v := range cur {
				snap[k] = v
			}
			snapModel = append(snapModel, snap)
			if int(seq) != len(snapModel)-1 {
				rt.Fatalf("seq %d, want %d", seq, len(snapModel)-1)
			}
			switch rapid.IntRange(0, 3).Draw(rt, "after") {
			case 1, 2: // commit some epoch up to this one
				c := uint64(rapid.IntRange(int(committed), int(seq)).Draw(rt, "commit"))
				if err := p.Commit(ctx, c); err != nil {
					rt.Fatal(err)
				}
				committed = c
			case 3: // crash and resume from the committed snapshot
				p.Close()
				resume := committed
				p = open(t, cfg, &resume)
				snapModel = snapModel[:committed+1]
				epochs = epochs[:committed]
				cur = map[int]val{}
				for k, v := range snapModel[committed] {
					cur[k] = v
				}
			}
		}
		if err := p.Commit(ctx, p.seq); err != nil {
			rt.Fatal(err)
		}
		if err := p.Close(); err != nil {
			rt.Fatal(err)
		}
		model := snapModel[len(snapModel)-1]
		var want []string
		for k, v := range model {
			a, b := "<nil>", "<nil>"
			if v.a != nil {
				a = *v.a
			}
			if v.b != nil {
				b = fmt.Sprint(*v.b)
			}
			want = append(want, fmt.Sprintf("%d %s %s", k, a, b))
		}
		sort.Strings(want)
		got := dump(t, conn, "SELECT k, a, b FROM m")
		if fmt.Sprint(got) != fmt.Sprint(want) {
			rt.Fatalf("table %q, want %q (epochs %v)", got, want, epochs)
		}
		if g := prepared(t, conn); len(g) != 0 {
			rt.Fatalf("prepared transactions left: %v", g)
		}
	})
}

type point struct {
	K    int    `db:"k"`
	Name string `db:"v"`
	Skip int    `db:"-"`
}

// FromMap and FromStruct make rows the sink writes.
func TestFromMapAndStruct(t *testing.T) {
	dsn, conn := newDB(t)
	exec(t, conn, "CREATE TABLE t (k int PRIMARY KEY, v text)")
	p := open(t, Config{DSN: dsn, Name: "ms"}, nil)
	defer p.Close()
	r, err := FromStruct("t", Insert, &point{K: 1, Name: "one", Skip: 5})
	if err != nil {
		t.Fatal(err)
	}
	commitEpoch(t, p, []Row{r, FromMap("t", Upsert, map[string]any{"k": 2, "v": "two"})})
	eventually(t, "the rows", func() bool { return fmt.Sprint(dump(t, conn, "SELECT k, v FROM t")) == "[1 one 2 two]" })
	if _, err := FromStruct("t", Insert, 3); err == nil {
		t.Error("FromStruct of an int: no error")
	}
}

// Bad input fails with an error that names the table, the column or the setting.
func TestSinkBadInput(t *testing.T) {
	dsn, conn := newDB(t)
	exec(t, conn, "CREATE TABLE t (k int PRIMARY KEY, v text, n int)")
	exec(t, conn, "CREATE TABLE nokey (k int, v text)")
	ctx := context.Background()
	cases := []struct {
		name string
		row  Row
		want string
	}{
		{"missing table", kv("nope", Insert, 1, "a"), `table "nope" does not exist`},
		{"no key", kv("nokey", Insert, 1, "a"), `table "public"."nokey" has no primary key`},
		{"missing column", Row{Table: "t", Op: Insert, Columns: []string{"k", "zz"}, Values: []any{1, 2}}, `has no column "zz"`},
		{"unconvertible", Row{Table: "t", Op: Insert, Columns: []string{"k", "n"}, Values: []any{1, struct{ X int }{1}}}, `column "n" of table "public"."t" (integer): cannot convert struct`},
		{"missing key", Row{Table: "t", Op: Upsert, Columns: []string{"v"}, Values: []any{"a"}}, `lacks key column "k"`},
		{"null key", kv("t", Delete, 0, nil), ""},
	}
	cases[5].row.Values[0] = nil
	cases[5].want = `NULL in key column "k"`
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := open(t, Config{DSN: dsn, Name: "bad"}, nil)
			defer p.Close()
			err := p.Write(ctx, []Row{c.row})
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want one containing %q", err, c.want)
			}
		})
	}
	// A row the table refuses fails Snapshot, and the epoch is not prepared.
	p := open(t, Config{DSN: dsn, Name: "bad"}, nil)
	if err := p.Write(ctx, []Row{{Table: "t", Op: Insert, Columns: []string{"k", "n"}, Values: []any{1, "not a number"}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Snapshot(); err == nil || !strings.Contains(err.Error(), "invalid input syntax for type integer") {
		t.Fatalf("Snapshot: %v", err)
	}
	p.Close()
	if g := prepared(t, conn); len(g) != 0 {
		t.Fatalf("prepared: %v", g)
	}
	for _, cfg := range []Config{{Name: "x"}, {DSN: dsn}} {
		if _, err := NewSink(cfg).Parts(ctx); err == nil {
			t.Errorf("Parts with %+v: no error", cfg)
		}
	}
}

// A server with max_prepared_transactions = 0 is refused at start, saying what to set.
func TestNoPreparedTransactions(t *testing.T) {
	c, err := pgtest.StartWith("max_prepared_transactions=0")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop()
	_, err = NewSink(Config{DSN: c.DSN("postgres"), Name: "x"}).Build(context.Background(), "p0", nil)
	if err == nil || !strings.Contains(err.Error(), "max_prepared_transactions = 0") || !strings.Contains(err.Error(), "set max_prepared_transactions") {
		t.Fatalf("error %v", err)
	}
}

// Inserts go through COPY in text format: values with tabs, newlines, carriage returns and
// backslashes, the text "\N", NULLs, and non-text types arrive exactly as written.
func TestInsertValuesSurviveCopy(t *testing.T) {
	dsn, conn := newDB(t)
	exec(t, conn, "CREATE TABLE c (k int PRIMARY KEY, v text, b bytea, a int[], j jsonb, ts timestamptz)")
	p := open(t, Config{DSN: dsn, Name: "test.copy"}, nil)
	defer p.Close()
	ctx := context.Background()
	ts := time.Date(2026, 11, 29, 12, 0, 0, 123456000, time.UTC)
	texts := []any{"tab\there", "line\nbreak\r\n", `back\slash\\`, `\N`, "", nil, "plain", "ünïcødé"}
	cols := []string{"k", "v", "b", "a", "j", "ts"}
	var rows []Row
	for i, v := range texts {
		rows = append(rows, Row{Table: "c", Op: Insert, Columns: cols,
			Values: []any{i, v, []byte{0, '\t', '\\', byte(i)}, []int32{int32(i), -1}, map[string]any{"s": "q\"\t\\"}, ts}})
	}
	commitEpoch(t, p, rows)
	eventually(t, "the commit", func() bool { return len(prepared(t, conn)) == 0 })
	for i, v := range texts {
		var got *string
		var b []byte
		var a []int32
		var j map[string]any
		var gotTS time.Time
		if err := conn.QueryRow(ctx, "SELECT v, b, a, j, ts FROM c WHERE k = $1", i).Scan(&got, &b, &a, &j, &gotTS); err != nil {
			t.Fatalf("row %d: %v", i, err)
		}
		if (v == nil) != (got == nil) || (got != nil && *got != v.(string)) {
			t.Errorf("row %d: v = %v, want %q", i, got, v)
		}
		if string(b) != string([]byte{0, '\t', '\\', byte(i)}) || len(a) != 2 || a[0] != int32(i) || a[1] != -1 ||
			j["s"] != "q\"\t\\" || !gotTS.Equal(ts) {
			t.Errorf("row %d: b=%q a=%v j=%v ts=%v", i, b, a, j, gotTS)
		}
	}
	// A failing COPY names the step's row like any other statement: a duplicate key. The
	// committer must be done with the epoch (not only Postgres): while a transaction is pending,
	// Snapshot logs its rows instead of copying them, and the duplicate shows at apply time.
	eventually(t, "the committer to finish", func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		return len(p.pending) == 0
	})
	if err := p.Write(ctx, []Row{kv2("c", 1)}); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Snapshot(); err == nil || !strings.Contains(err.Error(), "insert of 1 rows") || !strings.Contains(err.Error(), "k=1") {
		t.Fatalf("duplicate insert: %v, want an error naming the row", err)
	}
}

func kv2(table string, k int) Row {
	return Row{Table: table, Op: Insert, Columns: []string{"k"}, Values: []any{k}}
}

// An update that moves a row to a key another row holds replaces that row, as an upsert would
// (it happens when changes are applied again over newer rows: pgrepl's initial copy); a move
// whose old row is gone leaves the row at the new key alone.
func TestKeyChangeOverAnExistingRow(t *testing.T) {
	dsn, conn := newDB(t)
	exec(t, conn, "CREATE TABLE m (k int PRIMARY KEY, v text, w text)")
	exec(t, conn, "INSERT INTO m VALUES (1, 'old', 'w1'), (2, 'newer', 'w2'), (5, 'kept', 'w5')")
	p := open(t, Config{DSN: dsn, Name: "test.move"}, nil)
	defer p.Close()
	rows := []Row{
		// 1 -> 2, w unchanged (not sent): 2 is replaced by the moved row.
		{Table: "m", Op: Update, Columns: []string{"k", "v"}, Values: []any{2, "moved"}, KeyColumns: []string{"k"}, Key: []any{1}},
		// 9 -> 5: 9 does not exist, so 5 stays as it is.
		{Table: "m", Op: Update, Columns: []string{"k", "v"}, Values: []any{5, "ghost"}, KeyColumns: []string{"k"}, Key: []any{9}},
	}
	commitEpoch(t, p, rows)
	want := []string{"2 moved w1", "5 kept w5"}
	eventually(t, "the commit", func() bool { return fmt.Sprint(dump(t, conn, "SELECT k, v, w FROM m")) == fmt.Sprint(want) })
}
