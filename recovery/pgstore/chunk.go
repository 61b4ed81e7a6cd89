package pgstore

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"strings"
)

// A run is a sorted, immutable sequence of snapshot entries of one step, (key, epoch, state
// or tombstone) in ascending order of key and, within a key, of epoch, stored as rows of
// table chunks, each holding whole entries in a blob of about chunkTarget bytes. The blob's
// encoding is the SQLite store's (recovery/runs.go), entry after entry (uvarints as in
// encoding/binary):
//
//	shared   uvarint  bytes of the key shared with the previous entry's key (0 for the first
//	                  entry of a chunk: every chunk decodes on its own)
//	suffix   uvarint  length of the rest of the key, then those bytes
//	epoch    uvarint  the snapshot's epoch
//	state    uvarint  0 for a tombstone, else 1 + the state's length, then the state's bytes

// chunkTarget is the size at which a run's writer closes a chunk (at the first entry boundary
// at or after it). Tests make it small, to get runs of many chunks out of few entries.
var chunkTarget = 256 << 10

// castagnoli is the CRC-32C table.
var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// chunkCRC is the checksum a chunk row records: CRC-32C of the blob, then of the run's id and
// the chunk's position, so that a chunk copied to another place does not verify.
func chunkCRC(run int64, seq int, data []byte) uint32 {
	c := crc32.Update(0, castagnoli, data)
	var pos [16]byte
	binary.LittleEndian.PutUint64(pos[:8], uint64(run))
	binary.LittleEndian.PutUint64(pos[8:], uint64(seq))
	return crc32.Update(c, castagnoli, pos[:])
}

// item is one snapshot entry of a run. For a tombstone, state is nil and dead is true.
type item struct {
	key   string
	epoch uint64
	state []byte
	dead  bool
}

// compare orders entries by key, then epoch: a run's order.
func (e *item) compare(o *item) int {
	if c := strings.Compare(e.key, o.key); c != 0 {
		return c
	}
	switch {
	case e.epoch < o.epoch:
		return -1
	case e.epoch > o.epoch:
		return 1
	}
	return 0
}

// encoder appends entries to a chunk's blob.
type encoder struct {
	buf     []byte
	prev    string
	entries int
}

// add appends e, which must come after the chunk's previous entry in run order.
func (c *encoder) add(e *item) {
	shared := 0
	if c.entries > 0 {
		n := min(len(c.prev), len(e.key))
		for shared < n && c.prev[shared] == e.key[shared] {
			shared++
		}
	}
	c.buf = binary.AppendUvarint(c.buf, uint64(shared))
	c.buf = binary.AppendUvarint(c.buf, uint64(len(e.key)-shared))
	c.buf = append(c.buf, e.key[shared:]...)
	c.buf = binary.AppendUvarint(c.buf, e.epoch)
	if e.dead {
		c.buf = append(c.buf, 0)
	} else {
		c.buf = binary.AppendUvarint(c.buf, uint64(len(e.state))+1)
		c.buf = append(c.buf, e.state...)
	}
	c.prev = e.key
	c.entries++
}

// size is about how many bytes add(e) appends after an entry of key prev.
func size(prev string, e *item) int64 {
	shared, m := 0, min(len(prev), len(e.key))
	for shared < m && prev[shared] == e.key[shared] {
		shared++
	}
	n := int64(2 + len(e.key) - shared + binary.MaxVarintLen64/2)
	if !e.dead {
		n += int64(1 + len(e.state))
	}
	return n
}

// errChunk is the decoding error of a malformed chunk.
var errChunk = errors.New("malformed chunk")

// decodeChunk decodes the blob of a chunk into out (appended to, returned). The keys are
// fresh strings and the states sub-slices of data (capacity-limited): the caller gives data
// away along with the entries.
func decodeChunk(data []byte, out []item) ([]item, error) {
	var key []byte
	first := true
	for p := 0; p < len(data); {
		shared, n := binary.Uvarint(data[p:])
		if n <= 0 {
			return out, fmt.Errorf("%w: bad shared length at byte %d", errChunk, p)
		}
		p += n
		suffix, n := binary.Uvarint(data[p:])
		if n <= 0 || suffix > uint64(len(data)-p-n) {
			return out, fmt.Errorf("%w: bad key length at byte %d", errChunk, p)
		}
		p += n
		if shared > uint64(len(key)) || (first && shared != 0) {
			return out, fmt.Errorf("%w: key shares %d bytes with a previous key of %d at byte %d", errChunk, shared, len(key), p)
		}
		key = append(key[:shared], data[p:p+int(suffix)]...)
		p += int(suffix)
		epoch, n := binary.Uvarint(data[p:])
		if n <= 0 {
			return out, fmt.Errorf("%w: bad epoch at byte %d", errChunk, p)
		}
		p += n
		sz, n := binary.Uvarint(data[p:])
		if n <= 0 || (sz > 0 && sz-1 > uint64(len(data)-p-n)) {
			return out, fmt.Errorf("%w: bad state length at byte %d", errChunk, p)
		}
		p += n
		e := item{key: string(key), epoch: epoch, dead: sz == 0}
		if !e.dead {
			e.state = data[p : p+int(sz-1) : p+int(sz-1)]
			p += int(sz - 1)
		}
		out = append(out, e)
		first = false
	}
	return out, nil
}

// collectGroup returns what garbage collection keeps of the entries of one key, ascending by
// epoch, when every epoch at or before horizon was committed at least the backup window ago:
// the entries after the horizon, and the newest one at or before it, unless that is a
// tombstone and the entries are all the key has (prefix: they come from the step's oldest
// run on). The result is a sub-slice of group.
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
