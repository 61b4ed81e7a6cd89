package pgstore

import "fmt"

// source is a sorted sequence of entries that a merge reads: a run's cursor, or a commit's
// own entries (memSource).
type source interface {
	// next returns the next entry (valid until the next call), or nil after the last.
	next() (*item, error)
	// damaged is the error of damage found in the source.
	damaged(format string, args ...any) error
}

// memSource is a source over entries in memory, in run order.
type memSource struct {
	s     *Store
	step  string
	items []item
	pos   int
}

func (m *memSource) next() (*item, error) {
	if m.pos == len(m.items) {
		return nil, nil
	}
	m.pos++
	return &m.items[m.pos-1], nil
}

func (m *memSource) damaged(format string, args ...any) error {
	return m.s.damaged(fmt.Sprintf("step %q: the commit's snapshots: ", m.step) + fmt.Sprintf(format, args...))
}

// merger merges sources of one step (a k-way merge over a binary heap, the oldest source
// first on ties, which cannot happen but in damage) into groups: every entry of one key, in
// ascending order of epoch.
type merger struct {
	heads []head
	group []item
}

type head struct {
	e   item
	src source
}

func (h *head) less(o *head) bool { return h.e.compare(&o.e) < 0 }

// newMerger starts a merge of the sources.
func newMerger(sources []source) (*merger, error) {
	m := &merger{heads: make([]head, 0, len(sources))}
	for _, src := range sources {
		e, err := src.next()
		if err != nil {
			return nil, err
		}
		if e != nil {
			m.heads = append(m.heads, head{*e, src})
		}
	}
	for i := len(m.heads)/2 - 1; i >= 0; i-- {
		m.down(i)
	}
	return m, nil
}

func (m *merger) down(i int) {
	h := m.heads
	for {
		l := 2*i + 1
		if l >= len(h) {
			return
		}
		j := l
		if r := l + 1; r < len(h) && h[r].less(&h[l]) {
			j = r
		}
		if !h[j].less(&h[i]) {
			return
		}
		h[i], h[j] = h[j], h[i]
		i = j
	}
}

// next returns the entries of the next key, ascending by epoch (valid until the next call),
// or nil after the last key. Two sources holding the same (key, epoch) are damage.
func (m *merger) next() ([]item, error) {
	m.group = m.group[:0]
	for len(m.heads) > 0 {
		top := &m.heads[0]
		if len(m.group) > 0 {
			last := &m.group[len(m.group)-1]
			if top.e.key != last.key {
				break
			}
			if top.e.epoch == last.epoch {
				return nil, top.src.damaged("key %q has a snapshot of epoch %d in another run too", last.key, last.epoch)
			}
		}
		m.group = append(m.group, top.e)
		e, err := top.src.next()
		if err != nil {
			return nil, err
		}
		if e != nil {
			top.e = *e
		} else {
			n := len(m.heads) - 1
			m.heads[0] = m.heads[n]
			m.heads = m.heads[:n]
		}
		m.down(0)
	}
	if len(m.group) == 0 {
		return nil, nil
	}
	return m.group, nil
}
