package pgrepl

import (
	"context"
	"fmt"
	"reflect"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// applyAsUpserts applies changes to a model of table (id int, v text) keyed by id, the way an
// upserting sink does, and returns it.
func applyAsUpserts(t *testing.T, model map[int32]string, cs []Change) {
	t.Helper()
	for _, c := range cs {
		switch c.Kind {
		case Insert, Update:
			model[c.New[0].(int32)] = c.New[1].(string)
		case Delete:
			delete(model, c.Old[0].(int32))
		case Truncate:
			clear(model)
		}
	}
}

// dumpTable returns the source table as id -> v.
func dumpTable(t *testing.T, dsn string) map[int32]string {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	rows, err := conn.Query(context.Background(), "SELECT id, v FROM t")
	if err != nil {
		t.Fatal(err)
	}
	out := map[int32]string{}
	for rows.Next() {
		var id int32
		var v string
		if err := rows.Scan(&id, &v); err != nil {
			t.Fatal(err)
		}
		out[id] = v
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// Rows that were in the table before the slot existed come first, as Inserts marked FromCopy,
// with the relation described as the stream describes it; changes made after the copy's
// snapshot follow from the slot; applied as upserts, the whole converges to the table. A run
// resumed from a state taken in the middle of the copy copies again.
func TestInitialCopy(t *testing.T) {
	dsn, conn := newDB(t)
	name := slotName(t, conn)
	exec(t, conn, "CREATE TABLE t (id int PRIMARY KEY, v text)")
	exec(t, conn, "INSERT INTO t SELECT g, 'old ' || g FROM generate_series(1, 3000) g")
	cfg := Config{DSN: dsn, Slot: name, Publication: "pub", Tables: []string{"t"}, CreateSlot: true,
		CreatePublication: true, InitialCopy: true, MaxBuffered: 500}
	p := build(t, cfg, nil)
	// An epoch commits with the start state (the run that resumes from mid below had its
	// epochs committed): the slot this run created is kept.
	if err := p.Commit(context.Background(), p.Snapshot()); err != nil {
		t.Fatal(err)
	}
	if s := p.Snapshot(); !s.Copying {
		t.Fatalf("state before the copy: %+v, want Copying", s)
	}
	// Writes while the copy runs (it waits for room: MaxBuffered is 500).
	exec(t, conn, "UPDATE t SET v = 'new' WHERE id <= 10")
	exec(t, conn, "DELETE FROM t WHERE id BETWEEN 11 AND 20")
	exec(t, conn, "INSERT INTO t VALUES (5000, 'added')")
	midCopy := read(t, p, func(cs []Change) bool { return len(cs) >= 1000 })
	mid := p.Snapshot()
	if !mid.Copying {
		t.Fatalf("state after %d copied rows: %+v, want Copying", len(midCopy), mid)
	}
	got := append(midCopy, read(t, p, commits(3))...)
	p.Close()

	if !got[0].FromCopy || got[0].Kind != Truncate || len(got[0].Truncated) != 1 || got[0].Truncated[0].Table != "t" {
		t.Fatalf("the copy began with %+v, want a Truncate of t", got[0])
	}
	copied := 0
	for i, c := range got[1:] {
		if !c.FromCopy {
			break
		}
		copied = i + 1
		if c.Kind != Insert || c.Relation.Schema != "public" || c.Relation.Table != "t" || c.Xid != 0 ||
			!reflect.DeepEqual(c.Relation.KeyColumns(), []string{"id"}) || c.Relation.Columns[1].TypeName != "text" {
			t.Fatalf("copied change %d: %+v (relation %+v)", i, c, c.Relation)
		}
	}
	if copied < 2990 {
		t.Fatalf("%d rows came from the copy, want the 2990 to 3001 in the table when it read", copied)
	}
	for _, c := range got[1+copied:] {
		if c.FromCopy {
			t.Fatal("a copied row after the stream began")
		}
	}
	model := map[int32]string{}
	applyAsUpserts(t, model, got)
	if want := dumpTable(t, dsn); !reflect.DeepEqual(model, want) {
		t.Fatalf("copy + stream applied as upserts: %d rows, the table has %d", len(model), len(want))
	}

	// Resuming from the state taken mid-copy copies again (the earlier copy's epochs may not
	// have committed), then streams from the slot.
	exec(t, conn, "UPDATE t SET v = 'later' WHERE id = 1")
	p = build(t, cfg, &mid)
	defer p.Close()
	// The stream restarts at the slot's position: the three transactions of the first run,
	// then the new one.
	again := read(t, p, commits(4))
	n := 0
	for _, c := range again {
		if c.FromCopy && c.Kind == Insert {
			n++
		}
	}
	if n != len(model) {
		t.Errorf("the resumed copy emitted %d rows, want %d", n, len(model))
	}
	if s := p.Snapshot(); s.Copying {
		t.Errorf("state after the copy and a commit: %+v", s)
	}
	// Applied on top of what the first run wrote (with a row that is gone from the table
	// since), the resumed copy's Truncate clears it.
	model[424242] = "stale"
	applyAsUpserts(t, model, again)
	if want := dumpTable(t, dsn); !reflect.DeepEqual(model, want) {
		t.Errorf("after the resumed copy: %d rows, the table has %d", len(model), len(want))
	}
	var keys []int
	for _, c := range again {
		if !c.FromCopy && c.Kind == Update {
			keys = append(keys, int(c.New[0].(int32)))
		}
	}
	sort.Ints(keys)
	if fmt.Sprint(keys) != "[1 1 2 3 4 5 6 7 8 9 10]" {
		t.Errorf("updates streamed after the resumed copy: %v, want ids 1-10 and 1 again", keys)
	}
}

// InitialCopy needs the tables to copy.
func TestInitialCopyNeedsTables(t *testing.T) {
	_, err := NewSource(Config{DSN: "postgres://x", Slot: "s", Publication: "p", InitialCopy: true}).Parts(context.Background())
	if err == nil || !strings.Contains(err.Error(), "InitialCopy needs Config.Tables") {
		t.Fatalf("got %v", err)
	}
}

// Close in the middle of a copy (the queue full, the copy waiting for room) ends it at once,
// without starting replication and leaving no goroutine behind (TestMain checks with goleak).
func TestCloseDuringInitialCopy(t *testing.T) {
	dsn, conn := newDB(t)
	name := slotName(t, conn)
	exec(t, conn, "CREATE TABLE t (id int PRIMARY KEY, v text)")
	exec(t, conn, "INSERT INTO t SELECT g, 'x' FROM generate_series(1, 20000) g")
	p := build(t, Config{DSN: dsn, Slot: name, Publication: "pub", Tables: []string{"t"}, CreateSlot: true,
		CreatePublication: true, InitialCopy: true, MaxBuffered: 100}, nil)
	if err := p.Commit(context.Background(), p.Snapshot()); err != nil { // an epoch committed: the slot stays
		t.Fatal(err)
	}
	read(t, p, func(cs []Change) bool { return len(cs) >= 150 })
	done := make(chan error, 1)
	go func() { done <- p.Close() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not return within 10 s during the copy")
	}
	if s := slot(t, conn, name); s.active {
		t.Error("the slot is active after Close: replication started during the copy")
	}
}

// A partitioned table: its rows, in every partition, are copied as the table's, and the changes
// of its partitions stream as the table's too (the publication CreatePublication makes
// publishes via the partition root). A publication that does not is refused, naming the table
// and the setting, rather than copying nothing from a parent that holds no rows itself.
func TestInitialCopyPartitioned(t *testing.T) {
	dsn, conn := newDB(t)
	name := slotName(t, conn)
	exec(t, conn, "CREATE TABLE m (id int PRIMARY KEY, v text) PARTITION BY RANGE (id)")
	exec(t, conn, "CREATE TABLE m_low PARTITION OF m FOR VALUES FROM (0) TO (100)")
	exec(t, conn, "CREATE TABLE m_high PARTITION OF m FOR VALUES FROM (100) TO (1000)")
	exec(t, conn, "INSERT INTO m SELECT g, 'old' FROM generate_series(1, 300) g")

	exec(t, conn, "CREATE PUBLICATION leafpub FOR TABLE m")
	_, err := NewSource(Config{DSN: dsn, Slot: name, Publication: "leafpub", Tables: []string{"m"}, CreateSlot: true, InitialCopy: true}).
		Build(context.Background(), "slot/"+name, nil)
	if err == nil || !strings.Contains(err.Error(), `table "m" is partitioned`) || !strings.Contains(err.Error(), "publish_via_partition_root") {
		t.Fatalf("Build with a publication that streams partitions: %v, want an error naming the table and publish_via_partition_root", err)
	}

	p := build(t, Config{DSN: dsn, Slot: name, Publication: "rootpub", Tables: []string{"m"}, CreateSlot: true,
		CreatePublication: true, InitialCopy: true}, nil)
	defer p.Close()
	exec(t, conn, "INSERT INTO m VALUES (500, 'new')")
	exec(t, conn, "UPDATE m SET v = 'changed' WHERE id = 5")
	got := read(t, p, commits(2))
	copied := map[int32]bool{}
	streamed := 0
	for _, c := range got {
		if c.Relation == nil {
			continue
		}
		if c.Relation.Table != "m" {
			t.Fatalf("a change of relation %s, want every one as m's: %+v", c.Relation.Name(), c)
		}
		if c.FromCopy {
			copied[c.New[0].(int32)] = true
		} else {
			streamed++
		}
	}
	// The two writes may be in the copy's snapshot too (they race with it); the 300 rows of
	// both partitions must be.
	for id := int32(1); id <= 300; id++ {
		if !copied[id] {
			t.Fatalf("row %d (partition %s) was not copied; %d rows were", id, map[bool]string{true: "m_low", false: "m_high"}[id < 100], len(copied))
		}
	}
	if streamed != 2 {
		t.Fatalf("%d changes streamed, want the insert and the update", streamed)
	}
}
