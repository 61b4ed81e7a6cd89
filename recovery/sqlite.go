package recovery

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"time"

	_ "modernc.org/sqlite" // the "sqlite" database/sql driver
)

// FileName is the name of the SQLite file a SQLiteStore keeps in its directory. The design
// has one file per store partition, epochflow-N.sqlite3; there is only partition 0 so far.
// The file (with its -wal and -shm companions while in use) can be read with the sqlite3
// command-line shell.
const FileName = "epochflow-0.sqlite3"

// LockName is the name of the lock file a read-write SQLiteStore holds in its directory, so
// that a second run on the same store is refused (ErrInUse) instead of overwriting the first
// one's epochs. The lock is an advisory flock on Unix systems: the kernel releases it when
// the process ends, however it ends (a kill -9 leaves no stale lock). The file is empty and
// stays in place. On other systems there is no lock.
const LockName = "epochflow.lock"

// SQLiteOptions configures OpenSQLite. The zero value is the default.
type SQLiteOptions struct {
	// BackupInterval is how long a snapshot is kept after a newer snapshot of the same key
	// was committed (and a tombstone after it was committed). 0 keeps only the newest
	// snapshot of each key. It must not be negative.
	BackupInterval time.Duration
	// ReadOnly opens an existing store for inspection only: OpenSQLite creates nothing (it
	// returns an error wrapping ErrNoStore if there is no store), Begin and Commit return an
	// error wrapping ErrReadOnly, and nothing in the directory is written. If a process has
	// the store open (its -wal file exists), the read-only store sees that process's commits
	// as they happen; if none has, it reads the file as it is at open (SQLite's immutable
	// mode, which creates no -wal and -shm files) and must be closed before another process
	// opens the store for writing.
	ReadOnly bool
	// Now, if not nil, replaces time.Now as the clock for start and commit times (tests).
	Now func() time.Time
}

// SQLiteStore is the embedded Store: one SQLite file (FileName) in a directory, in WAL mode.
// Its methods are safe for concurrent use; Begin and Commit are serialised.
type SQLiteStore struct {
	path     string
	db       *sql.DB
	backup   time.Duration
	now      func() time.Time
	readOnly bool

	lock *os.File // the held LockName file; nil for read-only stores

	mu        sync.Mutex // serialises Begin and Commit; guards the fields below
	execution int        // the execution recorded by Begin, 0 before
	workers   int        // its worker count
	closed    bool
}

var _ Store = (*SQLiteStore)(nil)

// OpenSQLite opens the store in directory dir, creating dir and the store if they do not exist
// (unless opts.ReadOnly). The store's file is dir/FileName.
//
// OpenSQLite refuses, with an error that names the file and says what to do, a directory it
// cannot create, a file that is not an epochflow store or is corrupt (ErrNotStore), and a
// store of another schema version that it cannot use (ErrSchemaVersion). It checks all that
// through a read-only connection first: a refused open writes nothing to an existing store.
func OpenSQLite(ctx context.Context, dir string, opts SQLiteOptions) (*SQLiteStore, error) {
	if dir == "" {
		return nil, errors.New("recovery: OpenSQLite: empty directory name")
	}
	if opts.BackupInterval < 0 {
		return nil, fmt.Errorf("recovery: OpenSQLite %s: negative BackupInterval %v", dir, opts.BackupInterval)
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("recovery store %s: %w", dir, err)
	}
	path := filepath.Join(abs, FileName)
	s := &SQLiteStore{path: path, backup: opts.BackupInterval, now: opts.Now, readOnly: opts.ReadOnly}
	if s.now == nil {
		s.now = time.Now
	}

	if opts.ReadOnly {
		if _, err := os.Stat(path); err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil, fmt.Errorf("%w at %s", ErrNoStore, path)
			}
			return nil, fmt.Errorf("recovery store %s: %w", path, err)
		}
		version, err := inspect(ctx, path)
		if err == nil && version == 0 {
			err = fmt.Errorf("%w at %s: the file is an empty database", ErrNoStore, path)
		} else if err == nil && version != SchemaVersion {
			err = fmt.Errorf("%w: recovery store %s has schema version %d: open it read-write with this binary to migrate it to %d",
				ErrSchemaVersion, path, version, SchemaVersion)
		}
		if err != nil {
			return nil, err
		}
		if s.db, err = sql.Open("sqlite", readDSN(path)); err != nil {
			return nil, fmt.Errorf("recovery store %s: %w", path, err)
		}
		return s, nil
	}

	if err := os.MkdirAll(abs, 0o755); err != nil {
		return nil, fmt.Errorf("recovery: cannot create recovery directory %s: %w", abs, err)
	}
	switch fi, err := os.Stat(path); {
	case err == nil && !fi.Mode().IsRegular():
		return nil, fmt.Errorf("%w: %s is not a regular file: move it away, or use another recovery directory", ErrNotStore, path)
	case err == nil:
		// Check the existing file before a read-write connection (whose pragmas may
		// write) ever touches it.
		if _, err := inspect(ctx, path); err != nil {
			return nil, err
		}
	case !errors.Is(err, fs.ErrNotExist):
		return nil, fmt.Errorf("recovery store %s: %w", path, err)
	}

	// The lock comes after the checks, so that a refused open creates no file.
	lock, err := lockDir(abs)
	if errors.Is(err, ErrInUse) {
		return nil, fmt.Errorf("%w: %s is open for writing by another run (of this flow or another, in this process or another): stop that run, or give this one another recovery directory", ErrInUse, abs)
	}
	if err != nil {
		return nil, fmt.Errorf("recovery store %s: locking %s: %w", abs, LockName, err)
	}
	s.lock = lock
	db, err := sql.Open("sqlite", dsn(path, false))
	if err != nil {
		s.unlock()
		return nil, fmt.Errorf("recovery store %s: %w", path, err)
	}
	s.db = db
	if err := s.initialize(ctx); err != nil {
		db.Close()
		s.unlock()
		return nil, err
	}
	return s, nil
}

// synchronous is the PRAGMA synchronous of read-write connections; see dsn. Only
// BenchmarkCommit changes it, to measure what FULL costs.
var synchronous = "FULL"

// dsn is the modernc.org/sqlite data source name of the store at path.
//
// Durability: the store runs in WAL mode with synchronous=FULL. In WAL mode, NORMAL syncs the
// WAL only at checkpoints, so a transaction that COMMIT reported may be rolled back by a power
// loss (the database stays consistent, but the committed epoch goes back); FULL syncs the WAL
// at every COMMIT, so once Commit returns the epoch survives power loss. The cost is one
// fsync of the -wal file per Commit: BenchmarkCommit/sync=NORMAL measures the difference.
func dsn(path string, readOnly bool) string {
	q := url.Values{}
	q.Add("_pragma", "busy_timeout(10000)")
	// A bigger page cache (32 MiB, default 2 MiB) and statement journals in memory: with the
	// defaults, a Commit of 10,000 snapshots into 100,000 keys spilled pages to disk and spent
	// half its time in write syscalls.
	q.Add("_pragma", "cache_size(-32768)")
	q.Add("_pragma", "temp_store(MEMORY)")
	if readOnly {
		q.Set("mode", "ro")
	} else {
		q.Add("_pragma", "synchronous("+synchronous+")")
		// Writers take the write lock at BEGIN, so two writers wait for each other
		// instead of failing with SQLITE_BUSY when one upgrades its read lock.
		q.Set("_txlock", "immediate")
	}
	u := url.URL{Scheme: "file", OmitHost: true, Path: path, RawQuery: q.Encode()}
	return u.String()
}

// inspect runs checkSchema on the existing file at path without writing anything, not even
// the -wal and -shm files that a read-only connection to a WAL database creates (and cannot
// remove): if there is no -wal file, the database file holds the whole database and is read
// as immutable (no locks, no -shm); if there is one (the store is open elsewhere, or its
// process crashed), a read-only connection reads it, and a refused open leaves it as it was.
func inspect(ctx context.Context, path string) (int, error) {
	db, err := sql.Open("sqlite", readDSN(path))
	if err != nil {
		return 0, fmt.Errorf("recovery store %s: %w", path, err)
	}
	defer db.Close()
	return checkSchema(ctx, db, path)
}

// readDSN is the data source name for reading the store at path without writing anything:
// immutable if there is no -wal file (see inspect), read-only otherwise.
func readDSN(path string) string {
	d := dsn(path, true)
	if _, err := os.Lstat(path + "-wal"); errors.Is(err, fs.ErrNotExist) {
		d += "&immutable=1"
	}
	return d
}

// initialize creates the schema in a store without tables, migrates an older one, and
// switches the file to WAL mode.
func (s *SQLiteStore) initialize(ctx context.Context) error {
	// journal_mode is persistent in the file; it cannot change inside a transaction.
	var mode string
	if err := s.db.QueryRowContext(ctx, `PRAGMA journal_mode = WAL`).Scan(&mode); err != nil {
		return readError(s.path, err)
	}
	if mode != "wal" {
		return fmt.Errorf("recovery store %s: cannot switch to WAL mode (journal mode is %q)", s.path, mode)
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("recovery store %s: %w", s.path, err)
	}
	defer tx.Rollback()
	// Checked again under the write lock: another process may have created the store since.
	version, err := checkSchema(ctx, tx, s.path)
	if err != nil {
		return err
	}
	switch {
	case version == 0:
		for _, stmt := range schemaV1 {
			if _, err := tx.ExecContext(ctx, stmt); err != nil {
				return fmt.Errorf("recovery store %s: creating the schema: %w", s.path, err)
			}
		}
	case version < SchemaVersion:
		for v := version; v < SchemaVersion; v++ {
			if err := migrations[v](ctx, tx); err != nil {
				return fmt.Errorf("recovery store %s: migrating from schema version %d: %w", s.path, v, err)
			}
		}
		if _, err := tx.ExecContext(ctx, `UPDATE meta SET value = ? WHERE name = 'schema_version'`, SchemaVersion); err != nil {
			return fmt.Errorf("recovery store %s: migrating: %w", s.path, err)
		}
	default:
		return nil
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("recovery store %s: %w", s.path, err)
	}
	return nil
}

// Path returns the store's SQLite file.
func (s *SQLiteStore) Path() string { return s.path }

// checkWritable returns an error unless Begin or Commit may write. s.mu must be held.
func (s *SQLiteStore) checkWritable(op string) error {
	if s.closed {
		return fmt.Errorf("recovery store %s: %s: store is closed", s.path, op)
	}
	if s.readOnly {
		return fmt.Errorf("%w: %s: %s", ErrReadOnly, s.path, op)
	}
	return nil
}

// Begin implements Store.
func (s *SQLiteStore) Begin(ctx context.Context, e Execution) (Resume, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.checkWritable("Begin"); err != nil {
		return Resume{}, err
	}
	if e.Flow == "" {
		return Resume{}, fmt.Errorf("recovery store %s: Begin: empty flow name", s.path)
	}
	if e.Workers < 1 {
		return Resume{}, fmt.Errorf("recovery store %s: Begin: %d workers, want at least 1", s.path, e.Workers)
	}
	steps, err := json.Marshal(nonNil(e.Steps))
	if err != nil {
		return Resume{}, fmt.Errorf("recovery store %s: Begin: %w", s.path, err)
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return Resume{}, fmt.Errorf("recovery store %s: Begin: %w", s.path, err)
	}
	defer tx.Rollback()

	var r Resume
	var prevSteps string
	err = tx.QueryRowContext(ctx, `SELECT execution, flow, steps, workers FROM executions ORDER BY execution DESC LIMIT 1`).
		Scan(&r.Execution, &r.Flow, &prevSteps, &r.Workers)
	switch {
	case errors.Is(err, sql.ErrNoRows):
	case err != nil:
		return Resume{}, fmt.Errorf("recovery store %s: Begin: %w", s.path, err)
	default:
		if r.Flow != e.Flow {
			return Resume{}, fmt.Errorf("%w: recovery store %s belongs to flow %q, not %q: use another recovery directory for flow %q",
				ErrOtherFlow, s.path, r.Flow, e.Flow, e.Flow)
		}
		if err := json.Unmarshal([]byte(prevSteps), &r.Steps); err != nil {
			return Resume{}, fmt.Errorf("%w: recovery store %s: execution %d has malformed steps %q: %w", ErrNotStore, s.path, r.Execution, prevSteps, err)
		}
		if r.Steps == nil {
			r.Steps = []string{}
		}
	}
	committed, err := committedEpoch(ctx, tx)
	if err != nil {
		return Resume{}, fmt.Errorf("recovery store %s: Begin: %w", s.path, err)
	}
	r.Committed = committed
	r.Execution++
	if _, err := tx.ExecContext(ctx, `INSERT INTO executions (execution, flow, steps, workers, started_at) VALUES (?, ?, ?, ?, ?)`,
		r.Execution, e.Flow, string(steps), e.Workers, s.now().UnixNano()); err != nil {
		return Resume{}, fmt.Errorf("recovery store %s: Begin: %w", s.path, err)
	}
	if err := tx.Commit(); err != nil {
		return Resume{}, fmt.Errorf("recovery store %s: Begin: %w", s.path, err)
	}
	s.execution, s.workers = r.Execution, e.Workers
	return r, nil
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

// committedEpoch reads the committed epoch, 0 if none.
func committedEpoch(ctx context.Context, q interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}) (uint64, error) {
	var epoch int64
	err := q.QueryRowContext(ctx, `SELECT IFNULL(MAX(epoch), 0) FROM commits`).Scan(&epoch)
	return uint64(epoch), err
}

// insertBatch is how many snapshots one INSERT statement writes.
const insertBatch = 64

// Commit implements Store.
func (s *SQLiteStore) Commit(ctx context.Context, e Epoch) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.checkWritable("Commit"); err != nil {
		return err
	}
	if s.execution == 0 {
		return fmt.Errorf("recovery store %s: Commit of epoch %d before Begin", s.path, e.Epoch)
	}
	if e.Epoch == 0 || e.Epoch > math.MaxInt64 {
		return fmt.Errorf("%w: recovery store %s: Commit: epoch %d is not in [1, 2^63-1]", ErrEpochOrder, s.path, e.Epoch)
	}
	if len(e.Frontiers) != s.workers {
		return fmt.Errorf("recovery store %s: Commit of epoch %d: %d frontiers for %d workers", s.path, e.Epoch, len(e.Frontiers), s.workers)
	}
	for _, sn := range e.Snapshots {
		if sn.Epoch == 0 || sn.Epoch > e.Epoch {
			return fmt.Errorf("%w: recovery store %s: Commit of epoch %d: snapshot of step %q key %q has epoch %d",
				ErrEpochOrder, s.path, e.Epoch, sn.Step, sn.Key, sn.Epoch)
		}
	}

	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("recovery store %s: Commit of epoch %d: %w", s.path, e.Epoch, err)
	}
	defer tx.Rollback()
	fail := func(err error) error {
		return fmt.Errorf("recovery store %s: Commit of epoch %d: %w", s.path, e.Epoch, err)
	}
	committed, err := committedEpoch(ctx, tx)
	if err != nil {
		return fail(err)
	}
	if e.Epoch <= committed {
		return fmt.Errorf("%w: recovery store %s: Commit of epoch %d: epoch %d is already committed", ErrEpochOrder, s.path, e.Epoch, committed)
	}
	for _, sn := range e.Snapshots {
		if sn.Epoch <= committed {
			return fmt.Errorf("%w: recovery store %s: Commit of epoch %d: snapshot of step %q key %q has epoch %d, at or before the committed epoch %d",
				ErrEpochOrder, s.path, e.Epoch, sn.Step, sn.Key, sn.Epoch, committed)
		}
	}
	if err := insertSnapshots(ctx, tx, e.Snapshots); err != nil {
		return fail(err)
	}
	for w, f := range e.Frontiers {
		if _, err := tx.ExecContext(ctx, `INSERT INTO frontiers (execution, worker, frontier) VALUES (?, ?, ?)
			ON CONFLICT (execution, worker) DO UPDATE SET frontier = excluded.frontier`,
			s.execution, w, int64(f)); err != nil {
			return fail(err)
		}
	}
	now := s.now()
	if _, err := tx.ExecContext(ctx, `INSERT INTO commits (epoch, execution, committed_at) VALUES (?, ?, ?)`,
		int64(e.Epoch), s.execution, now.UnixNano()); err != nil {
		return fail(err)
	}
	if err := s.collect(ctx, tx, now, e.Epoch, e.Snapshots); err != nil {
		return fail(fmt.Errorf("garbage collection: %w", err))
	}
	if err := tx.Commit(); err != nil {
		return fail(err)
	}
	return nil
}

// insertSnapshots writes snaps insertBatch rows per statement.
func insertSnapshots(ctx context.Context, tx *sql.Tx, snaps []Snapshot) error {
	var full *sql.Stmt
	args := make([]any, 0, 4*insertBatch)
	for len(snaps) > 0 {
		n := min(len(snaps), insertBatch)
		args = args[:0]
		for _, sn := range snaps[:n] {
			var state any
			if !sn.Deleted {
				state = sn.State
				if sn.State == nil {
					state = []byte{}
				}
			}
			args = append(args, sn.Step, sn.Key, int64(sn.Epoch), state)
		}
		var err error
		if n == insertBatch {
			if full == nil {
				if full, err = tx.PrepareContext(ctx, insertSQL(n)); err != nil {
					return err
				}
				defer full.Close()
			}
			_, err = full.ExecContext(ctx, args...)
		} else {
			_, err = tx.ExecContext(ctx, insertSQL(n), args...)
		}
		if err != nil {
			if n == 1 {
				sn := snaps[0]
				return fmt.Errorf("snapshot of step %q key %q epoch %d: %w", sn.Step, sn.Key, sn.Epoch, err)
			}
			return fmt.Errorf("snapshots of step %q key %q epoch %d and the %d after: %w", snaps[0].Step, snaps[0].Key, snaps[0].Epoch, n-1, err)
		}
		snaps = snaps[n:]
	}
	return nil
}

// insertSQL is an INSERT of n snapshot rows.
func insertSQL(n int) string {
	b := make([]byte, 0, 64+n*14)
	b = append(b, "INSERT INTO snapshots (step, key, epoch, state) VALUES "...)
	for i := range n {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, "(?,?,?,?)"...)
	}
	return string(b)
}

// collect garbage-collects inside Commit's transaction: now is the commit time, epoch the
// epoch committed and snaps its snapshots.
//
// The horizon H is the newest epoch committed at or before now-BackupInterval: a snapshot
// epoch e <= H was committed (by the commit of H or an earlier one) at least the window ago.
// A row is collected when a newer row of its key has an epoch <= H; the newest row <= H is
// collected too if it is a tombstone. After a collection up to H, every key has at most one
// row <= H, which is no tombstone; new rows come with epochs > H. So when the horizon moves
// from H0 to H, only the keys with a row in (H0, H] can have something to collect.
//
// Those keys are known: H is either this commit's epoch (always so without a window), and
// then the keys are this commit's, collected by one indexed DELETE each; or it is an earlier
// epoch, and this commit's keys wait in gc_pending until the horizon passes them. (An index
// on snapshots(epoch) to find them instead made every Commit 1.5 to 2 times slower.)
func (s *SQLiteStore) collect(ctx context.Context, tx *sql.Tx, now time.Time, epoch uint64, snaps []Snapshot) error {
	cutoff := now.Add(-s.backup).UnixNano()
	var horizon sql.NullInt64
	if err := tx.QueryRowContext(ctx, `SELECT MAX(epoch) FROM commits WHERE committed_at <= ?`, cutoff).Scan(&horizon); err != nil {
		return err
	}
	var done int64
	if err := tx.QueryRowContext(ctx, `SELECT value FROM meta WHERE name = 'gc_horizon'`).Scan(&done); err != nil {
		return err
	}
	hi := max(done, horizon.Int64) // the store's horizon never goes back (the window may have grown)

	// The newest snapshot of each key of this commit.
	type stepKey struct{ step, key string }
	newest := make(map[stepKey]int, len(snaps))
	var order []stepKey
	for i, sn := range snaps {
		k := stepKey{sn.Step, sn.Key}
		j, ok := newest[k]
		if !ok {
			order = append(order, k)
		}
		if !ok || sn.Epoch > snaps[j].Epoch {
			newest[k] = i
		}
	}
	if uint64(hi) < epoch {
		if len(order) > 0 {
			st, err := tx.PrepareContext(ctx, `INSERT OR IGNORE INTO gc_pending (epoch, step, key) VALUES (?, ?, ?)`)
			if err != nil {
				return err
			}
			defer st.Close()
			for _, k := range order {
				if _, err := st.ExecContext(ctx, int64(snaps[newest[k]].Epoch), k.step, k.key); err != nil {
					return err
				}
			}
		}
	} else if len(order) > 0 {
		older, err := tx.PrepareContext(ctx, `DELETE FROM snapshots WHERE step = ? AND key = ? AND epoch < ?`)
		if err != nil {
			return err
		}
		defer older.Close()
		andItself, err := tx.PrepareContext(ctx, `DELETE FROM snapshots WHERE step = ? AND key = ? AND epoch <= ?`)
		if err != nil {
			return err
		}
		defer andItself.Close()
		for _, k := range order {
			sn := snaps[newest[k]]
			st := older
			if sn.Deleted {
				st = andItself
			}
			if _, err := st.ExecContext(ctx, k.step, k.key, int64(sn.Epoch)); err != nil {
				return err
			}
		}
	}
	if hi <= done {
		return nil
	}
	// The keys that waited for the horizon: of each, the newest pending row is the newest row
	// <= hi (the rows <= done were collected before); delete what is older, and it if it is
	// a tombstone.
	if _, err := tx.ExecContext(ctx, `DELETE FROM snapshots WHERE (step, key, epoch) IN (
		SELECT o.step, o.key, o.epoch
		FROM (SELECT step, key, MAX(epoch) AS m FROM gc_pending WHERE epoch <= ?1 GROUP BY step, key) AS p
		JOIN snapshots AS o ON o.step = p.step AND o.key = p.key AND o.epoch <= p.m
		WHERE o.epoch < p.m OR o.state IS NULL)`, hi); err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, `DELETE FROM gc_pending WHERE epoch <= ?`, hi); err != nil {
		return err
	}
	// Commits before the horizon's are no longer needed to compute a horizon.
	if _, err := tx.ExecContext(ctx, `DELETE FROM commits WHERE epoch < ?`, hi); err != nil {
		return err
	}
	_, err := tx.ExecContext(ctx, `UPDATE meta SET value = ? WHERE name = 'gc_horizon'`, hi)
	return err
}

// loadSQL streams every snapshot row of a step up to the committed epoch in (key, epoch)
// order, which is the primary key's: no sort, no temporary table. Load keeps the last row of
// each key. (A GROUP BY key with MAX(epoch) returns the same rows but took twice as long, and
// reading "state IS NULL" as a column another 25%: the driver tells NULL from an empty blob.)
const loadSQL = `SELECT key, epoch, state FROM snapshots
	WHERE step = ?1 AND epoch <= (SELECT IFNULL(MAX(epoch), 0) FROM commits)
	ORDER BY key, epoch`

// loadBatch is how many rows Load's reader hands to fn's goroutine at once.
const loadBatch = 1024

// loaded is a row Load passes to fn.
type loaded struct {
	key   string
	epoch uint64
	state []byte
}

// Load implements Store. One goroutine reads the rows while the caller's runs fn, so
// decoding the states that fn may do overlaps with SQLite's work.
func (s *SQLiteStore) Load(ctx context.Context, step string, fn func(key string, epoch uint64, state []byte) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	batches := make(chan []loaded, 2)
	errc := make(chan error, 1)
	go func() {
		defer close(batches)
		errc <- s.scan(ctx, step, batches)
	}()
	var fnErr error
	for batch := range batches {
		if fnErr != nil {
			continue // draining after fn failed
		}
		for _, r := range batch {
			if fnErr = fn(r.key, r.epoch, r.state); fnErr != nil {
				cancel()
				break
			}
		}
	}
	err := <-errc
	if fnErr != nil {
		return fnErr
	}
	if err != nil {
		return fmt.Errorf("recovery store %s: Load of step %q: %w", s.path, step, err)
	}
	return nil
}

// scan runs loadSQL on the driver's connection itself (database/sql's per-row work doubled
// the time) and sends batches of the newest live row of each key.
func (s *SQLiteStore) scan(ctx context.Context, step string, batches chan<- []loaded) error {
	conn, err := s.db.Conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	return conn.Raw(func(dc any) error {
		qc, ok := dc.(driver.QueryerContext)
		if !ok {
			return fmt.Errorf("driver connection %T cannot query", dc)
		}
		rows, err := qc.QueryContext(ctx, loadSQL, []driver.NamedValue{{Ordinal: 1, Value: step}})
		if err != nil {
			return err
		}
		defer rows.Close()
		batch := make([]loaded, 0, loadBatch)
		send := func() error {
			select {
			case batches <- batch:
				batch = make([]loaded, 0, loadBatch)
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		var (
			cur  loaded
			dead bool // cur is a tombstone
			have bool // cur holds a row
			dest = make([]driver.Value, 3)
		)
		for {
			err := rows.Next(dest)
			if err == io.EOF {
				break
			}
			if err != nil {
				return err
			}
			key, ok1 := dest[0].(string)
			epoch, ok2 := dest[1].(int64)
			state, ok3 := dest[2].([]byte)
			if !ok1 || !ok2 || (!ok3 && dest[2] != nil) {
				return fmt.Errorf("%w: snapshot row of types (%T, %T, %T)", ErrNotStore, dest[0], dest[1], dest[2])
			}
			if have && key != cur.key && !dead {
				if batch = append(batch, cur); len(batch) == loadBatch {
					if err := send(); err != nil {
						return err
					}
				}
			}
			// The copy keeps fn's slice its own, whatever the driver does with its buffers.
			cur, dead, have = loaded{key, uint64(epoch), append(make([]byte, 0, len(state)), state...)}, dest[2] == nil, true
		}
		if have && !dead {
			batch = append(batch, cur)
		}
		if len(batch) > 0 {
			return send()
		}
		return nil
	})
}

// Committed implements Store.
func (s *SQLiteStore) Committed(ctx context.Context) (CommitInfo, error) {
	var c CommitInfo
	var epoch, at int64
	err := s.db.QueryRowContext(ctx, `SELECT epoch, execution, committed_at FROM commits ORDER BY epoch DESC LIMIT 1`).
		Scan(&epoch, &c.Execution, &at)
	if errors.Is(err, sql.ErrNoRows) {
		return CommitInfo{}, nil
	}
	if err != nil {
		return CommitInfo{}, fmt.Errorf("recovery store %s: Committed: %w", s.path, err)
	}
	c.Epoch, c.At = uint64(epoch), time.Unix(0, at).UTC()
	return c, nil
}

// Executions implements Store.
func (s *SQLiteStore) Executions(ctx context.Context) ([]ExecutionInfo, error) {
	fail := func(err error) ([]ExecutionInfo, error) {
		return nil, fmt.Errorf("recovery store %s: Executions: %w", s.path, err)
	}
	tx, err := s.db.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return fail(err)
	}
	defer tx.Rollback()
	rows, err := tx.QueryContext(ctx, `SELECT execution, flow, steps, workers, started_at FROM executions ORDER BY execution`)
	if err != nil {
		return fail(err)
	}
	var out []ExecutionInfo
	index := map[int]int{}
	for rows.Next() {
		var x ExecutionInfo
		var steps string
		var started int64
		if err := rows.Scan(&x.Execution, &x.Flow, &steps, &x.Workers, &started); err != nil {
			rows.Close()
			return fail(err)
		}
		if err := json.Unmarshal([]byte(steps), &x.Steps); err != nil {
			rows.Close()
			return fail(fmt.Errorf("execution %d has malformed steps %q: %w", x.Execution, steps, err))
		}
		x.Started = time.Unix(0, started).UTC()
		index[x.Execution] = len(out)
		out = append(out, x)
	}
	if err := rows.Err(); err != nil {
		return fail(err)
	}
	rows, err = tx.QueryContext(ctx, `SELECT execution, worker, frontier FROM frontiers ORDER BY execution, worker`)
	if err != nil {
		return fail(err)
	}
	defer rows.Close()
	for rows.Next() {
		var x, w int
		var f int64
		if err := rows.Scan(&x, &w, &f); err != nil {
			return fail(err)
		}
		i, ok := index[x]
		if !ok || w < 0 || w >= out[i].Workers {
			return fail(fmt.Errorf("%w: frontier of worker %d of execution %d, which has no such worker", ErrNotStore, w, x))
		}
		if out[i].Frontiers == nil {
			out[i].Frontiers = make([]uint64, out[i].Workers)
		}
		out[i].Frontiers[w] = uint64(f)
	}
	if err := rows.Err(); err != nil {
		return fail(err)
	}
	return out, nil
}

// StepIDs implements Store. It skips from one step to the next through the primary key: one
// index search per step.
func (s *SQLiteStore) StepIDs(ctx context.Context) ([]string, error) {
	rows, err := s.db.QueryContext(ctx, `WITH RECURSIVE ids (step) AS (
			SELECT (SELECT MIN(step) FROM snapshots)
			UNION ALL
			SELECT (SELECT MIN(step) FROM snapshots WHERE step > ids.step) FROM ids WHERE ids.step IS NOT NULL)
		SELECT step FROM ids WHERE step IS NOT NULL`)
	if err != nil {
		return nil, fmt.Errorf("recovery store %s: StepIDs: %w", s.path, err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return nil, fmt.Errorf("recovery store %s: StepIDs: %w", s.path, err)
		}
		out = append(out, id)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("recovery store %s: StepIDs: %w", s.path, err)
	}
	return out, nil
}

// Steps implements Store.
func (s *SQLiteStore) Steps(ctx context.Context) ([]StepInfo, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT step, SUM(NOT dead), SUM(IIF(dead, 0, size)), SUM(n) FROM (
			SELECT step, MAX(epoch), state IS NULL AS dead, length(state) AS size, COUNT(*) AS n FROM snapshots
			WHERE epoch <= (SELECT IFNULL(MAX(epoch), 0) FROM commits)
			GROUP BY step, key)
		GROUP BY step ORDER BY step`)
	if err != nil {
		return nil, fmt.Errorf("recovery store %s: Steps: %w", s.path, err)
	}
	defer rows.Close()
	var out []StepInfo
	for rows.Next() {
		var st StepInfo
		if err := rows.Scan(&st.Step, &st.Keys, &st.Bytes, &st.Rows); err != nil {
			return nil, fmt.Errorf("recovery store %s: Steps: %w", s.path, err)
		}
		out = append(out, st)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("recovery store %s: Steps: %w", s.path, err)
	}
	return out, nil
}

// Close implements Store.
func (s *SQLiteStore) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	err := s.db.Close()
	s.unlock()
	if err != nil {
		return fmt.Errorf("recovery store %s: Close: %w", s.path, err)
	}
	return nil
}

// unlock releases the directory lock, if the store holds it.
func (s *SQLiteStore) unlock() {
	if s.lock != nil {
		s.lock.Close() // closing the file releases the flock
		s.lock = nil
	}
}
