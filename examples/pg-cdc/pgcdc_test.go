package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/epochflow/epochflow/internal/pgtest"
	"github.com/jackc/pgx/v5"
)

var cluster *pgtest.Cluster

func TestMain(m *testing.M) { pgtest.Main(m, &cluster, removeBinary) }

func connect(t *testing.T, dsn string) *pgx.Conn {
	t.Helper()
	c, err := pgx.Connect(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	return c
}

func mustExec(t *testing.T, c *pgx.Conn, sql string, args ...any) {
	t.Helper()
	if _, err := c.Exec(context.Background(), sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// tableText returns the table's rows, ordered by key, as text.
func tableText(t *testing.T, c *pgx.Conn) []string {
	t.Helper()
	rows, err := c.Query(context.Background(), "SELECT t::text FROM items t ORDER BY id")
	if err != nil {
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// writer runs n transactions of inserts, updates (some leaving a TOASTed value unchanged, some
// changing the key), deletes and 1,000-row inserts on the source table.
func writer(ctx context.Context, dsn string, n, next int, seed uint64, done *atomic.Int64) error {
	c, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer c.Close(ctx)
	r := rand.New(rand.NewPCG(seed, 1))
	big := "SELECT string_agg(md5(g::text || random()::text), '') FROM generate_series(1, 200) g" // 6.4 KB: TOASTed
	for i := 0; i < n; i++ {
		b := &pgx.Batch{}
		switch k := r.IntN(100); {
		case k < 2: // a large insert
			b.Queue("INSERT INTO items (id, v, n) SELECT g, 'bulk' || g, g % 7 FROM generate_series($1::int, $1::int + 999) g", next)
			next += 1000
		case k < 40:
			for j := range 1 + r.IntN(5) {
				if r.IntN(10) == 0 {
					b.Queue("INSERT INTO items (id, v, n, big) VALUES ($1, $2, $3, ("+big+"))", next, fmt.Sprint("v", i, j), j)
				} else {
					b.Queue("INSERT INTO items (id, v, n) VALUES ($1, $2, $3)", next, fmt.Sprint("v", i, j), j)
				}
				next++
			}
		case k < 75: // updates; big stays as it is
			for range 1 + r.IntN(3) {
				b.Queue("UPDATE items SET n = n + 1, v = v || '+' WHERE id = $1", 1+r.IntN(next))
			}
		case k < 80:
			b.Queue("UPDATE items SET n = (n % 1000) * 2 WHERE id BETWEEN $1 AND $1 + 50", 1+r.IntN(next))
		case k < 83: // a key change
			b.Queue("UPDATE items SET id = $2 WHERE id = $1", 1+r.IntN(next), next)
			next++
		case k < 85:
			b.Queue("UPDATE items SET big = ("+big+") WHERE id = $1", 1+r.IntN(next))
		default:
			for range 1 + r.IntN(3) {
				b.Queue("DELETE FROM items WHERE id = $1", 1+r.IntN(next))
			}
		}
		if err := c.SendBatch(ctx, b).Close(); err != nil {
			return fmt.Errorf("transaction %d: %w", i, err)
		}
		done.Add(1)
	}
	return nil
}

// The example, started on a table that already holds 50,000 rows, killed with SIGKILL during
// its initial copy and then at 20 random moments and restarted while a writer runs 10,000
// transactions on the source table (updating and deleting copied rows too), leaves the target
// table equal to the source table, with no prepared transaction and no logged row behind.
func TestPgCdcSurvivesKill9(t *testing.T) {
	bin := buildBinary(t)
	ctx := context.Background()
	srcDSN, err := cluster.CreateDB(ctx, "source")
	if err != nil {
		t.Fatal(err)
	}
	tgtDSN, err := cluster.CreateDB(ctx, "target")
	if err != nil {
		t.Fatal(err)
	}
	src, tgt := connect(t, srcDSN), connect(t, tgtDSN)
	mustExec(t, src, "CREATE TABLE items (id int PRIMARY KEY, v text NOT NULL, n int, big text)")
	const existing = 50_000
	mustExec(t, src, `INSERT INTO items (id, v, n, big) SELECT g, 'existing' || g, g % 13,
		CASE WHEN g % 500 = 0 THEN (SELECT string_agg(md5(h::text || g::text), '') FROM generate_series(1, 200) h) END
		FROM generate_series(1, $1::int) g`, existing)
	defer func() {
		// After a failure, prepared transactions would keep the next slot from being created.
		gids, _ := tgt.Query(ctx, "SELECT gid FROM pg_prepared_xacts")
		left, _ := pgx.CollectRows(gids, pgx.RowTo[string])
		for _, g := range left {
			tgt.Exec(ctx, "ROLLBACK PREPARED '"+g+"'")
		}
		eventually(t, "dropping the slot", func() bool {
			_, err := src.Exec(ctx, "SELECT pg_drop_replication_slot('cdc')")
			return err == nil
		})
	}()
	dir := t.TempDir()
	run := func(idle string) *exec.Cmd {
		args := []string{"-source", srcDSN, "-target", tgtDSN, "-table", "items", "-slot", "cdc", "-publication", "cdc",
			"-recovery", filepath.Join(dir, "store"), "-epoch-interval", "50ms", "-log-level", "warn"}
		if idle != "" {
			args = append(args, "-idle-exit", idle)
		}
		cmd := flowCommand(bin, args...)
		cmd.Stderr = os.Stderr
		return cmd
	}
	// The first run creates the slot, the publication and the target table and starts copying
	// the existing rows (replication starts after the copy, so the slot is not active yet): it
	// is killed during the copy.
	first := run("")
	if err := first.Start(); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the slot", func() bool {
		var n int
		src.QueryRow(ctx, "SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'cdc' AND confirmed_flush_lsn IS NOT NULL").Scan(&n)
		return n == 1
	})
	time.Sleep(200 * time.Millisecond)
	var active bool
	src.QueryRow(ctx, "SELECT active FROM pg_replication_slots WHERE slot_name = 'cdc'").Scan(&active)
	first.Process.Signal(syscall.SIGKILL)
	first.Wait()
	// The kill may land between an epoch's PREPARE TRANSACTION and its COMMIT PREPARED: that
	// prepared transaction holds the copy's TRUNCATE lock on the target table until the next run
	// settles it, so the count gives up after a second instead of waiting for a run that has
	// not started.
	copiedBeforeKill := -1
	mustExec(t, tgt, "SET lock_timeout = '1s'")
	tgt.QueryRow(ctx, "SELECT count(*) FROM items").Scan(&copiedBeforeKill)
	// From here on a wait for a lock fails within 10 s: a prepared transaction the runs did not
	// settle would otherwise hang the final comparison.
	mustExec(t, tgt, "SET lock_timeout = '10s'")

	const txs = 10_000
	var written atomic.Int64
	werr := make(chan error, 1)
	go func() { werr <- writer(ctx, srcDSN, txs, existing+1, uint64(time.Now().UnixNano()), &written) }()
	r := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 2))
	kills, killsWriting := 0, 0
	writing := true
	for kills < 20 {
		cmd := run("")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		wait := make(chan error, 1)
		go func() { wait <- cmd.Wait() }()
		select {
		case err := <-wait:
			t.Fatalf("run %d ended by itself: %v", kills, err)
		case <-time.After(time.Duration(100+r.IntN(1400)) * time.Millisecond):
		}
		cmd.Process.Signal(syscall.SIGKILL)
		<-wait
		kills++
		if writing {
			killsWriting++
			select {
			case err := <-werr:
				if err != nil {
					t.Fatal(err)
				}
				writing = false
			default:
			}
		}
	}
	if writing {
		if err := <-werr; err != nil {
			t.Fatal(err)
		}
	}
	// The last run catches up and exits once the slot is idle.
	start := time.Now()
	if err := run("2s").Run(); err != nil {
		t.Fatalf("last run: %v", err)
	}
	want, got := tableText(t, src), tableText(t, tgt)
	if len(want) < 1000 {
		t.Fatalf("the source table has only %d rows", len(want))
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		missing, extra := diff(want, got)
		t.Fatalf("target differs from source (%d rows vs %d): %d rows of the source missing or different, %d extra or different; first missing %v, first extra %v",
			len(got), len(want), len(missing), len(extra), head(missing), head(extra))
	}
	var prepared, logged int
	tgt.QueryRow(ctx, "SELECT count(*) FROM pg_prepared_xacts").Scan(&prepared)
	tgt.QueryRow(ctx, "SELECT count(*) FROM epochflow_sink_log").Scan(&logged)
	if prepared != 0 || logged != 0 {
		t.Fatalf("%d prepared transactions and %d logged rows left behind", prepared, logged)
	}
	t.Logf("%d transactions, %d kills (%d while the writer ran), %d rows; the first run, killed while copying (slot active: %v), had committed %d copied rows (-1: its prepared epoch held the table); the last run took %v",
		written.Load(), kills, killsWriting, len(want), active, copiedBeforeKill, time.Since(start))
}

func diff(want, got []string) (missing, extra []string) {
	w := map[string]bool{}
	for _, s := range want {
		w[s] = true
	}
	g := map[string]bool{}
	for _, s := range got {
		g[s] = true
		if !w[s] {
			extra = append(extra, s)
		}
	}
	for _, s := range want {
		if !g[s] {
			missing = append(missing, s)
		}
	}
	return missing, extra
}

func head(s []string) string {
	if len(s) == 0 {
		return "none"
	}
	if len(s[0]) > 200 {
		return s[0][:200] + "..."
	}
	return s[0]
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Missing flags and a missing table fail at start with an error naming them.
func TestBadFlags(t *testing.T) {
	ctx := context.Background()
	srcDSN, err := cluster.CreateDB(ctx, "badsrc")
	if err != nil {
		t.Fatal(err)
	}
	o := options{source: srcDSN, target: srcDSN, table: "nope", slot: "s", publication: "p"}
	if _, err := build(ctx, o); err == nil || !strings.Contains(err.Error(), `table "nope" does not exist`) {
		t.Errorf("missing table: %v", err)
	}
	o.slot = ""
	if _, err := build(ctx, o); err == nil || !strings.Contains(err.Error(), "-slot") {
		t.Errorf("missing -slot: %v", err)
	}
}

// flowCommand is exec.Command for a run of the example that is killed if it has not ended
// after 3 minutes: a run that hangs fails its test, with the error of the killed run, instead
// of stalling the package until the test binary's own timeout.
func flowCommand(bin string, args ...string) *exec.Cmd {
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(3*time.Minute, cancel)
	return exec.CommandContext(ctx, bin, args...)
}

// A first run that fails on something that can be checked before the replication slot is
// created fails before it creates the slot (and the publication and the target table), with an
// error naming the flag and what to do: the target's max_prepared_transactions, a column the
// target table lacks, the target's privileges, a publication that does not cover the table,
// the source's wal_level. The source has no free replication slot, so that a run that got as
// far as creating one fails with "all replication slots are in use" instead (the control case
// shows that it does). (The run created the slot first, and dropped it after the failure: a
// kill -9 in between left it holding the source's WAL.)
func TestFirstRunValidatesBeforeTheSlot(t *testing.T) {
	bin := buildBinary(t)
	ctx := context.Background()
	full, err := pgtest.StartWith("max_replication_slots=1")
	if err != nil {
		t.Fatal(err)
	}
	defer full.Stop()
	// A source server with wal_level = replica, which is also a target without
	// max_prepared_transactions.
	plain, err := pgtest.StartWith("wal_level=replica\nmax_prepared_transactions=0")
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Stop()
	srcDSN, err := full.CreateDB(ctx, "checksrc")
	if err != nil {
		t.Fatal(err)
	}
	src := connect(t, srcDSN)
	mustExec(t, src, "SELECT pg_create_physical_replication_slot('occupied')")
	const schema = "CREATE TABLE items (id int PRIMARY KEY, v text NOT NULL, n int)"
	for _, q := range []string{schema, "INSERT INTO items SELECT g, 'x', g FROM generate_series(1, 100) g",
		"CREATE TABLE other (id int PRIMARY KEY)", "CREATE PUBLICATION otherpub FOR TABLE other"} {
		mustExec(t, src, q)
	}
	replicaDSN, err := plain.CreateDB(ctx, "replicasrc")
	if err != nil {
		t.Fatal(err)
	}
	mustExec(t, connect(t, replicaDSN), schema)

	// target returns a new target database on the test cluster, after running setup in it.
	target := func(name string, setup ...string) string {
		t.Helper()
		dsn, err := cluster.CreateDB(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		c := connect(t, dsn)
		for _, q := range setup {
			mustExec(t, c, q)
		}
		return dsn
	}
	// A user of the target that may read the table but not write it.
	readerDSN := target("checkreader", schema,
		"DO $$ BEGIN CREATE ROLE pgcdc_reader LOGIN; EXCEPTION WHEN duplicate_object THEN NULL; END $$",
		"GRANT SELECT ON items TO pgcdc_reader", "GRANT CREATE ON SCHEMA public TO pgcdc_reader")
	readerDSN = strings.Replace(readerDSN, "postgres://postgres@", "postgres://pgcdc_reader@", 1)

	run := func(source, target, publication string) string {
		t.Helper()
		var out strings.Builder
		cmd := flowCommand(bin, "-source", source, "-target", target, "-table", "items", "-slot", "checkslot",
			"-publication", publication, "-recovery", filepath.Join(t.TempDir(), "store"), "-epoch-interval", "5s")
		cmd.Stderr = &out
		if err := cmd.Run(); err == nil {
			t.Fatalf("the run succeeded against a source without a free replication slot:\n%s", out.String())
		}
		return out.String()
	}
	const slotError = "all replication slots are in use"
	if out := run(srcDSN, target("checkgood"), "checkpub"); !strings.Contains(out, slotError) {
		t.Fatalf("the control run, against a good target, did not fail on the slot:\n%s", out)
	}
	for _, c := range []struct {
		name, source, target, publication string
		want                              []string
	}{
		{"no max_prepared_transactions", srcDSN, plain.DSN("postgres"), "checkpub", []string{"-target", "max_prepared_transactions = 0", "postgresql.conf"}},
		{"a missing column", srcDSN, target("checkcols", "CREATE TABLE items (id int PRIMARY KEY, v text NOT NULL)"), "checkpub",
			[]string{"-target", `"public"."items"`, `lacks column "n" (integer)`, `ALTER TABLE "public"."items" ADD COLUMN "n" integer`}},
		{"a NOT NULL column the source lacks", srcDSN, target("checkextra", schema, "ALTER TABLE items ADD extra int NOT NULL"), "checkpub",
			[]string{"-target", `"public"."items"`, `column "extra"`, "NOT NULL"}},
		{"no primary key", srcDSN, target("checkkey", "CREATE TABLE items (id int, v text NOT NULL, n int)"), "checkpub",
			[]string{"-target", `"public"."items"`, "no primary key"}},
		{"a user that may not write", srcDSN, readerDSN, "checkpub",
			[]string{"-target", `user "pgcdc_reader" may not INSERT table "public"."items"`, "GRANT"}},
		{"a publication without the table", srcDSN, target("checkpub"), "otherpub",
			[]string{"-publication", `publication "otherpub" does not cover table "public"."items"`, "ALTER PUBLICATION"}},
		{"wal_level replica", replicaDSN, target("checkwal"), "checkpub", []string{"-source", "wal_level = replica", "wal_level = logical"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			tables := func() int {
				tgt, err := pgx.Connect(ctx, strings.Replace(c.target, "pgcdc_reader@", "postgres@", 1))
				if err != nil {
					t.Fatal(err)
				}
				defer tgt.Close(ctx)
				return count(t, tgt, "SELECT count(*) FROM pg_tables WHERE tablename IN ('items', 'epochflow_sink_log')")
			}
			before := tables()
			out := run(c.source, c.target, c.publication)
			if strings.Contains(out, slotError) {
				t.Fatalf("the run tried to create its replication slot:\n%s", out)
			}
			for _, w := range c.want {
				if !strings.Contains(out, w) {
					t.Errorf("the error does not say %s:\n%s", w, out)
				}
			}
			if after := tables(); after != before {
				t.Errorf("the run created tables in the target (%d of items and the log table before, %d after)", before, after)
			}
			if n := count(t, src, "SELECT count(*) FROM pg_publication WHERE pubname = 'checkpub'"); n != 0 {
				t.Errorf("the run left publication checkpub behind")
			}
			t.Logf("%s", strings.TrimSpace(out))
		})
	}
}

// A first run that fails after the source created its slot and publication (a copied value
// that the target column cannot hold) drops them again: nothing is left to hold the source
// server's WAL. A bad -slot names the flag.
func TestFailedFirstRunDropsItsSlot(t *testing.T) {
	bin := buildBinary(t)
	ctx := context.Background()
	srcDSN, err := cluster.CreateDB(ctx, "failsrc")
	if err != nil {
		t.Fatal(err)
	}
	src := connect(t, srcDSN)
	mustExec(t, src, "CREATE TABLE items (id int PRIMARY KEY, v text NOT NULL, n int)")
	mustExec(t, src, "INSERT INTO items SELECT g, CASE WHEN g = 50 THEN 'too-long' ELSE 'x' END, g FROM generate_series(1, 100) g")
	tgtDSN, err := cluster.CreateDB(ctx, "failtgt")
	if err != nil {
		t.Fatal(err)
	}
	tgt := connect(t, tgtDSN)
	mustExec(t, tgt, "CREATE TABLE items (id int PRIMARY KEY, v varchar(5) NOT NULL, n int)")
	var out strings.Builder
	cmd := flowCommand(bin, "-source", srcDSN, "-target", tgtDSN, "-table", "items", "-slot", "failslot",
		"-publication", "failpub", "-recovery", filepath.Join(t.TempDir(), "store"), "-epoch-interval", "100ms", "-restart-attempts", "0")
	cmd.Stderr = &out
	if err := cmd.Run(); err == nil {
		t.Fatalf("the run succeeded with a value the target cannot hold:\n%s", out.String())
	}
	for _, want := range []string{`column "v"`, " id=50:", "dropped the replication slot"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the output does not say %s:\n%s", want, out.String())
		}
	}
	slots := count(t, src, "SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'failslot'")
	pubs := count(t, src, "SELECT count(*) FROM pg_publication WHERE pubname = 'failpub'")
	if slots != 0 || pubs != 0 {
		src.Exec(ctx, "SELECT pg_drop_replication_slot('failslot')")
		t.Fatalf("the failed first run left %d slots and %d publications behind:\n%s", slots, pubs, out.String())
	}

	out.Reset()
	cmd = flowCommand(bin, "-source", srcDSN, "-target", tgtDSN, "-table", "items", "-slot", "Bad-Slot", "-publication", "failpub")
	cmd.Stderr = &out
	if err := cmd.Run(); err == nil || !strings.Contains(out.String(), `-slot "Bad-Slot"`) || strings.Contains(out.String(), "Config.") {
		t.Errorf("a bad -slot: %v\n%s", err, out.String())
	}
}

// The source server is restarted (fast, immediate, fast) while pg-cdc runs and a writer runs
// 5,000 transactions on the source table: pg-cdc keeps running (it reconnects), the target
// table ends equal to the source table, and no row version was written twice
// (checkWrittenOnce): what the server sends again after a reconnect is not applied again.
// (It exited 1: "receive message failed: unexpected EOF".)
func TestPgCdcSurvivesSourceRestarts(t *testing.T) {
	bin := buildBinary(t)
	ctx := context.Background()
	source, err := pgtest.Start()
	if err != nil {
		t.Fatal(err)
	}
	defer source.Stop()
	srcDSN, err := source.CreateDB(ctx, "restartsrc")
	if err != nil {
		t.Fatal(err)
	}
	tgtDSN, err := cluster.CreateDB(ctx, "restarttgt")
	if err != nil {
		t.Fatal(err)
	}
	src := connect(t, srcDSN)
	const columns = "id int PRIMARY KEY, v text NOT NULL, n int"
	mustExec(t, src, "CREATE TABLE items ("+columns+")")
	stampVersions(t, src)
	mustExec(t, src, "INSERT INTO items SELECT g, 'existing', g FROM generate_series(1, 1000) g")
	recordVersions(t, connect(t, tgtDSN), columns)
	var out strings.Builder
	cmd := flowCommand(bin, "-source", srcDSN, "-target", tgtDSN, "-table", "items", "-slot", "cdc", "-publication", "cdc",
		"-recovery", filepath.Join(t.TempDir(), "store"), "-epoch-interval", "100ms", "-source-reconnect", "2m")
	cmd.Stderr = &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var waitErr error
	exited := make(chan struct{})
	go func() { waitErr = cmd.Wait(); close(exited) }()
	defer func() {
		cmd.Process.Signal(syscall.SIGKILL)
		<-exited
	}()
	eventually(t, "replication to start", func() bool {
		var n int
		src.QueryRow(ctx, "SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'cdc' AND active AND confirmed_flush_lsn IS NOT NULL").Scan(&n)
		return n == 1
	})
	src.Close(ctx)

	const txs = 5000
	var written atomic.Int64
	werr := make(chan error, 1)
	go func() { werr <- upsertWriter(srcDSN, txs, &written) }()
	for i, mode := range []string{"fast", "immediate", "fast"} {
		for written.Load() < int64((i+1)*txs/4) {
			select {
			case <-exited:
				t.Fatalf("pg-cdc exited during the run: %v\n%s", waitErr, out.String())
			case err := <-werr:
				t.Fatalf("the writer ended after %d transactions: %v", written.Load(), err)
			case <-time.After(20 * time.Millisecond):
			}
		}
		if _, err := source.Halt(mode, 30*time.Second); err != nil {
			t.Fatalf("source shutdown %d (%s): %v", i+1, mode, err)
		}
		if err := source.Boot(); err != nil {
			t.Fatal(err)
		}
	}
	if err := <-werr; err != nil {
		t.Fatal(err)
	}
	src = connect(t, srcDSN)
	tgt := connect(t, tgtDSN)
	want := tableText(t, src)
	deadline := time.Now().Add(time.Minute)
	for {
		got := tableText(t, tgt)
		if strings.Join(got, "\n") == strings.Join(want, "\n") {
			break
		}
		select {
		case <-exited:
			t.Fatalf("pg-cdc exited: %v\n%s", waitErr, out.String())
		case <-time.After(200 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			missing, extra := diff(want, got)
			t.Fatalf("a minute after the last write the target differs (%d rows vs %d): %d missing or different, %d extra; first missing %v, first extra %v",
				len(got), len(want), len(missing), len(extra), head(missing), head(extra))
		}
	}
	cmd.Process.Signal(syscall.SIGTERM)
	<-exited
	if waitErr != nil {
		t.Fatalf("pg-cdc after SIGTERM: %v\n%s", waitErr, out.String())
	}
	if n := strings.Count(out.String(), "reconnecting"); n < 3 {
		t.Errorf("%d reconnection attempts logged for 3 restarts:\n%s", n, out.String())
	}
	t.Logf("%d row versions written once each", checkWrittenOnce(t, tgt))
}

// upsertWriter runs n transactions of upserts and deletes on items, retrying on a new
// connection while the server restarts; the statements give the same rows when a transaction
// whose commit was not acknowledged is run again.
func upsertWriter(dsn string, n int, done *atomic.Int64) error {
	ctx := context.Background()
	var c *pgx.Conn
	defer func() {
		if c != nil {
			c.Close(ctx)
		}
	}()
	var failingSince time.Time
	retry := func(err error) error {
		if failingSince.IsZero() {
			failingSince = time.Now()
		} else if time.Since(failingSince) > 2*time.Minute {
			return fmt.Errorf("failing for 2 minutes: %w", err)
		}
		time.Sleep(50 * time.Millisecond)
		return nil
	}
	for i := 0; i < n; {
		if c == nil {
			var err error
			if c, err = pgx.Connect(ctx, dsn); err != nil {
				if err := retry(err); err != nil {
					return err
				}
				continue
			}
		}
		b := &pgx.Batch{}
		b.Queue("INSERT INTO items (id, v, n) VALUES ($1, $2, $3) ON CONFLICT (id) DO UPDATE SET v = EXCLUDED.v, n = EXCLUDED.n",
			1000+i, fmt.Sprint("w", i), i)
		b.Queue("UPDATE items SET n = $2 WHERE id = $1", 1+i%1000, i)
		if i%7 == 0 {
			b.Queue("DELETE FROM items WHERE id = $1", 1000+i/2)
		}
		if err := c.SendBatch(ctx, b).Close(); err != nil {
			c.Close(ctx)
			c = nil
			if err := retry(err); err != nil {
				return fmt.Errorf("transaction %d: %w", i, err)
			}
			continue
		}
		failingSince = time.Time{}
		i++
		done.Add(1)
	}
	return nil
}

// With pg-cdc connected and its table idle while another table of the source database is
// busy, the slot follows the WAL (its confirmed_flush_lsn stayed put and the retained WAL grew
// from 60 to 295 MB in 12 s), and a fast shutdown of the source server completes promptly (it
// hung until pg-cdc was stopped: 22 s and 68 s); pg-cdc carries on after the restart.
func TestPgCdcLetsItsSourceGo(t *testing.T) {
	bin := buildBinary(t)
	ctx := context.Background()
	source, err := pgtest.Start()
	if err != nil {
		t.Fatal(err)
	}
	defer source.Stop()
	srcDSN, err := source.CreateDB(ctx, "idlesrc")
	if err != nil {
		t.Fatal(err)
	}
	tgtDSN, err := cluster.CreateDB(ctx, "idletgt")
	if err != nil {
		t.Fatal(err)
	}
	src := connect(t, srcDSN)
	mustExec(t, src, "CREATE TABLE items (id int PRIMARY KEY, v text NOT NULL, n int)")
	mustExec(t, src, "CREATE TABLE other (id serial PRIMARY KEY, pad text)")
	mustExec(t, src, "ALTER TABLE other ALTER pad SET STORAGE PLAIN")
	mustExec(t, src, "INSERT INTO items VALUES (1, 'one', 1)")
	var out strings.Builder
	cmd := flowCommand(bin, "-source", srcDSN, "-target", tgtDSN, "-table", "items", "-slot", "cdc", "-publication", "cdc",
		"-recovery", filepath.Join(t.TempDir(), "store"), "-epoch-interval", "200ms")
	cmd.Stderr = &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var waitErr error
	exited := make(chan struct{})
	go func() { waitErr = cmd.Wait(); close(exited) }()
	defer func() {
		cmd.Process.Signal(syscall.SIGKILL)
		<-exited
	}()
	lsn := func(q string) int64 {
		t.Helper()
		var v int64
		if err := src.QueryRow(ctx, q).Scan(&v); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
		return v
	}
	eventually(t, "replication to start", func() bool {
		return lsn("SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'cdc' AND active AND confirmed_flush_lsn IS NOT NULL") == 1
	})
	for range 20 { // about 40 MB of WAL, none of it for pg-cdc's table
		mustExec(t, src, "INSERT INTO other (pad) SELECT repeat(md5(g::text), 32) FROM generate_series(1, 2000) g")
	}
	end := lsn("SELECT pg_current_wal_lsn() - '0/0'")
	deadline := time.Now().Add(time.Minute)
	for lsn("SELECT confirmed_flush_lsn - '0/0' FROM pg_replication_slots WHERE slot_name = 'cdc'") < end {
		if time.Now().After(deadline) {
			t.Fatalf("the slot's confirmed_flush_lsn is %d MB behind the WAL written to another table after a minute",
				(end-lsn("SELECT confirmed_flush_lsn - '0/0' FROM pg_replication_slots WHERE slot_name = 'cdc'"))>>20)
		}
		time.Sleep(50 * time.Millisecond)
	}
	const bound = 8 << 20
	for deadline := time.Now().Add(time.Minute); ; {
		mustExec(t, src, "CHECKPOINT")
		retained := lsn("SELECT pg_current_wal_lsn() - restart_lsn FROM pg_replication_slots WHERE slot_name = 'cdc'")
		if retained < bound {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the slot retains %d MB of WAL a minute after the writes, want less than %d MB", retained>>20, bound>>20)
		}
		time.Sleep(500 * time.Millisecond)
	}
	// More WAL that is not pg-cdc's, then a fast shutdown with pg-cdc connected and idle.
	mustExec(t, src, "INSERT INTO other (pad) SELECT 'x' FROM generate_series(1, 1000)")
	tgt := connect(t, tgtDSN)
	eventually(t, "the copied row in the target", func() bool { // pg-cdc is idle then
		var n int
		tgt.QueryRow(ctx, "SELECT count(*) FROM items").Scan(&n)
		return n == 1
	})
	src.Close(ctx)
	took, err := source.Halt("fast", 20*time.Second)
	if err != nil {
		t.Fatalf("pg_ctl stop -m fast with pg-cdc connected and idle: %v", err)
	}
	if took > 10*time.Second {
		t.Fatalf("the fast shutdown took %v with pg-cdc connected, want less than 10 s", took)
	}
	if err := source.Boot(); err != nil {
		t.Fatal(err)
	}
	src = connect(t, srcDSN)
	mustExec(t, src, "INSERT INTO items VALUES (2, 'two', 2)")
	eventually(t, "the row written after the restart to reach the target", func() bool {
		var n int
		tgt.QueryRow(ctx, "SELECT count(*) FROM items").Scan(&n)
		return n == 2
	})
	cmd.Process.Signal(syscall.SIGTERM)
	<-exited
	if waitErr != nil {
		t.Fatalf("pg-cdc after SIGTERM: %v\n%s", waitErr, out.String())
	}
	t.Logf("fast shutdown with pg-cdc connected and idle: %v", took)
}
