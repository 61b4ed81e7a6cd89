package main

import (
	"bytes"
	"context"
	"errors"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
)

// cdcRun runs the example to its end (-idle-exit) and returns its exit code and standard
// error.
func cdcRun(t *testing.T, bin string, args ...string) (int, string) {
	t.Helper()
	var stderr bytes.Buffer
	cmd := flowCommand(bin, append(args, "-epoch-interval", "50ms", "-log-level", "warn", "-idle-exit", "1s")...)
	cmd.Stderr = &stderr
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case err == nil:
		return 0, stderr.String()
	case errors.As(err, &exit):
		return exit.ExitCode(), stderr.String()
	}
	t.Fatalf("running %s: %v", bin, err)
	return 0, ""
}

func count(t *testing.T, c *pgx.Conn, q string) int {
	t.Helper()
	var n int
	if err := c.QueryRow(context.Background(), q).Scan(&n); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	return n
}

// A run without recovery state that finds rows in the target table refuses to start, exit 1,
// with an error naming the table and the choices, and changes nothing: on a first run (no
// slot yet) before it creates the slot or the publication; with the slot of an earlier run
// but a new -recovery directory without moving the slot. The run with the directory that
// wrote the rows carries on, and -target-exists replace lets the copy replace them.
func TestFreshRunRefusesATargetWithRows(t *testing.T) {
	bin := buildBinary(t)
	ctx := context.Background()
	srcDSN, err := cluster.CreateDB(ctx, "fresh_source")
	if err != nil {
		t.Fatal(err)
	}
	tgtDSN, err := cluster.CreateDB(ctx, "fresh_target")
	if err != nil {
		t.Fatal(err)
	}
	src, tgt := connect(t, srcDSN), connect(t, tgtDSN)
	mustExec(t, src, "CREATE TABLE items (id int PRIMARY KEY, v text NOT NULL, n int, big text)")
	mustExec(t, src, "INSERT INTO items (id, v, n) SELECT g, 'source' || g, g FROM generate_series(1, 100) g")
	mustExec(t, tgt, "CREATE TABLE items (id int PRIMARY KEY, v text NOT NULL, n int, big text)")
	mustExec(t, tgt, "INSERT INTO items (id, v, n) SELECT g, 'earlier' || g, g FROM generate_series(1, 50) g")
	defer func() {
		gids, _ := tgt.Query(ctx, "SELECT gid FROM pg_prepared_xacts")
		left, _ := pgx.CollectRows(gids, pgx.RowTo[string])
		for _, g := range left {
			tgt.Exec(ctx, "ROLLBACK PREPARED '"+g+"'")
		}
		src.Exec(ctx, "SELECT pg_drop_replication_slot('fresh')")
	}()
	dir := t.TempDir()
	args := func(store string, extra ...string) []string {
		return append([]string{"-source", srcDSN, "-target", tgtDSN, "-table", "items", "-slot", "fresh", "-publication", "fresh",
			"-recovery", filepath.Join(dir, store)}, extra...)
	}
	refused := func(what string, code int, stderr string) {
		t.Helper()
		if code != 1 {
			t.Fatalf("%s: exit %d, want 1 (refused)\n%s", what, code, stderr)
		}
		for _, want := range []string{`"public"."items"`, "already holds rows", "-recovery", "-target-exists replace", "TRUNCATE"} {
			if !strings.Contains(stderr, want) {
				t.Errorf("%s: the error does not say %q:\n%s", what, want, stderr)
			}
		}
		t.Logf("%s: %s", what, strings.TrimSpace(stderr))
	}
	earlier := strings.Join(tableText(t, tgt), "\n")
	unchanged := func(what string) {
		t.Helper()
		if got := strings.Join(tableText(t, tgt), "\n"); got != earlier {
			t.Fatalf("%s: the refused run changed the target table", what)
		}
	}

	// A first run: nothing is created.
	code, stderr := cdcRun(t, bin, args("a")...)
	refused("first run", code, stderr)
	unchanged("first run")
	if n := count(t, src, "SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'fresh'"); n != 0 {
		t.Fatal("the refused first run created the slot")
	}
	if n := count(t, src, "SELECT count(*) FROM pg_publication WHERE pubname = 'fresh'"); n != 0 {
		t.Fatal("the refused first run created the publication")
	}
	if n := count(t, tgt, "SELECT count(*) FROM pg_prepared_xacts"); n != 0 {
		t.Fatalf("the refused first run left %d prepared transactions", n)
	}

	// Emptied, the table takes the copy; a later run with a new directory is refused (the slot
	// exists now) without moving the slot; the directory that wrote the rows carries on.
	mustExec(t, tgt, "TRUNCATE items")
	if code, stderr := cdcRun(t, bin, args("a")...); code != 0 {
		t.Fatalf("run on an empty target: exit %d\n%s", code, stderr)
	}
	mustExec(t, src, "UPDATE items SET n = n + 1000 WHERE id <= 10")
	var lsn string
	src.QueryRow(ctx, "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = 'fresh'").Scan(&lsn)
	earlier = strings.Join(tableText(t, tgt), "\n")
	code, stderr = cdcRun(t, bin, args("b")...)
	refused("new recovery directory", code, stderr)
	unchanged("new recovery directory")
	var lsnAfter string
	src.QueryRow(ctx, "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = 'fresh'").Scan(&lsnAfter)
	if lsnAfter != lsn {
		t.Fatalf("the refused run moved the slot from %s to %s", lsn, lsnAfter)
	}
	if code, stderr := cdcRun(t, bin, args("a")...); code != 0 {
		t.Fatalf("run with the directory that wrote the rows: exit %d\n%s", code, stderr)
	}
	if want, got := strings.Join(tableText(t, src), "\n"), strings.Join(tableText(t, tgt), "\n"); got != want {
		t.Fatal("after the resumed run, the target differs from the source")
	}

	// -target-exists replace: the copy replaces the rows.
	mustExec(t, tgt, "UPDATE items SET v = 'stale'")
	mustExec(t, tgt, "INSERT INTO items (id, v) VALUES (1000000, 'extra')")
	if code, stderr := cdcRun(t, bin, args("c", "-target-exists", "replace")...); code != 0 {
		t.Fatalf("run with -target-exists replace: exit %d\n%s", code, stderr)
	}
	if want, got := strings.Join(tableText(t, src), "\n"), strings.Join(tableText(t, tgt), "\n"); got != want {
		t.Fatal("after the run with -target-exists replace, the target differs from the source")
	}
	if code, stderr := cdcRun(t, bin, args("d", "-target-exists", "nope")...); code == 0 || !strings.Contains(stderr, "-target-exists") {
		t.Fatalf("-target-exists nope: exit %d\n%s", code, stderr)
	}
}

// A target column narrower than the source's (varchar(5) for text) fails the run, exit 1,
// with an error naming the table, the column and the row, whether the value comes with the
// initial copy, a streamed insert or a streamed update of a copied row (one whose TOASTed
// value is unchanged, so that the sink runs an UPDATE of the columns that came, not an
// upsert); no value is cut to fit. A wider column then lets the run carry on.
func TestNarrowTargetColumnFails(t *testing.T) {
	bin := buildBinary(t)
	ctx := context.Background()
	srcDSN, err := cluster.CreateDB(ctx, "narrow_source")
	if err != nil {
		t.Fatal(err)
	}
	tgtDSN, err := cluster.CreateDB(ctx, "narrow_target")
	if err != nil {
		t.Fatal(err)
	}
	src, tgt := connect(t, srcDSN), connect(t, tgtDSN)
	mustExec(t, src, "CREATE TABLE items (id int PRIMARY KEY, v text NOT NULL, n int, big text)")
	mustExec(t, src, "INSERT INTO items (id, v, n) SELECT g, CASE WHEN g = 377 THEN 'copied-long-name' ELSE 'ok' END, g FROM generate_series(1, 500) g")
	mustExec(t, src, "UPDATE items SET big = (SELECT string_agg(md5(g::text), '') FROM generate_series(1, 200) g) WHERE id = 250") // TOASTed
	mustExec(t, tgt, "CREATE TABLE items (id int PRIMARY KEY, v varchar(5) NOT NULL, n int, big text)")
	defer func() {
		gids, _ := tgt.Query(ctx, "SELECT gid FROM pg_prepared_xacts")
		left, _ := pgx.CollectRows(gids, pgx.RowTo[string])
		for _, g := range left {
			tgt.Exec(ctx, "ROLLBACK PREPARED '"+g+"'")
		}
		src.Exec(ctx, "SELECT pg_drop_replication_slot('narrow')")
	}()
	args := []string{"-source", srcDSN, "-target", tgtDSN, "-table", "items", "-slot", "narrow", "-publication", "narrow",
		"-recovery", filepath.Join(t.TempDir(), "store")}
	failed := func(what, id string) string {
		t.Helper()
		code, stderr := cdcRun(t, bin, args...)
		if code != 1 {
			t.Fatalf("%s: exit %d, want 1\n%s", what, code, stderr)
		}
		for _, want := range []string{`"public"."items"`, `column "v" (character varying(5))`, " id=" + id + ":", `"copied-long-name"`} {
			if !strings.Contains(stderr, want) {
				t.Errorf("%s: the error does not name %s:\n%s", what, want, stderr)
			}
		}
		if n := count(t, tgt, "SELECT count(*) FROM items WHERE v = 'copie'"); n != 0 {
			t.Fatalf("%s: %d values cut to fit", what, n)
		}
		t.Logf("%s: %s", what, strings.TrimSpace(stderr))
		return stderr
	}
	failed("initial copy", "377")
	mustExec(t, src, "UPDATE items SET v = 'ok' WHERE id = 377")
	if code, stderr := cdcRun(t, bin, args...); code != 0 {
		t.Fatalf("the copy of values that fit: exit %d\n%s", code, stderr)
	}
	mustExec(t, src, "INSERT INTO items (id, v) VALUES (501, 'copied-long-name')")
	failed("streamed insert", "501")

	// A column wide enough lets the failed epoch through; narrowed again, it refuses an update.
	mustExec(t, src, "DELETE FROM items WHERE id = 501")
	mustExec(t, tgt, "ALTER TABLE items ALTER v TYPE varchar(20)")
	if code, stderr := cdcRun(t, bin, args...); code != 0 {
		t.Fatalf("the run with a column wide enough: exit %d\n%s", code, stderr)
	}
	if want, got := strings.Join(tableText(t, src), "\n"), strings.Join(tableText(t, tgt), "\n"); got != want {
		t.Fatal("after the run with a column wide enough, the target differs from the source")
	}
	mustExec(t, tgt, "ALTER TABLE items ALTER v TYPE varchar(5)")
	mustExec(t, src, "UPDATE items SET v = 'copied-long-name' WHERE id = 250")
	if stderr := failed("streamed update", "250"); !strings.Contains(stderr, `row update "public"."items" id=250:`) {
		t.Errorf("the refused update was not an UPDATE of the columns that came:\n%s", stderr)
	}
	if v := tableText(t, tgt)[249]; !strings.HasPrefix(v, "(250,ok,") {
		t.Fatalf("row 250 of the target after the refused update: %.40s", v)
	}
}
