package postgres

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/epochflow/epochflow/internal/pgtest"
	"github.com/jackc/pgx/v5"
)

// The target server restarted (fast, then immediate) between and inside epochs: the partition
// reconnects and carries on. A Write that looks a table up, a Snapshot (its transaction
// rewritten on a new connection) and a COMMIT PREPARED of a transaction prepared before an
// immediate restart all succeed, and every row is there once, with no prepared transaction
// left.
func TestReconnectAfterRestart(t *testing.T) {
	c, err := pgtest.Start()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop()
	ctx := context.Background()
	dsn, err := c.CreateDB(ctx, "reconnect")
	if err != nil {
		t.Fatal(err)
	}
	admin := func() *pgx.Conn {
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		return conn
	}
	conn := admin()
	exec(t, conn, "CREATE TABLE t (k int PRIMARY KEY, v text)")
	exec(t, conn, "CREATE TABLE t2 (k int PRIMARY KEY, v text)")
	conn.Close(ctx)
	p := open(t, Config{DSN: dsn, Name: "reconnect"}, nil)
	defer p.Close()
	rows := func(table string, from, n int) []Row {
		out := make([]Row, n)
		for i := range out {
			out[i] = kv(table, Upsert, from+i, fmt.Sprint("v", from+i))
		}
		return out
	}
	wait := func(what string, want string) {
		t.Helper()
		eventually(t, what, func() bool {
			conn, err := pgx.Connect(ctx, dsn)
			if err != nil {
				return false
			}
			defer conn.Close(ctx)
			var got string
			conn.QueryRow(ctx, "SELECT (SELECT count(*) FROM t) || ' ' || (SELECT count(*) FROM t2) || ' ' || (SELECT count(*) FROM pg_prepared_xacts)").Scan(&got)
			return got == want
		})
	}
	commitEpoch(t, p, rows("t", 0, 100))
	wait("epoch 1", "100 0 0")

	// Fast restart between epochs: the next Write looks up t2 on the lost connection, the
	// Snapshot prepares on it.
	if err := c.Restart("fast"); err != nil {
		t.Fatal(err)
	}
	commitEpoch(t, p, append(rows("t", 100, 100), rows("t2", 0, 100)...))
	wait("epoch 2", "200 100 0")

	// Immediate restart between the prepare and the commit: the transaction survives, the
	// committer reconnects and commits it.
	if err := p.Write(ctx, rows("t", 200, 100)); err != nil {
		t.Fatal(err)
	}
	seq, err := p.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Restart("immediate"); err != nil {
		t.Fatal(err)
	}
	if err := p.Commit(ctx, seq); err != nil {
		t.Fatal(err)
	}
	wait("epoch 3", "300 100 0")

	// Immediate restart with rows in the open epoch: the Snapshot writes them on a new
	// connection.
	if err := p.Write(ctx, rows("t2", 100, 100)); err != nil {
		t.Fatal(err)
	}
	if err := c.Restart("immediate"); err != nil {
		t.Fatal(err)
	}
	seq, err = p.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Commit(ctx, seq); err != nil {
		t.Fatal(err)
	}
	wait("epoch 4", "300 200 0")
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if n := p.reconnects.Load(); n < 3 {
		t.Errorf("%d reconnects, want at least 3", n)
	}
}

// A partition built while the target database is down waits for it (Config.RetryFor) instead
// of failing the flow's start: the server is stopped, Build starts, and once Build has been
// refused the server comes back and Build returns a working partition. A database that does
// not exist fails at once.
func TestBuildWaitsForTheTarget(t *testing.T) {
	c, err := pgtest.Start()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop()
	ctx := context.Background()
	dsn, err := c.CreateDB(ctx, "waits")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Halt("fast", 30*time.Second); err != nil {
		t.Fatal(err)
	}
	refused := make(chan struct{})
	var once sync.Once
	var attempts atomic.Int64
	connectAttempt = func(error) { attempts.Add(1); once.Do(func() { close(refused) }) }
	defer func() { connectAttempt = nil }()
	booted := make(chan error, 1)
	go func() {
		<-refused
		booted <- c.Boot()
	}()
	p, err := NewSink(Config{DSN: dsn, Name: "waits", RetryFor: time.Minute}).Build(ctx, "p0", nil)
	if err != nil {
		t.Fatalf("Build while the server restarts: %v", err)
	}
	if err := <-booted; err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}

	before := attempts.Load()
	if _, err := NewSink(Config{DSN: c.DSN("no_such_database"), Name: "waits", RetryFor: time.Minute}).Build(ctx, "p0", nil); err == nil || !strings.Contains(err.Error(), "no_such_database") {
		t.Fatalf("Build on a database that does not exist: %v", err)
	}
	if n := attempts.Load() - before; n != 0 {
		t.Fatalf("a database that does not exist was tried %d more times", n)
	}
}
