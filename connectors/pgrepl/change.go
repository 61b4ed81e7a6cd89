package pgrepl

import (
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"
)

// LSN is a position in the write-ahead log of the source server. It prints (and encodes as
// text, so also in JSON state) as PostgreSQL does, "16/B374D848".
type LSN uint64

// String formats the LSN as PostgreSQL does.
func (l LSN) String() string { return pglogrepl.LSN(l).String() }

// MarshalText encodes the LSN as String does.
func (l LSN) MarshalText() ([]byte, error) { return []byte(l.String()), nil }

// UnmarshalText parses what MarshalText (or PostgreSQL) wrote.
func (l *LSN) UnmarshalText(b []byte) error {
	v, err := ParseLSN(string(b))
	if err != nil {
		return err
	}
	*l = v
	return nil
}

// ParseLSN parses an LSN written as PostgreSQL writes it ("16/B374D848").
func ParseLSN(s string) (LSN, error) {
	v, err := pglogrepl.ParseLSN(s)
	if err != nil {
		return 0, fmt.Errorf("pgrepl: invalid LSN %q: %w", s, err)
	}
	return LSN(v), nil
}

// Kind says what a Change is.
type Kind uint8

// The kinds of Change.
const (
	// Begin starts a transaction: the events up to the matching Commit belong to it.
	Begin Kind = iota + 1
	// Commit ends a transaction; its LSN is the transaction's end LSN, the position the source
	// reports to the server once the epoch that emitted it is committed.
	Commit
	// Insert is a new row: New holds it.
	Insert
	// Update changes a row: New holds the new row (with UnchangedToast for unchanged TOASTed
	// values); Old holds the old key or the old row when the table's replica identity sends one.
	Update
	// Delete removes a row: Old holds its key (replica identity DEFAULT or USING INDEX) or
	// the whole old row (FULL).
	Delete
	// Truncate empties the tables in Truncated.
	Truncate
	// Message is a transactional logical decoding message written with
	// pg_logical_emit_message(true, prefix, content) (the source's own heartbeats are not
	// emitted).
	Message
)

var kindNames = [...]string{"", "begin", "commit", "insert", "update", "delete", "truncate", "message"}

// String returns the kind's name in lower case ("insert").
func (k Kind) String() string {
	if int(k) < len(kindNames) && k != 0 {
		return kindNames[k]
	}
	return fmt.Sprintf("kind(%d)", k)
}

// OldKind says what Change.Old holds.
type OldKind uint8

const (
	// NoOld: no old values were sent (an update that did not change the key, under replica
	// identity DEFAULT or USING INDEX; or replica identity NOTHING).
	NoOld OldKind = iota
	// OldKey: Old holds the old values of the key columns (Column.Key); the other entries are
	// nil and carry no information.
	OldKey
	// OldRow: Old holds the whole old row (replica identity FULL).
	OldRow
)

// UnchangedToast is the value of a column in Change.New (and, rarely, Change.Old) whose value
// is a TOASTed (large, stored out of line) value that the update did not change: pgoutput does
// not send it. It is not NULL: the column keeps its old value. Test with
// v == pgrepl.UnchangedToast{} or a type switch.
type UnchangedToast struct{}

// String returns "<unchanged toast>".
func (UnchangedToast) String() string { return "<unchanged toast>" }

// ReplicaIdentity is a table's replica identity, as pg_class.relreplident says it.
type ReplicaIdentity byte

// Replica identities.
const (
	IdentityDefault ReplicaIdentity = 'd' // the primary key
	IdentityNothing ReplicaIdentity = 'n' // no old values at all
	IdentityFull    ReplicaIdentity = 'f' // the whole old row
	IdentityIndex   ReplicaIdentity = 'i' // the columns of a chosen unique index
)

// Column describes a column of a Relation.
type Column struct {
	Name string
	// Type is the column's type OID; TypeName its name where known (the built-in types, and
	// types pgoutput described with a Type message), else "".
	Type     uint32
	TypeName string
	TypeMod  int32
	// Key is true for the columns of the replica identity (the primary key by default).
	Key bool
}

// Relation describes a table as the server sent it. A table that is altered while the source
// runs gets a new *Relation; events decoded before keep the old one, so a Change's values
// always line up with its Relation's Columns. Relations are shared between changes: do not
// modify them.
type Relation struct {
	ID              uint32
	Schema, Table   string
	ReplicaIdentity ReplicaIdentity
	Columns         []Column
}

// Name returns "schema.table", quoted where needed as SQL does.
func (r *Relation) Name() string { return QuoteIdent(r.Schema) + "." + QuoteIdent(r.Table) }

// Index returns the position of the column named name, or -1.
func (r *Relation) Index(name string) int {
	for i := range r.Columns {
		if r.Columns[i].Name == name {
			return i
		}
	}
	return -1
}

// KeyColumns returns the names of the key columns, in column order.
func (r *Relation) KeyColumns() []string {
	var out []string
	for _, c := range r.Columns {
		if c.Key {
			out = append(out, c.Name)
		}
	}
	return out
}

// Change is one event of the replication stream: a transaction boundary, a row change, a
// truncate or a logical message. Values are decoded as the package doc says: NULL is nil, an
// unchanged TOASTed value is UnchangedToast{}.
type Change struct {
	Kind Kind
	// Xid, CommitLSN and CommitTime identify the transaction the event belongs to; they are set
	// on every event of it.
	Xid        uint32
	CommitLSN  LSN
	CommitTime time.Time
	// LSN is, for Commit, the end LSN of the transaction (what the source resumes after and
	// reports as flushed); for the other events the WAL position of the message that carried
	// it.
	LSN LSN
	// Relation is the table of an Insert, Update or Delete.
	Relation *Relation
	// New is the new row of an Insert or Update, one value per Relation.Columns.
	New []any
	// Old is the old key or row of an Update or Delete (see OldKind), one value per
	// Relation.Columns; nil when OldKind is NoOld.
	Old     []any
	OldKind OldKind
	// Truncated lists the tables of a Truncate; Cascade and RestartIdentity are its options.
	Truncated       []*Relation
	Cascade         bool
	RestartIdentity bool
	// Prefix and Content are those of a Message.
	Prefix  string
	Content []byte
	// FromCopy marks the events of the initial copy (Config.InitialCopy), not changes from
	// the stream: a Truncate of the copied tables first, then an Insert for every row the
	// copy read. They belong to no transaction (Xid, CommitLSN, CommitTime and LSN are zero).
	FromCopy bool
}

// Get returns the value of column name in the new row (Insert, Update) or else in the old one
// (Delete), and whether the column exists.
func (c *Change) Get(name string) (any, bool) {
	if c.Relation == nil {
		return nil, false
	}
	i := c.Relation.Index(name)
	if i < 0 {
		return nil, false
	}
	switch {
	case c.New != nil:
		return c.New[i], true
	case c.Old != nil:
		return c.Old[i], true
	}
	return nil, false
}

// String describes the change briefly, for logs and error messages.
func (c Change) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s xid=%d commit=%s", c.Kind, c.Xid, c.CommitLSN)
	if c.Relation != nil {
		fmt.Fprintf(&b, " %s", c.Relation.Name())
		vals := c.New
		if vals == nil {
			vals = c.Old
		}
		for i, col := range c.Relation.Columns {
			if col.Key && i < len(vals) {
				fmt.Fprintf(&b, " %s=%v", col.Name, vals[i])
			}
		}
	}
	return b.String()
}

// QuoteIdent quotes a SQL identifier: "name", with inner quotes doubled.
func QuoteIdent(s string) string { return `"` + strings.ReplaceAll(s, `"`, `""`) + `"` }
