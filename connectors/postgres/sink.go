package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/epochflow/epochflow/connectors/pgrepl"
	"github.com/epochflow/epochflow/dataflow"
	"github.com/epochflow/epochflow/internal/commitloop"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
)

// DefaultLogTable is the table that holds the rows of prepared transactions that could not be
// written to their tables at once (see the package doc).
const DefaultLogTable = "epochflow_sink_log"

// logChunk is how many rows one row of the log table holds.
const logChunk = 1000

// maxLagging is how many prepared transactions of committed epochs may wait for the committer
// before Snapshot waits for it (so that a slow committer does not fill the server's
// max_prepared_transactions).
const maxLagging = 4

// Config says where the sink writes.
type Config struct {
	// DSN is the connection string (URL or key=value) of the target database.
	DSN string
	// Name identifies the flow and the step in the global ids of the sink's prepared
	// transactions ("epochflow:NAME:PART:SEQ") and in its log table: use one name per sink
	// (such as "pg-cdc.write"), the same across runs of the flow, and never two flows with the
	// same name on one database. At most 120 bytes.
	Name string
	// Partitions is the number of partitions, each with its own connection and transaction;
	// rows go to a partition by a hash of their table, so all writes of a table are in one
	// transaction. 0 means 1.
	Partitions int
	// Keys gives, for a table (as Row.Table names it), the columns that identify a row when
	// they are not its primary key; a unique index must cover exactly them.
	Keys map[string][]string
	// LogTable is the table (created if missing) that holds rows prepared while an earlier
	// prepared transaction was still waiting for its commit; "" means DefaultLogTable.
	LogTable string
	// RequireEmpty lists tables ("table" or "schema.table") that a partition opened without
	// resume state (a first run, or a run whose recovery store is new or lost) must find
	// empty: if one holds a row, Build fails with a *NotEmptyError naming it, before it
	// writes anything. A flow whose first rows replace a table's content (pg-cdc's initial
	// copy starts with a Truncate) names its tables here, so that it never destroys rows that
	// an earlier run wrote and that no recovery store accounts for. A missing table passes; a
	// resumed partition does not check.
	RequireEmpty []string
	// RetryFor is how long a partition keeps trying to reconnect when it loses a connection
	// to the target database (the server restarted, the network failed) before the statement
	// that noticed fails, and how long Build keeps trying to connect to a target that is not
	// reachable yet or is starting up (an authentication failure or a missing database fails
	// at once): 0 means DefaultRetryFor, a negative value no retry.
	RetryFor time.Duration
}

// NotEmptyError is the error of Build when a table of Config.RequireEmpty holds rows and the
// partition has no resume state. The sink changed nothing in the table.
type NotEmptyError struct {
	// Table is the table, as the server names it (quoted where needed).
	Table string
}

// Error names the table and says what an operator can do.
func (e *NotEmptyError) Error() string {
	return fmt.Sprintf("table %s already holds rows, and the sink has no resume state (a first run, or a new or lost recovery store) "+
		"that accounts for them: refusing to write into it (resume with the recovery store of the run that wrote them, or empty the table)", e.Table)
}

// Sink is the dataflow.PartitionedSink behind Rows. Its state is a sequence number: the
// number of snapshots the partition took, which names its prepared transactions.
type Sink struct {
	cfg Config
}

// NewSink returns the sink of Rows, for tests and for composing it.
func NewSink(cfg Config) *Sink { return &Sink{cfg: cfg} }

// Rows returns an exactly-once sink that writes rows into PostgreSQL tables (see the package
// doc).
func Rows(cfg Config) dataflow.Sink[Row] { return dataflow.ToPartitioned[Row, uint64](NewSink(cfg)) }

func (c *Config) check() error {
	switch {
	case c.DSN == "":
		return errors.New("postgres sink: Config.DSN is empty: give the target database's connection string")
	case c.Name == "" || len(c.Name) > 120:
		return fmt.Errorf("postgres sink: Config.Name %q: give the sink a name of 1 to 120 bytes that identifies the flow and step", c.Name)
	case c.Partitions < 0:
		return fmt.Errorf("postgres sink: Config.Partitions is %d, want 0 or more", c.Partitions)
	}
	if _, err := pgconn.ParseConfig(c.DSN); err != nil {
		return fmt.Errorf("postgres sink: Config.DSN: %w", err)
	}
	return nil
}

// Parts returns "p0", "p1", ... (Config.Partitions of them).
func (s *Sink) Parts(context.Context) ([]string, error) {
	if err := s.cfg.check(); err != nil {
		return nil, err
	}
	n := max(s.cfg.Partitions, 1)
	parts := make([]string, n)
	for i := range parts {
		parts[i] = "p" + strconv.Itoa(i)
	}
	return parts, nil
}

// PartFor picks the partition by a hash of the row's table.
func (s *Sink) PartFor(r Row, parts int) int {
	h := fnv.New32a()
	h.Write([]byte(r.Table))
	return int(h.Sum32() % uint32(parts))
}

// Build opens a partition: it checks that the server allows prepared transactions, creates
// the log table if missing, and finishes what an earlier run left: prepared transactions of
// snapshots up to resume are committed, later ones rolled back, and logged rows of committed
// snapshots applied.
func (s *Sink) Build(ctx context.Context, part string, resume *uint64) (dataflow.StatefulSink[Row, uint64], error) {
	cfg := s.cfg
	if err := cfg.check(); err != nil {
		return nil, err
	}
	if cfg.LogTable == "" {
		cfg.LogTable = DefaultLogTable
	}
	conn, err := connect(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("postgres sink: connecting to the target database: %w", err)
	}
	cconn, err := connect(ctx, cfg)
	if err != nil {
		conn.Close(ctx)
		return nil, fmt.Errorf("postgres sink: connecting to the target database: %w", err)
	}
	p := &partition{cfg: cfg, part: part, ctx: ctx, conn: conn, cconn: cconn,
		prefix: "epochflow:" + cfg.Name + ":" + part + ":", m: pgtype.NewMap(),
		cat: newCatalog(conn, cfg.Keys), ccat: newCatalog(cconn, cfg.Keys)}
	p.logIdent = quoteQualified(cfg.LogTable)
	p.index, _ = strconv.Atoi(strings.TrimPrefix(part, "p"))
	// Settling what an earlier run left can run again on a new connection: what it did before
	// the connection was lost is no longer listed.
	if err := p.retry(ctx, &p.conn, p.cat, func(bool) error { return p.start(ctx, resume) }); err != nil {
		p.conn.Close(ctx)
		cconn.Close(ctx)
		return nil, fmt.Errorf("postgres sink %q: %w", cfg.Name, err)
	}
	p.commits = commitloop.Start(p.commitUpTo, func(err error) error {
		return fmt.Errorf("postgres sink %q: partition %s: %w", p.cfg.Name, p.part, err)
	})
	return p, nil
}

func quoteQualified(name string) string {
	if s, t, ok := strings.Cut(name, "."); ok {
		return quote(s) + "." + quote(t)
	}
	return quote(name)
}

func (p *partition) start(ctx context.Context, resume *uint64) error {
	var mpt int
	if err := p.conn.QueryRow(ctx, "SELECT current_setting('max_prepared_transactions')::int").Scan(&mpt); err != nil {
		return err
	}
	if mpt == 0 {
		return errors.New("the server has max_prepared_transactions = 0, so it cannot prepare transactions (two-phase commit): " +
			"set max_prepared_transactions in postgresql.conf to at least 10 per sink partition writing to it " +
			"(for example max_prepared_transactions = 20) and restart the server")
	}
	// Finish what an earlier run left.
	rows, err := p.conn.Query(ctx, "SELECT gid FROM pg_prepared_xacts WHERE database = current_database() AND starts_with(gid, $1)", p.prefix)
	if err != nil {
		return fmt.Errorf("listing prepared transactions: %w", err)
	}
	gids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return fmt.Errorf("listing prepared transactions: %w", err)
	}
	type prepared struct {
		gid string
		seq uint64
	}
	var list []prepared
	for _, g := range gids {
		seq, err := strconv.ParseUint(strings.TrimPrefix(g, p.prefix), 10, 64)
		if err != nil {
			continue // another sink's whose name extends ours
		}
		list = append(list, prepared{g, seq})
	}
	sort.Slice(list, func(i, j int) bool { return list[i].seq < list[j].seq })
	var upTo uint64
	if resume != nil {
		upTo = *resume
	}
	// A fresh start checks its tables before it rolls anything back: without resume state it
	// cannot tell the prepared transactions of an earlier run that committed no epoch from
	// those of epochs that the store of an earlier run committed (killed before its COMMIT
	// PREPARED), and a run refused here must leave those for the resume with that store. A
	// table that a prepared transaction holds locked (the TRUNCATE of a copy) is checked once
	// the prepared transactions are rolled back, as their locks would hold the check up.
	var busy []string
	if resume == nil {
		if busy, err = p.checkEmpty(ctx, p.cfg.RequireEmpty, true); err != nil {
			return err
		}
	}
	for _, pr := range list {
		verb := "ROLLBACK PREPARED"
		if resume != nil && pr.seq <= upTo {
			verb = "COMMIT PREPARED"
		}
		if _, err := p.conn.Exec(ctx, verb+" "+literal(pr.gid)); err != nil {
			return fmt.Errorf("%s %s: %w", verb, pr.gid, err)
		}
	}
	if _, err := p.checkEmpty(ctx, busy, false); err != nil {
		return err
	}
	_, err = p.conn.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+p.logIdent+` (
		gid_prefix text NOT NULL, seq bigint NOT NULL, n int NOT NULL, rows text NOT NULL,
		PRIMARY KEY (gid_prefix, seq, n))`)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "23505" { // two partitions created it at once
		err = nil
	}
	if err != nil {
		return fmt.Errorf("creating the log table %s: %w", p.cfg.LogTable, err)
	}
	// The log now holds only rows of committed transactions (with no resume state, of a run
	// whose recovery store is gone: they were committed then, so they are applied too).
	if err := p.applyLog(ctx, p.conn, p.cat, ^uint64(0)>>1); err != nil {
		return err
	}
	p.seq = upTo
	return nil
}

// checkEmpty returns a *NotEmptyError for the first of the tables (of Config.RequireEmpty)
// written by this partition that holds a row. With nowait, a table locked against reading (by
// a prepared transaction, say) is not waited for but returned in busy, unchecked.
func (p *partition) checkEmpty(ctx context.Context, names []string, nowait bool) (busy []string, err error) {
	for _, name := range names {
		if (&Sink{}).PartFor(Row{Table: name}, max(p.cfg.Partitions, 1)) != p.index {
			continue // another partition writes it, and checks it
		}
		var schema, rel string
		err := p.conn.QueryRow(ctx, `SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
			WHERE c.oid = to_regclass($1)`, name).Scan(&schema, &rel)
		if errors.Is(err, pgx.ErrNoRows) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("looking up table %q (Config.RequireEmpty): %w", name, err)
		}
		ident := quote(schema) + "." + quote(rel)
		var full bool
		err = pgx.BeginFunc(ctx, p.conn, func(tx pgx.Tx) error {
			if nowait {
				if _, err := tx.Exec(ctx, "LOCK TABLE "+ident+" IN ACCESS SHARE MODE NOWAIT"); err != nil {
					return err
				}
			}
			return tx.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM "+ident+")").Scan(&full)
		})
		var pgErr *pgconn.PgError
		if nowait && errors.As(err, &pgErr) && pgErr.Code == "55P03" { // lock_not_available
			busy = append(busy, name)
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("checking that table %s is empty: %w", ident, err)
		}
		if full {
			return nil, &NotEmptyError{Table: ident}
		}
	}
	return busy, nil
}

// partition is one open partition. The worker calls Write, Snapshot, Commit and Close; the
// committer goroutine commits prepared transactions on its own connection.
type partition struct {
	cfg      Config
	part     string
	index    int // of part in Parts
	prefix   string
	logIdent string
	ctx      context.Context
	conn     *pgx.Conn // the worker's: writes and PREPARE
	cat      *catalog
	m        *pgtype.Map
	seq      uint64
	rows     []enc // of the open epoch
	buf      []byte
	err      error
	// reconnects counts the connections replaced after a loss (both goroutines').
	reconnects atomic.Int64
	told       bool
	closed     bool

	cconn   *pgx.Conn // the committer's
	ccat    *catalog
	commits *commitloop.Loop // the committer goroutine
	mu      sync.Mutex
	pending []pendingTx // prepared, not yet committed (and applied)
}

type pendingTx struct {
	seq    uint64
	logged bool // its rows are in the log table, to apply after the commit
}

func (p *partition) gid(seq uint64) string { return p.prefix + strconv.FormatUint(seq, 10) }

// literal quotes s as an SQL string literal.
func literal(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

func (p *partition) failed() error {
	if p.err == nil {
		p.err = p.commits.Err()
	}
	if p.err != nil {
		p.told = true
	}
	return p.err
}

// Write converts the rows' values to text for their columns' types and keeps them for the
// epoch's transaction. A table that does not exist or has no key, a column it lacks, or a
// value that does not convert fails the write with an error naming them.
func (p *partition) Write(ctx context.Context, batch []Row) error {
	if err := p.failed(); err != nil {
		return err
	}
	for i := range batch {
		e, err := p.encode(ctx, &batch[i])
		if connLost(ctx, p.conn, err) { // a table's first row looks it up on the connection
			e, err = p.encodeAgain(ctx, &batch[i], err)
		}
		if err != nil {
			p.err = fmt.Errorf("postgres sink %q: %w", p.cfg.Name, err)
			return p.failed()
		}
		p.rows = append(p.rows, e)
	}
	return nil
}

// encodeAgain is encode after it lost the connection (with err): it reconnects and tries
// again (see retry).
func (p *partition) encodeAgain(ctx context.Context, r *Row, lost error) (enc, error) {
	var e enc
	err := p.retry(ctx, &p.conn, p.cat, func(first bool) error {
		if first {
			return lost
		}
		var err error
		e, err = p.encode(ctx, r)
		return err
	})
	return e, err
}

func (p *partition) encode(ctx context.Context, r *Row) (enc, error) {
	t, err := p.cat.table(ctx, r.Table)
	if err != nil {
		return enc{}, fmt.Errorf("row %s: %w", r, err)
	}
	vals := make([]pgtype.Text, len(r.Values))
	if len(r.Columns) != len(r.Values) {
		return enc{}, fmt.Errorf("row %s: %d columns but %d values", r, len(r.Columns), len(r.Values))
	}
	for i, v := range r.Values {
		col, ok := t.byName[r.Columns[i]]
		if !ok {
			return enc{}, fmt.Errorf("row %s: table %s has no column %q", r, t.ident, r.Columns[i])
		}
		if vals[i], err = p.text(t.cols[col], v); err != nil {
			return enc{}, fmt.Errorf("row %s: column %q of table %s (%s): %w", r, t.cols[col].name, t.ident, t.cols[col].typ, err)
		}
	}
	var keyVals []pgtype.Text
	if r.KeyColumns != nil {
		if len(r.KeyColumns) != len(r.Key) {
			return enc{}, fmt.Errorf("row %s: %d key columns but %d key values", r, len(r.KeyColumns), len(r.Key))
		}
		keyVals = make([]pgtype.Text, len(r.Key))
		for i, v := range r.Key {
			col, ok := t.byName[r.KeyColumns[i]]
			if !ok {
				return enc{}, fmt.Errorf("row %s: table %s has no column %q", r, t.ident, r.KeyColumns[i])
			}
			if keyVals[i], err = p.text(t.cols[col], v); err != nil {
				return enc{}, fmt.Errorf("row %s: key column %q of table %s (%s): %w", r, t.cols[col].name, t.ident, t.cols[col].typ, err)
			}
		}
	}
	return makeEnc(t, r.Op, r.Columns, vals, r.KeyColumns, keyVals, r.String)
}

// text converts v to PostgreSQL's text format for the column, with pgx's type map (strings
// pass as they are, for any type).
func (p *partition) text(col column, v any) (pgtype.Text, error) {
	switch x := v.(type) {
	case nil:
		return pgtype.Text{}, nil
	case pgrepl.UnchangedToast:
		return pgtype.Text{}, errors.New("the value is pgrepl.UnchangedToast{}, which holds no value (leave the column out)")
	case string:
		return pgtype.Text{String: x, Valid: true}, nil
	}
	if _, known := p.m.TypeForOID(col.oid); !known {
		switch x := v.(type) {
		case []byte:
			return pgtype.Text{String: string(x), Valid: true}, nil
		case fmt.Stringer:
			return pgtype.Text{String: x.String(), Valid: true}, nil
		}
		return pgtype.Text{}, fmt.Errorf("cannot convert a %T to a type pgx does not know; pass its text form as a string", v)
	}
	if p.buf == nil {
		p.buf = make([]byte, 0, 64)
	}
	b, err := p.m.Encode(col.oid, pgtype.TextFormatCode, v, p.buf[:0])
	if err != nil {
		return pgtype.Text{}, fmt.Errorf("cannot convert %T: %w", v, err)
	}
	if b == nil {
		return pgtype.Text{}, nil
	}
	p.buf = b
	return pgtype.Text{String: string(b), Valid: true}, nil
}

// Snapshot is the pre-commit: it writes the epoch's rows in one transaction and prepares it
// (PREPARE TRANSACTION 'epochflow:NAME:PART:SEQ'). When no earlier prepared transaction of
// the partition is waiting for its commit, the rows go to their tables; otherwise into the log
// table, applied after the commit (see the package doc). An error (a row the table refuses, a
// failed PREPARE) fails the epoch, which is then never committed.
func (p *partition) Snapshot() (uint64, error) {
	if err := p.failed(); err != nil {
		return p.seq, err
	}
	p.seq++
	if len(p.rows) == 0 {
		return p.seq, nil
	}
	p.waitLagging()
	p.mu.Lock()
	direct := len(p.pending) == 0
	p.mu.Unlock()
	gid := p.gid(p.seq)
	err := p.retry(p.ctx, &p.conn, p.cat, func(first bool) error {
		if !first { // the PREPARE may have been done before the connection was lost
			var done bool
			if err := p.conn.QueryRow(p.ctx, "SELECT EXISTS (SELECT 1 FROM pg_prepared_xacts WHERE gid = $1)", gid).Scan(&done); err != nil || done {
				return err
			}
		}
		return p.prepare(direct)
	})
	clear(p.rows)
	p.rows = p.rows[:0]
	if err != nil {
		p.err = fmt.Errorf("postgres sink %q: partition %s: epoch transaction %s: %w", p.cfg.Name, p.part, p.gid(p.seq), err)
		return p.seq, p.failed()
	}
	p.mu.Lock()
	p.pending = append(p.pending, pendingTx{seq: p.seq, logged: !direct})
	p.mu.Unlock()
	return p.seq, nil
}

// waitLagging waits while maxLagging or more prepared transactions wait for a COMMIT PREPARED
// that Commit already asked for. It never waits for a transaction whose epoch is not
// committed: only the worker (this goroutine) could release that wait.
func (p *partition) waitLagging() {
	for {
		target := p.commits.Target()
		p.mu.Lock()
		lagging := 0
		for _, t := range p.pending {
			if t.seq <= target {
				lagging++
			}
		}
		p.mu.Unlock()
		if lagging < maxLagging || p.commits.Err() != nil {
			return
		}
		if !p.commits.Wait() {
			return
		}
	}
}

func (p *partition) prepare(direct bool) error {
	ctx := p.ctx
	if _, err := p.conn.Exec(ctx, "BEGIN"); err != nil {
		return err
	}
	apply := func(a *applier) error {
		for i := range p.rows {
			if err := a.add(&p.rows[i]); err != nil {
				return err
			}
		}
		return a.flush()
	}
	var err error
	if direct {
		err = apply(newApplier(ctx, p.conn, p.conn.PgConn().CopyFrom))
	} else {
		err = p.writeLog(ctx)
	}
	if err == nil {
		_, err = p.conn.Exec(ctx, "PREPARE TRANSACTION "+literal(p.gid(p.seq)))
	}
	if err != nil {
		p.conn.Exec(context.Background(), "ROLLBACK")
		var refused *stmtError
		if errors.As(err, &refused) {
			err = diagnose(ctx, p.conn, apply, err)
		}
		return err
	}
	return nil
}

// logRow is a row in the log table, in JSON.
type logRow struct {
	T  string    `json:"t"`
	O  Op        `json:"o"`
	C  []string  `json:"c,omitempty"`
	V  []*string `json:"v,omitempty"`
	KC []string  `json:"kc,omitempty"`
	K  []*string `json:"k,omitempty"`
}

func texts(v []pgtype.Text) []*string {
	out := make([]*string, len(v))
	for i := range v {
		if v[i].Valid {
			s := v[i].String
			out[i] = &s
		}
	}
	return out
}

func (p *partition) writeLog(ctx context.Context) error {
	var chunks []string
	for start := 0; start < len(p.rows); start += logChunk {
		end := min(start+logChunk, len(p.rows))
		lr := make([]logRow, 0, end-start)
		for _, e := range p.rows[start:end] {
			r := logRow{T: e.t.name, O: e.op, V: texts(e.vals)}
			for _, c := range e.cols {
				r.C = append(r.C, e.t.cols[c].name)
			}
			if e.oldKey != nil {
				r.K = texts(e.oldKey)
				for _, k := range e.t.key {
					r.KC = append(r.KC, e.t.cols[k].name)
				}
			}
			lr = append(lr, r)
		}
		b, err := json.Marshal(lr)
		if err != nil {
			return err
		}
		chunks = append(chunks, string(b))
	}
	_, err := p.conn.Exec(ctx, "INSERT INTO "+p.logIdent+" (gid_prefix, seq, n, rows) SELECT $1, $2, x.n, x.r FROM unnest($3::text[]) WITH ORDINALITY AS x(r, n)",
		p.prefix, int64(p.seq), chunks)
	return err
}

// applyLog applies the logged rows of snapshots up to upTo and deletes them, in one
// transaction. When the server refuses a row, a careful replay (diagnose) names it.
func (p *partition) applyLog(ctx context.Context, conn *pgx.Conn, cat *catalog, upTo uint64) error {
	err := p.applyLogTx(ctx, conn, cat, upTo, nil)
	var refused *stmtError
	if errors.As(err, &refused) {
		err = diagnose(ctx, conn, func(a *applier) error { return p.applyLogTx(ctx, conn, cat, upTo, a) }, err)
	}
	return err
}

// applyLogTx is applyLog's transaction; with a careful applier (of diagnose, in its own
// transaction) it applies the rows with it and changes nothing else.
func (p *partition) applyLogTx(ctx context.Context, conn *pgx.Conn, cat *catalog, upTo uint64, careful *applier) error {
	var q interface {
		Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
		Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	} = conn
	var tx pgx.Tx
	if careful == nil {
		var err error
		if tx, err = conn.Begin(ctx); err != nil {
			return err
		}
		defer tx.Rollback(context.Background())
		q = tx
	}
	rows, err := q.Query(ctx, "SELECT rows FROM "+p.logIdent+" WHERE gid_prefix = $1 AND seq <= $2 ORDER BY seq, n", p.prefix, int64(upTo))
	if err != nil {
		return fmt.Errorf("reading the log table %s: %w", p.cfg.LogTable, err)
	}
	chunks, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return fmt.Errorf("reading the log table %s: %w", p.cfg.LogTable, err)
	}
	if len(chunks) == 0 {
		return nil
	}
	a := careful
	if a == nil {
		a = newApplier(ctx, tx, conn.PgConn().CopyFrom)
	}
	for _, c := range chunks {
		var lr []logRow
		if err := json.Unmarshal([]byte(c), &lr); err != nil {
			return fmt.Errorf("the log table %s holds a malformed row: %w", p.cfg.LogTable, err)
		}
		for _, r := range lr {
			t, err := cat.table(ctx, r.T)
			if err != nil {
				return err
			}
			e, err := makeEnc(t, r.O, r.C, fromTexts(r.V), r.KC, fromTexts(r.K), func() string { return fmt.Sprintf("%s %s (logged)", r.O, r.T) })
			if err != nil {
				return err
			}
			if err := a.add(&e); err != nil {
				return err
			}
		}
	}
	if err := a.flush(); err != nil {
		return err
	}
	if careful != nil {
		return nil
	}
	if _, err := tx.Exec(ctx, "DELETE FROM "+p.logIdent+" WHERE gid_prefix = $1 AND seq <= $2", p.prefix, int64(upTo)); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

func fromTexts(v []*string) []pgtype.Text {
	if v == nil {
		return nil
	}
	out := make([]pgtype.Text, len(v))
	for i, s := range v {
		if s != nil {
			out[i] = pgtype.Text{String: *s, Valid: true}
		}
	}
	return out
}

// Commit hands seq to the committer goroutine, which commits the prepared transactions up to
// it (COMMIT PREPARED) and applies their logged rows. It returns at once, or with an earlier
// failure.
func (p *partition) Commit(_ context.Context, seq uint64) error {
	if seq > p.seq {
		return fmt.Errorf("postgres sink %q: partition %s: commit of snapshot %d, but only %d were taken", p.cfg.Name, p.part, seq, p.seq)
	}
	p.commits.Request(seq)
	return p.failed()
}

func (p *partition) commitUpTo(target uint64) error {
	ctx := context.Background()
	p.mu.Lock()
	var todo []pendingTx
	for _, t := range p.pending {
		if t.seq <= target {
			todo = append(todo, t)
		}
	}
	p.mu.Unlock()
	if len(todo) == 0 {
		return nil
	}
	logged := false
	for _, t := range todo {
		gid := p.gid(t.seq)
		err := p.retry(ctx, &p.cconn, p.ccat, func(first bool) error {
			_, err := p.cconn.Exec(ctx, "COMMIT PREPARED "+literal(gid))
			var pgErr *pgconn.PgError
			if !first && errors.As(err, &pgErr) && pgErr.Code == "42704" {
				return nil // gone: committed by the attempt whose answer went with the connection
			}
			return err
		})
		if err != nil {
			return fmt.Errorf("COMMIT PREPARED '%s': %w", gid, err)
		}
		logged = logged || t.logged
	}
	if logged {
		if err := p.retry(ctx, &p.cconn, p.ccat, func(bool) error { return p.applyLog(ctx, p.cconn, p.ccat, target) }); err != nil {
			return fmt.Errorf("applying the logged rows up to snapshot %d: %w", target, err)
		}
	}
	p.mu.Lock()
	p.pending = p.pending[len(todo):]
	p.mu.Unlock()
	return nil
}

// Close lets the committer finish the commits it was given (reconnecting for up to
// Config.RetryFor if the target is away), then closes the connections.
// Prepared transactions of epochs that were not committed stay: the next run (Build with
// its resume state) rolls them back.
func (p *partition) Close() error {
	if p.closed {
		return nil
	}
	p.closed = true
	p.commits.Stop()
	var errs []error
	if !p.told {
		errs = append(errs, p.failed())
	}
	ctx := context.Background()
	p.conn.Close(ctx)
	p.cconn.Close(ctx)
	return errors.Join(errs...)
}
