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

func TestMain(m *testing.M) { pgtest.Main(m, &cluster) }

func buildBinary(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "pg-cdc")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

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
