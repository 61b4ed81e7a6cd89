package dataflow

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/epochflow/epochflow/dataflow/internal/engine"
)

// With a recovery store, a cluster resumes through process 0, which alone opens the store:
// it begins the execution (whose number every frame then carries), loads the state, and sends
// every other process the committed epoch and the state in its hello (encodeResume); each
// worker keeps the keys and partitions it owns among all the cluster's workers. The other
// processes send their snapshots to process 0 with their frontiers, and call Commit when it
// announces the epoch.

// resumeVersion is the first byte of an encoded resume.
const resumeVersion = 1

// encodeResume encodes what a cluster resumes from: the committed epoch and every step's state.
func encodeResume(committed uint64, restored map[string][]engine.Restored) []byte {
	b := []byte{resumeVersion}
	b = binary.AppendUvarint(b, committed)
	b = binary.AppendUvarint(b, uint64(len(restored)))
	for step, rs := range restored {
		b = binary.AppendUvarint(b, uint64(len(step)))
		b = append(b, step...)
		b = binary.AppendUvarint(b, uint64(len(rs)))
		for _, r := range rs {
			b = binary.AppendUvarint(b, uint64(len(r.Key)))
			b = append(b, r.Key...)
			b = binary.AppendUvarint(b, uint64(len(r.State)))
			b = append(b, r.State...)
		}
	}
	return b
}

var errResume = errors.New("malformed resume from process 0")

// decodeResume decodes what encodeResume wrote. The states point into b.
func decodeResume(b []byte) (uint64, map[string][]engine.Restored, error) {
	if len(b) == 0 || b[0] != resumeVersion {
		return 0, nil, fmt.Errorf("%w: unknown version (do all processes run the same binary?)", errResume)
	}
	r := batchReader{b: b[1:]}
	committed := r.uvarint()
	n := r.count()
	restored := make(map[string][]engine.Restored, n)
	for range n {
		step := string(r.next(r.uvarint()))
		k := r.count()
		rs := make([]engine.Restored, 0, k)
		for range k {
			key := string(r.next(r.uvarint()))
			state := r.next(r.uvarint())
			rs = append(rs, engine.Restored{Key: key, State: state})
		}
		if r.err != nil {
			break
		}
		restored[step] = rs
	}
	if r.err != nil || len(r.b) != 0 {
		return 0, nil, fmt.Errorf("%w: %v", errResume, r.err)
	}
	return committed, restored, nil
}
