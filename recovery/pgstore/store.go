package pgstore

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/epochflow/epochflow/recovery"
)

// DefaultSchema is the PostgreSQL schema a store lives in when neither Options.Schema nor the
// DSN's schema parameter names one.
const DefaultSchema = "epochflow"

// Options configures Open. The zero value is the default.
type Options struct {
	// BackupInterval is how long a snapshot is kept after a newer snapshot of the same key
	// was committed (and a tombstone after it was committed), as
	// recovery.SQLiteOptions.BackupInterval. 0 keeps only the newest snapshot of each key. It
	// must not be negative.
	BackupInterval time.Duration
	// Schema is the PostgreSQL schema that holds the store's tables: one store per schema,
	// so that several flows can share a database, each with its own schema. Empty means the
	// DSN's schema parameter if it has one, else DefaultSchema. A read-write Open creates the
	// schema if it does not exist.
	Schema string
	// ReadOnly opens an existing store for inspection only: Open creates nothing (it returns
	// an error wrapping recovery.ErrNoStore if the schema holds no store), Begin and Commit
	// return an error wrapping recovery.ErrReadOnly, and nothing is written. It takes no
	// lock: it can be open while a writer commits, and sees each commit once it is
	// committed.
	ReadOnly bool
	// Now, if not nil, replaces time.Now as the clock for start and commit times (tests).
	Now func() time.Time
}

// Store is the PostgreSQL recovery.Store (see the package documentation). Its methods are
// safe for concurrent use; Begin and Commit are serialised.
type Store struct {
	name     string // the DSN without password, and the schema: what errors name the store by
	schema   string
	backup   time.Duration
	now      func() time.Time
	readOnly bool
	pool     *pool // connections for reads

	mu        sync.Mutex // serialises Begin and Commit; guards the fields below
	writer    *pgx.Conn  // holds the writer's advisory lock; Begin and Commit run on it
	execution int        // the execution recorded by Begin, 0 before (or after the lock was lost)
	workers   int        // its worker count
	closed    bool
}

var _ recovery.Store = (*Store)(nil)

// Open opens the store in the schema opts.Schema of the PostgreSQL database dsn (a URL,
// postgres://user:password@host:port/database?sslmode=..., or keyword=value pairs, as
// pgx.ParseConfig takes it). A URL may carry the schema as a parameter schema=NAME, which Open
// takes out of it (a DSN parameter it does not know is sent to the server as a setting).
//
// A read-write Open connects, takes the store's advisory lock on that connection (held until
// Close: a second writer of the same schema gets an error wrapping recovery.ErrInUse), and
// creates the schema and its tables if they do not exist. It refuses a schema that holds
// other tables than a store's (recovery.ErrNotStore) and a store of another schema version
// (recovery.ErrSchemaVersion). Errors name the store by its DSN without the password, and its
// schema.
func Open(ctx context.Context, dsn string, opts Options) (*Store, error) {
	dsn, schema, err := splitSchema(dsn, opts.Schema)
	name := fmt.Sprintf("%s (schema %s)", redact(dsn), schema)
	if err != nil {
		return nil, fmt.Errorf("recovery store %s: %w", name, err)
	}
	if opts.BackupInterval < 0 {
		return nil, fmt.Errorf("recovery store %s: negative BackupInterval %v", name, opts.BackupInterval)
	}
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		// pgx's error quotes the DSN with the password redacted as best it can: give
		// only the reason.
		if why := errors.Unwrap(err); why != nil {
			return nil, fmt.Errorf("recovery store %s: cannot parse the DSN: %w", name, why)
		}
		return nil, fmt.Errorf("recovery store %s: cannot parse the DSN", name)
	}
	if cfg.RuntimeParams["application_name"] == "" {
		cfg.RuntimeParams["application_name"] = "epochflow recovery store"
	}
	s := &Store{name: name, schema: schema, backup: opts.BackupInterval, now: opts.Now, readOnly: opts.ReadOnly, pool: newPool(cfg)}
	if s.now == nil {
		s.now = time.Now
	}
	if opts.ReadOnly {
		c, _, err := s.pool.get(ctx)
		if err != nil {
			return nil, s.opError("Open", err)
		}
		err = s.checkSchema(ctx, c, false)
		s.pool.put(c)
		if err != nil {
			s.pool.close()
			return nil, err
		}
		return s, nil
	}
	if err := s.connectWriter(ctx, 0); err != nil {
		s.pool.close()
		return nil, err
	}
	if err := s.checkSchema(ctx, s.writer, true); err != nil {
		s.closeWriter()
		s.pool.close()
		return nil, err
	}
	return s, nil
}

// schemaParam is the DSN parameter that names the schema.
const schemaParam = "schema"

// splitSchema takes the schema parameter out of a URL dsn and returns the DSN without it and
// the schema: opts (if not empty), else the parameter, else DefaultSchema.
func splitSchema(dsn, opt string) (string, string, error) {
	schema := opt
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		u, err := url.Parse(dsn)
		if err != nil {
			return redact(dsn), firstOf(schema, DefaultSchema), errors.New("malformed DSN URL")
		}
		q := u.Query()
		if p := q.Get(schemaParam); p != "" {
			if schema != "" && schema != p {
				return dsn, schema, fmt.Errorf("the DSN's schema parameter %q differs from Options.Schema %q", p, schema)
			}
			schema = p
		}
		if q.Has(schemaParam) {
			q.Del(schemaParam)
			u.RawQuery = q.Encode()
			dsn = u.String()
		}
	}
	schema = firstOf(schema, DefaultSchema)
	if len(schema) > 63 || strings.ContainsRune(schema, 0) {
		return dsn, schema, fmt.Errorf("schema name %q: want 1 to 63 bytes, no NUL", schema)
	}
	return dsn, schema, nil
}

func firstOf(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// RedactDSN returns dsn without its password (a URL's user password or password parameter,
// a keyword=value DSN's password), for logs and errors.
func RedactDSN(dsn string) string { return redact(dsn) }

// passwordRe finds the password of a keyword=value DSN.
var passwordRe = regexp.MustCompile(`(?i)(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S*)`)

// redact returns dsn without its password (a URL's user password or password parameter, a
// keyword=value DSN's password).
func redact(dsn string) string {
	if u, err := url.Parse(dsn); err == nil && (u.Scheme == "postgres" || u.Scheme == "postgresql") {
		if u.User != nil {
			if _, ok := u.User.Password(); ok {
				u.User = url.User(u.User.Username())
			}
		}
		q := u.Query()
		if q.Has("password") {
			q.Set("password", "xxxxx")
			u.RawQuery = q.Encode()
		}
		return u.String()
	}
	if strings.Contains(dsn, "://") {
		return "(a malformed DSN URL)"
	}
	return passwordRe.ReplaceAllString(dsn, "${1}xxxxx")
}

// Name returns what the store's errors name it by: its DSN without the password, and its
// schema.
func (s *Store) Name() string { return s.name }

// Schema returns the PostgreSQL schema that holds the store's tables.
func (s *Store) Schema() string { return s.schema }

// table returns the quoted, schema-qualified name of the store's table t.
func (s *Store) table(t string) string { return pgx.Identifier{s.schema, t}.Sanitize() }

// checkWritable returns an error unless Begin or Commit may write. s.mu must be held.
func (s *Store) checkWritable(op string) error {
	if s.closed {
		return fmt.Errorf("recovery store %s: %s: store is closed", s.name, op)
	}
	if s.readOnly {
		return fmt.Errorf("%w: %s: %s", recovery.ErrReadOnly, s.name, op)
	}
	return nil
}

// Close implements recovery.Store: it releases the writer's lock (by closing its connection)
// and closes every connection. Close is idempotent.
func (s *Store) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	s.closeWriter()
	s.pool.close()
	return nil
}

// opError wraps an error of operation op (which names the step or epoch if there is one).
func (s *Store) opError(op string, err error) error {
	return fmt.Errorf("recovery store %s: %s: %w", s.name, op, err)
}

// damaged returns an error wrapping recovery.ErrDamaged that names the store, says what is
// wrong (why names the step) and what to do.
func (s *Store) damaged(why string) error {
	return fmt.Errorf("%w: %s: %s; the flow cannot resume from it: restore a backup of the schema %s (pg_dump --schema), "+
		"or start over with a new schema, which replays the flow from its sources", recovery.ErrDamaged, s.name, why, s.schema)
}
