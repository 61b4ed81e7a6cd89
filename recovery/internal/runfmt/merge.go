package runfmt

// Source is a sorted sequence of entries that a merge reads: a run's cursor, or a commit's own
// entries.
type Source interface {
	// Next returns the next entry (valid until the call after the next), or nil after the last.
	Next() (*Entry, error)
	// Damaged is the error of damage found in the source (wrapping the store's ErrDamaged).
	Damaged(format string, args ...any) error
}

// Merger merges sources of one step (a k-way merge over a binary heap of their current
// entries) into groups: every entry of one key, in ascending order of epoch. Load keeps the
// newest entry of each group; compaction keeps what garbage collection leaves of it
// (CollectGroup).
type Merger struct {
	heads []head // the heap: each source's current entry, the least first
	group []Entry
}

type head struct {
	e   Entry
	src Source
}

func (h *head) less(o *head) bool { return h.e.Less(&o.e) }

// NewMerger starts a merge of the sources.
func NewMerger(sources []Source) (*Merger, error) {
	m := &Merger{heads: make([]head, 0, len(sources))}
	for _, src := range sources {
		e, err := src.Next()
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

func (m *Merger) down(i int) {
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

// Next returns the entries of the next key, ascending by epoch (valid until the next call),
// or nil after the last key. Two sources holding the same (key, epoch) are damage.
func (m *Merger) Next() ([]Entry, error) {
	m.group = m.group[:0]
	for len(m.heads) > 0 {
		top := &m.heads[0]
		if len(m.group) > 0 {
			last := &m.group[len(m.group)-1]
			if top.e.Key != last.Key {
				break
			}
			if top.e.Epoch == last.Epoch {
				return nil, top.src.Damaged("key %q has a snapshot of epoch %d in another run too", last.Key, last.Epoch)
			}
		}
		m.group = append(m.group, top.e)
		e, err := top.src.Next()
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

// EachNewest merges the sources (a step's runs) and calls emit with the newest entry of each
// key, in key order, leaving out the keys whose newest entry is a tombstone: what a Load
// yields.
func EachNewest(sources []Source, emit func(*Entry) error) error {
	m, err := NewMerger(sources)
	if err != nil {
		return err
	}
	for {
		g, err := m.Next()
		if err != nil || g == nil {
			return err
		}
		if newest := &g[len(g)-1]; !newest.Dead {
			if err := emit(newest); err != nil {
				return err
			}
		}
	}
}

// CollectGroup returns what garbage collection keeps of the entries of one key, ascending by
// epoch, when the horizon is horizon (every epoch at or before it was committed at least the
// backup window ago): the entries after the horizon, and the newest one at or before it,
// unless that is a tombstone and the entries are all the key has (prefix: they come from
// the step's oldest runs on, so no older entry of the key stays elsewhere). The entries at
// or before the horizon but the newest are superseded by it. The result is a sub-slice of
// group.
func CollectGroup(group []Entry, horizon uint64, prefix bool) []Entry {
	p := -1 // the newest entry at or before the horizon
	for i := range group {
		if group[i].Epoch > horizon {
			break
		}
		p = i
	}
	switch {
	case p < 0:
		return group
	case group[p].Dead && prefix:
		return group[p+1:]
	default:
		return group[p:]
	}
}
