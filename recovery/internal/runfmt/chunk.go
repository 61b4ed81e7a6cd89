// Package runfmt is the format of the sorted runs in which both recovery stores (the SQLite
// store of package recovery and package recovery/pgstore) keep snapshots: the encoding of a
// chunk of entries and its checksum, the k-way merge of runs into groups of one key, what
// garbage collection keeps of a group, and the radix sort of a commit's keys. The stores hold
// the chunks in their own tables; this package knows nothing of SQL.
//
// A run is a sorted, immutable sequence of snapshot entries of one step: (key, epoch,
// tombstone or state), in ascending order of key and, within a key, of epoch. A commit writes
// one run per step it has snapshots of; compaction merges runs into one. A run is stored as
// chunk rows, each a blob of about 256 KiB holding whole entries, so that a commit of a
// million snapshots is a few dozen rows instead of a million.
//
// The encoding of a chunk's blob, entry after entry (uvarints as in encoding/binary):
//
//	shared   uvarint  bytes of the key shared with the previous entry's key (0 for the first
//	                  entry of a chunk: every chunk decodes on its own)
//	suffix   uvarint  length of the rest of the key, then those bytes
//	epoch    uvarint  the snapshot's epoch
//	state    uvarint  0 for a tombstone, else 1 + the state's length, then the state's bytes
//
// Each chunk row also records its entry count and its ChunkCRC; each run row records its entry
// and chunk counts, its epoch range and the sum of its chunks' checksums.
package runfmt

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"strings"
	"unsafe"
)

// castagnoli is the CRC-32C table (hardware-assisted on amd64 and arm64).
var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// ChunkCRC is the checksum a chunk row records: CRC-32C of the blob, then of the run's id and
// the chunk's sequence number (so a chunk copied to another place does not verify).
func ChunkCRC(run int64, seq int, data []byte) uint32 {
	c := crc32.Update(0, castagnoli, data)
	var pos [16]byte
	binary.LittleEndian.PutUint64(pos[:8], uint64(run))
	binary.LittleEndian.PutUint64(pos[8:], uint64(seq))
	return crc32.Update(c, castagnoli, pos[:])
}

// Entry is one snapshot entry of a run. For a tombstone, State is nil and Dead is true.
type Entry struct {
	Key   string
	Epoch uint64
	State []byte
	Dead  bool
	// Same: the entry before it has the same key. Set only in a commit's entries as the
	// SQLite store sorts them, which it groups by it without comparing keys.
	Same bool
}

// Compare orders entries by key, then epoch (a run's order): -1, 0 or +1.
func (e *Entry) Compare(o *Entry) int {
	if c := strings.Compare(e.Key, o.Key); c != 0 {
		return c
	}
	switch {
	case e.Epoch < o.Epoch:
		return -1
	case e.Epoch > o.Epoch:
		return 1
	}
	return 0
}

// Less orders entries by key, then epoch: a run's order.
func (e *Entry) Less(o *Entry) bool {
	// One comparison of the keys: e.key < o.key || e.key == o.key && ... compares them twice
	// when they differ, as most keys a merge or a check compares do.
	if c := strings.Compare(e.Key, o.Key); c != 0 {
		return c < 0
	}
	return e.Epoch < o.Epoch
}

// Encoder appends entries to a chunk's blob.
type Encoder struct {
	Buf     []byte // the blob so far
	prev    string
	Entries int // the entries in Buf
}

// Add appends e; it must come after the chunk's previous entry in run order.
func (c *Encoder) Add(e *Entry) {
	shared := 0
	if c.Entries > 0 {
		n := min(len(c.prev), len(e.Key))
		for shared < n && c.prev[shared] == e.Key[shared] {
			shared++
		}
	}
	c.Buf = binary.AppendUvarint(c.Buf, uint64(shared))
	c.Buf = binary.AppendUvarint(c.Buf, uint64(len(e.Key)-shared))
	c.Buf = append(c.Buf, e.Key[shared:]...)
	c.Buf = binary.AppendUvarint(c.Buf, e.Epoch)
	if e.Dead {
		c.Buf = append(c.Buf, 0)
	} else {
		c.Buf = binary.AppendUvarint(c.Buf, uint64(len(e.State))+1)
		c.Buf = append(c.Buf, e.State...)
	}
	c.prev = e.Key
	c.Entries++
}

// Reset empties the encoder for the next chunk, keeping its buffer.
func (c *Encoder) Reset() {
	c.Buf = c.Buf[:0]
	c.prev = ""
	c.Entries = 0
}

// KeySpan is where a decoded key lies in its chunk's key bytes (DecodeChunk's scratch).
type KeySpan struct{ off, end int }

// ErrChunk is the decoding error of a malformed chunk (the message says where).
var ErrChunk = errors.New("malformed chunk")

// DecodeChunk decodes the blob data of a chunk into out (appended to, returned). The keys
// are substrings of one string allocated for the chunk and the states are sub-slices of data
// (capacity-limited, so that appending to one never writes into the next): the caller must
// not change data afterwards, and gives away the entries' memory along with data. It returns
// an error wrapping ErrChunk if data is not a sequence of whole, well-formed entries.
//
// spans, if not nil, is scratch memory for the keys' offsets, reused from chunk to chunk.
func DecodeChunk(data []byte, out []Entry, spans *[]KeySpan) ([]Entry, error) {
	// The keys live in one allocation; their offsets are resolved into substrings at the end.
	keys := make([]byte, 0, len(data))
	if spans == nil {
		spans = new([]KeySpan)
	}
	sp := (*spans)[:0]
	defer func() { *spans = sp[:0] }()
	first := len(out)
	var prevStart, prevLen int
	for p := 0; p < len(data); {
		shared, n := binary.Uvarint(data[p:])
		if n <= 0 {
			return out, fmt.Errorf("%w: bad shared length at byte %d", ErrChunk, p)
		}
		p += n
		suffix, n := binary.Uvarint(data[p:])
		if n <= 0 || suffix > uint64(len(data)-p-n) {
			return out, fmt.Errorf("%w: bad key length at byte %d", ErrChunk, p)
		}
		p += n
		if shared > uint64(prevLen) || (len(out) == first && shared != 0) {
			return out, fmt.Errorf("%w: key shares %d bytes with a previous key of %d at byte %d", ErrChunk, shared, prevLen, p)
		}
		start := len(keys)
		keys = append(keys, keys[prevStart:prevStart+int(shared)]...)
		keys = append(keys, data[p:p+int(suffix)]...)
		p += int(suffix)
		prevStart, prevLen = start, len(keys)-start
		epoch, n := binary.Uvarint(data[p:])
		if n <= 0 {
			return out, fmt.Errorf("%w: bad epoch at byte %d", ErrChunk, p)
		}
		p += n
		size, n := binary.Uvarint(data[p:])
		if n <= 0 || (size > 0 && size-1 > uint64(len(data)-p-n)) {
			return out, fmt.Errorf("%w: bad state length at byte %d", ErrChunk, p)
		}
		p += n
		e := Entry{Epoch: epoch, Dead: size == 0}
		if !e.Dead {
			e.State = data[p : p+int(size-1) : p+int(size-1)]
			p += int(size - 1)
		}
		// The key's span, resolved to a substring once keys no longer moves.
		e.Key = ""
		out = append(out, e)
		sp = append(sp, KeySpan{start, len(keys)})
	}
	all := unsafe.String(unsafe.SliceData(keys), len(keys)) // keys is never written again
	for i := range out[first:] {
		out[first+i].Key = all[sp[i].off:sp[i].end]
	}
	return out, nil
}
