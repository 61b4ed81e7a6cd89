package dataflow

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/epochflow/epochflow/dataflow/internal/engine"
	"github.com/epochflow/epochflow/recovery"
)

// What process 0 sends the others to resume from decodes to what it encoded; a truncated or
// foreign encoding is an error.
func TestResumeRoundTrip(t *testing.T) {
	restored := map[string][]engine.Restored{
		"count": {{Key: "a", State: []byte{1, 2}}, {Key: "", State: nil}, {Key: "long-key", State: bytes.Repeat([]byte{7}, 300)}},
		"read":  {{Key: "/tmp/input.txt", State: []byte("{}")}},
		"empty": {},
	}
	b := encodeResume(42, restored)
	committed, got, err := decodeResume(b)
	if err != nil || committed != 42 || len(got) != len(restored) {
		t.Fatalf("decoded %d, %d steps, %v", committed, len(got), err)
	}
	for step, rs := range restored {
		if len(got[step]) != len(rs) {
			t.Fatalf("step %q: %d states, want %d", step, len(got[step]), len(rs))
		}
		for i, r := range rs {
			if g := got[step][i]; g.Key != r.Key || !bytes.Equal(g.State, r.State) {
				t.Fatalf("step %q, state %d: %q %v, want %q %v", step, i, g.Key, g.State, r.Key, r.State)
			}
		}
	}
	for cut := range len(b) {
		if _, _, err := decodeResume(b[:cut]); !errors.Is(err, errResume) {
			t.Fatalf("cut at %d of %d: %v, want errResume", cut, len(b), err)
		}
	}
	if _, _, err := decodeResume(append([]byte{9}, b[1:]...)); !errors.Is(err, errResume) {
		t.Fatalf("another version: %v", err)
	}
}

// Only process 0 of a cluster may be given the recovery store.
func TestClusterStoreOnlyAtProcessZero(t *testing.T) {
	var store recovery.Store = nopStore{}
	c := &ClusterOptions{Addresses: []string{"127.0.0.1:1", "127.0.0.1:2"}, Process: 1, Secret: "s"}
	if err := c.check(Options{Recovery: store}); err == nil || !strings.Contains(err.Error(), "only process 0") {
		t.Fatalf("process 1 with a store: %v", err)
	}
	c.Process = 0
	if err := c.check(Options{Recovery: store}); err != nil {
		t.Fatalf("process 0 with a store: %v", err)
	}
}

// nopStore is a recovery.Store that is never used.
type nopStore struct{ recovery.Store }
