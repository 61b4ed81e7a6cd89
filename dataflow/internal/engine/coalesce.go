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
// taken, and the rest. A chunk all of whose snapshots are taken is taken as it is, without a
// copy (the store reads the chunks as pieces of one commit); a chunk that holds both is split
// into two fresh slices, and returned in spent: its snapshots are all copied, so the caller
// may reuse it at once.
func takeUpTo(chunks [][]Snapshot, epoch uint64) (taken, spent, rest [][]Snapshot) {
	for _, ch := range chunks {
		k := 0
		for j := range ch {
			if ch[j].Epoch <= epoch {
				k++
			}
		}
		switch k {
		case 0:
			rest = append(rest, ch)
		case len(ch):
			taken = append(taken, ch)
		default:
			in, out := make([]Snapshot, 0, k), make([]Snapshot, 0, len(ch)-k)
			for j := range ch {
				if ch[j].Epoch <= epoch {
					in = append(in, ch[j])
				} else {
					out = append(out, ch[j])
				}
			}
			taken, rest, spent = append(taken, in), append(rest, out), append(spent, ch)
		}
	}
	return taken, spent, rest
}

// coalesce returns pieces as they are when all their snapshots are of one epoch; else (the
// writer fell behind and one commit covers several epochs) it copies them into one slice and
// keeps only the newest snapshot of each (step, key) (see newestOnly), and the pieces are
// spent: the caller may reuse them at once.
func coalesce(pieces [][]Snapshot) (out, spent [][]Snapshot) {
	first, several, n := uint64(0), false, 0
	for _, p := range pieces {
		for j := range p {
			if n == 0 && j == 0 {
				first = p[0].Epoch
			}
			several = several || p[j].Epoch != first
		}
		n += len(p)
	}
	if !several {
		return pieces, nil
	}
	all := make([]Snapshot, 0, n)
	for _, p := range pieces {
		all = append(all, p...)
	}
	return [][]Snapshot{newestOnly(all)}, pieces
}
