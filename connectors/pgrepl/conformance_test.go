package pgrepl

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/epochflow/epochflow/connectors/conformance"
	"github.com/epochflow/epochflow/dataflow"
)

// The source resumes after the LSN in its snapshot (exactly once into the flow) and moves the
// slot's confirmed flush position only past committed epochs: Remaining counts the produced
// rows whose transaction ends beyond it. Each row is its own transaction.
func TestSourceConformance(t *testing.T) {
	conformance.TestSource(t, conformance.SourceKit[Change, State]{
		Setup: func(t *testing.T) conformance.SourceSystem[Change, State] {
			dsn, conn := newDB(t)
			exec(t, conn, "CREATE TABLE items (id text PRIMARY KEY)")
			slot := slotName(t, conn)
			// The slot exists before the rows are written, or it would not see them.
			exec(t, conn, "CREATE PUBLICATION "+slot+"_pub FOR TABLE items")
			exec(t, conn, "SELECT pg_create_logical_replication_slot($1, 'pgoutput')", slot)
			cfg := Config{DSN: dsn, Slot: slot, Publication: slot + "_pub", IdleEOF: 300 * time.Millisecond}
			var mu sync.Mutex
			var inside []LSN // per row: a WAL position inside its transaction, before its commit
			return conformance.SourceSystem[Change, State]{
				New: func() dataflow.PartitionedSource[Change, State] { return NewSource(cfg) },
				Produce: func(ids []string) {
					ctx := context.Background()
					for _, id := range ids {
						tx, err := conn.Begin(ctx)
						if err != nil {
							t.Fatal(err)
						}
						var lsn string
						if err := tx.QueryRow(ctx, "INSERT INTO items VALUES ($1) RETURNING pg_current_wal_insert_lsn()::text", id).Scan(&lsn); err != nil {
							t.Fatal(err)
						}
						if err := tx.Commit(ctx); err != nil {
							t.Fatal(err)
						}
						l, err := ParseLSN(lsn)
						if err != nil {
							t.Fatal(err)
						}
						mu.Lock()
						inside = append(inside, l)
						mu.Unlock()
					}
				},
				Remaining: func() int {
					var confirmed string
					if err := conn.QueryRow(context.Background(), "SELECT coalesce(confirmed_flush_lsn, '0/0')::text FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&confirmed); err != nil {
						t.Fatal(err)
					}
					c, err := ParseLSN(confirmed)
					if err != nil {
						t.Fatal(err)
					}
					mu.Lock()
					defer mu.Unlock()
					n := 0
					for _, l := range inside {
						if l >= c {
							n++
						}
					}
					return n
				},
			}
		},
		ID: func(c Change) string {
			if c.Kind != Insert {
				return ""
			}
			s, _ := c.New[0].(string)
			return s
		},
		Guarantee: conformance.ExactlyOnce,
	})
}
