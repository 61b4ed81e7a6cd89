package recovery

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"strings"
	"unsafe"
)

// A run is a sorted, immutable sequence of snapshot entries of one step: (key, epoch,
// tombstone or state), in ascending order of key and, within a key, of epoch. A commit writes
// one run per step it has snapshots of; compaction (compact.go) merges runs into one. A run is
// stored as chunk rows, each a blob of about chunkTarget bytes holding whole entries, so
// that a commit of a million snapshots is a few dozen INSERTs instead of a million.
//
// The encoding of a chunk's blob, entry after entry (uvarints as in encoding/binary):
//
//	shared   uvarint  bytes of the key shared with the previous entry's key (0 for the first
//	                  entry of a chunk: every chunk decodes on its own)
//	suffix   uvarint  length of the rest of the key, then those bytes
//	epoch    uvarint  the snapshot's epoch
//	state    uvarint  0 for a tombstone, else 1 + the state's length, then the state's bytes
//
// Each chunk row also records its entry count and a CRC-32C (Castagnoli) of its blob, its run
// and its position in the run (so a chunk copied to another place does not verify); each run
// row records its entry and chunk counts, its epoch range and the sum of its chunks'
// checksums; step_sums records per step the sums over its runs.

// chunkTarget is the size at which a run's writer closes a chunk: a chunk holds whole
// entries and ends at the first entry boundary at or after it (one entry may make it
// bigger). Only tests change it, to make runs of many chunks out of few entries.
var chunkTarget = 256 << 10

// castagnoli is the CRC-32C table (hardware-assisted on amd64 and arm64).
var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// chunkCRC is the checksum a chunk row records: CRC-32C of the blob, then of the run's id and
// the chunk's sequence number.
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
	// same: the entry before it has the same key. Set only in a commit's entries (sortStep),
	// which eachKept groups by it without comparing keys.
	same bool
}

// less orders entries by key, then epoch: a run's order.
func (e *item) less(o *item) bool {
	// One comparison of the keys: e.key < o.key || e.key == o.key && ... compares them twice
	// when they differ, as most keys a merge or a check compares do.
	if c := strings.Compare(e.key, o.key); c != 0 {
		return c < 0
	}
	return e.epoch < o.epoch
}

// chunkEncoder appends entries to a chunk's blob.
type chunkEncoder struct {
	buf     []byte
	prev    string
	entries int
}

// add appends e; it must come after the chunk's previous entry in run order.
func (c *chunkEncoder) add(e *item) {
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

// reset empties the encoder for the next chunk, keeping its buffer.
func (c *chunkEncoder) reset() {
	c.buf = c.buf[:0]
	c.prev = ""
	c.entries = 0
}

// keySpan is where a decoded key lies in its chunk's key bytes.
type keySpan struct{ off, end int }

// errChunk is the decoding error of a malformed chunk (the message says where).
var errChunk = errors.New("malformed chunk")

// decodeChunk decodes the blob data of a chunk into out (appended to, returned). The keys
// are substrings of one string allocated for the chunk and the states are sub-slices of data
// (capacity-limited, so that appending to one never writes into the next): the caller must
// not change data afterwards, and gives away the entries' memory along with data. It returns
// an error wrapping errChunk if data is not a sequence of whole, well-formed entries.
//
// spans, if not nil, is scratch memory for the keys' offsets, reused from chunk to chunk.
func decodeChunk(data []byte, out []item, spans *[]keySpan) ([]item, error) {
	// The keys live in one allocation; their offsets are resolved into substrings at the end.
	keys := make([]byte, 0, len(data))
	if spans == nil {
		spans = new([]keySpan)
	}
	sp := (*spans)[:0]
	defer func() { *spans = sp[:0] }()
	first := len(out)
	var prevStart, prevLen int
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
		if shared > uint64(prevLen) || (len(out) == first && shared != 0) {
			return out, fmt.Errorf("%w: key shares %d bytes with a previous key of %d at byte %d", errChunk, shared, prevLen, p)
		}
		start := len(keys)
		keys = append(keys, keys[prevStart:prevStart+int(shared)]...)
		keys = append(keys, data[p:p+int(suffix)]...)
		p += int(suffix)
		prevStart, prevLen = start, len(keys)-start
		epoch, n := binary.Uvarint(data[p:])
		if n <= 0 {
			return out, fmt.Errorf("%w: bad epoch at byte %d", errChunk, p)
		}
		p += n
		size, n := binary.Uvarint(data[p:])
		if n <= 0 || (size > 0 && size-1 > uint64(len(data)-p-n)) {
			return out, fmt.Errorf("%w: bad state length at byte %d", errChunk, p)
		}
		p += n
		e := item{epoch: epoch, dead: size == 0}
		if !e.dead {
			e.state = data[p : p+int(size-1) : p+int(size-1)]
			p += int(size - 1)
		}
		// The key's span, resolved to a substring once keys no longer moves.
		e.key = ""
		out = append(out, e)
		sp = append(sp, keySpan{start, len(keys)})
	}
	all := unsafe.String(unsafe.SliceData(keys), len(keys)) // keys is never written again
	for i := range out[first:] {
		out[first+i].key = all[sp[i].off:sp[i].end]
	}
	return out, nil
}
