package postgres

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/epochflow/epochflow/connectors/conformance"
	"github.com/epochflow/epochflow/dataflow"
)

// Each epoch's rows are one prepared transaction per partition, committed by Commit: a
// reader sees none of them before, and each once after (a row inserted twice would fail
// the run on the tables' key). Two tables, so that both partitions write.
func TestSinkConformance(t *testing.T) {
	tables := []string{"items_a", "items_b"}
	conformance.TestSink(t, conformance.SinkKit[Row, uint64]{
		Setup: func(t *testing.T) conformance.SinkSystem[Row, uint64] {
			dsn, conn := newDB(t)
			for _, tb := range tables {
				exec(t, conn, "CREATE TABLE "+tb+" (id text PRIMARY KEY)")
			}
			return conformance.SinkSystem[Row, uint64]{
				New: func() dataflow.PartitionedSink[Row, uint64] {
					return NewSink(Config{DSN: dsn, Name: "conformance", Partitions: 2})
				},
				Item: func(id string) Row {
					return Row{Table: tables[len(id)%2], Op: Insert, Columns: []string{"id"}, Values: []any{id}}
				},
				Visible: func() []string {
					var out []string
					for _, tb := range tables {
						rows, err := conn.Query(context.Background(), "SELECT id FROM "+tb)
						if err != nil {
							t.Fatal(err)
						}
						ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
						if err != nil {
							t.Fatal(err)
						}
						out = append(out, ids...)
					}
					return out
				},
			}
		},
		Guarantee: conformance.ExactlyOnce,
	})
}
