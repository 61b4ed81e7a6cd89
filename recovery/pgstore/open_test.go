package pgstore

import (
	"context"
	"errors"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/epochflow/epochflow/recovery"
)

// exec runs statements on the tests' database.
func exec(t testing.TB, stmts ...string) {
	t.Helper()
	ctx := context.Background()
	c, err := pgx.Connect(ctx, testDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	for _, q := range stmts {
		if _, err := c.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
}

// A store is refused when its schema holds something else, another schema version, or lacks
// a table; a refused read-write open leaves the lock free.
func TestOpenRefusals(t *testing.T) {
	ctx := context.Background()
	store := func(edit ...string) func(t *testing.T, schema string) {
		return func(t *testing.T, schema string) {
			s := open(t, schema, Options{})
			if _, err := s.Begin(ctx, recovery.Execution{Flow: "f", Workers: 1}); err != nil {
				t.Fatal(err)
			}
			s.Close()
			for i := range edit {
				edit[i] = strings.ReplaceAll(edit[i], "SCHEMA.", schema+".")
			}
			exec(t, edit...)
		}
	}
	cases := []struct {
		name  string
		setup func(t *testing.T, schema string)
		opts  Options
		is    error
		msg   string
	}{
		{"newer schema", store(`UPDATE SCHEMA.meta SET value = 7 WHERE name = 'schema_version'`), Options{},
			recovery.ErrSchemaVersion, "has schema version 7, this binary knows 1: use a newer binary, or another schema"},
		{"newer schema read-only", store(`UPDATE SCHEMA.meta SET value = 7 WHERE name = 'schema_version'`), Options{ReadOnly: true},
			recovery.ErrSchemaVersion, "has schema version 7"},
		{"schema version 0", store(`UPDATE SCHEMA.meta SET value = 0 WHERE name = 'schema_version'`), Options{},
			recovery.ErrNotStore, "which no epochflow release wrote"},
		{"no schema version", store(`DELETE FROM SCHEMA.meta WHERE name = 'schema_version'`), Options{},
			recovery.ErrNotStore, "has no schema_version"},
		{"missing table", store(`DROP TABLE SCHEMA.chunks`), Options{},
			recovery.ErrNotStore, "lacks table(s) chunks"},
		{"another application's schema", func(t *testing.T, schema string) {
			exec(t, `CREATE SCHEMA `+schema, `CREATE TABLE `+schema+`.users (name text)`)
		}, Options{}, recovery.ErrNotStore, "holds tables (users) but not epochflow's meta table"},
		{"read-only without store", func(t *testing.T, schema string) {}, Options{ReadOnly: true}, recovery.ErrNoStore, ""},
		{"read-only of an empty schema", func(t *testing.T, schema string) { exec(t, `CREATE SCHEMA `+schema) },
			Options{ReadOnly: true}, recovery.ErrNoStore, ""},
		{"negative backup interval", store(), Options{BackupInterval: -time.Second}, nil, "negative BackupInterval"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			schema := newSchema()
			c.setup(t, schema)
			opts := c.opts
			opts.Schema = schema
			s, err := Open(ctx, testDSN(t), opts)
			if err == nil {
				s.Close()
				t.Fatalf("Open succeeded")
			}
			if (c.is != nil && !errors.Is(err, c.is)) || !strings.Contains(err.Error(), c.msg) || !strings.Contains(err.Error(), "(schema "+schema+")") {
				t.Errorf("Open: %v\nwant an error wrapping %v, naming schema %s, containing %q", err, c.is, schema, c.msg)
			}
			if !c.opts.ReadOnly && c.opts.BackupInterval >= 0 {
				// The lock is free: a store whose schema is fixed opens at once.
				exec(t, `DROP SCHEMA IF EXISTS `+schema+` CASCADE`)
				open(t, schema, Options{}).Close()
			}
		})
	}
	// An empty schema (made by an administrator, say) is a new store's.
	schema := newSchema()
	exec(t, `CREATE SCHEMA `+schema)
	open(t, schema, Options{}).Close()
	open(t, schema, Options{ReadOnly: true}).Close()
}

// The store's name, in every error, has the DSN without its password; the schema may be a
// parameter of the DSN URL, which must then agree with Options.Schema.
func TestNamesAndSchemaParameter(t *testing.T) {
	ctx := context.Background()
	u, err := url.Parse(testDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword("postgres", "s3cret") // trust authentication takes any password
	q := u.Query()
	q.Set("schema", "From Param")
	u.RawQuery = q.Encode()
	s, err := Open(ctx, u.String(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if s.Schema() != "From Param" || strings.Contains(s.Name(), "s3cret") || !strings.Contains(s.Name(), "postgres@127.0.0.1") ||
		!strings.Contains(s.Name(), "(schema From Param)") || strings.Contains(s.Name(), "schema=") {
		t.Errorf("schema %q, name %q", s.Schema(), s.Name())
	}
	if _, err := Open(ctx, u.String(), Options{}); !errors.Is(err, recovery.ErrInUse) || strings.Contains(err.Error(), "s3cret") {
		t.Errorf("second writer: %v, want ErrInUse without the password", err)
	}
	if _, err := Open(ctx, u.String(), Options{Schema: "other"}); err == nil || !strings.Contains(err.Error(), `differs from Options.Schema "other"`) {
		t.Errorf("Open with two schemas: %v", err)
	}

	for dsn, want := range map[string]string{
		"postgres://u:pw@h:5/db?sslmode=disable":              "postgres://u@h:5/db?sslmode=disable",
		"postgresql://u@h/db?password=pw":                     "postgresql://u@h/db?password=xxxxx",
		"host=h user=u password=pw dbname=db":                 "host=h user=u password=xxxxx dbname=db",
		"host=h password='p w' dbname=db":                     "host=h password=xxxxx dbname=db",
		"postgres://u:pw@h:5/db?sslmode=disable&schema=x%20y": "postgres://u@h:5/db?sslmode=disable&schema=x%20y",
	} {
		if got := redact(dsn); got != want {
			t.Errorf("redact(%q) = %q, want %q", dsn, got, want)
		}
	}
	// A DSN that does not parse is refused without quoting its password.
	if _, err := Open(ctx, "postgres://u:s3cret@h:notaport/db", Options{}); err == nil || strings.Contains(err.Error(), "s3cret") {
		t.Errorf("Open of a malformed DSN: %v", err)
	}
}
