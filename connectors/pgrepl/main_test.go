package pgrepl

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/epochflow/epochflow/dataflow"
	"github.com/epochflow/epochflow/internal/pgtest"
	"github.com/jackc/pgx/v5"
)

var cluster *pgtest.Cluster

func TestMain(m *testing.M) { pgtest.Main(m, &cluster) }

var slotSeq atomic.Int64

// newDB makes a fresh database and a connection to it; the slots named with slotName are
// dropped at the end of the test.
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

// slotName returns a slot name unique in the cluster, dropped when the test ends.
func slotName(t testing.TB, conn *pgx.Conn) string {
	name := fmt.Sprintf("slot_%d", slotSeq.Add(1))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		for ctx.Err() == nil {
			_, err := conn.Exec(ctx, "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1", name)
			if err == nil {
				return
			}
			time.Sleep(50 * time.Millisecond) // still active for a moment after Close
		}
	})
	return name
}

func exec(t testing.TB, conn *pgx.Conn, sql string, args ...any) {
	t.Helper()
	if _, err := conn.Exec(context.Background(), sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

func build(t testing.TB, cfg Config, resume *State) *partition {
	t.Helper()
	src, err := NewSource(cfg).Build(context.Background(), "slot/"+cfg.Slot, resume)
	if err != nil {
		t.Fatal(err)
	}
	return src.(*partition)
}

// read calls Next until until returns true for the events read so far, or fails the test
// after a minute.
func read(t testing.TB, p *partition, until func([]Change) bool) []Change {
	t.Helper()
	var got []Change
	deadline := time.Now().Add(time.Minute)
	for !until(got) {
		batch, err := p.Next(context.Background())
		if err != nil {
			t.Fatalf("Next: %v", err)
		}
		got = append(got, batch...)
		if len(batch) == 0 {
			if time.Now().After(deadline) {
				t.Fatalf("timed out with %d events read", len(got))
			}
			select {
			case <-p.Wait():
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
	return got
}

func commits(n int) func([]Change) bool {
	return func(cs []Change) bool {
		k := 0
		for _, c := range cs {
			if c.Kind == Commit {
				k++
			}
		}
		return k >= n
	}
}

type slotInfo struct {
	confirmed, restart LSN
	active             bool
}

func slot(t testing.TB, conn *pgx.Conn, name string) slotInfo {
	t.Helper()
	var c, r string
	var s slotInfo
	err := conn.QueryRow(context.Background(), "SELECT confirmed_flush_lsn::text, restart_lsn::text, active FROM pg_replication_slots WHERE slot_name = $1", name).Scan(&c, &r, &s.active)
	if err != nil {
		t.Fatal(err)
	}
	var err1, err2 error
	s.confirmed, err1 = ParseLSN(c)
	s.restart, err2 = ParseLSN(r)
	if err1 != nil || err2 != nil {
		t.Fatal(err1, err2)
	}
	return s
}

// waitSlotCreated waits until the flow's source has created its slot and streams from it. A
// slot is listed, and active, while CREATE_REPLICATION_SLOT still waits for a consistent point:
// its confirmed_flush_lsn is NULL then, and what commits before that point is not streamed.
func waitSlotCreated(t testing.TB, conn *pgx.Conn, name string) {
	t.Helper()
	eventually(t, "the slot "+name+" to be created and active", func() bool {
		var n int
		conn.QueryRow(context.Background(), "SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1 AND active AND confirmed_flush_lsn IS NOT NULL", name).Scan(&n)
		return n == 1
	})
}

// eventually polls cond for up to 20 s.
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

var _ dataflow.Waiter = (*partition)(nil)
