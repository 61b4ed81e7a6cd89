package pgrepl

import (
	"context"
	"testing"
	"time"

	"github.com/epochflow/epochflow/connectors/flowtest"
	"github.com/epochflow/epochflow/dataflow"
)

// The source reports epochflow_source_lag in bytes of WAL: it rises while changes wait (the
// sink holds the first epoch, so nothing is confirmed), rises again with more, and falls to 0
// once everything is read and committed.
func TestSourceLag(t *testing.T) {
	dsn, conn := newDB(t)
	name := slotName(t, conn)
	exec(t, conn, "CREATE TABLE t (id int PRIMARY KEY, v text)")
	g := flowtest.NewGateSink[Change]()
	stop := make(chan struct{})
	mon := dataflow.NewMonitor()
	flow := dataflow.New("pg")
	in := dataflow.Input(flow, "read", Changes(Config{DSN: dsn, Slot: name, Publication: "pub",
		Tables: []string{"t"}, CreateSlot: true, CreatePublication: true}))
	// The gate counts the inserts only (not the transactions' Begin and Commit events).
	inserts := dataflow.Transform("inserts", in, func(b []Change) ([]Change, error) {
		out := b[:0:0]
		for _, c := range b {
			if c.Kind == Insert {
				out = append(out, c)
			}
		}
		return out, nil
	})
	dataflow.Output("write", inserts, g.Output())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- dataflow.Run(ctx, flow, dataflow.Options{EpochInterval: 50 * time.Millisecond, Stop: stop, Monitor: mon})
	}()
	lag := func() float64 { l, _ := mon.SourceLag("pg.read"); return l }
	eventually(t, "the first lag report", func() bool { _, ok := mon.SourceLag("pg.read"); return ok })
	exec(t, conn, "INSERT INTO t SELECT g, 'a' FROM generate_series(1, 1000) g")
	eventually(t, "a lag of the first 1000 rows", func() bool { return lag() >= 10_000 })
	first := lag()
	exec(t, conn, "INSERT INTO t SELECT g, 'b' FROM generate_series(1001, 3000) g")
	eventually(t, "the lag to rise with 2000 more rows", func() bool { return lag() > first+20_000 })
	g.Open()
	eventually(t, "the lag to fall to 0 once drained", func() bool { return g.Count() == 3000 && lag() == 0 })
	close(stop)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
