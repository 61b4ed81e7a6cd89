package pgrepl

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
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

// DefaultReconnectTimeout is how long the source tries to reconnect after its replication
// connection was lost, when Config.ReconnectTimeout is 0.
const DefaultReconnectTimeout = time.Minute

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
	// (pg_logical_emit_message(true, HeartbeatPrefix, '')) that often, so that the slot's
	// confirmed_flush_lsn moves at least that often through a transaction of the source's
	// own. The slot also advances without it while the published tables are idle and the
	// server writes other WAL (see the package doc); pgoutput sends the message whatever the
	// publication covers, so it needs no heartbeat table. Heartbeats that keep failing fail
	// the source: three in a row, once ReconnectTimeout has passed since the first.
	Heartbeat time.Duration
	// StatusInterval is the longest time between two standby status updates; 0 means
	// DefaultStatusInterval, or a third of the server's wal_sender_timeout when that is
	// shorter. (Keepalives that ask for a reply are answered at once in any case.)
	StatusInterval time.Duration
	// ReconnectTimeout bounds how long the source tries to reconnect, with back-off, after
	// its replication connection was lost (the server restarted or shut down, the network
	// broke) before it fails the flow; 0 means DefaultReconnectTimeout, negative fails at
	// once. Replication resumes after what the source has emitted: nothing is lost or
	// emitted twice. Each attempt is logged.
	ReconnectTimeout time.Duration
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
	// FlagNames, if set, maps names of Config fields ("DSN", "Slot", "Publication",
	// "Tables", "CreateSlot", "CreatePublication", "Heartbeat", "IdleEOF", "InitialCopy",
	// "ReconnectTimeout", ...) to what errors call them instead of "Config.Slot": a program
	// whose flags fill the Config maps them to its flags ("-slot"), so that an error names
	// what its user can change.
	FlagNames map[string]string
}

// name is what errors call the Config field: its FlagNames entry, else "Config.FIELD".
func (c *Config) name(field string) string {
	if n := c.FlagNames[field]; n != "" {
		return n
	}
	return "Config." + field
}

// State is the resume state of the source's one partition: the end LSN of the last complete
// transaction emitted (or a later position the server reported as sent, when nothing of the
// slot's tables came before it), and, when an epoch ended in the middle of a transaction, that
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
		return fmt.Errorf("pgrepl: %s is empty: give the source database's connection string", c.name("DSN"))
	case !validSlotName(c.Slot):
		return fmt.Errorf("pgrepl: %s %q: a slot name is 1 to 63 lower-case letters, digits and underscores", c.name("Slot"), c.Slot)
	case c.Publication == "":
		return fmt.Errorf("pgrepl: %s is empty: name the publication the slot streams", c.name("Publication"))
	case c.Heartbeat < 0:
		return fmt.Errorf("pgrepl: %s is negative", c.name("Heartbeat"))
	case c.StatusInterval < 0:
		return fmt.Errorf("pgrepl: %s is negative", c.name("StatusInterval"))
	case c.IdleEOF < 0:
		return fmt.Errorf("pgrepl: %s is negative", c.name("IdleEOF"))
	case c.MaxBuffered < 0:
		return fmt.Errorf("pgrepl: %s is negative", c.name("MaxBuffered"))
	case c.InitialCopy && len(c.Tables) == 0:
		return fmt.Errorf("pgrepl: %s needs %s: name the tables to copy", c.name("InitialCopy"), c.name("Tables"))
	}
	if _, err := pgconn.ParseConfig(c.DSN); err != nil {
		return fmt.Errorf("pgrepl: %s: %w", c.name("DSN"), err)
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
	if cfg.ReconnectTimeout == 0 {
		cfg.ReconnectTimeout = DefaultReconnectTimeout
	}
	admin, err := pgx.Connect(ctx, cfg.DSN)
	if err != nil {
		return nil, fmt.Errorf("pgrepl: connecting to the source database: %w", err)
	}
	p := &partition{cfg: cfg, admin: admin, dec: newDecoder(), rels: map[uint32]*Relation{}, typeNames: map[uint32]string{},
		ready: make(chan struct{}, 1), room: make(chan struct{}, 1), wakeCh: make(chan struct{}, 1),
		done: make(chan struct{}), hbStop: make(chan struct{}), hbDone: make(chan struct{}), lagDone: make(chan struct{}),
		log: dataflow.Logger(ctx)}
	fail := func(err error) (dataflow.StatefulSource[Change, State], error) {
		if p.conn != nil {
			p.conn.Close(context.Background())
		}
		if derr := p.dropCreated("its start failed"); derr != nil {
			err = errors.Join(err, derr)
		}
		p.admin.Close(context.Background())
		return nil, err
	}
	confirmed, err := p.prepare(ctx, resume)
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
	p.skip, p.qpos = p.pos, p.pos
	p.start = p.pos.LSN
	p.flushed.Store(uint64(confirmed))
	p.runCtx, p.runCancel = context.WithCancel(context.Background())
	if p.pos.Copying {
		// The copy runs first, on the replication goroutine; replication starts after it.
		p.copying = true
	} else if err := p.startReplication(ctx, p.pos.LSN); err != nil {
		p.runCancel()
		return fail(err)
	}
	p.lastChange = time.Now() // the IdleEOF clock starts with the stream, not before the slot and the connections
	go p.loop()
	go p.watchLag(dataflow.Metrics(ctx), part)
	if cfg.Heartbeat > 0 {
		go p.heartbeat()
	} else {
		close(p.hbDone)
	}
	return p, nil
}

// prepare checks the tables, the publication and the slot, and creates the publication and
// the slot when the Config allows, and returns the slot's confirmed_flush_lsn. Everything that
// can be checked is checked before anything is created, so that a start that fails leaves
// nothing behind; what it did create it records (createdPub, createdSlot) for dropCreated.
func (p *partition) prepare(ctx context.Context, resume *State) (LSN, error) {
	cfg := &p.cfg
	db := p.admin
	// (Whether the user may replicate is not checked here: managed servers grant it through
	// roles of their own. A slot that cannot be created fails the start, and the
	// publication created before it is dropped again.)
	var walLevel string
	if err := db.QueryRow(ctx, "SELECT current_setting('wal_level')").Scan(&walLevel); err != nil {
		return 0, fmt.Errorf("pgrepl: checking the source server's wal_level: %w", err)
	}
	if walLevel != "logical" {
		return 0, fmt.Errorf("pgrepl: the source server has wal_level = %s: logical replication needs wal_level = logical in postgresql.conf (and a restart)", walLevel)
	}
	type table struct {
		arg, quoted, kind, ident string
		hasKey, canSelect        bool
	}
	var tables []table
	var partitioned []string
	for _, t := range cfg.Tables {
		var schema, name string
		tb := table{arg: t}
		err := db.QueryRow(ctx, `SELECT n.nspname, c.relname, c.relkind::text, c.relreplident::text,
				EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = c.oid AND (CASE c.relreplident WHEN 'i' THEN i.indisreplident ELSE i.indisprimary END)),
				has_table_privilege(c.oid, 'SELECT')
			FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
			WHERE c.oid = to_regclass($1)`, t).Scan(&schema, &name, &tb.kind, &tb.ident, &tb.hasKey, &tb.canSelect)
		if errors.Is(err, pgx.ErrNoRows) {
			return 0, fmt.Errorf("pgrepl: table %q does not exist in the source database (%s)", t, cfg.name("Tables"))
		}
		if err != nil {
			return 0, fmt.Errorf("pgrepl: looking up table %q: %w", t, err)
		}
		tb.quoted = QuoteIdent(schema) + "." + QuoteIdent(name)
		if cfg.InitialCopy && !tb.canSelect {
			return 0, fmt.Errorf("pgrepl: table %q: the user of %s may not read it, which the initial copy (%s) needs: GRANT SELECT ON %s TO the user",
				t, cfg.name("DSN"), cfg.name("InitialCopy"), tb.quoted)
		}
		tables = append(tables, tb)
		if tb.kind == "p" {
			partitioned = append(partitioned, t)
		}
	}
	// The publication: it exists (and then covers the tables) or is created, later.
	var viaRoot bool
	err := db.QueryRow(ctx, "SELECT pubviaroot FROM pg_publication WHERE pubname = $1", cfg.Publication).Scan(&viaRoot)
	pubExists := err == nil
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		if !cfg.CreatePublication {
			return 0, fmt.Errorf("pgrepl: publication %q does not exist (%s; create it with CREATE PUBLICATION, or set %s)",
				cfg.Publication, cfg.name("Publication"), cfg.name("CreatePublication"))
		}
		viaRoot = len(partitioned) > 0 // CREATE PUBLICATION below sets it
	case err != nil:
		return 0, fmt.Errorf("pgrepl: looking up publication %q: %w", cfg.Publication, err)
	}
	if len(partitioned) > 0 && !viaRoot {
		return 0, fmt.Errorf("pgrepl: table %q is partitioned, and publication %q streams its changes as those of its partitions, under their names: "+
			"ALTER PUBLICATION %s SET (publish_via_partition_root = true) to have them as the table's, or name the partitions in %s",
			partitioned[0], cfg.Publication, QuoteIdent(cfg.Publication), cfg.name("Tables"))
	}
	for _, tb := range tables {
		// A table without a replica identity in a publication of updates or deletes: the
		// server refuses its UPDATEs and DELETEs, in every session, from then on.
		// That is the user's doing for a publication that exists; the source does not do it.
		if !pubExists && tb.kind != "p" && (tb.ident == "n" || !tb.hasKey && tb.ident != "f") {
			return 0, fmt.Errorf("pgrepl: table %q has no replica identity (no primary key, no REPLICA IDENTITY USING INDEX or FULL): "+
				"creating publication %q for it would make the source server refuse its UPDATEs and DELETEs; "+
				"add a primary key or ALTER TABLE %s REPLICA IDENTITY FULL, then start again", tb.arg, cfg.Publication, tb.quoted)
		}
		if !pubExists {
			continue
		}
		var covered bool
		err := db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_publication_tables pt
			WHERE pt.pubname = $1 AND format('%I.%I', pt.schemaname, pt.tablename)::regclass = to_regclass($2))`,
			cfg.Publication, tb.quoted).Scan(&covered)
		if err != nil {
			return 0, fmt.Errorf("pgrepl: checking that publication %q covers table %q: %w", cfg.Publication, tb.arg, err)
		}
		if !covered {
			return 0, fmt.Errorf("pgrepl: publication %q does not cover table %q (ALTER PUBLICATION %s ADD TABLE %s)",
				cfg.Publication, tb.arg, QuoteIdent(cfg.Publication), tb.quoted)
		}
	}
	// The slot: it exists (and then is a pgoutput slot of this database) or is created, last.
	var plugin, slotType, slotDB, curDB string
	var confirmed *string
	lookup := func() error {
		return db.QueryRow(ctx, `SELECT coalesce(plugin, ''), slot_type, coalesce(database, ''), confirmed_flush_lsn::text, current_database()
			FROM pg_replication_slots WHERE slot_name = $1`, cfg.Slot).Scan(&plugin, &slotType, &slotDB, &confirmed, &curDB)
	}
	err = lookup()
	slotExists := err == nil
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		if resume != nil {
			return 0, fmt.Errorf("pgrepl: replication slot %q does not exist (%s), but the recovery state resumes from its position %s: the slot was dropped and the changes since are gone; "+
				"start the flow afresh (without its recovery state) to create a new slot", cfg.Slot, cfg.name("Slot"), resume.LSN)
		}
		if !cfg.CreateSlot {
			return 0, fmt.Errorf("pgrepl: replication slot %q does not exist (%s; create it with pg_create_logical_replication_slot('%s', 'pgoutput'), or set %s)",
				cfg.Slot, cfg.name("Slot"), cfg.Slot, cfg.name("CreateSlot"))
		}
	case err != nil:
		return 0, fmt.Errorf("pgrepl: looking up replication slot %q: %w", cfg.Slot, err)
	}
	if slotExists {
		if err := checkSlot(cfg, plugin, slotType, slotDB, curDB); err != nil {
			return 0, err
		}
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

	// Everything checked: create what is missing, the publication first (pgoutput cannot
	// decode WAL written before its publication existed).
	if !pubExists {
		q := "CREATE PUBLICATION " + QuoteIdent(cfg.Publication)
		if len(tables) > 0 {
			names := make([]string, len(tables))
			for i, tb := range tables {
				names[i] = tb.quoted
			}
			q += " FOR TABLE " + strings.Join(names, ", ")
		} else {
			q += " FOR ALL TABLES"
		}
		if len(partitioned) > 0 {
			// A partitioned table's changes then come as the table's, not as those of
			// partitions the flow does not know by name.
			q += " WITH (publish_via_partition_root = true)"
		}
		if _, err := db.Exec(ctx, q); err != nil {
			return 0, fmt.Errorf("pgrepl: creating publication %q: %w", cfg.Publication, err)
		}
		p.createdPub = true
	}
	if !slotExists {
		if _, err := db.Exec(ctx, "SELECT pg_create_logical_replication_slot($1, 'pgoutput')", cfg.Slot); err != nil {
			return 0, fmt.Errorf("pgrepl: creating replication slot %q: %w", cfg.Slot, err)
		}
		p.createdSlot = true
		if err := lookup(); err != nil {
			return 0, fmt.Errorf("pgrepl: looking up replication slot %q: %w", cfg.Slot, err)
		}
		if err := checkSlot(cfg, plugin, slotType, slotDB, curDB); err != nil {
			return 0, err
		}
	}
	if confirmed == nil {
		return 0, fmt.Errorf("pgrepl: replication slot %q has no confirmed_flush_lsn yet: it is still being created (creating a logical slot waits until every transaction running on the server, prepared ones of pg_prepared_xacts included, has ended)", cfg.Slot)
	}
	return ParseLSN(*confirmed)
}

func checkSlot(cfg *Config, plugin, slotType, slotDB, curDB string) error {
	switch {
	case slotType != "logical":
		return fmt.Errorf("pgrepl: replication slot %q is a %s slot, want a logical slot with the pgoutput plugin", cfg.Slot, slotType)
	case plugin != "pgoutput":
		return fmt.Errorf("pgrepl: replication slot %q uses the plugin %q, want pgoutput", cfg.Slot, plugin)
	case slotDB != curDB:
		return fmt.Errorf("pgrepl: replication slot %q belongs to database %q, not to %q", cfg.Slot, slotDB, curDB)
	}
	return nil
}

func (p *partition) startReplication(ctx context.Context, start LSN) error {
	pc, err := pgconn.ParseConfig(p.cfg.DSN)
	if err != nil {
		return fmt.Errorf("pgrepl: %s: %w", p.cfg.name("DSN"), err)
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
	log   *slog.Logger

	// What this run created (prepare), and whether an epoch was committed (Commit): Close
	// drops what a run created if it ends before that.
	createdSlot, createdPub bool
	committed               bool

	// The initial copy (Config.InitialCopy), when copying: start is the LSN replication
	// starts at once it is done. runCtx (the copy's, the reconnections') is cancelled by
	// Close.
	start      LSN
	copying    bool
	runCtx     context.Context
	runCancel  context.CancelFunc
	reconnects atomic.Int64

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
	qpos       State    // after everything queued: what Snapshot returns once Next took it all
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
	lagDone    chan struct{}
	adminMu    sync.Mutex // admin is shared by the heartbeat and watchLag
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
		if advance(&p.pos, c) {
			out = append(out, c)
		}
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

// advance moves pos past c, an event in the order the replication goroutine queued it, and
// tells whether c is an event for the flow (not a position marker). A marker (Kind 0: the end
// of a transaction without events, a position the server reported as sent, the end of the
// initial copy) moves pos only between transactions and never back.
func advance(pos *State, c Change) bool {
	if c.FromCopy {
		return true
	}
	switch c.Kind {
	case 0:
		if pos.Copying || (pos.TxCommit == 0 && c.LSN >= pos.LSN) {
			*pos = State{LSN: c.LSN}
		}
		return false
	case Commit:
		*pos = State{LSN: c.LSN}
	default:
		if pos.TxCommit != c.CommitLSN {
			pos.TxCommit, pos.TxEvents = c.CommitLSN, 0
		}
		pos.TxEvents++
	}
	return true
}

// Snapshot returns the position after everything Next returned.
func (p *partition) Snapshot() State { return p.pos }

// Commit makes state.LSN (the end of the last complete transaction of a committed epoch) the
// flushed LSN the replication goroutine reports, if it is later than the one reported. It
// returns at once, or with the replication goroutine's failure.
func (p *partition) Commit(_ context.Context, state State) error {
	p.committed = true
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
	p.runCancel()
	p.wake()
	<-p.done
	close(p.hbStop)
	<-p.hbDone
	<-p.lagDone
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if p.conn != nil {
		p.conn.Close(ctx)
	}
	var errs []error
	p.mu.Lock()
	loopErr := p.err
	p.mu.Unlock()
	switch {
	case !p.committed && (p.createdSlot || p.createdPub):
		if err := p.dropCreated("it ended before any epoch was committed"); err != nil {
			errs = append(errs, err)
		}
	case p.cfg.DropSlotAtEnd && p.eof && loopErr == nil && uint64(p.pos.LSN) <= p.flushed.Load():
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

// dropCreated drops the slot and the publication that this run created, for a run that ends
// before any epoch was committed with them (a start that failed, in the source or anywhere in
// the flow): no recovery state refers to them then, and a slot left behind would hold the
// server's WAL for good. The replication connection must be closed.
func (p *partition) dropCreated(why string) error {
	if !p.createdSlot && !p.createdPub {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var errs, dropped []string
	if p.createdSlot {
		if err := p.dropSlot(ctx); err != nil {
			errs = append(errs, fmt.Sprintf("%v (drop it with SELECT pg_drop_replication_slot('%s'))", err, p.cfg.Slot))
		} else {
			p.createdSlot = false
			dropped = append(dropped, fmt.Sprintf("replication slot %q", p.cfg.Slot))
		}
	}
	if p.createdPub {
		err := func() error {
			db := p.admin
			if db.IsClosed() {
				c, err := pgx.Connect(ctx, p.cfg.DSN)
				if err != nil {
					return err
				}
				p.admin.Close(ctx)
				p.admin, db = c, c
			}
			_, err := db.Exec(ctx, "DROP PUBLICATION IF EXISTS "+QuoteIdent(p.cfg.Publication))
			return err
		}()
		if err != nil {
			errs = append(errs, fmt.Sprintf("pgrepl: dropping publication %q: %v (drop it with DROP PUBLICATION %s)", p.cfg.Publication, err, QuoteIdent(p.cfg.Publication)))
		} else {
			p.createdPub = false
			dropped = append(dropped, fmt.Sprintf("publication %q", p.cfg.Publication))
		}
	}
	if len(dropped) > 0 {
		p.log.Warn("pgrepl: dropped the "+strings.Join(dropped, " and ")+" that this run created, since "+why+": the next run starts afresh",
			"slot", p.cfg.Slot)
	}
	if len(errs) > 0 {
		return fmt.Errorf("pgrepl: this run created them and %s, but: %s", why, strings.Join(errs, "; "))
	}
	return nil
}

// heartbeat writes a logical message every Heartbeat until Close. Three failures in a row
// fail the source (a database that cannot be written to cannot let the slot advance), unless
// they all come within Config.ReconnectTimeout of the first: a server that restarts.
func (p *partition) heartbeat() {
	defer close(p.hbDone)
	t := time.NewTicker(p.cfg.Heartbeat)
	defer t.Stop()
	failures := 0
	var firstFailure time.Time
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
		if failures == 0 {
			firstFailure = time.Now()
		}
		failures++
		if failures >= 3 && time.Since(firstFailure) >= max(p.cfg.ReconnectTimeout, 0) {
			p.fail(fmt.Errorf("heartbeat: %w", err))
			return
		}
	}
}

func (p *partition) beat(ctx context.Context) error {
	p.adminMu.Lock()
	defer p.adminMu.Unlock()
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

// loop is the replication goroutine: it runs the initial copy, then streams, and when the
// connection is lost (the server restarted, the network broke) it reconnects with back-off
// for up to Config.ReconnectTimeout and streams on from what it has queued.
func (p *partition) loop() {
	defer close(p.done)
	defer p.runCancel()
	if p.copying {
		if err := p.copyTables(p.runCtx); err != nil {
			if !p.stop.Load() {
				p.fail(fmt.Errorf("initial copy: %w", err))
			}
			return
		}
		if p.stop.Load() {
			return
		}
		if err := p.startReplication(p.runCtx, p.start); err != nil {
			if !p.stop.Load() {
				p.fail(err)
			}
			return
		}
	}
	for {
		err := p.stream()
		if err == nil || p.stop.Load() {
			return
		}
		if !connectionLost(err) || p.cfg.ReconnectTimeout < 0 {
			p.fail(err)
			return
		}
		if err := p.reconnect(err); err != nil {
			if !p.stop.Load() {
				p.fail(err)
			}
			return
		}
	}
}

// connectionLost tells whether err ends the connection but not the slot's stream: a network
// error, an end of the stream by the server, a server that shuts down or restarts.
func connectionLost(err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		// 57: operator intervention (admin_shutdown, crash_shutdown, cannot_connect_now);
		// 08: connection exception.
		return strings.HasPrefix(pgErr.Code, "57") || strings.HasPrefix(pgErr.Code, "08")
	}
	var netErr net.Error
	return errors.Is(err, errServerEnded) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.As(err, &netErr) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.ECONNREFUSED) ||
		errors.Is(err, syscall.EPIPE) || pgconn.SafeToRetry(err)
}

// reconnect opens a new replication connection after the old one was lost (cause), with
// back-off, for up to Config.ReconnectTimeout, logging each attempt. Replication restarts
// after what is queued (qpos): the server sends again what the source did not confirm, and
// what was already queued (whole transactions before qpos.LSN, and the first events of a
// transaction queued in part) is skipped, as a resumed run skips what its state covers.
func (p *partition) reconnect(cause error) error {
	if p.conn != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		p.conn.Close(ctx)
		cancel()
		p.conn = nil
		p.live.Store(nil)
	}
	p.mu.Lock()
	p.skip = p.qpos
	p.mu.Unlock()
	p.tx = txInfo{}
	deadline := time.Now().Add(p.cfg.ReconnectTimeout)
	backoff := 100 * time.Millisecond
	for attempt := 1; ; attempt++ {
		p.log.Warn("pgrepl: the replication connection was lost; reconnecting", "slot", p.cfg.Slot, "attempt", attempt,
			"in", backoff, "error", cause.Error())
		select {
		case <-p.runCtx.Done():
			return p.runCtx.Err()
		case <-time.After(backoff):
		}
		ctx, cancel := context.WithTimeout(p.runCtx, max(time.Until(deadline), 5*time.Second))
		err := p.startReplication(ctx, p.skip.LSN)
		cancel()
		if err == nil {
			p.reconnects.Add(1)
			p.log.Info("pgrepl: replication resumed", "slot", p.cfg.Slot, "at", p.skip.LSN.String(), "attempts", attempt,
				"reconnects", p.reconnects.Load())
			return nil
		}
		if p.stop.Load() {
			return err
		}
		var pgErr *pgconn.PgError
		if !connectionLost(err) && !(errors.As(err, &pgErr) && (pgErr.Code == "55006" || strings.HasPrefix(pgErr.Code, "53"))) {
			// Not a server that is away, busy or still holding the slot for the old
			// connection: the slot was dropped, the user lost a privilege...
			return fmt.Errorf("the replication connection was lost (%v), and reconnecting failed: %w", cause, err)
		}
		cause = err
		if time.Now().After(deadline) {
			return fmt.Errorf("the replication connection was lost and %d attempts to reconnect in %v failed (%s): %w",
				attempt, p.cfg.ReconnectTimeout, p.cfg.name("ReconnectTimeout"), err)
		}
		backoff = min(2*backoff, 5*time.Second, max(time.Until(deadline), 10*time.Millisecond))
	}
}

// stream reads and decodes the stream, answers keepalives and sends status updates with the
// committed LSN, until Close (nil) or an error.
func (p *partition) stream() error {
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
			return nil
		}
		now := time.Now()
		if flushed != sent || keepalive != nil || !now.Before(next) {
			if err := p.sendStatus(flushed, keepalive); err != nil {
				return fmt.Errorf("sending a standby status update: %w", err)
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
				return nil
			}
			return fmt.Errorf("receiving from the replication connection: %w", err)
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
					return err
				}
				if pkm.ReplyRequested {
					keepalive = &pkm
				}
				p.mark(LSN(pkm.ServerWALEnd))
			case pglogrepl.XLogDataByteID:
				xld, err := pglogrepl.ParseXLogData(msg.Data[1:])
				if err != nil {
					return err
				}
				if err := p.handle(LSN(xld.WALStart), xld.WALData); err != nil {
					return err
				}
			}
		case *pgproto3.ErrorResponse:
			return pgconn.ErrorResponseToPgError(msg)
		case *pgproto3.CopyDone:
			// The server ends the stream (it shuts down): answer with CopyDone, as the
			// protocol wants, so that it does not wait for us.
			_, err := pglogrepl.SendStandbyCopyDone(context.Background(), p.conn)
			return fmt.Errorf("the server ended the replication stream (shutting down?): %w", errors.Join(errServerEnded, err))
		case *pgproto3.CommandComplete:
			// A walsender that shuts down ends the stream so, once everything it sent is
			// confirmed, and then closes the connection.
			return fmt.Errorf("the server ended the replication stream (shutting down?): %w", errServerEnded)
		}
	}
}

// errServerEnded is the end of the replication stream by the server (CopyDone, or the
// CommandComplete of a walsender that shuts down).
var errServerEnded = errors.New("end of the replication stream")

// mark queues a position marker at walEnd, a position up to which the server has sent
// everything (a keepalive's WAL end): every transaction that committed before it has been
// received, so once the epoch in which Next returns the marker is committed, walEnd may be
// confirmed, also when nothing of the slot's tables was written for a long time while other
// tables (or databases) filled the WAL. Only between transactions, past what is queued, and
// never while a transaction that a resumed epoch emitted in part is still to come; a marker
// still queued is moved on rather than another added.
func (p *partition) mark(walEnd LSN) {
	if p.tx.commitLSN != 0 {
		return
	}
	p.mu.Lock()
	if p.qpos.TxCommit != 0 || p.qpos.Copying || walEnd <= p.qpos.LSN {
		p.mu.Unlock()
		return
	}
	p.qpos = State{LSN: walEnd}
	if n := len(p.queue); n > 0 && p.queue[n-1].Kind == 0 && !p.queue[n-1].FromCopy {
		p.queue[n-1].LSN = walEnd
	} else {
		p.queue = append(p.queue, Change{LSN: walEnd})
	}
	p.mu.Unlock()
	signal(p.ready)
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
	advance(&p.qpos, c)
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
