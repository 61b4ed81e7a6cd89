package pgrepl

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/epochflow/epochflow/dataflow"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
)

// HeartbeatPrefix is the prefix of the logical messages the source writes when
// Config.Heartbeat is set. Transactions that carry only such a message advance the source's
// position but emit no event.
const HeartbeatPrefix = "epochflow.heartbeat"

// DefaultStatusInterval is the longest time between two standby status updates.
const DefaultStatusInterval = 10 * time.Second

// DefaultMaxBuffered is how many events the replication goroutine holds for Next before it
// stops reading from the server (the server then waits; the connection stays alive).
const DefaultMaxBuffered = 50_000

// maxBatch is the most events one Next returns.
const maxBatch = 2048

// Config says which slot and publication a Source reads and what it may create.
type Config struct {
	// DSN is the connection string (URL or key=value) of the source database. The source
	// opens a normal connection (checks, slot and publication creation, heartbeats) and a
	// replication connection (the same DSN with replication=database). The user needs the
	// REPLICATION attribute (or to be a superuser), and CREATE on the database to create a
	// publication.
	DSN string
	// Slot is the logical replication slot (lower-case letters, digits and underscores). It
	// must use the pgoutput plugin and belong to the DSN's database.
	Slot string
	// Publication is the publication whose tables the slot streams.
	Publication string
	// Tables, if set, are the tables ("table" or "schema.table") the flow needs: each must
	// exist and be covered by the publication, or Build fails naming it. CreatePublication
	// creates the publication FOR TABLE these. A partitioned table needs a publication with
	// publish_via_partition_root (CreatePublication sets it), so that the changes of its
	// partitions come as the table's and InitialCopy copies the rows of all its partitions
	// as the table's; Build fails naming the table otherwise.
	Tables []string
	// CreateSlot creates the slot (pgoutput) when it does not exist; otherwise a missing slot
	// is an error. A created slot starts at the current end of WAL: changes committed before
	// are not streamed.
	CreateSlot bool
	// CreatePublication creates the publication when it does not exist, FOR TABLE Tables (FOR
	// ALL TABLES when Tables is empty, which needs a superuser).
	CreatePublication bool
	// DropSlotAtEnd drops the slot in Close once the source has ended (see IdleEOF) and its
	// last position is committed. Without it the flow never drops a slot.
	DropSlotAtEnd bool
	// Heartbeat, when positive, writes a transactional logical message
	// (pg_logical_emit_message(true, HeartbeatPrefix, '')) that often, so that a database
	// whose published tables are idle still lets the slot advance (and the server free WAL).
	Heartbeat time.Duration
	// StatusInterval is the longest time between two standby status updates; 0 means
	// DefaultStatusInterval, or a third of the server's wal_sender_timeout when that is
	// shorter. (Keepalives that ask for a reply are answered at once in any case.)
	StatusInterval time.Duration
	// IdleEOF, when positive, ends the source (Next returns io.EOF) once no change has arrived
	// for that long, at a transaction boundary. Zero streams forever.
	IdleEOF time.Duration
	// MaxBuffered bounds the events decoded but not yet returned by Next; 0 means
	// DefaultMaxBuffered.
	MaxBuffered int
	// InitialCopy, on a run without recovery state, first emits a Truncate of Tables (which
	// must be set) and every row of them as an Insert, both with FromCopy set, read in one
	// REPEATABLE READ snapshot taken after the slot exists, and then streams from the slot. Changes committed
	// between the slot's position and that snapshot are in both, so the consumer must apply
	// changes by key, inserts as upserts (postgres.FromChange does): the copy then converges
	// to the source table. A run that stops before the epoch that ends the copy is committed
	// copies again, with a new snapshot, when it resumes.
	InitialCopy bool
}

// State is the resume state of the source's one partition: the end LSN of the last complete
// transaction emitted, and, when an epoch ended in the middle of a transaction, that
// transaction's commit LSN and how many of its events were emitted (a resumed source skips
// them when the server sends the transaction again).
type State struct {
	LSN      LSN
	TxCommit LSN `json:",omitempty"`
	TxEvents int `json:",omitempty"`
	// Copying is set while the initial copy (Config.InitialCopy) is not complete.
	Copying bool `json:",omitempty"`
}

// Source is the dataflow.PartitionedSource behind Changes: one partition, the slot, named
// "slot/NAME".
type Source struct {
	cfg Config
}

// NewSource returns the source of Changes, for tests and for composing it.
func NewSource(cfg Config) *Source { return &Source{cfg: cfg} }

// Changes returns a source of the change events of a logical replication slot (see the
// package doc for what it promises).
func Changes(cfg Config) dataflow.Source[Change] {
	return dataflow.FromPartitioned[Change, State](NewSource(cfg))
}

func validSlotName(s string) bool {
	if s == "" || len(s) > 63 {
		return false
	}
	for _, r := range s {
		if !(r == '_' || (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9')) {
			return false
		}
	}
	return true
}

func (c *Config) check() error {
	switch {
	case c.DSN == "":
		return errors.New("pgrepl: Config.DSN is empty: give the source database's connection string")
	case !validSlotName(c.Slot):
		return fmt.Errorf("pgrepl: Config.Slot %q: a slot name is 1 to 63 lower-case letters, digits and underscores", c.Slot)
	case c.Publication == "":
		return errors.New("pgrepl: Config.Publication is empty: name the publication the slot streams")
	case c.Heartbeat < 0 || c.StatusInterval < 0 || c.IdleEOF < 0 || c.MaxBuffered < 0:
		return errors.New("pgrepl: Config.Heartbeat, StatusInterval, IdleEOF and MaxBuffered must not be negative")
	case c.InitialCopy && len(c.Tables) == 0:
		return errors.New("pgrepl: Config.InitialCopy needs Config.Tables: name the tables to copy")
	}
	if _, err := pgconn.ParseConfig(c.DSN); err != nil {
		return fmt.Errorf("pgrepl: Config.DSN: %w", err)
	}
	return nil
}

// Parts checks the configuration and returns the one partition, "slot/NAME".
func (s *Source) Parts(context.Context) ([]string, error) {
	if err := s.cfg.check(); err != nil {
		return nil, err
	}
	return []string{"slot/" + s.cfg.Slot}, nil
}

// statusHook, when set (by tests), is called by the replication goroutine with every standby
// status update it sends, and the keepalive it answers (nil for a periodic or commit update).
var statusHook func(flushed LSN, keepalive *pglogrepl.PrimaryKeepaliveMessage)

// Build checks the slot, the publication and the tables (creating what the Config allows),
// starts replication from the resume state's LSN (the slot's confirmed_flush_lsn on a fresh
// start) and starts the replication goroutine.
func (s *Source) Build(ctx context.Context, part string, resume *State) (dataflow.StatefulSource[Change, State], error) {
	cfg := s.cfg
	if err := cfg.check(); err != nil {
		return nil, err
	}
	if cfg.MaxBuffered == 0 {
		cfg.MaxBuffered = DefaultMaxBuffered
	}
	admin, err := pgx.Connect(ctx, cfg.DSN)
	if err != nil {
		return nil, fmt.Errorf("pgrepl: connecting to the source database: %w", err)
	}
	p := &partition{cfg: cfg, admin: admin, dec: newDecoder(), rels: map[uint32]*Relation{}, typeNames: map[uint32]string{},
		ready: make(chan struct{}, 1), room: make(chan struct{}, 1), wakeCh: make(chan struct{}, 1),
		done: make(chan struct{}), hbStop: make(chan struct{}), hbDone: make(chan struct{})}
	fail := func(err error) (dataflow.StatefulSource[Change, State], error) {
		if p.conn != nil {
			p.conn.Close(context.Background())
		}
		admin.Close(context.Background())
		return nil, err
	}
	confirmed, err := p.prepare(ctx)
	if err != nil {
		return fail(err)
	}
	if resume != nil {
		if resume.LSN < confirmed {
			return fail(fmt.Errorf("pgrepl: slot %q: its confirmed_flush_lsn %s is past the resume point %s: the changes between were consumed by another client or the slot was advanced by hand; recreate the slot and start the flow afresh (without its recovery store)",
				cfg.Slot, confirmed, resume.LSN))
		}
		p.pos = *resume
		p.pos.Copying = resume.Copying && cfg.InitialCopy
	} else {
		p.pos = State{LSN: confirmed, Copying: cfg.InitialCopy}
	}
	p.skip = p.pos
	p.start = p.pos.LSN
	p.flushed.Store(uint64(confirmed))
	if p.pos.Copying {
		// The copy runs first, on the replication goroutine; replication starts after it.
		p.copyCtx, p.copyCancel = context.WithCancel(context.Background())
	} else if err := p.startReplication(ctx, p.pos.LSN); err != nil {
		return fail(err)
	}
	p.lastChange = time.Now() // the IdleEOF clock starts with the stream, not before the slot and the connections
	go p.loop()
	if cfg.Heartbeat > 0 {
		go p.heartbeat()
	} else {
		close(p.hbDone)
	}
	return p, nil
}

// prepare checks (and creates) the tables, the publication and the slot, and returns the
// slot's confirmed_flush_lsn.
func (p *partition) prepare(ctx context.Context) (LSN, error) {
	cfg := &p.cfg
	db := p.admin
	var tables []string // quoted names
	var partitioned []string
	for _, t := range cfg.Tables {
		var schema, name, kind string
		err := db.QueryRow(ctx, `SELECT n.nspname, c.relname, c.relkind::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
			WHERE c.oid = to_regclass($1)`, t).Scan(&schema, &name, &kind)
		if errors.Is(err, pgx.ErrNoRows) {
			return 0, fmt.Errorf("pgrepl: table %q does not exist in the source database", t)
		}
		if err != nil {
			return 0, fmt.Errorf("pgrepl: looking up table %q: %w", t, err)
		}
		tables = append(tables, QuoteIdent(schema)+"."+QuoteIdent(name))
		if kind == "p" {
			partitioned = append(partitioned, t)
		}
	}
	var allTables, viaRoot bool
	err := db.QueryRow(ctx, "SELECT puballtables, pubviaroot FROM pg_publication WHERE pubname = $1", cfg.Publication).Scan(&allTables, &viaRoot)
	if errors.Is(err, pgx.ErrNoRows) {
		if !cfg.CreatePublication {
			return 0, fmt.Errorf("pgrepl: publication %q does not exist (create it with CREATE PUBLICATION, or set CreatePublication)", cfg.Publication)
		}
		q := "CREATE PUBLICATION " + QuoteIdent(cfg.Publication)
		if len(tables) > 0 {
			q += " FOR TABLE " + strings.Join(tables, ", ")
		} else {
			q += " FOR ALL TABLES"
		}
		if len(partitioned) > 0 {
			// A partitioned table's changes then come as the table's, not as those of
			// partitions the flow does not know by name.
			q += " WITH (publish_via_partition_root = true)"
			viaRoot = true
		}
		if _, err := db.Exec(ctx, q); err != nil {
			return 0, fmt.Errorf("pgrepl: creating publication %q: %w", cfg.Publication, err)
		}
	} else if err != nil {
		return 0, fmt.Errorf("pgrepl: looking up publication %q: %w", cfg.Publication, err)
	}
	if len(partitioned) > 0 && !viaRoot {
		return 0, fmt.Errorf("pgrepl: table %q is partitioned, and publication %q streams its changes as those of its partitions, under their names: "+
			"ALTER PUBLICATION %s SET (publish_via_partition_root = true) to have them as the table's, or name the partitions in Config.Tables",
			partitioned[0], cfg.Publication, QuoteIdent(cfg.Publication))
	}
	for i, t := range cfg.Tables {
		var covered bool
		err := db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_publication_tables pt
			WHERE pt.pubname = $1 AND format('%I.%I', pt.schemaname, pt.tablename)::regclass = to_regclass($2))`,
			cfg.Publication, tables[i]).Scan(&covered)
		if err != nil {
			return 0, fmt.Errorf("pgrepl: checking that publication %q covers table %q: %w", cfg.Publication, t, err)
		}
		if !covered {
			return 0, fmt.Errorf("pgrepl: publication %q does not cover table %q (ALTER PUBLICATION %s ADD TABLE %s)",
				cfg.Publication, t, QuoteIdent(cfg.Publication), tables[i])
		}
	}
	var plugin, slotType, slotDB, curDB string
	var confirmed *string
	err = db.QueryRow(ctx, `SELECT coalesce(plugin, ''), slot_type, coalesce(database, ''), confirmed_flush_lsn::text, current_database()
		FROM pg_replication_slots WHERE slot_name = $1`, cfg.Slot).Scan(&plugin, &slotType, &slotDB, &confirmed, &curDB)
	if errors.Is(err, pgx.ErrNoRows) {
		if !cfg.CreateSlot {
			return 0, fmt.Errorf("pgrepl: replication slot %q does not exist (create it with pg_create_logical_replication_slot('%s', 'pgoutput'), or set CreateSlot)", cfg.Slot, cfg.Slot)
		}
		if _, err := db.Exec(ctx, "SELECT pg_create_logical_replication_slot($1, 'pgoutput')", cfg.Slot); err != nil {
			return 0, fmt.Errorf("pgrepl: creating replication slot %q: %w", cfg.Slot, err)
		}
		err = db.QueryRow(ctx, `SELECT coalesce(plugin, ''), slot_type, coalesce(database, ''), confirmed_flush_lsn::text, current_database()
			FROM pg_replication_slots WHERE slot_name = $1`, cfg.Slot).Scan(&plugin, &slotType, &slotDB, &confirmed, &curDB)
	}
	if err != nil {
		return 0, fmt.Errorf("pgrepl: looking up replication slot %q: %w", cfg.Slot, err)
	}
	switch {
	case slotType != "logical":
		return 0, fmt.Errorf("pgrepl: replication slot %q is a %s slot, want a logical slot with the pgoutput plugin", cfg.Slot, slotType)
	case plugin != "pgoutput":
		return 0, fmt.Errorf("pgrepl: replication slot %q uses the plugin %q, want pgoutput", cfg.Slot, plugin)
	case slotDB != curDB:
		return 0, fmt.Errorf("pgrepl: replication slot %q belongs to database %q, not to %q", cfg.Slot, slotDB, curDB)
	case confirmed == nil:
		return 0, fmt.Errorf("pgrepl: replication slot %q has no confirmed_flush_lsn yet: it is still being created (creating a logical slot waits until every transaction running on the server, prepared ones of pg_prepared_xacts included, has ended)", cfg.Slot)
	}
	lsn, err := ParseLSN(*confirmed)
	if err != nil {
		return 0, err
	}
	if cfg.StatusInterval == 0 {
		// Status updates must come well within wal_sender_timeout.
		cfg.StatusInterval = DefaultStatusInterval
		var timeoutMs int64
		if err := db.QueryRow(ctx, "SELECT setting::bigint FROM pg_settings WHERE name = 'wal_sender_timeout'").Scan(&timeoutMs); err == nil && timeoutMs > 0 {
			if t := time.Duration(timeoutMs) * time.Millisecond / 3; t < cfg.StatusInterval {
				cfg.StatusInterval = t
			}
		}
	}
	return lsn, nil
}

func (p *partition) startReplication(ctx context.Context, start LSN) error {
	pc, err := pgconn.ParseConfig(p.cfg.DSN)
	if err != nil {
		return fmt.Errorf("pgrepl: Config.DSN: %w", err)
	}
	pc.RuntimeParams["replication"] = "database"
	pubs := strings.ReplaceAll(QuoteIdent(p.cfg.Publication), "'", "''")
	args := []string{"proto_version '1'", "publication_names '" + pubs + "'", "messages 'true'"}
	// A slot stays active for a moment after its previous client died (a crashed run): retry.
	deadline := time.Now().Add(30 * time.Second)
	for {
		conn, err := pgconn.ConnectConfig(ctx, pc)
		if err != nil {
			return fmt.Errorf("pgrepl: opening the replication connection: %w", err)
		}
		err = pglogrepl.StartReplication(ctx, conn, p.cfg.Slot, pglogrepl.LSN(start),
			pglogrepl.StartReplicationOptions{Mode: pglogrepl.LogicalReplication, PluginArgs: args})
		if err == nil {
			p.conn = conn
			p.live.Store(conn)
			return nil
		}
		conn.Close(context.Background())
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "55006" && time.Now().Before(deadline) { // object_in_use
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(100 * time.Millisecond):
			}
			continue
		}
		return fmt.Errorf("pgrepl: slot %q: starting replication at %s: %w", p.cfg.Slot, start, err)
	}
}

// partition is the open slot. The worker calls Next, Snapshot, Commit and Close; the
// replication goroutine (loop) owns conn and the decoding state; the heartbeat goroutine owns
// admin until it ends.
type partition struct {
	cfg   Config
	conn  *pgconn.PgConn // nil until replication started (after the initial copy)
	live  atomic.Pointer[pgconn.PgConn]
	admin *pgx.Conn

	// The initial copy (Config.InitialCopy): start is the LSN replication starts at once it
	// is done; copyCtx is cancelled by Close.
	start      LSN
	copyCtx    context.Context
	copyCancel context.CancelFunc

	// Worker side.
	pos       State // after everything Next returned
	eof       bool
	idleTimer *time.Timer
	closed    bool

	// Replication goroutine side.
	dec       *decoder
	rels      map[uint32]*Relation
	typeNames map[uint32]string
	skip      State // what a resumed run skips
	tx        txInfo

	// Shared.
	mu         sync.Mutex
	queue      []Change // Kind 0: a position marker (a transaction with no events)
	err        error
	lastChange time.Time
	ready      chan struct{} // data (or an error) for Next
	room       chan struct{} // the queue has room again
	wakeCh     chan struct{}
	wakeFlag   atomic.Bool
	stop       atomic.Bool
	flushed    atomic.Uint64 // the LSN to report: a committed epoch's
	done       chan struct{} // loop ended
	hbStop     chan struct{}
	hbDone     chan struct{}
}

type txInfo struct {
	xid       uint32
	commitLSN LSN
	time      time.Time
	begun     bool // the Begin event was queued
	events    int  // events of the transaction so far (queued or skipped)
	skipAll   bool // a transaction the resume point covers
	skipFirst int  // events to skip (a transaction a resumed epoch emitted in part)
}

func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// Wait implements dataflow.Waiter: it is ready when events, the end, or an error arrived.
func (p *partition) Wait() <-chan struct{} { return p.ready }

// Next returns the events decoded so far (at most a couple of thousand).
func (p *partition) Next(context.Context) ([]Change, error) {
	if p.eof {
		return nil, io.EOF
	}
	p.mu.Lock()
	if p.err != nil {
		err := p.err
		p.mu.Unlock()
		return nil, err
	}
	n := min(len(p.queue), maxBatch)
	var items []Change
	if n > 0 {
		wasFull := len(p.queue) >= p.cfg.MaxBuffered
		items = make([]Change, n)
		copy(items, p.queue)
		rest := copy(p.queue, p.queue[n:])
		clear(p.queue[rest:])
		p.queue = p.queue[:rest]
		if wasFull {
			signal(p.room)
		}
	}
	more := len(p.queue) > 0
	last := p.lastChange
	p.mu.Unlock()
	if more {
		signal(p.ready)
	}
	out := items[:0]
	for _, c := range items {
		if c.FromCopy {
			out = append(out, c)
			continue
		}
		switch c.Kind {
		case 0: // a transaction without events, or the end of the initial copy
			p.pos = State{LSN: c.LSN}
			continue
		case Commit:
			p.pos = State{LSN: c.LSN}
		default:
			if p.pos.TxCommit != c.CommitLSN {
				p.pos.TxCommit, p.pos.TxEvents = c.CommitLSN, 0
			}
			p.pos.TxEvents++
		}
		out = append(out, c)
	}
	// At a transaction boundary with nothing buffered, the source ends IdleEOF after the last
	// change: now, or by waking the waiter then. The clock starts also after a Next that
	// returned changes (the end of a transaction whose first events an earlier Next took).
	if !more && p.cfg.IdleEOF > 0 && p.pos.TxCommit == 0 && !p.pos.Copying {
		wait := time.Until(last.Add(p.cfg.IdleEOF))
		switch {
		case wait <= 0 && len(out) == 0:
			p.eof = true
			return nil, io.EOF
		case p.idleTimer == nil:
			p.idleTimer = time.AfterFunc(max(wait, 0), func() { signal(p.ready) })
		default:
			p.idleTimer.Reset(max(wait, 0))
		}
	}
	return out, nil
}

// Snapshot returns the position after everything Next returned.
func (p *partition) Snapshot() State { return p.pos }

// Commit makes state.LSN (the end of the last complete transaction of a committed epoch) the
// flushed LSN the replication goroutine reports, if it is later than the one reported. It
// returns at once, or with the replication goroutine's failure.
func (p *partition) Commit(_ context.Context, state State) error {
	if uint64(state.LSN) > p.flushed.Load() {
		p.flushed.Store(uint64(state.LSN))
		p.wake()
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}

// wake interrupts the replication goroutine's read so that it sends a status update (or
// stops).
func (p *partition) wake() {
	p.wakeFlag.Store(true)
	signal(p.wakeCh)
	if pc := p.live.Load(); pc != nil {
		if c := pc.Conn(); c != nil {
			c.SetReadDeadline(time.Now())
		}
	}
}

func (p *partition) fail(err error) {
	p.mu.Lock()
	if p.err == nil {
		p.err = fmt.Errorf("pgrepl: slot %q: %w", p.cfg.Slot, err)
	}
	p.mu.Unlock()
	signal(p.ready)
}

// Close stops the goroutines, sends a last status update with the committed LSN, closes the
// connections, and drops the slot if DropSlotAtEnd says so and the source ended.
func (p *partition) Close() error {
	if p.closed {
		return nil
	}
	p.closed = true
	if p.idleTimer != nil {
		p.idleTimer.Stop()
	}
	p.stop.Store(true)
	if p.copyCancel != nil {
		p.copyCancel()
	}
	p.wake()
	<-p.done
	close(p.hbStop)
	<-p.hbDone
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if p.conn != nil {
		p.conn.Close(ctx)
	}
	var errs []error
	p.mu.Lock()
	loopErr := p.err
	p.mu.Unlock()
	if p.cfg.DropSlotAtEnd && p.eof && loopErr == nil && uint64(p.pos.LSN) <= p.flushed.Load() {
		if err := p.dropSlot(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	p.admin.Close(ctx)
	return errors.Join(errs...)
}

func (p *partition) dropSlot(ctx context.Context) error {
	pc, err := pgconn.ParseConfig(p.cfg.DSN)
	if err != nil {
		return err
	}
	pc.RuntimeParams["replication"] = "database"
	conn, err := pgconn.ConnectConfig(ctx, pc)
	if err != nil {
		return fmt.Errorf("pgrepl: dropping slot %q: %w", p.cfg.Slot, err)
	}
	defer conn.Close(ctx)
	if err := pglogrepl.DropReplicationSlot(ctx, conn, p.cfg.Slot, pglogrepl.DropReplicationSlotOptions{Wait: true}); err != nil {
		return fmt.Errorf("pgrepl: dropping slot %q: %w", p.cfg.Slot, err)
	}
	return nil
}

// heartbeat writes a logical message every Heartbeat until Close. Three failures in a row
// fail the source (a database that cannot be written to cannot let an idle slot advance).
func (p *partition) heartbeat() {
	defer close(p.hbDone)
	t := time.NewTicker(p.cfg.Heartbeat)
	defer t.Stop()
	failures := 0
	for {
		select {
		case <-p.hbStop:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), p.cfg.Heartbeat+5*time.Second)
		go func() {
			select {
			case <-p.hbStop:
				cancel()
			case <-ctx.Done():
			}
		}()
		err := p.beat(ctx)
		cancel()
		if err == nil {
			failures = 0
			continue
		}
		if p.stop.Load() {
			return
		}
		failures++
		if failures >= 3 {
			p.fail(fmt.Errorf("heartbeat: %w", err))
			return
		}
	}
}

func (p *partition) beat(ctx context.Context) error {
	if p.admin.IsClosed() {
		c, err := pgx.Connect(ctx, p.cfg.DSN)
		if err != nil {
			return err
		}
		p.admin.Close(ctx)
		p.admin = c
	}
	_, err := p.admin.Exec(ctx, "SELECT pg_logical_emit_message(true, $1, '')", HeartbeatPrefix)
	return err
}

// loop is the replication goroutine: it reads and decodes the stream, answers keepalives and
// sends status updates with the committed LSN, never with the server's WAL end.
func (p *partition) loop() {
	defer close(p.done)
	if p.copyCtx != nil {
		defer p.copyCancel()
		if err := p.copyTables(p.copyCtx); err != nil {
			if !p.stop.Load() {
				p.fail(fmt.Errorf("initial copy: %w", err))
			}
			return
		}
		if p.stop.Load() {
			return
		}
		if err := p.startReplication(p.copyCtx, p.start); err != nil {
			if !p.stop.Load() {
				p.fail(err)
			}
			return
		}
	}
	sent := LSN(0)
	next := time.Now().Add(p.cfg.StatusInterval)
	var keepalive *pglogrepl.PrimaryKeepaliveMessage
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		p.wakeFlag.Store(false)
		flushed := LSN(p.flushed.Load())
		if p.stop.Load() {
			if flushed != sent {
				p.sendStatus(flushed, nil)
			}
			return
		}
		now := time.Now()
		if flushed != sent || keepalive != nil || !now.Before(next) {
			if err := p.sendStatus(flushed, keepalive); err != nil {
				p.fail(fmt.Errorf("sending a standby status update: %w", err))
				return
			}
			sent, keepalive, next = flushed, nil, now.Add(p.cfg.StatusInterval)
		}
		p.mu.Lock()
		full := len(p.queue) >= p.cfg.MaxBuffered
		p.mu.Unlock()
		if full {
			timer.Reset(time.Until(next))
			select {
			case <-p.room:
			case <-p.wakeCh:
			case <-timer.C:
			}
			timer.Stop()
			continue
		}
		p.conn.Conn().SetReadDeadline(next)
		if p.wakeFlag.Load() {
			continue
		}
		msg, err := p.conn.ReceiveMessage(context.Background())
		if err != nil {
			if pgconn.Timeout(err) {
				continue
			}
			if p.stop.Load() {
				return
			}
			p.fail(fmt.Errorf("receiving from the replication connection: %w", err))
			return
		}
		switch msg := msg.(type) {
		case *pgproto3.CopyData:
			if len(msg.Data) == 0 {
				continue
			}
			switch msg.Data[0] {
			case pglogrepl.PrimaryKeepaliveMessageByteID:
				pkm, err := pglogrepl.ParsePrimaryKeepaliveMessage(msg.Data[1:])
				if err != nil {
					p.fail(err)
					return
				}
				if pkm.ReplyRequested {
					keepalive = &pkm
				}
			case pglogrepl.XLogDataByteID:
				xld, err := pglogrepl.ParseXLogData(msg.Data[1:])
				if err != nil {
					p.fail(err)
					return
				}
				if err := p.handle(LSN(xld.WALStart), xld.WALData); err != nil {
					p.fail(err)
					return
				}
			}
		case *pgproto3.ErrorResponse:
			p.fail(pgconn.ErrorResponseToPgError(msg))
			return
		case *pgproto3.CopyDone:
			p.fail(errors.New("the server ended the replication stream"))
			return
		}
	}
}

func (p *partition) sendStatus(flushed LSN, keepalive *pglogrepl.PrimaryKeepaliveMessage) error {
	if statusHook != nil {
		statusHook(flushed, keepalive)
	}
	return pglogrepl.SendStandbyStatusUpdate(context.Background(), p.conn, pglogrepl.StandbyStatusUpdate{
		WALWritePosition: pglogrepl.LSN(flushed), WALFlushPosition: pglogrepl.LSN(flushed), WALApplyPosition: pglogrepl.LSN(flushed)})
}

// push queues an event of the current transaction (the Begin first), unless a resumed epoch
// already emitted it.
func (p *partition) push(c Change) {
	tx := &p.tx
	if !tx.begun {
		tx.begun = true
		p.push1(Change{Kind: Begin, LSN: tx.commitLSN})
	}
	p.push1(c)
}

func (p *partition) push1(c Change) {
	tx := &p.tx
	tx.events++
	if tx.events <= tx.skipFirst {
		return
	}
	c.Xid, c.CommitLSN, c.CommitTime = tx.xid, tx.commitLSN, tx.time
	p.enqueue(c, c.Kind != Commit)
}

func (p *partition) enqueue(c Change, change bool) {
	p.mu.Lock()
	p.queue = append(p.queue, c)
	if change {
		p.lastChange = time.Now()
	}
	p.mu.Unlock()
	signal(p.ready)
}

// handle decodes one pgoutput message.
func (p *partition) handle(walStart LSN, data []byte) error {
	msg, err := pglogrepl.Parse(data)
	if err != nil {
		return fmt.Errorf("decoding a pgoutput message at %s: %w", walStart, err)
	}
	tx := &p.tx
	switch m := msg.(type) {
	case *pglogrepl.RelationMessage:
		rel := &Relation{ID: m.RelationID, Schema: m.Namespace, Table: m.RelationName,
			ReplicaIdentity: ReplicaIdentity(m.ReplicaIdentity), Columns: make([]Column, len(m.Columns))}
		for i, c := range m.Columns {
			rel.Columns[i] = Column{Name: c.Name, Type: c.DataType, TypeName: p.typeName(c.DataType), TypeMod: c.TypeModifier, Key: c.Flags&1 != 0}
		}
		p.rels[m.RelationID] = rel
	case *pglogrepl.TypeMessage:
		p.typeNames[m.DataType] = m.Namespace + "." + m.Name
	case *pglogrepl.BeginMessage:
		*tx = txInfo{xid: m.Xid, commitLSN: LSN(m.FinalLSN), time: m.CommitTime}
		switch {
		case tx.commitLSN < p.skip.LSN:
			tx.skipAll = true
		case p.skip.TxCommit != 0 && tx.commitLSN == p.skip.TxCommit:
			tx.skipFirst = p.skip.TxEvents
		}
	case *pglogrepl.CommitMessage:
		if tx.skipAll {
			*tx = txInfo{}
			return nil
		}
		end := LSN(m.TransactionEndLSN)
		if tx.begun {
			p.push1(Change{Kind: Commit, LSN: end})
		} else {
			p.enqueue(Change{LSN: end}, false) // a position marker
		}
		*tx = txInfo{}
	case *pglogrepl.InsertMessage:
		if tx.skipAll {
			return nil
		}
		rel, err := p.rel(m.RelationID)
		if err != nil {
			return err
		}
		vals, err := p.tuple(rel, m.Tuple, "new")
		if err != nil {
			return err
		}
		p.push(Change{Kind: Insert, LSN: walStart, Relation: rel, New: vals})
	case *pglogrepl.UpdateMessage:
		if tx.skipAll {
			return nil
		}
		rel, err := p.rel(m.RelationID)
		if err != nil {
			return err
		}
		c := Change{Kind: Update, LSN: walStart, Relation: rel}
		if c.New, err = p.tuple(rel, m.NewTuple, "new"); err != nil {
			return err
		}
		if m.OldTuple != nil {
			c.OldKind = oldKind(m.OldTupleType)
			if c.Old, err = p.tuple(rel, m.OldTuple, "old"); err != nil {
				return err
			}
		}
		p.push(c)
	case *pglogrepl.DeleteMessage:
		if tx.skipAll {
			return nil
		}
		rel, err := p.rel(m.RelationID)
		if err != nil {
			return err
		}
		c := Change{Kind: Delete, LSN: walStart, Relation: rel, OldKind: oldKind(m.OldTupleType)}
		if m.OldTuple != nil {
			if c.Old, err = p.tuple(rel, m.OldTuple, "old"); err != nil {
				return err
			}
		}
		p.push(c)
	case *pglogrepl.TruncateMessage:
		if tx.skipAll {
			return nil
		}
		c := Change{Kind: Truncate, LSN: walStart,
			Cascade:         m.Option&pglogrepl.TruncateOptionCascade != 0,
			RestartIdentity: m.Option&pglogrepl.TruncateOptionRestartIdentity != 0}
		for _, id := range m.RelationIDs {
			rel, err := p.rel(id)
			if err != nil {
				return err
			}
			c.Truncated = append(c.Truncated, rel)
		}
		p.push(c)
	case *pglogrepl.LogicalDecodingMessage:
		if !m.Transactional || tx.skipAll || m.Prefix == HeartbeatPrefix {
			return nil
		}
		p.push(Change{Kind: Message, LSN: walStart, Prefix: m.Prefix, Content: append([]byte(nil), m.Content...)})
	}
	return nil
}

// typeName names a type: as a Type message described it, else as pgx knows it, else "".
func (p *partition) typeName(oid uint32) string {
	if name := p.typeNames[oid]; name != "" {
		return name
	}
	return p.dec.typeName(oid)
}

func oldKind(t uint8) OldKind {
	switch t {
	case 'K':
		return OldKey
	case 'O':
		return OldRow
	}
	return NoOld
}

func (p *partition) rel(id uint32) (*Relation, error) {
	rel := p.rels[id]
	if rel == nil {
		return nil, fmt.Errorf("a change of relation %d, which the server did not describe", id)
	}
	return rel, nil
}

func (p *partition) tuple(rel *Relation, td *pglogrepl.TupleData, which string) ([]any, error) {
	if td == nil {
		return nil, nil
	}
	if len(td.Columns) != len(rel.Columns) {
		return nil, fmt.Errorf("table %s: a %s tuple of %d columns, but the relation has %d", rel.Name(), which, len(td.Columns), len(rel.Columns))
	}
	vals := make([]any, len(td.Columns))
	for i, col := range td.Columns {
		switch col.DataType {
		case pglogrepl.TupleDataTypeNull:
		case pglogrepl.TupleDataTypeToast:
			vals[i] = UnchangedToast{}
		case pglogrepl.TupleDataTypeText:
			v, err := p.dec.decode(rel.Columns[i].Type, col.Data)
			if err != nil {
				return nil, fmt.Errorf("table %s column %s (type %s): %w", rel.Name(), QuoteIdent(rel.Columns[i].Name), typeLabel(rel.Columns[i]), err)
			}
			vals[i] = v
		default: // binary: not requested, kept as is
			vals[i] = col.Data
		}
	}
	return vals, nil
}

func typeLabel(c Column) string {
	if c.TypeName != "" {
		return c.TypeName
	}
	return "oid " + strconv.FormatUint(uint64(c.Type), 10)
}
