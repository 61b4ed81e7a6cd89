package pgrepl

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/epochflow/epochflow/connectors/flowtest"
	"github.com/epochflow/epochflow/dataflow"
	"github.com/jackc/pgx/v5"
)

// runFlow runs a flow from the source into a collecting sink, with 100 ms epochs, until the
// returned stop function is called; stop returns what Run returned.
func runFlow(t testing.TB, cfg Config) (*flowtest.Sink[Change], func() error) {
	t.Helper()
	sink := flowtest.NewSink[Change]()
	flow := dataflow.New("pgrepl-test")
	dataflow.Output("collect", dataflow.Input(flow, "read", Changes(cfg)), sink.Output())
	stopCh := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- dataflow.Run(context.Background(), flow, dataflow.Options{Stop: stopCh, EpochInterval: 100 * time.Millisecond})
	}()
	stopped := false
	var runErr error
	stop := func() error {
		if !stopped {
			stopped = true
			close(stopCh)
			select {
			case runErr = <-done:
			case <-time.After(time.Minute):
				t.Fatal("the flow did not stop within a minute")
			}
		}
		return runErr
	}
	t.Cleanup(func() { stop() })
	return sink, stop
}

func currentLSN(t testing.TB, conn *pgx.Conn) LSN {
	t.Helper()
	var s string
	if err := conn.QueryRow(context.Background(), "SELECT pg_current_wal_lsn()::text").Scan(&s); err != nil {
		t.Fatal(err)
	}
	l, err := ParseLSN(s)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// While the published table is idle and another table of the database fills the WAL, the
// slot's confirmed_flush_lsn follows the WAL the server has sent (the source confirms the
// position a keepalive reported once the epoch that took it is committed), and its
// restart_lsn follows at the next checkpoint: the WAL the slot retains stays bounded instead
// of growing with every write (it grew from 60 to 295 MB in 12 s).
func TestIdleSlotAdvancesWhileOtherTablesAreBusy(t *testing.T) {
	dsn, conn := newDB(t)
	name := slotName(t, conn)
	exec(t, conn, "CREATE TABLE t (id int PRIMARY KEY)")
	exec(t, conn, "CREATE TABLE other (id serial PRIMARY KEY, pad text)")
	exec(t, conn, "ALTER TABLE other ALTER pad SET STORAGE PLAIN") // no compression: WAL as written
	sink, stop := runFlow(t, Config{DSN: dsn, Slot: name, Publication: "pub", Tables: []string{"t"}, CreateSlot: true, CreatePublication: true})
	waitSlotCreated(t, conn, name)
	start := slot(t, conn, name)
	for range 20 { // about 40 MB of WAL
		exec(t, conn, "INSERT INTO other (pad) SELECT repeat(md5(g::text), 32) FROM generate_series(1, 2000) g")
	}
	end := currentLSN(t, conn)
	written := float64(end-start.confirmed) / (1 << 20)
	if written < 30 {
		t.Fatalf("only %.1f MB of WAL written", written)
	}
	deadline := time.Now().Add(60 * time.Second)
	for s := slot(t, conn, name); s.confirmed < end; s = slot(t, conn, name) {
		if time.Now().After(deadline) {
			t.Fatalf("confirmed_flush_lsn is %s after 60 s, %.1f MB behind the %.1f MB of WAL written since it was %s (the published table idle, another table busy)",
				s.confirmed, float64(end-s.confirmed)/(1<<20), written, start.confirmed)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// A checkpoint logs the running transactions; the slot's restart_lsn then moves once the
	// source has confirmed past it.
	const bound = 8 << 20
	var retained LSN
	for deadline := time.Now().Add(60 * time.Second); ; {
		exec(t, conn, "CHECKPOINT")
		retained = currentLSN(t, conn) - slot(t, conn, name).restart
		if retained < bound {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the slot retains %.1f MB of WAL after 60 s, want less than %d MB (%.1f MB written)", float64(retained)/(1<<20), bound>>20, written)
		}
		time.Sleep(500 * time.Millisecond)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if n := len(sink.Items()); n != 0 {
		t.Fatalf("the idle table's flow got %d events", n)
	}
	t.Logf("%.1f MB written to another table; confirmed_flush_lsn followed; %.1f MB retained after a checkpoint", written, float64(retained)/(1<<20))
}

// A run that resumes from a position that came from the server's keepalives (and from a slot
// confirmed there), with transactions of the published table between writes to another one,
// emits every row once across the runs.
func TestResumeFromAReportedPositionExactlyOnce(t *testing.T) {
	dsn, conn := newDB(t)
	name := slotName(t, conn)
	exec(t, conn, "CREATE TABLE t (id int PRIMARY KEY)")
	exec(t, conn, "CREATE TABLE other (id serial PRIMARY KEY, pad text)")
	cfg := Config{DSN: dsn, Slot: name, Publication: "pub", Tables: []string{"t"}, CreateSlot: true, CreatePublication: true,
		StatusInterval: 100 * time.Millisecond}
	p := build(t, cfg, nil)
	if err := p.Commit(context.Background(), p.Snapshot()); err != nil {
		t.Fatal(err)
	}
	seen := map[int32]int{}
	count := func(cs []Change) (last LSN) {
		for _, c := range cs {
			switch c.Kind {
			case Insert:
				seen[c.New[0].(int32)]++
			case Commit:
				last = c.LSN
			}
		}
		return last
	}
	next := int32(1)
	write := func(n int) {
		for range n {
			exec(t, conn, "INSERT INTO other (pad) SELECT 'x' FROM generate_series(1, 200)")
			exec(t, conn, fmt.Sprintf("INSERT INTO t VALUES (%d), (%d)", next, next+1))
			next += 2
		}
		exec(t, conn, "INSERT INTO other (pad) SELECT 'x' FROM generate_series(1, 200)")
	}
	write(20)
	lastCommit := count(read(t, p, commits(20)))
	// The other table's last writes: the position moves past the last commit of t.
	var marked State
	deadline := time.Now().Add(30 * time.Second)
	for marked = p.Snapshot(); marked.LSN <= lastCommit; marked = p.Snapshot() {
		cs, err := p.Next(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if len(cs) > 0 {
			t.Fatalf("events after the last transaction of t: %v", cs)
		}
		if time.Now().After(deadline) {
			t.Fatalf("the position stayed at %s, the end of the last transaction of t, for 30 s", marked.LSN)
		}
		select {
		case <-p.Wait():
		case <-time.After(100 * time.Millisecond):
		}
	}
	if err := p.Commit(context.Background(), marked); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the slot to confirm the reported position", func() bool { return slot(t, conn, name).confirmed == marked.LSN })
	// More, read but not committed: the epoch is lost, the next run gets it again.
	write(10)
	read(t, p, commits(10))
	p.Close()

	write(10)
	p = build(t, cfg, &marked)
	if err := p.Commit(context.Background(), marked); err != nil {
		t.Fatal(err)
	}
	count(read(t, p, commits(20)))
	p.Close()
	if next != 81 {
		t.Fatalf("%d rows written, want 80", next-1)
	}
	for id := int32(1); id < next; id++ {
		if seen[id] != 1 {
			t.Fatalf("row %d seen %d times in the committed epochs of the two runs, the second resumed from %s", id, seen[id], marked.LSN)
		}
	}
}
