package postgres

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/epochflow/epochflow/dataflow"
)

// DefaultRetryFor is how long a partition keeps reconnecting to the target database after it
// lost a connection, when Config.RetryFor is 0.
const DefaultRetryFor = time.Minute

// connLost reports whether err means that the connection is gone (the server stopped or
// restarted, the network failed), not that the server refused a statement.
func connLost(ctx context.Context, conn *pgx.Conn, err error) bool {
	if err == nil || ctx.Err() != nil {
		return false
	}
	if conn.IsClosed() {
		return true
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case "57P01", "57P02", "57P03": // admin shutdown, crash shutdown, cannot connect now
			return true
		}
		return strings.HasPrefix(pgErr.Code, "08") // connection exception
	}
	var connectErr *pgconn.ConnectError
	return errors.As(err, &connectErr)
}

func (p *partition) retryFor() time.Duration {
	if p.cfg.RetryFor == 0 {
		return DefaultRetryFor
	}
	return p.cfg.RetryFor
}

// retry runs f, and while it fails because the connection *conn is lost, replaces the
// connection (and cat's) with a new one, trying with backoff, and runs f again with
// first = false, for up to Config.RetryFor. f must be safe to run again: each run either
// finishes its work or the server rolled it back with the connection, except what f checks
// itself on a later run (a PREPARE TRANSACTION or COMMIT PREPARED whose answer was lost).
func (p *partition) retry(ctx context.Context, conn **pgx.Conn, cat *catalog, f func(first bool) error) error {
	err := f(true)
	if err == nil || p.cfg.RetryFor < 0 || !connLost(ctx, *conn, err) {
		return err
	}
	limit := p.retryFor()
	deadline := time.Now().Add(limit)
	for {
		cctx, cancel := context.WithTimeout(context.Background(), time.Second)
		(*conn).Close(cctx)
		cancel()
		c, cerr := dial(ctx, p.cfg.DSN, deadline)
		if cerr != nil {
			return fmt.Errorf("lost the connection to the target database and could not reconnect within %v (the last attempt: %v): %w", limit, cerr, err)
		}
		*conn, cat.conn = c, c
		p.reconnects.Add(1)
		if err = f(false); err == nil || !connLost(ctx, *conn, err) {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("lost the connection to the target database again and again for %v: %w", limit, err)
		}
	}
}

// connectAttempt, if set, is called with every failed attempt that connect and dial will
// try again (for tests).
var connectAttempt func(err error)

// connect opens a connection to the target database for Build. A server that is not there
// yet or is restarting (connection refused or reset, "the database system is starting up")
// is tried again with backoff for up to Config.RetryFor, as a lost connection is, logging the
// first failure: a flow started while its target restarts waits for it instead of failing. A
// refusal of the server itself (authentication, a database that does not exist) fails at once.
func connect(ctx context.Context, cfg Config) (*pgx.Conn, error) {
	c, err := pgx.Connect(ctx, cfg.DSN)
	if err == nil || cfg.RetryFor < 0 || !transientConnect(err) {
		return c, err
	}
	if connectAttempt != nil {
		connectAttempt(err)
	}
	limit := cfg.RetryFor
	if limit == 0 {
		limit = DefaultRetryFor
	}
	dataflow.Logger(ctx).Warn("postgres sink: the target database is not reachable; trying again", "for", limit, "error", err)
	if c, err = dial(ctx, cfg.DSN, time.Now().Add(limit)); err != nil {
		return nil, fmt.Errorf("not reachable within %v: %w", limit, err)
	}
	return c, nil
}

// dial connects to dsn, trying again with backoff while the failure is transient
// (transientConnect) and deadline is not passed; each attempt is bounded by 10 s.
func dial(ctx context.Context, dsn string, deadline time.Time) (*pgx.Conn, error) {
	wait := 50 * time.Millisecond
	for {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		c, err := pgx.Connect(cctx, dsn)
		cancel()
		if err == nil {
			return c, nil
		}
		if !transientConnect(err) || ctx.Err() != nil || time.Now().Add(wait).After(deadline) {
			return nil, err
		}
		if connectAttempt != nil {
			connectAttempt(err)
		}
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return nil, err
		}
		wait = min(2*wait, 2*time.Second)
	}
}

// transientConnect tells whether a failed connect may succeed if tried again: the server is
// starting, shutting down or not listening, or the network failed; not when the server
// refused the connection for a reason of its own.
func transientConnect(err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case "57P01", "57P02", "57P03":
			return true
		}
		return strings.HasPrefix(pgErr.Code, "08")
	}
	var connectErr *pgconn.ConnectError
	return errors.As(err, &connectErr)
}
