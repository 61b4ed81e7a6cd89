package pgstore

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// maxIdle is how many idle read connections a store keeps.
const maxIdle = 4

// closeTimeout bounds how long closing a connection waits for the server.
const closeTimeout = 5 * time.Second

// pool is the store's connections for reads (Load, Steps, the inspection methods): Loads from
// several goroutines each take their own. pgx's own pool (pgxpool) needs a module this one
// does not otherwise use; this one needs no goroutine.
type pool struct {
	cfg    *pgx.ConnConfig
	mu     sync.Mutex
	idle   []*pgx.Conn
	closed bool
}

func newPool(cfg *pgx.ConnConfig) *pool { return &pool{cfg: cfg} }

// errClosed is the error of a use of a closed store's connections.
var errClosed = errors.New("store is closed")

// get returns an idle connection (reused) or a new one.
func (p *pool) get(ctx context.Context) (c *pgx.Conn, reused bool, err error) {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil, false, errClosed
	}
	if n := len(p.idle); n > 0 {
		c := p.idle[n-1]
		p.idle = p.idle[:n-1]
		p.mu.Unlock()
		return c, true, nil
	}
	p.mu.Unlock()
	c, err = pgx.ConnectConfig(ctx, p.cfg.Copy())
	return c, false, err
}

// put gives c back: it is kept if it is healthy and there is room, else closed.
func (p *pool) put(c *pgx.Conn) {
	if c == nil {
		return
	}
	p.mu.Lock()
	if !p.closed && !c.IsClosed() && c.PgConn().TxStatus() == 'I' && len(p.idle) < maxIdle {
		p.idle = append(p.idle, c)
		p.mu.Unlock()
		return
	}
	p.mu.Unlock()
	closeConn(c)
}

// close closes the idle connections; those in use are closed as they are given back.
func (p *pool) close() {
	p.mu.Lock()
	idle := p.idle
	p.idle, p.closed = nil, true
	p.mu.Unlock()
	for _, c := range idle {
		closeConn(c)
	}
}

// closeConn closes c, waiting at most closeTimeout for the server.
func closeConn(c *pgx.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
	defer cancel()
	c.Close(ctx)
}
