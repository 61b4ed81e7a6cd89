package pgstore

import (
	"encoding/binary"

	"github.com/epochflow/epochflow/recovery/internal/runfmt"
)

// A run is a sorted, immutable sequence of snapshot entries of one step, (key, epoch, state
// or tombstone) in ascending order of key and, within a key, of epoch, stored as rows of
// table chunks, each holding whole entries in a blob of about chunkTarget bytes. The blob's
// encoding, its checksum and the merge of runs are the SQLite store's (package runfmt),
// entry after entry (uvarints as in encoding/binary):
//
//	shared   uvarint  bytes of the key shared with the previous entry's key (0 for the first
//	                  entry of a chunk: every chunk decodes on its own)
//	suffix   uvarint  length of the rest of the key, then those bytes
//	epoch    uvarint  the snapshot's epoch
//	state    uvarint  0 for a tombstone, else 1 + the state's length, then the state's bytes

// chunkTarget is the size at which a run's writer closes a chunk (at the first entry boundary
// at or after it). Tests make it small, to get runs of many chunks out of few entries.
var chunkTarget = 256 << 10

// item is one snapshot entry of a run.
type item = runfmt.Entry

// size is about how many bytes add(e) appends after an entry of key prev.
func size(prev string, e *item) int64 {
	shared, m := 0, min(len(prev), len(e.Key))
	for shared < m && prev[shared] == e.Key[shared] {
		shared++
	}
	n := int64(2 + len(e.Key) - shared + binary.MaxVarintLen64/2)
	if !e.Dead {
		n += int64(1 + len(e.State))
	}
	return n
}
