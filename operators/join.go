package operators

import (
	"fmt"
	"slices"

	"github.com/epochflow/epochflow/dataflow"
)

// InsertMode says what a Join keeps when several values of one side arrive for a key.
type InsertMode uint8

const (
	// InsertLast keeps the latest value of each side (the default).
	InsertLast InsertMode = iota
	// InsertFirst keeps the first value of each side and ignores later ones.
	InsertFirst
	// InsertProduct keeps every value of each side; rows are the cartesian product of the
	// kept values (a side with no value contributes one missing entry).
	InsertProduct
)

// String returns the constant's name ("InsertLast", ...).
func (m InsertMode) String() string {
	switch m {
	case InsertLast:
		return "InsertLast"
	case InsertFirst:
		return "InsertFirst"
	case InsertProduct:
		return "InsertProduct"
	}
	return fmt.Sprintf("InsertMode(%d)", uint8(m))
}

// EmitMode says when a Join emits a key's rows.
type EmitMode uint8

const (
	// EmitComplete emits once every side has a value for the key, then clears the key's state
	// (the default). Keys still incomplete at EOF are dropped without output.
	EmitComplete EmitMode = iota
	// EmitFinal emits once per key at EOF, whatever sides are present, then clears the state.
	EmitFinal
	// EmitRunning emits the key's current rows after every value, keeping the state. The state
	// is dropped at EOF without output.
	EmitRunning
)

// String returns the constant's name ("EmitComplete", ...).
func (m EmitMode) String() string {
	switch m {
	case EmitComplete:
		return "EmitComplete"
	case EmitFinal:
		return "EmitFinal"
	case EmitRunning:
		return "EmitRunning"
	}
	return fmt.Sprintf("EmitMode(%d)", uint8(m))
}

// JoinOptions configures a Join. The zero value is InsertLast, EmitComplete.
type JoinOptions struct {
	Insert InsertMode
	Emit   EmitMode
}

// JoinRow is one output row of a Join: one entry per side, in the order the sides were given.
// Present[i] tells whether side i has a value; when it is false, Values[i] is the zero V. Each
// row owns its slices.
type JoinRow[V any] struct {
	Values  []V
	Present []bool
}

// joinItem is a value tagged with the index of its side. Its fields are exported so that it
// can be encoded where items cross processes.
type joinItem[V any] struct {
	Side  int
	Value V
}

// joinState is a key's state: for InsertFirst and InsertLast one value per side (Vals), for
// InsertProduct every value per side (Lists). Its fields are exported so that the default
// codec stores it in the recovery store.
type joinState[V any] struct {
	Has   []bool
	Vals  []V   `json:",omitempty"`
	Lists [][]V `json:",omitempty"`
	Count int   // sides with a value
}

// Join adds a keyed step that joins the values of two or more keyed streams by key, like
// Bytewax's join. Each side's items are first tagged with the side's index in an internal
// step (name+".tag0", name+".tag1", ...), the sides are merged (name+".merge"), then the keyed
// step named name keeps, per key, what opts.Insert says and emits JoinRows when opts.Emit says.
// All sides must belong to the same flow; fewer than two sides, or an unknown mode, is a build
// error recorded on the flow.
//
// Rows of InsertProduct come in the order of the cartesian product with the last side varying
// fastest. Values of a key are handled in the order they reach the key's worker: values of
// different sides that arrive in the same epoch have no defined order between them.
//
// State: per key, the kept values of each side. EmitComplete discards it once a row is
// emitted, EmitFinal at EOF, EmitRunning keeps it until EOF. Epochs: the state carries across
// epochs; rows emitted on a value carry its epoch. EOF: EmitFinal emits every key's rows;
// every key's state is discarded.
func Join[V any](name string, opts JoinOptions, sides ...dataflow.Stream[dataflow.KV[V]]) dataflow.Stream[dataflow.KV[JoinRow[V]]] {
	var zero dataflow.Stream[dataflow.KV[JoinRow[V]]]
	if !sameFlow(name, sides) || !validName(sides[0].Flow(), name) {
		return zero
	}
	f := sides[0].Flow()
	switch {
	case len(sides) < 2:
		f.Fail(fmt.Errorf("step %q: a join needs at least 2 sides, got %d", stepID(f, name), len(sides)))
		return zero
	case !knownModes(f, name, opts.Insert, opts.Emit):
		return zero
	}
	tagged := make([]dataflow.Stream[dataflow.KV[joinItem[V]]], len(sides))
	for i, s := range sides {
		tagged[i] = dataflow.TransformInto(fmt.Sprintf("%s.tag%d", name, i), s,
			func(batch []dataflow.KV[V], out []dataflow.KV[joinItem[V]]) ([]dataflow.KV[joinItem[V]], error) {
				out = slices.Grow(out, len(batch))[:len(batch)]
				for j, kv := range batch {
					out[j] = dataflow.KV[joinItem[V]]{Key: kv.Key, Value: joinItem[V]{Side: i, Value: kv.Value}}
				}
				return out, nil
			})
	}
	merged := dataflow.Merge(name+".merge", tagged...)
	n, insert, emit := len(sides), opts.Insert, opts.Emit
	return dataflow.Stateful(name, merged, dataflow.StatefulLogic[joinItem[V], joinState[V], JoinRow[V]]{
		Codec: defaultCodec[joinState[V]](noCodecAdvice("operators.Join")),
		OnItem: func(_ string, s *joinState[V], exists bool, it joinItem[V], out *dataflow.Emitter[JoinRow[V]]) (bool, error) {
			if !exists {
				s.Has = make([]bool, n)
				if insert == InsertProduct {
					s.Lists = make([][]V, n)
				} else {
					s.Vals = make([]V, n)
				}
			}
			s.insert(insert, it)
			switch {
			case emit == EmitComplete && s.Count == n:
				s.emit(out, insert, false)
				return false, nil
			case emit == EmitRunning:
				s.emit(out, insert, true)
			}
			return true, nil
		},
		OnEOF: func(_ string, s *joinState[V], out *dataflow.Emitter[JoinRow[V]]) (bool, error) {
			if emit == EmitFinal {
				s.emit(out, insert, false)
			}
			return false, nil
		},
	})
}

func (s *joinState[V]) insert(mode InsertMode, it joinItem[V]) {
	had := s.Has[it.Side]
	if !had {
		s.Has[it.Side] = true
		s.Count++
	}
	switch mode {
	case InsertLast:
		s.Vals[it.Side] = it.Value
	case InsertFirst:
		if !had {
			s.Vals[it.Side] = it.Value
		}
	case InsertProduct:
		s.Lists[it.Side] = append(s.Lists[it.Side], it.Value)
	}
}

// emit emits the key's rows. With keep, the state lives on and rows get copies of its slices;
// without, the state is about to be discarded and its slices are handed over.
func (s *joinState[V]) emit(out *dataflow.Emitter[JoinRow[V]], mode InsertMode, keep bool) {
	if mode != InsertProduct {
		if keep {
			out.Emit(JoinRow[V]{Values: slices.Clone(s.Vals), Present: slices.Clone(s.Has)})
		} else {
			out.Emit(JoinRow[V]{Values: s.Vals, Present: s.Has})
		}
		return
	}
	product(s.Lists, out.Emit)
}

// JoinProduct returns the rows of the product of each side's values (lists[i] for side i), as
// Join emits them with InsertProduct: one entry per side in the order of lists, the last side
// varying fastest, each side's values in the order given, and a side without values giving one
// entry with Present false. Each row owns its slices; the values are copied.
func JoinProduct[V any](lists [][]V) []JoinRow[V] {
	var rows []JoinRow[V]
	product(lists, func(r JoinRow[V]) { rows = append(rows, r) })
	return rows
}

// product hands emit the rows of JoinProduct, one at a time.
func product[V any](lists [][]V, emit func(JoinRow[V])) {
	n := len(lists)
	rows := 1
	for _, l := range lists {
		rows *= max(1, len(l))
	}
	vals := make([]V, rows*n)
	pres := make([]bool, rows*n)
	idx := make([]int, n)
	for r := range rows {
		lo, hi := r*n, (r+1)*n
		row, p := vals[lo:hi:hi], pres[lo:hi:hi]
		for i, l := range lists {
			if len(l) > 0 {
				row[i], p[i] = l[idx[i]], true
			}
		}
		emit(JoinRow[V]{Values: row, Present: p})
		for i := n - 1; i >= 0; i-- {
			if idx[i]++; idx[i] < len(lists[i]) {
				break
			}
			idx[i] = 0
		}
	}
}

// knownModes fails the flow, naming the step, if insert or emit is not one of the modes a
// join knows.
func knownModes(f *dataflow.Flow, name string, insert InsertMode, emit EmitMode) bool {
	switch {
	case insert > InsertProduct:
		f.Fail(fmt.Errorf("step %q: unknown insert mode %v", stepID(f, name), insert))
	case emit > EmitRunning:
		f.Fail(fmt.Errorf("step %q: unknown emit mode %v", stepID(f, name), emit))
	default:
		return true
	}
	return false
}
