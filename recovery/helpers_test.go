package recovery

import (
	"cmp"
	"context"
	"database/sql"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// clock is a settable clock for SQLiteOptions.Now.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *clock { return &clock{t: time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// open opens the store in dir and closes it when the test ends.
func open(t testing.TB, dir string, opts SQLiteOptions) *SQLiteStore {
	t.Helper()
	s, err := OpenSQLite(context.Background(), dir, opts)
	if err != nil {
		t.Fatalf("OpenSQLite(%s): %v", dir, err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// begin calls Begin and fails the test on error.
func begin(t testing.TB, s Store, flow string, workers int, steps ...string) Resume {
	t.Helper()
	r, err := s.Begin(context.Background(), Execution{Flow: flow, Steps: steps, Workers: workers})
	if err != nil {
		t.Fatalf("Begin: %v", err)
	}
	return r
}

// commit commits epoch with the given snapshots and frontiers all equal to epoch.
func commit(t testing.TB, s Store, workers int, epoch uint64, snaps ...Snapshot) {
	t.Helper()
	fr := make([]uint64, workers)
	for i := range fr {
		fr[i] = epoch
	}
	if err := s.Commit(context.Background(), Epoch{Epoch: epoch, Frontiers: fr, Snapshots: snaps}); err != nil {
		t.Fatalf("Commit(%d): %v", epoch, err)
	}
}

// entry is one key as Load returned it.
type entry struct {
	Epoch uint64
	State string
}

// loadAll returns what Load returns for step, checking that keys come in ascending order,
// once each, and that no state is nil.
func loadAll(t testing.TB, s Store, step string) map[string]entry {
	t.Helper()
	out := map[string]entry{}
	var keys []string
	err := s.Load(context.Background(), step, func(key string, epoch uint64, state []byte) error {
		if state == nil {
			t.Errorf("Load(%q): key %q: nil state", step, key)
		}
		keys = append(keys, key)
		out[key] = entry{epoch, string(state)}
		return nil
	})
	if err != nil {
		t.Fatalf("Load(%q): %v", step, err)
	}
	if !slices.IsSorted(keys) || len(keys) != len(out) {
		t.Fatalf("Load(%q): keys not ascending and unique: %q", step, keys)
	}
	return out
}

// snapshot is a Snapshot literal helper.
func snap(step, key string, epoch uint64, state string) Snapshot {
	return Snapshot{Step: step, Key: key, Epoch: epoch, State: []byte(state)}
}

// tomb is a tombstone.
func tomb(step, key string, epoch uint64) Snapshot {
	return Snapshot{Step: step, Key: key, Epoch: epoch, Deleted: true}
}

// row is a snapshot row as stored.
type row struct {
	Step, Key string
	Epoch     uint64
	Dead      bool
}

// fataler is what rows needs of a *testing.T or a *rapid.T.
type fataler interface {
	Helper()
	Fatal(args ...any)
}

// rows returns every snapshot entry the store keeps (in every run of every step), in
// (step, key, epoch) order, verifying what it reads.
func rows(t fataler, s *SQLiteStore) []row {
	t.Helper()
	ctx := context.Background()
	tx, err := s.db.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	steps, err := queryStrings(ctx, tx, `SELECT DISTINCT step FROM runs ORDER BY step`)
	if err != nil {
		t.Fatal(err)
	}
	get, err := tx.PrepareContext(ctx, selectChunkSQL)
	if err != nil {
		t.Fatal(err)
	}
	defer get.Close()
	var out []row
	for _, step := range steps {
		runs, err := readRuns(ctx, tx, step)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range runs {
			c := newRunCursor(r, stmtGetter(ctx, get), true, s.path)
			for {
				e, err := c.Next()
				if err != nil {
					t.Fatal(err)
				}
				if e == nil {
					break
				}
				out = append(out, row{step, e.Key, e.Epoch, e.Dead})
			}
		}
	}
	slices.SortFunc(out, func(a, b row) int {
		return cmp.Or(strings.Compare(a.Step, b.Step), strings.Compare(a.Key, b.Key), cmp.Compare(a.Epoch, b.Epoch))
	})
	return out
}

// compactAll merges all runs of every step into one, in one transaction, collecting up to
// the store's horizon: what garbage collection must leave of the store.
func compactAll(t fataler, s *SQLiteStore) {
	t.Helper()
	ctx := context.Background()
	s.mu.Lock()
	defer s.mu.Unlock()
	err := func() error {
		tx, err := s.db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer tx.Rollback()
		var horizon, id int64
		if err := tx.QueryRowContext(ctx, `SELECT value FROM meta WHERE name = 'gc_horizon'`).Scan(&horizon); err != nil {
			return err
		}
		if err := tx.QueryRowContext(ctx, `SELECT IFNULL(MAX(id), 0) FROM runs`).Scan(&id); err != nil {
			return err
		}
		steps, err := queryStrings(ctx, tx, `SELECT DISTINCT step FROM runs ORDER BY step`)
		if err != nil {
			return err
		}
		st, err := prepare(ctx, tx)
		if err != nil {
			return err
		}
		defer st.close()
		for _, step := range steps {
			runs, err := readRuns(ctx, tx, step)
			if err != nil {
				return err
			}
			id++
			merged, ok, err := s.merge(ctx, tx, st, runs, uint64(horizon), true, id)
			if err != nil {
				return err
			}
			var kept []runInfo
			if ok {
				kept = append(kept, merged)
			}
			if err := writeStepSum(ctx, tx, step, uint64(horizon), totals(kept)); err != nil {
				return err
			}
		}
		return tx.Commit()
	}()
	if err != nil {
		t.Fatal(err)
	}
}

// files returns the name and content of every file under dir.
func files(t testing.TB, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(path)
		out[path] = string(b)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}
