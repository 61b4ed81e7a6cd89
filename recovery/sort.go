package recovery

import (
	"encoding/binary"
	"fmt"
	"math"
	"slices"
	"strings"
)

// A commit's snapshots come in packs (Pack), in no order. Commit sorts each step's into run
// order without copying them: it radix-sorts references into the packs (24 bytes a snapshot,
// no pointers), and decodes each snapshot from its pack again when it writes the run.

// sortScratch is the memory sortPacks works in, kept by a store from one commit to the next:
// with a million snapshots a commit, allocating it anew each time made the garbage collector
// run about once a commit.
type sortScratch struct {
	keys, tmp []sortKey // the radix sort's (no pointers)
	own       Pack      // Epoch.Snapshots, packed
}

// grow returns s with length n, reusing its array if it is big enough.
func grow[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	return s[:n]
}

// ref is where a snapshot is: its pack's index among the commit's, and its offset in it.
type ref struct{ p, off uint32 }

// sortKey is what the sort sorts: the first sixteen bytes of a snapshot's key, big-endian (so
// that comparing them compares those bytes; a shorter key is padded with zeros), and where the
// snapshot is. Most keys differ in them; equal ones compare the keys.
type sortKey struct {
	hi, lo uint64
	r      ref
}

// entries are the snapshots of one step of a commit in run order (by key, then epoch), as
// references into the commit's packs.
type entries struct {
	packs []*Pack
	keys  []sortKey
}

// len is the number of entries.
func (es *entries) len() int { return len(es.keys) }

// item decodes entry j; its key and state point into its pack. Its same field says whether
// entry j-1 has the same key.
func (es *entries) item(j int) item {
	k := &es.keys[j]
	var r packed
	es.packs[k.r.p].decode(int(k.r.off), &r)
	e := item{key: r.key, epoch: r.epoch, state: r.state, dead: r.dead}
	if j > 0 {
		// Keys whose first sixteen bytes differ differ: most neighbours are told apart
		// without comparing the keys.
		if p := &es.keys[j-1]; p.hi == k.hi && p.lo == k.lo {
			_, key := es.packs[p.r.p].keyAt(int(p.r.off))
			e.same = key == e.key
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
	at := slices.Clone(start[:len(steps)])
	for i, p := range packs {
		for off := 0; off < len(p.buf); {
			var r packed
			next := p.decode(off, &r)
			j := local[i][r.step]
			var w [16]byte
			copy(w[:], r.key)
			keys[at[j]] = sortKey{binary.BigEndian.Uint64(w[:8]), binary.BigEndian.Uint64(w[8:]), ref{uint32(i), uint32(off)}}
			at[j]++
			off = next
		}
	}
	out := make([]stepEntries, len(steps))
	for j, step := range steps {
		es := entries{packs: packs, keys: radixSort(keys[start[j]:start[j+1]], sc.tmp[start[j]:start[j+1]])}
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
		for hi < len(keys) && keys[hi].hi == keys[lo].hi && keys[hi].lo == keys[lo].lo {
			hi++
		}
		if hi-lo > 1 {
			decode := func(k sortKey) packed {
				var r packed
				es.packs[k.r.p].decode(int(k.r.off), &r)
				return r
			}
			slices.SortFunc(keys[lo:hi], func(a, b sortKey) int {
				x, y := decode(a), decode(b)
				if c := strings.Compare(x.key, y.key); c != 0 {
					return c
				}
				switch {
				case x.epoch < y.epoch:
					return -1
				case x.epoch > y.epoch:
					return 1
				}
				return 0
			})
			for i := lo + 1; i < hi; i++ {
				x, y := decode(keys[i-1]), decode(keys[i])
				if x.key == y.key && x.epoch == y.epoch {
					return fmt.Errorf("snapshot of step %q key %q epoch %d appears twice", step, y.key, y.epoch)
				}
			}
		}
		lo = hi
	}
	return nil
}

// radixSort sorts keys by (hi, lo), a byte at a time from the least significant (stable; a
// byte that all keys share, such as those of a common prefix, costs one counting pass),
// using tmp (as long as keys) as scratch. It returns the sorted slice: keys or tmp.
func radixSort(keys, tmp []sortKey) []sortKey {
	if len(keys) == 0 {
		return keys
	}
	for pass := range 16 {
		shift := uint(pass%8) * 8
		word := func(k *sortKey) uint64 {
			if pass < 8 {
				return k.lo
			}
			return k.hi
		}
		var count [256]int
		for j := range keys {
			count[byte(word(&keys[j])>>shift)]++
		}
		if count[byte(word(&keys[0])>>shift)] == len(keys) {
			continue
		}
		pos := 0
		for b, c := range count {
			count[b] = pos
			pos += c
		}
		for j := range keys {
			b := byte(word(&keys[j]) >> shift)
			tmp[count[b]] = keys[j]
			count[b]++
		}
		keys, tmp = tmp, keys
	}
	return keys
}
