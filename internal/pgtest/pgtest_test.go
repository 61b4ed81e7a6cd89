package pgtest

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// A started cluster accepts connections, has the settings logical replication and two-phase
// commit need, makes databases, and is gone after Stop.
func TestStartStop(t *testing.T) {
	c, err := Start()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop()
	ctx := context.Background()
	dsn, err := c.CreateDB(ctx, "Start-Stop")
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	for setting, want := range map[string]string{"wal_level": "logical", "max_prepared_transactions": "20", "fsync": "off"} {
		var got string
		if err := conn.QueryRow(ctx, "SELECT current_setting($1)", setting).Scan(&got); err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Errorf("%s = %s, want %s", setting, got, want)
		}
	}
	conn.Close(ctx)
	if err := c.Stop(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(c.Dir); !os.IsNotExist(err) {
		t.Errorf("directory %s still there after Stop: %v", c.Dir, err)
	}
	if _, err := pgx.Connect(ctx, c.DSN("postgres")); err == nil {
		t.Error("the server still accepts connections after Stop")
	}
}

// Restart, fast or immediate, brings the server back on its port with its data and its
// prepared transactions; a connection of before is gone.
func TestRestart(t *testing.T) {
	c, err := Start()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop()
	ctx := context.Background()
	dsn, err := c.CreateDB(ctx, "restart")
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	for _, q := range []string{"CREATE TABLE t (k int)", "BEGIN", "INSERT INTO t VALUES (1)", "PREPARE TRANSACTION 'restart-test'"} {
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	for _, mode := range []string{"fast", "immediate"} {
		if err := c.Restart(mode); err != nil {
			t.Fatal(err)
		}
		if _, err := conn.Exec(ctx, "SELECT 1"); err == nil {
			t.Fatalf("a connection of before the %s restart still works", mode)
		}
		conn.Close(ctx)
		if conn, err = pgx.Connect(ctx, dsn); err != nil {
			t.Fatalf("after the %s restart: %v", mode, err)
		}
		var n int
		if err := conn.QueryRow(ctx, "SELECT count(*) FROM pg_prepared_xacts WHERE gid = 'restart-test'").Scan(&n); err != nil || n != 1 {
			t.Fatalf("after the %s restart: %d prepared transactions, %v", mode, n, err)
		}
	}
	if err := c.Restart("smart"); err == nil {
		t.Error("Restart(smart) did not fail")
	}
}

// A fast shutdown that does not finish is an error of Restart (it was a silent SIGKILL after
// a minute, which hid the hang a test was there to find): a logical replication client that
// never confirms what it was sent keeps its walsender, and so the fast shutdown, waiting (for
// ever with wal_sender_timeout = 0). Restart reports it, naming pg_ctl and the mode, then
// stops the server with an immediate shutdown and starts it again.
func TestRestartReportsAHang(t *testing.T) {
	c, err := StartWith("wal_sender_timeout=0")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop()
	ctx := context.Background()
	dsn, err := c.CreateDB(ctx, "hang")
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	for _, q := range []string{"CREATE TABLE t (k int PRIMARY KEY)", "CREATE PUBLICATION p FOR TABLE t",
		"SELECT pg_create_logical_replication_slot('hang', 'pgoutput')"} {
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	repl, err := pgconn.Connect(ctx, dsn+"&replication=database")
	if err != nil {
		t.Fatal(err)
	}
	defer repl.Close(ctx)
	if err := pglogrepl.StartReplication(ctx, repl, "hang", 0, pglogrepl.StartReplicationOptions{Mode: pglogrepl.LogicalReplication,
		PluginArgs: []string{"proto_version '1'", "publication_names 'p'"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "INSERT INTO t VALUES (1)"); err != nil {
		t.Fatal(err)
	}
	defer func(d time.Duration) { restartTimeout = d }(restartTimeout)
	restartTimeout = 3 * time.Second
	start := time.Now()
	err = c.Restart("fast")
	if err == nil {
		t.Fatalf("Restart(fast) returned no error, after %v, with a replication client that never confirms", time.Since(start))
	}
	for _, want := range []string{"pg_ctl stop -m fast", "did not stop within 3s", "immediate shutdown"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the error does not say %q: %v", want, err)
		}
	}
	t.Logf("after %v: %v", time.Since(start), err)
	conn2, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatalf("the server is not running after the failed restart: %v", err)
	}
	defer conn2.Close(ctx)
	var n int
	if err := conn2.QueryRow(ctx, "SELECT count(*) FROM t").Scan(&n); err != nil || n != 1 {
		t.Fatalf("after the failed restart: %d rows, %v", n, err)
	}
}
