package recovery

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/epochflow/epochflow/recovery/internal/runfmt"
)

// A commit's snapshots come in packs (Pack), in no order. Commit sorts each step's into run
// order without copying them: it radix-sorts references into the packs (runfmt.SortKey: 24
// bytes a snapshot, no pointers), and decodes each snapshot from its pack again when it writes
// the run.

// sortScratch is the memory sortPacks works in, kept by a store from one commit to the next:
// with a million snapshots a commit, allocating it anew each time made the garbage collector
// run about once a commit.
type sortScratch struct {
	keys, tmp []runfmt.SortKey // the radix sort's (no pointers)
	own       Pack             // Epoch.Snapshots, packed
}

// grow returns s with length n, reusing its array if it is big enough.
func grow[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	return s[:n]
}

// ref is where a snapshot is (a runfmt.SortKey's Ref): its pack's index among the commit's in
// the high 32 bits, its offset in it in the low ones.
func ref(pack, off int) uint64 { return uint64(pack)<<32 | uint64(off) }

// at returns the pack and offset of r.
func at(r uint64) (pack, off int) { return int(r >> 32), int(uint32(r)) }

// entries are the snapshots of one step of a commit in run order (by key, then epoch), as
// references into the commit's packs.
type entries struct {
	packs []*Pack
	keys  []runfmt.SortKey
}

// decode decodes the snapshot k refers to.
func (es *entries) decode(k *runfmt.SortKey) packed {
	var r packed
	p, off := at(k.Ref)
	es.packs[p].decode(off, &r)
	return r
}

// len is the number of entries.
func (es *entries) len() int { return len(es.keys) }

// item decodes entry j; its key and state point into its pack. Its same field says whether
// entry j-1 has the same key.
func (es *entries) item(j int) item {
	k := &es.keys[j]
	r := es.decode(k)
	e := item{Key: r.key, Epoch: r.epoch, State: r.state, Dead: r.dead}
	if j > 0 {
		// Keys whose first sixteen bytes differ differ: most neighbours are told apart
		// without comparing the keys.
		if p := &es.keys[j-1]; p.SamePrefix(k) {
			pk, off := at(p.Ref)
			_, key := es.packs[pk].keyAt(off)
			e.Same = key == e.Key
		}
	}
	return e
}

// stepEntries are the snapshots of one step of a commit, in run order.
type stepEntries struct {
	step    string
	entries entries
}

// sortSnapshots groups snaps by step (ascending) and sorts each step's into run order. A
// (step, key, epoch) that appears twice is an error.
func sortSnapshots(snaps []Snapshot) ([]stepEntries, error) {
	var p Pack
	for i := range snaps {
		p.AddSnapshot(&snaps[i])
	}
	return sortPacks([]*Pack{&p}, nil)
}

// sortPacks groups the snapshots of packs by step (ascending) and sorts each step's into run
// order, working in sc (nil for fresh memory): the entries it returns use sc's memory until the
// next call. A (step, key, epoch) that appears twice is an error.
func sortPacks(packs []*Pack, sc *sortScratch) ([]stepEntries, error) {
	n := 0
	for _, p := range packs {
		n += p.Len()
		if p.Size() > math.MaxUint32 {
			return nil, fmt.Errorf("a pack of %d bytes: more than a commit can hold", p.Size())
		}
	}
	if n == 0 {
		return nil, nil
	}
	if len(packs) > math.MaxUint32 {
		return nil, fmt.Errorf("%d packs: more than a commit can hold", len(packs))
	}
	if sc == nil {
		sc = &sortScratch{}
	}
	// The steps of every pack, numbered in the commit; each pack's own numbers mapped to them.
	var steps []string
	index := map[string]int{}
	local := make([][]int, len(packs))
	for i, p := range packs {
		for _, s := range p.steps {
			j, ok := index[s]
			if !ok {
				j = len(steps)
				index[s] = j
				steps = append(steps, s)
			}
			local[i] = append(local[i], j)
		}
	}
	// Each step's snapshots go to their own segment of keys: counted first, unless there is
	// one step (the common case).
	start := make([]int, len(steps)+1)
	if len(steps) == 1 {
		start[1] = n
	} else {
		for i, p := range packs {
			for off := 0; off < len(p.buf); {
				var r packed
				off = p.decode(off, &r)
				start[local[i][r.step]+1]++
			}
		}
		for j := range steps {
			start[j+1] += start[j]
		}
	}
	sc.keys, sc.tmp = grow(sc.keys, n), grow(sc.tmp, n)
	keys := sc.keys
	fill := slices.Clone(start[:len(steps)]) // where each step's next key goes
	for i, p := range packs {
		for off := 0; off < len(p.buf); {
			var r packed
			next := p.decode(off, &r)
			j := local[i][r.step]
			keys[fill[j]] = runfmt.MakeSortKey(r.key, ref(i, off))
			fill[j]++
			off = next
		}
	}
	out := make([]stepEntries, len(steps))
	for j, step := range steps {
		es := entries{packs: packs, keys: runfmt.RadixSort(keys[start[j]:start[j+1]], sc.tmp[start[j]:start[j+1]])}
		if err := es.sortTies(step); err != nil {
			return nil, err
		}
		out[j] = stepEntries{step, es}
	}
	slices.SortFunc(out, func(a, b stepEntries) int { return strings.Compare(a.step, b.step) })
	return out, nil
}

// sortTies orders the entries whose keys share their first sixteen bytes (which the radix sort
// leaves in the order they came) by key, then epoch; a key with two snapshots of one epoch is
// an error.
func (es *entries) sortTies(step string) error {
	keys := es.keys
	for lo := 0; lo < len(keys); {
		hi := lo + 1
		for hi < len(keys) && keys[hi].SamePrefix(&keys[lo]) {
			hi++
		}
		if hi-lo > 1 {
			slices.SortFunc(keys[lo:hi], func(a, b runfmt.SortKey) int {
				x, y := es.decode(&a), es.decode(&b)
				if c := strings.Compare(x.key, y.key); c != 0 {
					return c
				}
				return cmp.Compare(x.epoch, y.epoch)
			})
			for i := lo + 1; i < hi; i++ {
				x, y := es.decode(&keys[i-1]), es.decode(&keys[i])
				if x.key == y.key && x.epoch == y.epoch {
					return fmt.Errorf("snapshot of step %q key %q epoch %d appears twice", step, y.key, y.epoch)
				}
			}
		}
		lo = hi
	}
	return nil
}
