package pgrepl

import (
	"context"
	"database/sql/driver"
	"encoding/json"
	"fmt"
	"math"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgtype"
	"pgregory.net/rapid"
)

func mustTime(s string) time.Time {
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		panic(err)
	}
	return t
}

func numericText(t *testing.T, v any) string {
	t.Helper()
	n, ok := v.(pgtype.Numeric)
	if !ok {
		t.Fatalf("numeric decoded to %T, want pgtype.Numeric", v)
	}
	s, err := n.Value()
	if err != nil {
		t.Fatal(err)
	}
	return s.(string)
}

// Every type the package doc names decodes to its Go type, arrays (with NULL elements and
// more dimensions) to []any, other types to their text, and NULLs to nil.
func TestDecodeTypes(t *testing.T) {
	dsn, conn := newDB(t)
	name := slotName(t, conn)
	exec(t, conn, "SET timezone = 'UTC'")
	exec(t, conn, `CREATE TABLE types (id int PRIMARY KEY,
		b bool, i2 int2, i4 int4, i8 int8, f4 float4, f8 float8, n numeric, tx text, vc varchar(20), bp char(3),
		by bytea, u uuid, d date, ts timestamp, tz timestamptz, j json, jb jsonb,
		ab bool[], ai2 int2[], ai4 int4[], ai8 int8[], af4 float4[], af8 float8[], an numeric[], atx text[],
		avc varchar[], aby bytea[], au uuid[], ad date[], ats timestamp[], atz timestamptz[], aj json[], ajb jsonb[],
		m int4[], ip inet, iv interval, tinf timestamptz, dinf date)`)
	p := build(t, Config{DSN: dsn, Slot: name, Publication: "pub", Tables: []string{"types"}, CreateSlot: true, CreatePublication: true}, nil)
	defer p.Close()
	exec(t, conn, `INSERT INTO types VALUES (1,
		true, -32768, 2147483647, -9223372036854775808, 1.5, -2.25e-300, 12345678901234567890.000123, 'héllo "w"', 'vc', 'ab',
		'\x00ff10', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '2024-02-29', '2024-01-02 03:04:05.123456', '2024-01-02 03:04:05.5+02',
		'{"a": [1, 2.5, "x"]}', '{"b": {"c": null}}',
		'{t,f,NULL}', '{1,-2}', '{3,NULL,4}', '{5}', '{1.5,NaN}', '{Infinity,-Infinity}', '{1.10,NULL}', '{"a,b","c\"d","NULL",NULL,"","{x}"," s "}',
		'{v}', '{"\\x0102",NULL}', '{a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11}', '{2000-01-01}', '{"2000-01-01 00:00:00"}', '{"2000-01-01 00:00:00+00"}',
		ARRAY['{"k": 1}'::json], ARRAY['[1, 2]'::jsonb],
		'{{1,2},{3,4}}', '192.168.0.1/24', '1 day 02:00:00', 'infinity', '-infinity')`)
	exec(t, conn, "INSERT INTO types (id) VALUES (2)")
	got := read(t, p, commits(2))
	var rows [][]any
	var rel *Relation
	for _, c := range got {
		if c.Kind == Insert {
			rows = append(rows, c.New)
			rel = c.Relation
		}
	}
	if len(rows) != 2 {
		t.Fatalf("%d inserts, want 2", len(rows))
	}
	col := func(name string) any {
		i := rel.Index(name)
		if i < 0 {
			t.Fatalf("no column %s", name)
		}
		return rows[0][i]
	}
	u := [16]byte{0xa0, 0xee, 0xbc, 0x99, 0x9c, 0x0b, 0x4e, 0xf8, 0xbb, 0x6d, 0x6b, 0xb9, 0xbd, 0x38, 0x0a, 0x11}
	want := map[string]any{
		"id": int32(1), "b": true, "i2": int16(-32768), "i4": int32(2147483647), "i8": int64(math.MinInt64),
		"f4": float32(1.5), "f8": -2.25e-300, "tx": `héllo "w"`, "vc": "vc", "bp": "ab ",
		"by": []byte{0, 0xff, 0x10}, "u": u,
		"d": mustTime("2024-02-29T00:00:00Z"), "ts": mustTime("2024-01-02T03:04:05.123456Z"), "tz": mustTime("2024-01-02T01:04:05.5Z"),
		"j": json.RawMessage(`{"a": [1, 2.5, "x"]}`), "jb": json.RawMessage(`{"b": {"c": null}}`),
		"ab": []any{true, false, nil}, "ai2": []any{int16(1), int16(-2)}, "ai4": []any{int32(3), nil, int32(4)},
		"ai8": []any{int64(5)}, "af8": []any{math.Inf(1), math.Inf(-1)},
		"atx": []any{"a,b", `c"d`, "NULL", nil, "", "{x}", " s "}, "avc": []any{"v"},
		"aby": []any{[]byte{1, 2}, nil}, "au": []any{u}, "ad": []any{mustTime("2000-01-01T00:00:00Z")},
		"ats": []any{mustTime("2000-01-01T00:00:00Z")}, "atz": []any{mustTime("2000-01-01T00:00:00Z")},
		"aj": []any{json.RawMessage(`{"k": 1}`)}, "ajb": []any{json.RawMessage(`[1, 2]`)},
		"m":  []any{[]any{int32(1), int32(2)}, []any{int32(3), int32(4)}},
		"ip": "192.168.0.1/24", "iv": "1 day 02:00:00",
		"tinf": pgtype.Infinity, "dinf": pgtype.NegativeInfinity,
	}
	for name, w := range want {
		g := col(name)
		if wt, ok := w.(time.Time); ok {
			if gt, ok := g.(time.Time); !ok || !gt.Equal(wt) {
				t.Errorf("%s = %#v, want %v", name, g, wt)
			}
			continue
		}
		if !reflect.DeepEqual(normTimes(g), normTimes(w)) {
			t.Errorf("%s = %#v (%T), want %#v (%T)", name, g, g, w, w)
		}
	}
	if s := numericText(t, col("n")); s != "12345678901234567890.000123" {
		t.Errorf("n = %s", s)
	}
	af4 := col("af4").([]any)
	if af4[0] != float32(1.5) || !math.IsNaN(float64(af4[1].(float32))) {
		t.Errorf("af4 = %v", af4)
	}
	an := col("an").([]any)
	if len(an) != 2 || an[1] != nil || numericText(t, an[0]) != "1.10" {
		t.Errorf("an = %v", an)
	}
	for i, v := range rows[1] {
		if i > 0 && v != nil {
			t.Errorf("column %s of the NULL row = %#v, want nil", rel.Columns[i].Name, v)
		}
	}
	for _, c := range rel.Columns {
		if (c.Name == "id") != c.Key {
			t.Errorf("column %s: Key = %v", c.Name, c.Key)
		}
	}
	if rel.Columns[rel.Index("i4")].TypeName != "int4" {
		t.Errorf("type name of i4: %q", rel.Columns[rel.Index("i4")].TypeName)
	}
}

// normTimes makes times comparable with DeepEqual (same instant, same location).
func normTimes(v any) any {
	switch x := v.(type) {
	case time.Time:
		return x.UTC()
	case []any:
		out := make([]any, len(x))
		for i := range x {
			out[i] = normTimes(x[i])
		}
		return out
	}
	return v
}

// Random values of the common types survive the trip through Postgres and pgoutput.
func TestDecodeRoundTripProperty(t *testing.T) {
	dsn, conn := newDB(t)
	name := slotName(t, conn)
	exec(t, conn, "CREATE TABLE r (id int PRIMARY KEY, i8 int8, f8 float8, s text, by bytea, b bool, ai int4[], at text[], n numeric)")
	p := build(t, Config{DSN: dsn, Slot: name, Publication: "pub", Tables: []string{"r"}, CreateSlot: true, CreatePublication: true}, nil)
	defer p.Close()
	noNUL := func(s string) bool { return !strings.ContainsRune(s, 0) }
	text := rapid.String().Filter(noNUL)
	id := 0
	rapid.Check(t, func(rt *rapid.T) {
		type row struct {
			i8 int64
			f8 float64
			s  string
			by []byte
			b  *bool
			ai []*int32
			at []*string
			n  int64
		}
		rows := rapid.SliceOfN(rapid.Custom(func(rt *rapid.T) row {
			r := row{i8: rapid.Int64().Draw(rt, "i8"), f8: rapid.Float64().Draw(rt, "f8"), s: text.Draw(rt, "s"),
				by: rapid.SliceOf(rapid.Byte()).Draw(rt, "by"), n: rapid.Int64().Draw(rt, "n")}
			if rapid.Bool().Draw(rt, "bnull") {
				b := rapid.Bool().Draw(rt, "b")
				r.b = &b
			}
			r.ai = rapid.SliceOfN(rapid.Ptr(rapid.Int32(), true), 0, 5).Draw(rt, "ai")
			r.at = rapid.SliceOfN(rapid.Ptr(text, true), 0, 5).Draw(rt, "at")
			return r
		}), 1, 20).Draw(rt, "rows")
		ctx := context.Background()
		tx, err := conn.Begin(ctx)
		if err != nil {
			rt.Fatal(err)
		}
		first := id + 1
		for _, r := range rows {
			id++
			if _, err := tx.Exec(ctx, "INSERT INTO r VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
				id, r.i8, r.f8, r.s, r.by, r.b, r.ai, r.at, fmt.Sprint(r.n)); err != nil {
				rt.Fatal(err)
			}
		}
		if err := tx.Commit(ctx); err != nil {
			rt.Fatal(err)
		}
		got := read(t, p, commits(1))
		i := 0
		for _, c := range got {
			if c.Kind != Insert {
				continue
			}
			r := rows[i]
			v := c.New
			if v[0] != int32(first+i) || v[1] != r.i8 || v[3] != r.s || v[2] != r.f8 && !(math.IsNaN(r.f8) && math.IsNaN(v[2].(float64))) {
				rt.Fatalf("row %d: got %#v, want %+v", first+i, v, r)
			}
			if !reflect.DeepEqual(v[4], append([]byte{}, r.by...)) {
				rt.Fatalf("bytea: got %#v, want %#v", v[4], r.by)
			}
			if (r.b == nil) != (v[5] == nil) || (r.b != nil && v[5] != *r.b) {
				rt.Fatalf("bool: got %#v, want %v", v[5], r.b)
			}
			if r.ai == nil { // pgx sends a nil slice as NULL
				if v[6] != nil {
					rt.Fatalf("int4[]: got %#v, want NULL", v[6])
				}
			} else {
				ai := v[6].([]any)
				if len(ai) != len(r.ai) {
					rt.Fatalf("int4[]: got %#v, want %d elements", ai, len(r.ai))
				}
				for k, e := range r.ai {
					if (e == nil) != (ai[k] == nil) || (e != nil && ai[k] != *e) {
						rt.Fatalf("int4[] element %d: got %#v, want %v", k, ai[k], e)
					}
				}
			}
			if r.at != nil {
				at := v[7].([]any)
				if len(at) != len(r.at) {
					rt.Fatalf("text[]: got %#v, want %d elements", at, len(r.at))
				}
				for k, e := range r.at {
					if (e == nil) != (at[k] == nil) || (e != nil && at[k] != *e) {
						rt.Fatalf("text[] element %d: got %#v, want %q", k, at[k], *e)
					}
				}
			}
			nv, _ := v[8].(pgtype.Numeric).Value()
			if nv != driver.Value(fmt.Sprint(r.n)) {
				rt.Fatalf("numeric: got %v, want %d", nv, r.n)
			}
			i++
		}
		if i != len(rows) {
			rt.Fatalf("%d inserts, want %d", i, len(rows))
		}
	})
}

// Unchanged TOASTed values are UnchangedToast{}, not nil; old keys and rows follow the replica
// identity; a column added while the source runs shows in the events after the ALTER.
func TestToastReplicaIdentityAlter(t *testing.T) {
	dsn, conn := newDB(t)
	name := slotName(t, conn)
	exec(t, conn, "CREATE TABLE d (id int PRIMARY KEY, small text, big text)")
	exec(t, conn, "CREATE TABLE f (id int PRIMARY KEY, small text)")
	exec(t, conn, "ALTER TABLE f REPLICA IDENTITY FULL")
	p := build(t, Config{DSN: dsn, Slot: name, Publication: "pub", Tables: []string{"d", "f"}, CreateSlot: true, CreatePublication: true}, nil)
	defer p.Close()

	big := "SELECT string_agg(md5(g::text || random()::text), '') FROM generate_series(1, 2000) g" // 64 KB, stored out of line
	exec(t, conn, "INSERT INTO d VALUES (1, 'a', ("+big+")), (2, 'b', NULL)")
	exec(t, conn, "UPDATE d SET small = 'a2' WHERE id = 1") // big unchanged: not sent
	exec(t, conn, "UPDATE d SET id = 3 WHERE id = 2")       // key change: old key sent
	exec(t, conn, "DELETE FROM d WHERE id = 3")
	exec(t, conn, "INSERT INTO f VALUES (1, 'x')")
	exec(t, conn, "UPDATE f SET small = 'y' WHERE id = 1")
	exec(t, conn, "DELETE FROM f WHERE id = 1")
	got := read(t, p, commits(7))
	var ch []Change
	for _, c := range got {
		if c.Kind != Begin && c.Kind != Commit {
			ch = append(ch, c)
		}
	}
	if len(ch) != 8 {
		t.Fatalf("%d changes, want 8: %v", len(ch), ch)
	}
	bigLen := len(ch[0].New[2].(string))
	if bigLen != 64000 {
		t.Fatalf("inserted big value has %d bytes", bigLen)
	}
	if u := ch[2]; u.Kind != Update || u.New[1] != "a2" || u.New[2] != (UnchangedToast{}) || u.OldKind != NoOld || u.Old != nil {
		t.Errorf("update leaving the TOASTed value: %+v", u)
	}
	if u := ch[3]; u.Kind != Update || u.OldKind != OldKey || u.Old[0] != int32(2) || u.New[0] != int32(3) || u.New[2] != nil {
		t.Errorf("key-changing update: %+v", u)
	}
	if d := ch[4]; d.Kind != Delete || d.OldKind != OldKey || d.Old[0] != int32(3) || d.Old[1] != nil {
		t.Errorf("delete under replica identity default: %+v", d)
	}
	if ch[5].Relation.ReplicaIdentity != IdentityFull || ch[0].Relation.ReplicaIdentity != IdentityDefault {
		t.Errorf("replica identities %c and %c", ch[5].Relation.ReplicaIdentity, ch[0].Relation.ReplicaIdentity)
	}
	if u := ch[6]; u.Kind != Update || u.OldKind != OldRow || !reflect.DeepEqual(u.Old, []any{int32(1), "x"}) || !reflect.DeepEqual(u.New, []any{int32(1), "y"}) {
		t.Errorf("update under replica identity full: %+v", u)
	}
	if d := ch[7]; d.Kind != Delete || d.OldKind != OldRow || !reflect.DeepEqual(d.Old, []any{int32(1), "y"}) {
		t.Errorf("delete under replica identity full: %+v", d)
	}

	// ALTER TABLE while the source runs.
	exec(t, conn, "ALTER TABLE d ADD COLUMN extra int DEFAULT 7")
	exec(t, conn, "INSERT INTO d (id, small) VALUES (10, 'n')")
	exec(t, conn, "UPDATE d SET small = 'a3' WHERE id = 1")
	exec(t, conn, "TRUNCATE d")
	exec(t, conn, "SELECT pg_logical_emit_message(true, 'app', 'hello')")
	got = read(t, p, commits(4))
	ch = ch[:0]
	for _, c := range got {
		if c.Kind != Begin && c.Kind != Commit {
			ch = append(ch, c)
		}
	}
	if len(ch) != 4 {
		t.Fatalf("%d changes after the ALTER, want 4: %v", len(ch), ch)
	}
	if n := len(ch[0].Relation.Columns); n != 4 || ch[0].New[3] != int32(7) {
		t.Errorf("insert after ADD COLUMN: %d columns, values %v", n, ch[0].New)
	}
	if ch[1].New[3] != int32(7) || ch[1].New[2] != (UnchangedToast{}) {
		t.Errorf("update after ADD COLUMN: %v", ch[1].New)
	}
	if len(got[1].Relation.Columns) != 4 {
		t.Errorf("relation of the insert: %d columns", len(got[1].Relation.Columns))
	}
	// Earlier events keep the relation they were decoded with.
	if n := len(ch[0].Relation.Columns); n == 3 {
		t.Error("new relation has 3 columns")
	}
	if tr := ch[2]; tr.Kind != Truncate || len(tr.Truncated) != 1 || tr.Truncated[0].Table != "d" {
		t.Errorf("truncate: %+v", tr)
	}
	if m := ch[3]; m.Kind != Message || m.Prefix != "app" || string(m.Content) != "hello" {
		t.Errorf("message: %+v", m)
	}
}

// Bad configuration and missing or wrong objects fail Build (or Parts) with an error that
// names the object.
func TestBadInput(t *testing.T) {
	dsn, conn := newDB(t)
	exec(t, conn, "CREATE TABLE t (id int PRIMARY KEY)")
	exec(t, conn, "CREATE TABLE other (id int PRIMARY KEY)")
	exec(t, conn, "CREATE PUBLICATION narrow FOR TABLE other")
	other := slotName(t, conn)
	exec(t, conn, "SELECT pg_create_logical_replication_slot($1, 'test_decoding')", other)
	good := slotName(t, conn)
	exec(t, conn, "SELECT pg_create_logical_replication_slot($1, 'pgoutput')", good)
	cases := []struct {
		name string
		cfg  Config
		want string
	}{
		{"no dsn", Config{Slot: good, Publication: "narrow"}, "Config.DSN"},
		{"bad slot name", Config{DSN: dsn, Slot: "Bad-Name", Publication: "narrow"}, `Config.Slot "Bad-Name"`},
		{"no publication name", Config{DSN: dsn, Slot: good}, "Config.Publication"},
		{"missing table", Config{DSN: dsn, Slot: good, Publication: "narrow", Tables: []string{"nope"}}, `table "nope" does not exist`},
		{"table not covered", Config{DSN: dsn, Slot: good, Publication: "narrow", Tables: []string{"t"}}, `publication "narrow" does not cover table "t"`},
		{"missing publication", Config{DSN: dsn, Slot: good, Publication: "nopub"}, `publication "nopub" does not exist`},
		{"missing slot", Config{DSN: dsn, Slot: "noslot", Publication: "narrow"}, `replication slot "noslot" does not exist`},
		{"other plugin", Config{DSN: dsn, Slot: other, Publication: "narrow"}, `uses the plugin "test_decoding", want pgoutput`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := NewSource(c.cfg)
			_, err := s.Parts(context.Background())
			if err == nil {
				_, err = s.Build(context.Background(), "slot/"+c.cfg.Slot, nil)
			}
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want one containing %q", err, c.want)
			}
		})
	}
}
