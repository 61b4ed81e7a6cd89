package recovery

// merger merges runs of one step (a k-way merge over a binary heap of their cursors) into
// groups: every entry of one key, in ascending order of epoch. Load keeps the newest entry
// of each group; compaction keeps what garbage collection leaves of it (collectGroup).
type merger struct {
	heads []head // the heap: each cursor's current entry, the least first
	group []item
}

type head struct {
	e item
	c *runCursor
}

func (h *head) less(o *head) bool { return h.e.less(&o.e) }

// newMerger starts a merge of the cursors' runs.
func newMerger(cursors []*runCursor) (*merger, error) {
	m := &merger{heads: make([]head, 0, len(cursors))}
	for _, c := range cursors {
		e, err := c.next()
		if err != nil {
			return nil, err
		}
		if e != nil {
			m.heads = append(m.heads, head{*e, c})
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
// or nil after the last key. Two runs holding the same (key, epoch) are damage.
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
				return nil, top.c.damaged("key %q has a snapshot of epoch %d in another run too", last.key, last.epoch)
			}
		}
		m.group = append(m.group, top.e)
		e, err := top.c.next()
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

// collectGroup returns what garbage collection keeps of the entries of one key, ascending by
// epoch, when the horizon is horizon (every epoch at or before it was committed at least the
// backup window ago): the entries after the horizon, and the newest one at or before it,
// unless that is a tombstone and the entries are all the key has (prefix: they come from
// the step's oldest runs on, so no older entry of the key stays elsewhere). The entries at
// or before the horizon but the newest are superseded by it. The result is a sub-slice of
// group.
func collectGroup(group []item, horizon uint64, prefix bool) []item {
	p := -1 // the newest entry at or before the horizon
	for i := range group {
		if group[i].epoch > horizon {
			break
		}
		p = i
	}
	switch {
	case p < 0:
		return group
	case group[p].dead && prefix:
		return group[p+1:]
	default:
		return group[p:]
	}
}
