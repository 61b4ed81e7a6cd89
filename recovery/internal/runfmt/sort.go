package runfmt

import "encoding/binary"

// SortKey is what RadixSort sorts: the first sixteen bytes of an entry's key, big-endian (so
// that comparing them compares those bytes; a shorter key is padded with zeros), and the
// caller's reference to the entry. Most keys differ in their first sixteen bytes; the caller
// orders those that do not by the whole key.
type SortKey struct {
	Hi, Lo uint64
	Ref    uint64
}

// MakeSortKey returns the SortKey of key, referring to its entry by ref.
func MakeSortKey(key string, ref uint64) SortKey {
	var w [16]byte
	copy(w[:], key)
	return SortKey{binary.BigEndian.Uint64(w[:8]), binary.BigEndian.Uint64(w[8:]), ref}
}

// SamePrefix tells whether a and b have the same first sixteen bytes of key.
func (a *SortKey) SamePrefix(b *SortKey) bool { return a.Hi == b.Hi && a.Lo == b.Lo }

// RadixSort sorts keys by (Hi, Lo), a byte at a time from the least significant (stable; a
// byte that all keys share, such as those of a common prefix, costs one counting pass),
// using tmp (as long as keys) as scratch. It returns the sorted slice: keys or tmp.
func RadixSort(keys, tmp []SortKey) []SortKey {
	if len(keys) < 2 {
		return keys
	}
	for pass := range 16 {
		shift := uint(pass%8) * 8
		word := func(k *SortKey) uint64 {
			if pass < 8 {
				return k.Lo
			}
			return k.Hi
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
