package pgstore

import (
	"fmt"

	"github.com/epochflow/epochflow/recovery/internal/runfmt"
)

// source is a sorted sequence of entries that a merge reads: a run's cursor, or a commit's
// own entries (memSource).
type source = runfmt.Source

// memSource is a source over entries in memory, in run order.
type memSource struct {
	s     *Store
	step  string
	items []item
	pos   int
}

func (m *memSource) Next() (*item, error) {
	if m.pos == len(m.items) {
		return nil, nil
	}
	m.pos++
	return &m.items[m.pos-1], nil
}

func (m *memSource) Damaged(format string, args ...any) error {
	return m.s.damaged(fmt.Sprintf("step %q: the commit's snapshots: ", m.step) + fmt.Sprintf(format, args...))
}
