package main

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
)

// The tables' contents cannot show a change applied twice: an upsert written again leaves the
// row as it was. The fault tests therefore number the row versions. On the source, a trigger
// stamps every row version that an INSERT or UPDATE writes with a new number of a sequence
// (column ver), so that each change of a row carries its own number into the WAL. On the
// target, a trigger appends the key and the number of every row version written (by an
// INSERT, COPY or UPDATE) to a side table, in the order of writing; the side table is the
// target's own (nothing replicates it), and a transaction that is rolled back, prepared or
// not, takes its side rows with it.
//
// The sink collapses the changes of a key within an epoch into one write (an insert and two
// updates become one upsert of the last version), so the target writes fewer versions than
// the source made, and the per-key counts do not match. What must hold is that no version is
// written twice: an epoch written again after its prepared transaction was committed, or a
// change that a reconnected source emitted again, writes versions that the side table holds
// already. So each (key, version) appears once, and each key's versions rise in the order of
// writing. Together with the final comparison of the tables (every change arrived, the last
// version of each row among them) that is "each change applied exactly once".

// stampVersions adds the column ver to the source table items and the trigger that fills it.
func stampVersions(t *testing.T, src *pgx.Conn) {
	t.Helper()
	for _, q := range []string{
		"ALTER TABLE items ADD COLUMN ver bigint",
		"CREATE SEQUENCE item_versions",
		`CREATE FUNCTION stamp_version() RETURNS trigger LANGUAGE plpgsql AS $$
			BEGIN NEW.ver := nextval('item_versions'); RETURN NEW; END $$`,
		"CREATE TRIGGER stamp_version BEFORE INSERT OR UPDATE ON items FOR EACH ROW EXECUTE FUNCTION stamp_version()",
	} {
		mustExec(t, src, q)
	}
}

// recordVersions creates the target table items (as the source's, ver included) with the
// trigger that records every row version written in the side table written_versions.
func recordVersions(t *testing.T, tgt *pgx.Conn, columns string) {
	t.Helper()
	for _, q := range []string{
		"CREATE TABLE items (" + columns + ", ver bigint)",
		"CREATE TABLE written_versions (seq bigserial PRIMARY KEY, id int NOT NULL, ver bigint)",
		`CREATE FUNCTION record_version() RETURNS trigger LANGUAGE plpgsql AS $$
			BEGIN INSERT INTO written_versions (id, ver) VALUES (NEW.id, NEW.ver); RETURN NULL; END $$`,
		"CREATE TRIGGER record_version AFTER INSERT OR UPDATE ON items FOR EACH ROW EXECUTE FUNCTION record_version()",
	} {
		mustExec(t, tgt, q)
	}
}

// checkWrittenOnce fails the test when the target wrote a row version twice, or a key's
// versions out of order, and returns how many versions it wrote.
func checkWrittenOnce(t *testing.T, tgt *pgx.Conn) int {
	t.Helper()
	ctx := context.Background()
	var written, twice, backwards int
	var first *string
	err := tgt.QueryRow(ctx, `WITH w AS (SELECT id, ver, lag(ver) OVER (PARTITION BY id ORDER BY seq) AS prev FROM written_versions),
			d AS (SELECT id, ver, count(*) AS n FROM written_versions GROUP BY id, ver HAVING count(*) > 1)
		SELECT (SELECT count(*) FROM written_versions), (SELECT count(*) FROM d), (SELECT count(*) FROM w WHERE ver <= prev),
			(SELECT format('id=%s ver=%s written %s times', id, ver, n) FROM d ORDER BY id, ver LIMIT 1)`).
		Scan(&written, &twice, &backwards, &first)
	if err != nil {
		t.Fatalf("reading written_versions: %v", err)
	}
	if written == 0 {
		t.Fatal("the target recorded no row version: its trigger did not fire")
	}
	if twice > 0 || backwards > 0 {
		s := "none"
		if first != nil {
			s = *first
		}
		t.Fatalf("of %d row versions written to the target, %d were written more than once (the first: %s), and %d times a key's version did not rise: a change was applied twice",
			written, twice, s, backwards)
	}
	return written
}
