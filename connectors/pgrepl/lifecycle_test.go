package pgrepl

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
)

// count returns the number of rows of a query's single count(*) result.
func count(t testing.TB, conn *pgx.Conn, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := conn.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

func slotAndPub(t testing.TB, conn *pgx.Conn, slot, pub string) (slots, pubs int) {
	t.Helper()
	return count(t, conn, "SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1", slot),
		count(t, conn, "SELECT count(*) FROM pg_publication WHERE pubname = $1", pub)
}

// A run that created its slot and publication and ends before any epoch was committed (a
// start that failed elsewhere in the flow: the engine closes the source without a Commit)
// drops both: a slot left behind would hold the server's WAL for good. A run with a committed
// epoch keeps them, and a run that found them existing never drops them.
func TestFailedStartDropsWhatItCreated(t *testing.T) {
	dsn, conn := newDB(t)
	name := slotName(t, conn)
	exec(t, conn, "CREATE TABLE t (id int PRIMARY KEY)")
	cfg := Config{DSN: dsn, Slot: name, Publication: "pub", Tables: []string{"t"}, CreateSlot: true, CreatePublication: true}

	p := build(t, cfg, nil)
	if s, pb := slotAndPub(t, conn, name, "pub"); s != 1 || pb != 1 {
		t.Fatalf("after Build: %d slots, %d publications", s, pb)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if s, pb := slotAndPub(t, conn, name, "pub"); s != 0 || pb != 0 {
		t.Fatalf("a run that created them and committed no epoch left %d slots and %d publications behind", s, pb)
	}

	// With a committed epoch they stay.
	p = build(t, cfg, nil)
	if err := p.Commit(context.Background(), p.Snapshot()); err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if s, pb := slotAndPub(t, conn, name, "pub"); s != 1 || pb != 1 {
		t.Fatalf("after a run with a committed epoch: %d slots, %d publications, want both kept", s, pb)
	}

	// Found existing: kept, though no epoch committed.
	p = build(t, cfg, nil)
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if s, pb := slotAndPub(t, conn, name, "pub"); s != 1 || pb != 1 {
		t.Fatalf("after a run that found them: %d slots, %d publications, want both kept", s, pb)
	}
}

// What can be checked is checked before the publication and the slot are created: a table
// without a replica identity (for which a publication would make the source server refuse
// UPDATE and DELETE), a resume whose slot is gone; and a start that fails creating the slot
// (a user without the REPLICATION attribute) drops the publication it created. Nothing is
// left by a start that fails so.
func TestChecksBeforeCreating(t *testing.T) {
	dsn, conn := newDB(t)
	ctx := context.Background()
	exec(t, conn, "CREATE TABLE keyed (id int PRIMARY KEY)")
	exec(t, conn, "CREATE TABLE nokey (v text)")
	name := slotName(t, conn)
	cfg := Config{DSN: dsn, Slot: name, Publication: "pub", Tables: []string{"keyed", "nokey"}, CreateSlot: true, CreatePublication: true}
	_, err := NewSource(cfg).Build(ctx, "slot/"+name, nil)
	if err == nil || !strings.Contains(err.Error(), `table "nokey" has no replica identity`) || !strings.Contains(err.Error(), "REPLICA IDENTITY FULL") {
		t.Fatalf("a table without replica identity: %v", err)
	}
	if s, pb := slotAndPub(t, conn, name, "pub"); s != 0 || pb != 0 {
		t.Fatalf("the failed start left %d slots and %d publications", s, pb)
	}
	// The source server still takes updates of the table.
	exec(t, conn, "INSERT INTO nokey VALUES ('a')")
	exec(t, conn, "UPDATE nokey SET v = 'b'")

	// A user who may create the publication (the tables' owner) but not replicate: the slot
	// cannot be created, and the publication created before it is dropped again.
	exec(t, conn, "CREATE ROLE norepl LOGIN")
	exec(t, conn, "GRANT CREATE ON DATABASE "+pgx.Identifier{conn.Config().Database}.Sanitize()+" TO norepl")
	exec(t, conn, "ALTER TABLE keyed OWNER TO norepl")
	c := cfg
	c.Tables = []string{"keyed"}
	c.DSN = strings.Replace(dsn, "postgres://postgres@", "postgres://norepl@", 1)
	_, err = NewSource(c).Build(ctx, "slot/"+name, nil)
	if err == nil || !strings.Contains(err.Error(), "creating replication slot") {
		t.Fatalf("a user without REPLICATION: %v", err)
	}
	if s, pb := slotAndPub(t, conn, name, "pub"); s != 0 || pb != 0 {
		t.Fatalf("the failed start left %d slots and %d publications", s, pb)
	}

	c = cfg
	c.Tables = []string{"keyed"}
	_, err = NewSource(c).Build(ctx, "slot/"+name, &State{LSN: 0x1000000})
	if err == nil || !strings.Contains(err.Error(), "does not exist") || !strings.Contains(err.Error(), "resumes from") {
		t.Fatalf("a resume whose slot is gone: %v", err)
	}
	if s, pb := slotAndPub(t, conn, name, "pub"); s != 0 || pb != 0 {
		t.Fatalf("the failed resume left %d slots and %d publications", s, pb)
	}
}

// Errors name what the program's user can change: FlagNames replaces "Config.FIELD".
func TestErrorsNameFlags(t *testing.T) {
	names := map[string]string{"Slot": "-slot", "Publication": "-publication", "DSN": "-source"}
	_, err := NewSource(Config{DSN: "postgres://x", Slot: "Bad-Name", Publication: "p", FlagNames: names}).Parts(context.Background())
	if err == nil || !strings.Contains(err.Error(), `-slot "Bad-Name"`) || strings.Contains(err.Error(), "Config.") {
		t.Fatalf("bad slot name: %v", err)
	}
	_, err = NewSource(Config{DSN: "postgres://x", Slot: "s", FlagNames: names}).Parts(context.Background())
	if err == nil || !strings.Contains(err.Error(), "-publication is empty") {
		t.Fatalf("no publication: %v", err)
	}
	_, err = NewSource(Config{DSN: "postgres://x", Slot: "Bad-Name", Publication: "p"}).Parts(context.Background())
	if err == nil || !strings.Contains(err.Error(), `Config.Slot "Bad-Name"`) {
		t.Fatalf("without FlagNames: %v", err)
	}
}
