package pgstore

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"

	"github.com/epochflow/epochflow/recovery"
)

// The writer's exclusion: a read-write store takes a session-level advisory lock, keyed by its
// schema (lockKey), on a connection of its own, and runs Begin and Commit on that connection.
// The lock is held as long as that connection lives: Close ends it; if the process dies or the
// connection breaks (a network failure, a restart of the server), the server releases it. A
// second writer's pg_try_advisory_lock fails, and its Open returns an error wrapping
// recovery.ErrInUse. Since Commit runs on the lock's own connection, a commit can never be
// made by a store that lost its lock: when the connection is gone, Commit fails, and the
// next Begin or Commit connects again and takes the lock again (or gets ErrInUse).

// lockKey is the SQL expression of the store's lock key, of its schema ($1).
const lockKey = `hashtextextended('epochflow recovery store ' || $1, 0)`

// relockWait is how long a store that lost its connection tries to take the lock again: the
// server releases the lock of a broken connection once its backend notices and exits.
var relockWait = 5 * time.Second

// connectWriter connects the writer's connection and takes the lock on it, trying again for
// up to wait while another connection holds it. s.mu must be held (or s not yet shared).
func (s *Store) connectWriter(ctx context.Context, wait time.Duration) error {
	cfg := s.pool.cfg.Copy()
	// A cancelled context cancels the statement (a cancel request) instead of closing the
	// connection, which would release the lock (and leave the statement running until the
	// server notices).
	cfg.BuildContextWatcherHandler = func(c *pgconn.PgConn) ctxwatch.Handler {
		return &pgconn.CancelRequestContextWatcherHandler{Conn: c, DeadlineDelay: 10 * time.Second}
	}
	c, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return s.opError("connecting", err)
	}
	deadline := time.Now().Add(wait)
	var ok bool
	for {
		if err := c.QueryRow(ctx, `SELECT pg_try_advisory_lock(`+lockKey+`)`, s.schema).Scan(&ok); err != nil {
			closeConn(c)
			return s.opError("taking the writer's lock", err)
		}
		if ok || time.Now().After(deadline) {
			break
		}
		select {
		case <-ctx.Done():
			closeConn(c)
			return s.opError("taking the writer's lock", ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
	if !ok {
		closeConn(c)
		return fmt.Errorf("%w: %s is open for writing by another run (of this flow or another, in this process or another): "+
			"stop that run, or give this one another schema", recovery.ErrInUse, s.name)
	}
	s.writer = c
	return nil
}

// closeWriter releases the lock and closes the writer's connection. s.mu must be held.
func (s *Store) closeWriter() {
	if s.writer == nil {
		return
	}
	if !s.writer.IsClosed() {
		// Closing the connection releases the lock too, but once the server's backend
		// has exited, after Close has returned: unlocking first makes the store free for
		// a next open as soon as Close returns.
		ctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
		s.writer.Exec(ctx, `SELECT pg_advisory_unlock(`+lockKey+`)`, s.schema)
		cancel()
	}
	closeConn(s.writer)
	s.writer = nil
}

// ensureWriter returns the writer's connection, connecting again and taking the lock again if
// it was lost. If the lock was lost after Begin and another run has begun since, the
// execution is no longer this store's: it returns an error and Commit needs a new Begin.
// s.mu must be held.
func (s *Store) ensureWriter(ctx context.Context, op string) (*pgx.Conn, error) {
	if s.writer != nil && !s.writer.IsClosed() {
		return s.writer, nil
	}
	if err := ctx.Err(); err != nil {
		return nil, s.opError(op, err)
	}
	s.closeWriter()
	if err := s.connectWriter(ctx, relockWait); err != nil {
		// (The error says "connecting"; nothing of op was written.)
		return nil, err
	}
	if s.execution == 0 {
		return s.writer, nil
	}
	var last int
	if err := s.writer.QueryRow(ctx, `SELECT COALESCE(MAX(execution), 0) FROM `+s.table("executions")).Scan(&last); err != nil {
		s.closeWriter()
		return nil, s.opError(op, err)
	}
	if last != s.execution {
		x := s.execution
		s.execution = 0
		return nil, fmt.Errorf("%w: %s: %s: the connection holding the writer's lock was lost, and execution %d has begun since "+
			"(this store's is %d): Begin again", recovery.ErrInUse, s.name, op, last, x)
	}
	return s.writer, nil
}

// beginTx starts a transaction on the writer's connection (ensureWriter). If the connection
// turns out to be gone at BEGIN (the server ended it while it was idle: a restart), nothing
// was sent but BEGIN, and it connects again (taking the lock again) and starts it once more.
// Its errors name the store and op. s.mu must be held.
func (s *Store) beginTx(ctx context.Context, op string) (pgx.Tx, error) {
	c, err := s.ensureWriter(ctx, op)
	if err != nil {
		return nil, err
	}
	tx, err := c.Begin(ctx)
	if err != nil && c.IsClosed() && ctx.Err() == nil {
		if c, err = s.ensureWriter(ctx, op); err != nil {
			return nil, err
		}
		tx, err = c.Begin(ctx)
	}
	if err != nil {
		return nil, s.opError(op, err)
	}
	return tx, nil
}
