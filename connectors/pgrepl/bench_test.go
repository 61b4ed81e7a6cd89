package pgrepl

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/epochflow/epochflow/dataflow"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
)

const benchRows = 200_000

// countSink discards what it gets and counts the inserts.
type countSink struct {
	n    atomic.Int64
	once sync.Once
	full chan struct{}
}

func (s *countSink) Build(context.Context, dataflow.Worker) (dataflow.WorkerSink[Change], error) {
	return s, nil
}

func (s *countSink) Write(_ context.Context, batch []Change) error {
	k := 0
	for i := range batch {
		if batch[i].Kind == Insert {
			k++
		}
	}
	if s.n.Add(int64(k)) >= benchRows {
		s.once.Do(func() { close(s.full) })
	}
	return nil
}

func (s *countSink) Close() error { return nil }

// plainLoop reads slot with a plain pglogrepl loop (receive, parse, take each insert's
// values as text) until it has seen n inserts, and returns how long that took.
func plainLoop(b *testing.B, dsn, slot string, n int) time.Duration {
	ctx := context.Background()
	start := time.Now()
	pc, err := pgconn.ParseConfig(dsn)
	if err != nil {
		b.Fatal(err)
	}
	pc.RuntimeParams["replication"] = "database"
	conn, err := pgconn.ConnectConfig(ctx, pc)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close(ctx)
	err = pglogrepl.StartReplication(ctx, conn, slot, 0, pglogrepl.StartReplicationOptions{Mode: pglogrepl.LogicalReplication,
		PluginArgs: []string{"proto_version '1'", "publication_names 'pub'"}})
	if err != nil {
		b.Fatal(err)
	}
	seen := 0
	var sink []string
	for seen < n {
		msg, err := conn.ReceiveMessage(ctx)
		if err != nil {
			b.Fatal(err)
		}
		cd, ok := msg.(*pgproto3.CopyData)
		if !ok || cd.Data[0] != pglogrepl.XLogDataByteID {
			continue
		}
		xld, err := pglogrepl.ParseXLogData(cd.Data[1:])
		if err != nil {
			b.Fatal(err)
		}
		m, err := pglogrepl.Parse(xld.WALData)
		if err != nil {
			b.Fatal(err)
		}
		if ins, ok := m.(*pglogrepl.InsertMessage); ok {
			sink = sink[:0]
			for _, c := range ins.Tuple.Columns {
				sink = append(sink, string(c.Data))
			}
			seen++
		}
	}
	return time.Since(start)
}

// BenchmarkDecode decodes 200,000 inserted rows (int, text, int8, float8, timestamptz) once
// through a flow (pgrepl.Changes into a sink that discards) and once with a plain pglogrepl
// loop over an identical slot, and reports both rates and their ratio (flow / plain).
//
//	go test -run '^$' -bench Decode -benchtime 1x ./connectors/pgrepl/
func BenchmarkDecode(b *testing.B) {
	dsn, conn := newDB(b)
	exec(b, conn, "CREATE TABLE t (id int PRIMARY KEY, v text, n int8, f float8, ts timestamptz)")
	exec(b, conn, "CREATE PUBLICATION pub FOR TABLE t")
	next := 0
	for b.Loop() {
		// Four identical slots over the same 200,000 rows, read plain, flow, flow, plain: the
		// best time of each way counts, so neither gains from a warm cache or loses to a
		// checkpoint.
		slots := make([]string, 4)
		for i := range slots {
			slots[i] = slotName(b, conn)
			exec(b, conn, "SELECT pg_create_logical_replication_slot($1, 'pgoutput')", slots[i])
		}
		for i := 0; i < benchRows; i += 10_000 {
			exec(b, conn, "INSERT INTO t SELECT g, 'row ' || g, g * 7, g / 3.0, now() FROM generate_series($1::int, $1::int + 9999) g", next+i)
		}
		next += benchRows
		exec(b, conn, "CHECKPOINT")
		var flowBest, plainBest time.Duration
		best := func(d *time.Duration, t time.Duration) {
			if *d == 0 || t < *d {
				*d = t
			}
		}
		best(&plainBest, plainLoop(b, dsn, slots[0], benchRows))
		best(&flowBest, flowRun(b, dsn, slots[1]))
		best(&flowBest, flowRun(b, dsn, slots[2]))
		best(&plainBest, plainLoop(b, dsn, slots[3], benchRows))
		flowRate := float64(benchRows) / flowBest.Seconds()
		plainRate := float64(benchRows) / plainBest.Seconds()
		b.ReportMetric(flowRate, "flow-rows/s")
		b.ReportMetric(plainRate, "plain-rows/s")
		b.ReportMetric(flowRate/plainRate, "ratio")
	}
}

// flowRun reads slot through a flow into a discarding sink until it has seen benchRows inserts,
// and returns how long that took.
func flowRun(b *testing.B, dsn, slot string) time.Duration {
	sink := &countSink{full: make(chan struct{})}
	flow := dataflow.New("bench")
	dataflow.Output("discard", dataflow.Input(flow, "read", Changes(Config{DSN: dsn, Slot: slot, Publication: "pub"})), dataflow.ToDynamic[Change](sink))
	stop := make(chan struct{})
	start := time.Now()
	var took time.Duration
	done := make(chan error, 1)
	go func() { done <- dataflow.Run(context.Background(), flow, dataflow.Options{Stop: stop}) }()
	select {
	case <-sink.full:
		took = time.Since(start)
	case err := <-done:
		b.Fatalf("the flow ended early: %v", err)
	}
	close(stop)
	if err := <-done; err != nil {
		b.Fatal(err)
	}
	return took
}
