package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/epochflow/epochflow/internal/pgtest"
	"github.com/epochflow/epochflow/recovery"
	"github.com/epochflow/epochflow/recovery/pgstore"
)

// recovery inspect takes the postgres:// URL of a PostgreSQL store, as -recovery does, and
// prints it as it prints a SQLite store (named by its URL without the password).
func TestInspectPostgres(t *testing.T) {
	pg, err := pgtest.Start()
	if err != nil {
		t.Fatal(err) // never skip: the tests need the PostgreSQL server binaries
	}
	defer pg.Stop()
	dsn, err := pg.CreateDB(context.Background(), "inspect")
	if err != nil {
		t.Fatal(err)
	}
	url := strings.Replace(dsn, "postgres@", "postgres:s3cret@", 1) + "&schema=wc"
	makeStoreWith(t, func(clock func() time.Time) (recovery.Store, error) {
		return pgstore.Open(context.Background(), url, pgstore.Options{Now: clock})
	})
	want := `store            ` + dsn + ` (schema wc)
schema version   1
verification     ok
flow             wordcount
committed epoch  2 at 2030-01-02T03:04:06.500Z by execution 1

EXECUTION  STARTED                   WORKERS  FLOW       FRONTIERS  STEPS
1          2030-01-02T03:04:05.000Z  2        wordcount  2,3        count,"sum words"
2          2030-01-02T04:04:06.500Z  3        wordcount  -          count,"sum words"
` + wrap(frontiersHelp, 96) + `

STEP         KEYS  BYTES  ROWS
count        2     6      2
"sum words"  1     1000   1
`
	var stdout, stderr strings.Builder
	code := run(context.Background(), []string{"recovery", "inspect", url}, &stdout, &stderr)
	if code != 0 || stderr.Len() > 0 {
		t.Fatalf("inspect: exit %d, stderr %q", code, stderr.String())
	}
	if stdout.String() != want {
		t.Errorf("inspect printed\n%s\nwant\n%s", stdout.String(), want)
	}
	if strings.Contains(stdout.String(), "s3cret") {
		t.Error("inspect printed the password")
	}
	// A schema without a store is an error (exit 1).
	stdout.Reset()
	stderr.Reset()
	if code := run(context.Background(), []string{"recovery", "inspect", dsn + "&schema=none"}, &stdout, &stderr); code != 1 ||
		!strings.Contains(stderr.String(), "no recovery store") {
		t.Errorf("inspect of a schema without a store: exit %d, stderr %q", code, stderr.String())
	}
}
