package postgres

import (
	"fmt"
	"reflect"
	"strings"

	"github.com/epochflow/epochflow/connectors/pgrepl"
)

// Op says what a Row does to its table.
type Op uint8

// The operations of a Row.
const (
	// Insert adds the row; a row with the same key already there is an error (as in SQL).
	Insert Op = iota + 1
	// Upsert makes the row with the row's key hold the given columns: an insert if there is
	// none (other columns get their defaults), else an update of the given columns.
	Upsert
	// Update sets the given columns of the row with the key (Row.Key, or the key columns of
	// Values); no such row: nothing happens.
	Update
	// Delete removes the row with the key (Row.Key, or the key columns of Values); no such row:
	// nothing happens.
	Delete
	// Truncate empties the table (Columns and Values are not used).
	Truncate
)

var opNames = [...]string{"", "insert", "upsert", "update", "delete", "truncate"}

// String returns the operation's name in lower case.
func (o Op) String() string {
	if o > 0 && int(o) < len(opNames) {
		return opNames[o]
	}
	return fmt.Sprintf("op(%d)", o)
}

// Row is one write of the sink: an operation on a row of a table, the row given as column
// names and values (one value per name). Values are converted to the column's type by pgx
// (see the package doc); nil is NULL.
type Row struct {
	// Table is the target table, "table" or "schema.table" as SQL reads it (unquoted names
	// are folded to lower case; quote names that need it, as pgrepl.QuoteIdent does).
	Table   string
	Op      Op
	Columns []string
	Values  []any
	// KeyColumns and Key, for Update and Delete, name the row to change when that differs
	// from Values (an update that changes the key): columns and values that include the
	// table's key columns. nil means the key is taken from Columns and Values. An update
	// that moves the row named by Key to a key another row holds replaces that row, as an
	// upsert would; if no row has Key, nothing changes.
	KeyColumns []string
	Key        []any
}

// String describes the row briefly, for error messages.
func (r Row) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s", r.Op, r.Table)
	for i, c := range r.Columns {
		if i == 4 {
			b.WriteString(" ...")
			break
		}
		if i < len(r.Values) {
			s := fmt.Sprint(r.Values[i])
			if len(s) > 40 {
				s = s[:40] + "..."
			}
			fmt.Fprintf(&b, " %s=%s", c, s)
		}
	}
	return b.String()
}

// FromMap returns a Row of table with the columns and values of m (in sorted column order).
func FromMap(table string, op Op, m map[string]any) Row {
	r := Row{Table: table, Op: op, Columns: make([]string, 0, len(m)), Values: make([]any, 0, len(m))}
	for k := range m {
		r.Columns = append(r.Columns, k)
	}
	sortStrings(r.Columns)
	for _, k := range r.Columns {
		r.Values = append(r.Values, m[k])
	}
	return r
}

func sortStrings(s []string) {
	for i := 1; i < len(s); i++ {
		for j := i; j > 0 && s[j] < s[j-1]; j-- {
			s[j], s[j-1] = s[j-1], s[j]
		}
	}
}

// FromStruct returns a Row of table with the exported fields of the struct v (or *struct) as
// columns: a field's column is its `db:"name"` tag, or its name in lower case; a field tagged
// `db:"-"` is left out.
func FromStruct(table string, op Op, v any) (Row, error) {
	rv := reflect.ValueOf(v)
	for rv.Kind() == reflect.Pointer {
		if rv.IsNil() {
			return Row{}, fmt.Errorf("postgres.FromStruct: nil %T", v)
		}
		rv = rv.Elem()
	}
	if rv.Kind() != reflect.Struct {
		return Row{}, fmt.Errorf("postgres.FromStruct: %T is not a struct", v)
	}
	rt := rv.Type()
	r := Row{Table: table, Op: op}
	for i := 0; i < rt.NumField(); i++ {
		f := rt.Field(i)
		if !f.IsExported() {
			continue
		}
		name := strings.ToLower(f.Name)
		if tag, ok := f.Tag.Lookup("db"); ok {
			tag, _, _ = strings.Cut(tag, ",")
			if tag == "-" {
				continue
			}
			if tag != "" {
				name = tag
			}
		}
		r.Columns = append(r.Columns, name)
		r.Values = append(r.Values, rv.Field(i).Interface())
	}
	return r, nil
}

// FromChange turns a change event of pgrepl into the rows that replay it on a copy of the
// table: an insert becomes an Upsert (so a copy that already holds the row takes it), an
// update an Upsert of the new row (an Update of the sent columns when unchanged TOASTed
// values were left out; with replica identity FULL they are taken from the old row), preceded
// by a Delete of the old key when the key changed; a delete a Delete of the old key; a truncate
// a Truncate of each table. Begin, Commit and Message events give no rows. table names the
// target table of a relation; nil keeps the source's schema and name.
func FromChange(c pgrepl.Change, table func(*pgrepl.Relation) string) []Row {
	name := func(r *pgrepl.Relation) string {
		if table != nil {
			return table(r)
		}
		return r.Name()
	}
	rel := c.Relation
	switch c.Kind {
	case pgrepl.Insert:
		return []Row{{Table: name(rel), Op: Upsert, Columns: columnNames(rel), Values: c.New}}
	case pgrepl.Update:
		cols, vals, complete := newValues(rel, c.New, c.Old, c.OldKind)
		var oldCols []string
		var oldKey []any
		if c.OldKind != pgrepl.NoOld {
			oldCols, oldKey = keyColumns(rel, c.Old)
			if reflect.DeepEqual(oldKey, keyValues(rel, c.New)) {
				oldCols, oldKey = nil, nil
			}
		}
		t := name(rel)
		switch {
		case complete && oldKey == nil:
			return []Row{{Table: t, Op: Upsert, Columns: cols, Values: vals}}
		case complete:
			kc, kv := keyColumns(rel, c.Old)
			return []Row{{Table: t, Op: Delete, Columns: kc, Values: kv}, {Table: t, Op: Upsert, Columns: cols, Values: vals}}
		default:
			return []Row{{Table: t, Op: Update, Columns: cols, Values: vals, KeyColumns: oldCols, Key: oldKey}}
		}
	case pgrepl.Delete:
		if c.Old == nil {
			return nil
		}
		kc, kv := keyColumns(rel, c.Old)
		return []Row{{Table: name(rel), Op: Delete, Columns: kc, Values: kv}}
	case pgrepl.Truncate:
		out := make([]Row, len(c.Truncated))
		for i, r := range c.Truncated {
			out[i] = Row{Table: name(r), Op: Truncate}
		}
		return out
	}
	return nil
}

func columnNames(rel *pgrepl.Relation) []string {
	out := make([]string, len(rel.Columns))
	for i, c := range rel.Columns {
		out[i] = c.Name
	}
	return out
}

// newValues returns the columns of an update's new row that carry a value (filling unchanged
// TOASTed ones from a full old row), and whether that is every column.
func newValues(rel *pgrepl.Relation, newRow, old []any, kind pgrepl.OldKind) ([]string, []any, bool) {
	cols := make([]string, 0, len(newRow))
	vals := make([]any, 0, len(newRow))
	complete := true
	for i, v := range newRow {
		if _, unchanged := v.(pgrepl.UnchangedToast); unchanged {
			if kind == pgrepl.OldRow && i < len(old) {
				if _, u := old[i].(pgrepl.UnchangedToast); !u {
					v = old[i]
					goto keep
				}
			}
			complete = false
			continue
		}
	keep:
		cols = append(cols, rel.Columns[i].Name)
		vals = append(vals, v)
	}
	return cols, vals, complete
}

// keyColumns returns the key columns of rel and their values in row (with replica identity
// FULL every column is part of the identity, and the sink picks the table's key from them).
func keyColumns(rel *pgrepl.Relation, row []any) ([]string, []any) {
	var cols []string
	var vals []any
	for i, c := range rel.Columns {
		if c.Key && i < len(row) {
			cols = append(cols, c.Name)
			vals = append(vals, row[i])
		}
	}
	return cols, vals
}

func keyValues(rel *pgrepl.Relation, row []any) []any {
	_, v := keyColumns(rel, row)
	return v
}
