package postgres

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

const benchRows = 200_000

// BenchmarkSink writes 200,000 rows (int, text, int8, float8, timestamptz) with the sink (4
// epochs of 50,000 rows, each prepared and committed) and with one plain COPY of the same rows
// into an identical table, and reports both rates and their ratio (sink / copy).
//
//	go test -run '^$' -bench Sink -benchtime 1x ./connectors/postgres/
func BenchmarkSink(b *testing.B) {
	dsn, conn := newDB(b)
	ctx := context.Background()
	now := time.Now()
	rows := make([]Row, benchRows)
	cols := []string{"id", "v", "n", "f", "ts"}
	copyRows := make([][]any, benchRows)
	for i := range rows {
		vals := []any{int32(i), fmt.Sprint("row ", i), int64(i) * 7, float64(i) / 3, now}
		rows[i] = Row{Table: "s", Op: Insert, Columns: cols, Values: vals}
		copyRows[i] = vals
	}
	for b.Loop() {
		exec(b, conn, "DROP TABLE IF EXISTS s, c")
		exec(b, conn, "CREATE TABLE s (id int PRIMARY KEY, v text, n int8, f float8, ts timestamptz)")
		exec(b, conn, "CREATE TABLE c (id int PRIMARY KEY, v text, n int8, f float8, ts timestamptz)")
		p := open(b, Config{DSN: dsn, Name: "bench"}, nil)
		start := time.Now()
		const epoch = benchRows / 4
		for e := 0; e < benchRows; e += epoch {
			for i := e; i < e+epoch; i += 1000 {
				if err := p.Write(ctx, rows[i:i+1000]); err != nil {
					b.Fatal(err)
				}
			}
			seq, err := p.Snapshot()
			if err != nil {
				b.Fatal(err)
			}
			if err := p.Commit(ctx, seq); err != nil {
				b.Fatal(err)
			}
		}
		if err := p.Close(); err != nil { // waits for the last COMMIT PREPARED
			b.Fatal(err)
		}
		sinkTook := time.Since(start)

		start = time.Now()
		n, err := conn.CopyFrom(ctx, pgx.Identifier{"c"}, cols, pgx.CopyFromRows(copyRows))
		if err != nil || n != benchRows {
			b.Fatal(n, err)
		}
		copyTook := time.Since(start)
		var count int
		conn.QueryRow(ctx, "SELECT count(*) FROM s").Scan(&count)
		if count != benchRows {
			b.Fatalf("the sink wrote %d rows", count)
		}
		sinkRate := benchRows / sinkTook.Seconds()
		copyRate := benchRows / copyTook.Seconds()
		b.ReportMetric(sinkRate, "sink-rows/s")
		b.ReportMetric(copyRate, "copy-rows/s")
		b.ReportMetric(sinkRate/copyRate, "ratio")
	}
}
