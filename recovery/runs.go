package recovery

import "github.com/epochflow/epochflow/recovery/internal/runfmt"

// A run is a sorted, immutable sequence of snapshot entries of one step: (key, epoch,
// tombstone or state), in ascending order of key and, within a key, of epoch. A commit writes
// one run per step it has snapshots of; compaction (compact.go) merges runs into one. A run is
// stored as chunk rows, each a blob of about chunkTarget bytes holding whole entries, so
// that a commit of a million snapshots is a few dozen INSERTs instead of a million.
//
// The encoding of a chunk's blob, its checksum and the merge of runs are package runfmt's (shared
// with pgstore).
//
// Each chunk row also records its entry count and a CRC-32C (Castagnoli) of its blob, its run
// and its position in the run (so a chunk copied to another place does not verify); each run
// row records its entry and chunk counts, its epoch range and the sum of its chunks'
// checksums; step_sums records per step the sums over its runs.

// chunkTarget is the size at which a run's writer closes a chunk: a chunk holds whole
// entries and ends at the first entry boundary at or after it (one entry may make it
// bigger). Only tests change it, to make runs of many chunks out of few entries.
var chunkTarget = 256 << 10

// item is one snapshot entry of a run (the format is package runfmt's, shared with pgstore).
type item = runfmt.Entry
