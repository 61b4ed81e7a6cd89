package pgstore

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/epochflow/epochflow/internal/pgtest"
	"github.com/epochflow/epochflow/recovery"
	"github.com/epochflow/epochflow/recovery/storetest"
)

// pg is the throwaway PostgreSQL cluster of the test binary.
var pg *pgtest.Cluster

func TestMain(m *testing.M) { pgtest.Main(m, &pg, stopBenchCluster) }

// db is the database the tests' stores live in, each in a schema of its own.
var db struct {
	once sync.Once
	dsn  string
	err  error
	n    atomic.Int64
}

// testDSN returns the DSN of the tests' database, creating it the first time.
func testDSN(t testing.TB) string {
	t.Helper()
	db.once.Do(func() { db.dsn, db.err = pg.CreateDB(context.Background(), "pgstore") })
	if db.err != nil {
		t.Fatal(db.err)
	}
	return db.dsn
}

// newSchema returns a schema name no test has used.
func newSchema() string { return fmt.Sprintf("store_%d", db.n.Add(1)) }

// opener returns the storetest.Opener of the store in schema of the tests' database.
func opener(t testing.TB, schema string) storetest.Opener {
	dsn := testDSN(t)
	return func(c storetest.Config) (recovery.Store, error) {
		return Open(context.Background(), dsn, Options{Schema: schema, BackupInterval: c.BackupInterval, Now: c.Now, ReadOnly: c.ReadOnly})
	}
}

// open opens the store in schema with opts, and closes it when the test ends.
func open(t testing.TB, schema string, opts Options) *Store {
	t.Helper()
	opts.Schema = schema
	s, err := Open(context.Background(), testDSN(t), opts)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestStoreContract(t *testing.T) {
	defer func(n int) { chunkTarget = n }(chunkTarget)
	for _, chunk := range []int{16, 256 << 10} {
		t.Run(fmt.Sprintf("chunk=%d", chunk), func(t *testing.T) {
			chunkTarget = chunk
			storetest.Run(t, storetest.Harness{
				New:       func(t *testing.T) storetest.Opener { return opener(t, newSchema()) },
				Name:      func(s recovery.Store) string { return s.(*Store).Name() },
				Entries:   func(s recovery.Store) ([]storetest.Entry, error) { return s.(*Store).entries(context.Background()) },
				Collect:   func(s recovery.Store) error { return s.(*Store).collectAll(context.Background()) },
				Verify:    func(ctx context.Context, s recovery.Store) error { return s.(*Store).Verify(ctx) },
				ReadOnly:  true,
				Exclusive: true,
				// One run of the model test is enough: it takes a while.
				SkipProperties: chunk != 16,
			})
		})
	}
}

// entries returns every snapshot entry the store keeps, in (step, key, epoch) order,
// verifying what it reads.
func (s *Store) entries(ctx context.Context) ([]storetest.Entry, error) {
	var out []storetest.Entry
	err := s.read(ctx, func(tx pgx.Tx) error {
		steps, err := queryStrings(ctx, tx, `SELECT DISTINCT step FROM `+s.table("runs"))
		if err != nil {
			return err
		}
		for _, step := range steps {
			runs, err := s.readRuns(ctx, tx, step)
			if err != nil {
				return err
			}
			if err := s.checkStep(ctx, tx, step, runs); err != nil {
				return err
			}
			for _, r := range runs {
				c := s.newRunCursor(ctx, tx, r, true)
				for {
					e, err := c.Next()
					if err != nil {
						return err
					}
					if e == nil {
						break
					}
					out = append(out, storetest.Entry{Step: step, Key: e.Key, Epoch: e.Epoch, Dead: e.Dead})
				}
			}
		}
		return nil
	})
	slices.SortFunc(out, func(a, b storetest.Entry) int {
		return cmp.Or(strings.Compare(a.Step, b.Step), strings.Compare(a.Key, b.Key), cmp.Compare(a.Epoch, b.Epoch))
	})
	return out, err
}

// collectAll merges all runs of every step into one, in one transaction on the writer's
// connection, collecting up to the store's horizon: what garbage collection must leave.
func (s *Store) collectAll(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	c, err := s.ensureWriter(ctx, "collectAll")
	if err != nil {
		return err
	}
	tx, err := c.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx)
	var horizon, id int64
	if err := tx.QueryRow(ctx, `SELECT value FROM `+s.table("meta")+` WHERE name = 'gc_horizon'`).Scan(&horizon); err != nil {
		return err
	}
	if err := tx.QueryRow(ctx, `SELECT COALESCE(MAX(id), 0) FROM `+s.table("runs")).Scan(&id); err != nil {
		return err
	}
	steps, err := queryStrings(ctx, tx, `SELECT DISTINCT step FROM `+s.table("runs"))
	if err != nil {
		return err
	}
	for _, step := range steps {
		runs, err := s.readRuns(ctx, tx, step)
		if err != nil {
			return err
		}
		if err := s.checkStep(ctx, tx, step, runs); err != nil {
			return err
		}
		id++
		r, ok, err := s.mergeRuns(ctx, tx, step, runs, nil, true, runs[len(runs)-1].epoch, uint64(horizon), id)
		if err != nil {
			return err
		}
		var kept []runInfo
		if ok {
			kept = append(kept, r)
		}
		if err := s.writeStepSum(ctx, tx, step, kept, r.epoch); err != nil {
			return err
		}
	}
	return tx.Commit(ctx)
}
