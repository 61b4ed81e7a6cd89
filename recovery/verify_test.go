package recovery

import (
	"fmt"
	"testing"
)

func TestRowHash(t *testing.T) {
	// Every field, and every byte's position, counts.
	base := rowHash("step", "key-0001", 7, []byte("some state"), false)
	variants := map[string]uint64{
		"step":      rowHash("stex", "key-0001", 7, []byte("some state"), false),
		"key":       rowHash("step", "key-0002", 7, []byte("some state"), false),
		"epoch":     rowHash("step", "key-0001", 8, []byte("some state"), false),
		"state":     rowHash("step", "key-0001", 7, []byte("some statf"), false),
		"tombstone": rowHash("step", "key-0001", 7, nil, true),
		"empty":     rowHash("step", "key-0001", 7, nil, false),
		"shifted":   rowHash("step", "key-000", 7, []byte("1some state"), false),
		"step-key":  rowHash("stepkey-0001", "", 7, []byte("some state"), false),
		"padding":   rowHash("step", "key-0001", 7, []byte("some state\x00"), false),
	}
	seen := map[uint64]string{base: "base"}
	for name, h := range variants {
		if other, ok := seen[h]; ok {
			t.Errorf("rowHash of %s = that of %s", name, other)
		}
		seen[h] = name
	}
	// Stable across processes and releases: step_sums of existing stores depend on it.
	if got, want := base, uint64(0x5cd2e7c8ed7f256a); got != want {
		t.Errorf("rowHash changed: %#x, was %#x; stores written before would read as damaged", got, want)
	}
}

func BenchmarkRowHash(b *testing.B) {
	keys := make([]string, 1000)
	for i := range keys {
		keys[i] = fmt.Sprintf("key-%07d", i)
	}
	state := []byte{0x12, 0x34, 0x56}
	var sum uint64
	for i := 0; b.Loop(); i++ {
		sum += rowHash("resume.state", keys[i%len(keys)], 1, state, false)
	}
	_ = sum
}
