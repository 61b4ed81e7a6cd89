package recovery

import (
	"context"
	"database/sql"

	"encoding/json"
	"errors"
	"fmt"

	"io/fs"

	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	_ "modernc.org/sqlite" // the "sqlite" database/sql driver

	"github.com/epochflow/epochflow/internal/storecheck"
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
	scratch   sortScratch // Commit's sorting memory, reused
}

var _ Store = (*SQLiteStore)(nil)

// OpenSQLite opens the store in directory dir, creating dir and the store if they do not exist
// (unless opts.ReadOnly). The store's file is dir/FileName.
//
// OpenSQLite refuses, with an error that names the file and says what to do, a directory it
// cannot create, a file that is not an epochflow store (ErrNotStore), a store of another
// schema version that it cannot use (ErrSchemaVersion), and a damaged one (ErrDamaged): it
// checks the SQLite header and runs SQLite's quick check of the whole file (about a
// millisecond for 300,000 keys: it reads the pages' structure, not the chunks), which finds
// damage that no chunk shows, such as in the list of free pages that the next commit would
// allocate from; Load verifies the chunks' contents as it reads them (see verify.go). A
// read-only open checks every table but the chunks, so that `recovery inspect` can show what
// a damaged store holds (Verify runs the whole check). It checks all that through a
// read-only connection first: a refused open writes nothing to an existing store. A store of
// an older schema version is migrated to SchemaVersion, after the quick check of the whole
// file.
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
		if err := checkHeader(path); err != nil {
			return nil, err
		}
		version, err := inspect(ctx, path, false)
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
		if err := checkHeader(path); err != nil {
			return nil, err
		}
		if _, err := inspect(ctx, path, true); err != nil {
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
	// Reads of the file through a memory map of up to 1 GiB instead of a pread per page:
	// BenchmarkLoad1M 0.30-0.32 CPU seconds without, 0.21-0.22 with.
	q.Add("_pragma", "mmap_size(1073741824)")
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

// inspect runs checkSchema on the existing file at path, and SQLite's quick check: of the
// whole file if whole (a store opened for a run, which writes to it), if the store is of an
// older schema version (which OpenSQLite migrates) or if it has no table (which OpenSQLite
// would create in it), else of every table but chunks. It writes
// nothing, not even the -wal and -shm files that a read-only connection to a WAL database
// creates (and cannot remove): if there is no -wal file, the database file holds the whole
// database and is read as immutable (no locks, no -shm); if there is one (the store is open
// elsewhere, or its process crashed), a read-only connection reads it, and a refused open
// leaves it as it was. The quick checks are skipped while storecheck is off (benchmarks).
func inspect(ctx context.Context, path string, whole bool) (int, error) {
	db, err := sql.Open("sqlite", readDSN(path))
	if err != nil {
		return 0, fmt.Errorf("recovery store %s: %w", path, err)
	}
	defer db.Close()
	version, err := checkSchema(ctx, db, path)
	switch {
	case err != nil:
		return 0, err
	case version == 0:
		// No table: a new store, unless damage to the schema's page hides the tables of a
		// file that has them, whose pages then belong to no table (cheap for an empty file).
		if err := quickCheck(ctx, db, path, ""); err != nil {
			return 0, err
		}
		return 0, nil
	case version < SchemaVersion:
		// A migration computes what later opens verify from the rows as they are: they
		// must be sound first.
		if err := quickCheck(ctx, db, path, ""); err != nil {
			return 0, fmt.Errorf("%w (found before migrating it from schema version %d)", err, version)
		}
		return version, nil
	case !storecheck.On():
		return version, nil
	case whole:
		// A commit allocates pages from the free list, which no row shows and Load never
		// reads: damage there would overwrite live pages. The check reads every page's
		// structure but not the chunks' contents (overflow pages), which Load verifies.
		if err := quickCheck(ctx, db, path, ""); err != nil {
			return 0, err
		}
		return version, nil
	}
	// A read-only open: the chunks, whose check grows with the state, are verified by Load
	// as it reads them; Verify (recovery inspect) runs the quick check of the whole file.
	for _, t := range storeTables {
		if slices.Contains(bigTables, t) {
			continue
		}
		if err := quickCheck(ctx, db, path, t); err != nil {
			return 0, err
		}
	}
	return version, nil
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
	case version < SchemaVersion:
		if version == 0 {
			// A new store starts at version 1 and takes the migrations from there.
			for _, stmt := range schemaV1 {
				if _, err := tx.ExecContext(ctx, stmt); err != nil {
					return fmt.Errorf("recovery store %s: creating the schema: %w", s.path, err)
				}
			}
			version = 1
		}
		// (inspect has run the quick check of the whole file on an older store.)
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
		return Resume{}, s.opError("Begin", err)
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return Resume{}, s.opError("Begin", err)
	}
	defer tx.Rollback()

	var r Resume
	var prevSteps string
	err = tx.QueryRowContext(ctx, `SELECT execution, flow, steps, workers FROM executions ORDER BY execution DESC LIMIT 1`).
		Scan(&r.Execution, &r.Flow, &prevSteps, &r.Workers)
	switch {
	case errors.Is(err, sql.ErrNoRows):
	case err != nil:
		return Resume{}, s.opError("Begin", err)
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
		return Resume{}, s.opError("Begin", err)
	}
	r.Committed = committed
	r.Execution++
	if _, err := tx.ExecContext(ctx, `INSERT INTO executions (execution, flow, steps, workers, started_at) VALUES (?, ?, ?, ?, ?)`,
		r.Execution, e.Flow, string(steps), e.Workers, s.now().UnixNano()); err != nil {
		return Resume{}, s.opError("Begin", err)
	}
	if err := tx.Commit(); err != nil {
		return Resume{}, s.opError("Begin", err)
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
		return CommitInfo{}, s.opError("Committed", err)
	}
	c.Epoch, c.At = uint64(epoch), time.Unix(0, at).UTC()
	return c, nil
}

// Executions implements Store.
func (s *SQLiteStore) Executions(ctx context.Context) ([]ExecutionInfo, error) {
	fail := func(err error) ([]ExecutionInfo, error) {
		return nil, s.opError("Executions", err)
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

// StepIDs implements Store. It reads the steps of the runs table (through its index, one
// search per step) and those of step_sums, and returns an error wrapping ErrDamaged if they
// differ.
func (s *SQLiteStore) StepIDs(ctx context.Context) ([]string, error) {
	fail := func(err error) ([]string, error) {
		return nil, s.opError("StepIDs", err)
	}
	tx, err := s.db.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return fail(err)
	}
	defer tx.Rollback()
	stored, err := queryStrings(ctx, tx, `SELECT DISTINCT step FROM runs ORDER BY step`)
	if err != nil {
		return fail(err)
	}
	recorded, err := queryStrings(ctx, tx, `SELECT step FROM step_sums ORDER BY step`)
	if err != nil {
		return fail(err)
	}
	if !slices.Equal(stored, recorded) {
		var why []string
		for _, id := range recorded {
			if !slices.Contains(stored, id) {
				why = append(why, fmt.Sprintf("step %q has no snapshots, its commits recorded some", id))
			}
		}
		for _, id := range stored {
			if !slices.Contains(recorded, id) {
				why = append(why, fmt.Sprintf("step %q has snapshots that no commit recorded", id))
			}
		}
		return nil, damaged(s.path, strings.Join(why, "; "))
	}
	return stored, nil
}

// queryStrings runs a query of one text column and returns its rows.
func queryStrings(ctx context.Context, tx *sql.Tx, query string) ([]string, error) {
	rows, err := tx.QueryContext(ctx, query)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return nil, err
		}
		out = append(out, id)
	}
	return out, rows.Err()
}

// Verify checks the whole store as a resume would, and more: it runs SQLite's quick check of
// the whole file (which also finds damage that no row shows, such as in the list of free
// pages that later commits allocate from), then compares the steps and, for every step, the
// snapshot rows with what the commits recorded (reading them all, as Load does). It returns
// nil if the store is sound, or an error wrapping ErrDamaged that says why. `epochflow
// recovery inspect` runs it.
func (s *SQLiteStore) Verify(ctx context.Context) error {
	if err := quickCheck(ctx, s.db, s.path, ""); err != nil {
		return err
	}
	ids, err := s.StepIDs(ctx)
	if err != nil {
		return err
	}
	for _, id := range ids {
		if err := s.Load(ctx, id, func(string, uint64, []byte) error { return nil }); err != nil {
			return err
		}
	}
	return nil
}

// Steps implements Store. It merges every step's runs as Load does, but does not verify
// their checksums: inspect shows what a damaged store holds (Verify says whether it is).
func (s *SQLiteStore) Steps(ctx context.Context) ([]StepInfo, error) {
	tx, err := s.db.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return nil, s.opError("Steps", err)
	}
	ids, err := queryStrings(ctx, tx, `SELECT DISTINCT step FROM runs ORDER BY step`)
	tx.Rollback()
	if err != nil {
		return nil, s.opError("Steps", err)
	}
	var out []StepInfo
	for _, id := range ids {
		st := StepInfo{Step: id}
		err := s.scan(ctx, id, false, func(runs []runInfo) {
			st.Rows = int(totals(runs).rows)
		}, func(e *item) error {
			st.Keys++
			st.Bytes += int64(len(e.State))
			return nil
		})
		if errors.Is(err, ErrDamaged) {
			return nil, err
		}
		if err != nil {
			return nil, s.opError(fmt.Sprintf("Steps: step %q", id), err)
		}
		out = append(out, st)
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

// opError wraps an error of operation op (which names the step or epoch if there is one):
// SQLite's report of a corrupt file becomes an error wrapping ErrDamaged.
func (s *SQLiteStore) opError(op string, err error) error {
	if isCorrupt(err) {
		return damaged(s.path, fmt.Sprintf("%s: SQLite: %v", op, err))
	}
	return fmt.Errorf("recovery store %s: %s: %w", s.path, op, err)
}

// unlock releases the directory lock, if the store holds it.
func (s *SQLiteStore) unlock() {
	if s.lock != nil {
		s.lock.Close() // closing the file releases the flock
		s.lock = nil
	}
}
