package postgres

import (
	"context"
	"errors"
	"strings"
	"testing"
)

// A partition opened without resume state refuses a table of Config.RequireEmpty that holds
// rows, with a *NotEmptyError naming it, and writes nothing (not even its log table); an
// empty or missing table, or a resumed partition, passes; so does a table whose only rows are
// in a prepared transaction of an earlier run that committed no epoch (rolled back first).
func TestRequireEmpty(t *testing.T) {
	dsn, conn := newDB(t)
	ctx := context.Background()
	exec(t, conn, "CREATE TABLE full_t (k int PRIMARY KEY, v text)")
	exec(t, conn, "INSERT INTO full_t VALUES (1, 'earlier')")
	exec(t, conn, "CREATE TABLE empty_t (k int PRIMARY KEY, v text)")
	cfg := Config{DSN: dsn, Name: "fresh", RequireEmpty: []string{"empty_t", "missing_t", "full_t"}}
	_, err := NewSink(cfg).Build(ctx, "p0", nil)
	var ne *NotEmptyError
	if !errors.As(err, &ne) || ne.Table != `"public"."full_t"` || !strings.Contains(err.Error(), `postgres sink "fresh"`) {
		t.Fatalf("Build of a fresh partition over a table with rows: %v, want a NotEmptyError naming full_t", err)
	}
	t.Log(err)
	if got := dump(t, conn, "SELECT to_regclass('epochflow_sink_log') IS NULL, (SELECT count(*) FROM full_t)"); got[0] != "true 1" {
		t.Fatalf("the refused Build changed the database: log table missing, rows: %v", got)
	}
	// Resumed: no check.
	zero := uint64(0)
	open(t, cfg, &zero).Close()
	// Several partitions: each checks the tables it writes, and one of them refuses.
	cfg.Partitions = 3
	refused := 0
	for _, part := range []string{"p0", "p1", "p2"} {
		p, err := NewSink(cfg).Build(ctx, part, nil)
		if errors.As(err, &ne) {
			refused++
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		p.Close()
	}
	if refused != 1 {
		t.Fatalf("%d partitions of 3 refused the table with rows, want 1", refused)
	}
	// Rows only in a prepared transaction of a run that committed nothing: rolled back, then
	// the table is empty.
	cfg = Config{DSN: dsn, Name: "fresh2", RequireEmpty: []string{"empty_t"}}
	p := open(t, cfg, nil)
	if err := p.Write(ctx, []Row{kv("empty_t", Insert, 1, "uncommitted")}); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Snapshot(); err != nil {
		t.Fatal(err)
	}
	p.Close()
	open(t, cfg, nil).Close()
	if g := prepared(t, conn); len(g) != 0 {
		t.Fatalf("prepared transactions left: %v", g)
	}
}

// A fresh start that refuses a table with rows leaves the prepared transactions of an earlier
// run as they are: a run with a new or wrong recovery store must not roll back the prepared
// transaction of an epoch that the earlier run's store committed (the run was killed before
// its COMMIT PREPARED), or the resume with the right store finds it gone and loses its rows.
// A prepared TRUNCATE of a run that committed nothing does not hold the check up.
func TestRefusedFreshStartKeepsPrepared(t *testing.T) {
	dsn, conn := newDB(t)
	ctx := context.Background()
	exec(t, conn, "CREATE TABLE t (k int PRIMARY KEY, v text)")
	cfg := Config{DSN: dsn, Name: "keep", RequireEmpty: []string{"t"}}
	p := open(t, cfg, nil)
	commitEpoch(t, p, []Row{kv("t", Insert, 1, "one")})
	eventually(t, "the first epoch's commit", func() bool { return dump(t, conn, "SELECT count(*) FROM t")[0] == "1" })
	if err := p.Write(ctx, []Row{kv("t", Insert, 2, "two")}); err != nil {
		t.Fatal(err)
	}
	seq, err := p.Snapshot() // prepared; its epoch is committed in the store, and the run dies
	if err != nil {
		t.Fatal(err)
	}
	p.Close()
	defer rollbackPrepared(t, conn)
	_, err = NewSink(cfg).Build(ctx, "p0", nil)
	var ne *NotEmptyError
	if !errors.As(err, &ne) {
		t.Fatalf("fresh Build over a table with rows: %v, want a NotEmptyError", err)
	}
	if g := prepared(t, conn); len(g) != 1 {
		t.Fatalf("the refused fresh start left prepared transactions %v, want the earlier run's one", g)
	}
	open(t, cfg, &seq).Close() // the resume with the earlier run's store
	if got := dump(t, conn, "SELECT k, v FROM t"); strings.Join(got, ",") != "1 one,2 two" {
		t.Fatalf("after the resume the table holds %v, want both epochs' rows", got)
	}

	// A run that committed nothing, its first epoch (a copy: TRUNCATE and rows) prepared.
	exec(t, conn, "CREATE TABLE u (k int PRIMARY KEY, v text)")
	cfg = Config{DSN: dsn, Name: "keep2", RequireEmpty: []string{"u"}}
	p = open(t, cfg, nil)
	if err := p.Write(ctx, []Row{{Table: "u", Op: Truncate}, kv("u", Insert, 1, "copied")}); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Snapshot(); err != nil {
		t.Fatal(err)
	}
	p.Close()
	open(t, cfg, nil).Close()
	if g := prepared(t, conn); len(g) != 0 {
		t.Fatalf("prepared transactions left: %v", g)
	}
}
