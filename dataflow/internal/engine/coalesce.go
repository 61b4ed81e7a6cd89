package engine

// newestOnly returns the snapshots of one store commit that the store needs: when the commit
// covers several epochs (the writer fell behind and coalesced them), only the newest snapshot
// of each (step, key), whether a state or a tombstone. An older one would never be loaded:
// Load returns the newest snapshot at or before a committed epoch, and no epoch between the
// older snapshot and the newer one is ever recorded as committed (the commit records only the
// newest epoch it covers), so no committed epoch, and no backup window, can ask for it. A
// tombstone that is newest stays (the store may hold an older state of its key from an
// earlier commit); a state newer than a tombstone replaces the tombstone.
//
// snaps is reordered and truncated in place (no copy); the order of the result is
// unspecified. When every snapshot is of one epoch, snaps is returned as it is, at no cost.
func newestOnly(snaps []Snapshot) []Snapshot {
	if len(snaps) < 2 {
		return snaps
	}
	first, several := snaps[0].Epoch, false
	for i := range snaps {
		if snaps[i].Epoch != first {
			several = true
			break
		}
	}
	if !several {
		return snaps
	}
	// One map per step, keyed by the key's string as the snapshot holds it (no copy); the
	// value is the index, in the kept prefix of snaps, of the newest snapshot seen so far.
	// Few steps: a linear search beats hashing the step id per snapshot. A first pass counts
	// each step's snapshots, to size its map (for half of them: the commit covers at least
	// two epochs, and a bigger map would cost more memory than it saves in growing).
	type stepKeys struct {
		step string
		n    int
		at   map[string]int
	}
	var steps []stepKeys
	find := func(step string, last int) int {
		if last >= 0 && steps[last].step == step {
			return last
		}
		for j := range steps {
			if steps[j].step == step {
				return j
			}
		}
		steps = append(steps, stepKeys{step: step})
		return len(steps) - 1
	}
	last := -1
	for i := range snaps {
		last = find(snaps[i].Step, last)
		steps[last].n++
	}
	for j := range steps {
		steps[j].at = make(map[string]int, steps[j].n/2)
	}
	kept := 0
	for i := range snaps {
		s := &snaps[i]
		last = find(s.Step, last)
		at := steps[last].at
		if j, ok := at[s.Key]; ok {
			if s.Epoch > snaps[j].Epoch {
				snaps[j] = *s
			}
			continue
		}
		at[s.Key] = kept
		snaps[kept] = *s
		kept++
	}
	clear(snaps[kept:]) // let the states of the dropped snapshots be collected
	return snaps[:kept]
}

// takeUpTo splits the chunks of snapshots the workers reported into those of epochs <= epoch,
// as one slice, and the chunks of the rest. A chunk that is taken whole is not copied when it
// is all that is taken; otherwise the taken snapshots are copied once into a slice of the
// right size (appending them one by one to a growing slice cost a fifth of the writer's time
// with a million keys), and spent returns the chunks, whose snapshots are all copied (into
// taken or rest): the caller may reuse them.
func takeUpTo(chunks [][]Snapshot, epoch uint64) (taken []Snapshot, spent, rest [][]Snapshot) {
	n, whole := 0, -1
	for i, ch := range chunks {
		k := 0
		for j := range ch {
			if ch[j].Epoch <= epoch {
				k++
			}
		}
		if k == len(ch) && k > 0 {
			whole = i
		}
		n += k
	}
	if n == 0 {
		return nil, nil, chunks
	}
	if whole >= 0 && len(chunks[whole]) == n {
		rest = append(chunks[:whole:whole], chunks[whole+1:]...)
		return chunks[whole], nil, rest
	}
	taken = make([]Snapshot, 0, n)
	for _, ch := range chunks {
		var keep []Snapshot
		for j := range ch {
			if ch[j].Epoch <= epoch {
				taken = append(taken, ch[j])
			} else {
				keep = append(keep, ch[j])
			}
		}
		if len(keep) > 0 {
			rest = append(rest, keep)
		}
	}
	return taken, chunks, rest
}
