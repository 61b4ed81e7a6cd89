package pgrepl

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// restartDB is newDB for tests that halt the cluster: the connection it returns is opened
// again by reconnect after a restart, and the slot is dropped at the end over a fresh one.
func restartDB(t *testing.T) (dsn, slot string) {
	t.Helper()
	dsn, err := cluster.CreateDB(context.Background(), t.Name())
	if err != nil {
		t.Fatal(err)
	}
	slot = "rslot_" + dsnSuffix(slotSeq.Add(1))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		for ctx.Err() == nil {
			if c, err := pgx.Connect(ctx, dsn); err == nil {
				_, err = c.Exec(ctx, "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1", slot)
				c.Close(ctx)
				if err == nil {
					return
				}
			}
			time.Sleep(100 * time.Millisecond)
		}
	})
	return dsn, slot
}

func dsnSuffix(n int64) string {
	return string(rune('a'+n%26)) + time.Now().Format("150405") + string(rune('a'+(n/26)%26))
}

func connectT(t *testing.T, dsn string) *pgx.Conn {
	t.Helper()
	c, err := pgx.Connect(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	return c
}

// A fast shutdown of the source server while the source is connected and idle completes
// promptly: the walsender waits until everything it sent is confirmed, and the source
// confirms the position it reported once the epoch that took it is committed (it hung until
// the flow was stopped: 22 s and 68 s).
func TestFastShutdownWithTheSourceConnected(t *testing.T) {
	dsn, name := restartDB(t)
	conn := connectT(t, dsn)
	exec(t, conn, "CREATE TABLE t (id int PRIMARY KEY)")
	sink, stop := runFlow(t, Config{DSN: dsn, Slot: name, Publication: "pub", Tables: []string{"t"}, CreateSlot: true, CreatePublication: true})
	waitSlotCreated(t, conn, name)
	exec(t, conn, "CREATE TABLE other (id int)")
	exec(t, conn, "INSERT INTO t VALUES (1)")
	// WAL after the source's last transaction: writes to a table it does not read (or to
	// another database of the cluster, such as a flow's target).
	exec(t, conn, "INSERT INTO other SELECT generate_series(1, 1000)")
	eventually(t, "the insert to reach the sink", func() bool { // then the source is idle
		for _, c := range sink.Items() {
			if c.Kind == Commit {
				return true
			}
		}
		return false
	})
	conn.Close(context.Background())
	took, err := cluster.Halt("fast", 20*time.Second)
	if err != nil {
		stop() // the walsender lets the server go once the source has gone
		if _, err := cluster.Halt("fast", time.Minute); err != nil {
			t.Fatal(err)
		}
		if err := cluster.Boot(); err != nil {
			t.Fatal(err)
		}
		t.Fatalf("pg_ctl stop -m fast with the source connected and idle: %v", err)
	}
	if err := cluster.Boot(); err != nil {
		t.Fatal(err)
	}
	if took > 10*time.Second {
		t.Fatalf("the fast shutdown took %v with the source connected, want less than 10 s", took)
	}
	t.Logf("fast shutdown with the source connected and idle: %v", took)
	// The source reconnects: a row written after the restart comes, and the flow ends well.
	conn = connectT(t, dsn)
	exec(t, conn, "INSERT INTO t VALUES (2)")
	eventually(t, "the row written after the restart", func() bool {
		for _, c := range sink.Items() {
			if c.Kind == Insert && c.New[0].(int32) == 2 {
				return true
			}
		}
		return false
	})
	if err := stop(); err != nil {
		t.Fatalf("the flow: %v", err)
	}
}

// The source server restarts (fast, immediate, fast) during a run of 5,000 transactions: the
// flow keeps running (the source reconnects, its heartbeats wait for the server), and every
// row comes exactly once.
func TestSourceSurvivesServerRestarts(t *testing.T) {
	dsn, name := restartDB(t)
	conn := connectT(t, dsn)
	exec(t, conn, "CREATE TABLE t (id int PRIMARY KEY, v text)")
	sink, stop := runFlow(t, Config{DSN: dsn, Slot: name, Publication: "pub", Tables: []string{"t"}, CreateSlot: true,
		CreatePublication: true, ReconnectTimeout: 2 * time.Minute, Heartbeat: 20 * time.Millisecond})
	waitSlotCreated(t, conn, name) // the slot streams what commits after it was created
	conn.Close(context.Background())
	const txs = 5000
	var written atomic.Int64
	werr := make(chan error, 1)
	go func() { werr <- restartingWriter(dsn, txs, &written) }()
	waitWritten := func(n int64) {
		t.Helper()
		deadline := time.Now().Add(2 * time.Minute)
		for written.Load() < n {
			select {
			case err := <-werr:
				t.Fatalf("the writer ended after %d transactions: %v", written.Load(), err)
			case <-time.After(20 * time.Millisecond):
			}
			if time.Now().After(deadline) {
				t.Fatalf("only %d transactions written after 2 minutes", written.Load())
			}
		}
	}
	restarts := []string{"fast", "immediate", "fast"}
	for i, mode := range restarts {
		waitWritten(int64((i + 1) * txs / (len(restarts) + 1)))
		took, err := cluster.Halt(mode, 30*time.Second)
		if err != nil {
			stop()
			cluster.Halt(mode, time.Minute)
			cluster.Boot()
			t.Fatalf("shutdown %d (%s): %v", i+1, mode, err)
		}
		if err := cluster.Boot(); err != nil {
			t.Fatal(err)
		}
		t.Logf("restart %d (%s) after %d transactions: the shutdown took %v", i+1, mode, written.Load(), took)
	}
	if err := <-werr; err != nil {
		t.Fatal(err)
	}
	conn = connectT(t, dsn)
	var rows int
	if err := conn.QueryRow(context.Background(), "SELECT count(*) FROM t").Scan(&rows); err != nil {
		t.Fatal(err)
	}
	if rows != 2*txs {
		t.Fatalf("the table has %d rows, want %d", rows, 2*txs)
	}
	inserts := func() map[int32]int {
		m := map[int32]int{}
		for _, c := range sink.Items() {
			if c.Kind == Insert {
				m[c.New[0].(int32)]++
			}
		}
		return m
	}
	deadline := time.Now().Add(30 * time.Second)
	for len(inserts()) < rows {
		if time.Now().After(deadline) {
			m := inserts()
			var missing []int32
			for id := int32(0); id < 2*txs; id++ {
				if m[id] == 0 {
					missing = append(missing, id)
				}
			}
			var st, rs string
			var active bool
			conn.QueryRow(context.Background(), "SELECT confirmed_flush_lsn::text, restart_lsn::text, active FROM pg_replication_slots WHERE slot_name = $1", name).Scan(&st, &rs, &active)
			t.Fatalf("%d of %d rows reached the sink within 30 s of the last write; missing %d, from %v to %v; slot confirmed %s restart %s active %v",
				len(m), rows, len(missing), missing[0], missing[len(missing)-1], st, rs, active)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := stop(); err != nil {
		t.Fatalf("the flow: %v", err)
	}
	seen := inserts()
	for id := int32(0); id < 2*txs; id++ {
		if seen[id] != 1 {
			t.Fatalf("row %d came %d times", id, seen[id])
		}
	}
	if len(seen) != rows {
		t.Fatalf("%d distinct rows came, the table has %d", len(seen), rows)
	}
}

// restartingWriter runs n transactions of two inserts each (ids 2i and 2i+1), retrying on a
// new connection while the server restarts. The inserts do nothing when the rows exist, so a
// retried transaction that had committed adds nothing.
func restartingWriter(dsn string, n int, done *atomic.Int64) error {
	ctx := context.Background()
	var c *pgx.Conn
	defer func() {
		if c != nil {
			c.Close(ctx)
		}
	}()
	for i := 0; i < n; {
		if c == nil {
			var err error
			if c, err = pgx.Connect(ctx, dsn); err != nil {
				time.Sleep(50 * time.Millisecond)
				continue
			}
		}
		b := &pgx.Batch{}
		b.Queue("INSERT INTO t VALUES ($1, 'a'), ($2, 'b') ON CONFLICT DO NOTHING", 2*i, 2*i+1)
		if err := c.SendBatch(ctx, b).Close(); err != nil {
			if c.IsClosed() || pgconn.SafeToRetry(err) || isShutdown(err) {
				c.Close(ctx)
				c = nil
				time.Sleep(50 * time.Millisecond)
				continue
			}
			return fmt.Errorf("transaction %d: %w", i, err)
		}
		i++
		done.Add(1)
	}
	return nil
}

func isShutdown(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (strings.HasPrefix(pgErr.Code, "57") || strings.HasPrefix(pgErr.Code, "08"))
}

// The replication connection is lost in the middle of a large transaction, after part of it
// was emitted (the walsender is terminated): the source reconnects, the server sends the
// transaction again, and the source emits only the rest of it, so every row comes once and the
// transaction has one Begin.
func TestReconnectInsideATransaction(t *testing.T) {
	dsn, conn := newDB(t)
	name := slotName(t, conn)
	exec(t, conn, "CREATE TABLE t (id int PRIMARY KEY)")
	p := build(t, Config{DSN: dsn, Slot: name, Publication: "pub", Tables: []string{"t"}, CreateSlot: true,
		CreatePublication: true, MaxBuffered: 100}, nil)
	defer p.Close()
	if err := p.Commit(context.Background(), p.Snapshot()); err != nil {
		t.Fatal(err)
	}
	exec(t, conn, "INSERT INTO t SELECT generate_series(1, 5000)")
	exec(t, conn, "INSERT INTO t VALUES (5001)")
	got := read(t, p, func(cs []Change) bool { return len(cs) >= 300 })
	if s := p.Snapshot(); s.TxCommit == 0 {
		t.Fatalf("state %+v after 300 events: not inside the transaction", s)
	}
	eventually(t, "the walsender to be terminated", func() bool {
		var ok bool
		conn.QueryRow(context.Background(), "SELECT coalesce(bool_or(pg_terminate_backend(active_pid)), false) FROM pg_replication_slots WHERE slot_name = $1 AND active", name).Scan(&ok)
		return ok
	})
	got = append(got, read(t, p, commits(2))...)
	// What the server had sent before it terminated the walsender may carry the rest of the
	// transaction, so the two commits can be read before the source has reconnected: wait
	// for the reconnect, then read a marker transaction, which comes after anything the
	// server sends again.
	eventually(t, "the source to reconnect", func() bool { return p.reconnects.Load() > 0 })
	exec(t, conn, "INSERT INTO t VALUES (5002)")
	got = append(got, read(t, p, commits(1))...)
	seen, begins := map[int32]int{}, 0
	for _, c := range got {
		switch c.Kind {
		case Begin:
			begins++
		case Insert:
			seen[c.New[0].(int32)]++
		}
	}
	if begins != 3 {
		t.Errorf("%d Begin events for 3 transactions", begins)
	}
	for id := int32(1); id <= 5002; id++ {
		if seen[id] != 1 {
			t.Fatalf("row %d came %d times (%d reconnects)", id, seen[id], p.reconnects.Load())
		}
	}
}
