package storetest

import (
	"context"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/epochflow/epochflow/recovery"
)

// close: Close is idempotent, and a closed store refuses Begin, Commit and Load.
func (su suite) close(t *testing.T) {
	ctx := context.Background()
	s := mustOpen(t, su.h.New(t), Config{})
	begin(t, s, "f", 1)
	commit(t, s, 1, 1, snap("s", "k", 1, "v"))
	for range 2 {
		if err := s.Close(); err != nil {
			t.Fatalf("Close: %v", err)
		}
	}
	if _, err := s.Begin(ctx, recovery.Execution{Flow: "f", Workers: 1}); err == nil {
		t.Error("Begin after Close: no error")
	}
	if err := s.Commit(ctx, recovery.Epoch{Epoch: 2, Frontiers: []uint64{2}}); err == nil {
		t.Error("Commit after Close: no error")
	}
	if err := s.Load(ctx, "s", func(string, uint64, []byte) error { return nil }); err == nil {
		t.Error("Load after Close: no error")
	}
}

// readOnly: a read-only store refuses Begin and Commit with ErrReadOnly, sees what the
// writer commits while both are open, and reads the store once the writer is closed.
func (su suite) readOnly(t *testing.T) {
	ctx := context.Background()
	open := su.h.New(t)
	w := mustOpen(t, open, Config{})
	begin(t, w, "f", 1)
	commit(t, w, 1, 1, snap("s", "k", 1, "v1"))

	r := mustOpen(t, open, Config{ReadOnly: true})
	if _, err := r.Begin(ctx, recovery.Execution{Flow: "f", Workers: 1}); !errors.Is(err, recovery.ErrReadOnly) {
		t.Errorf("Begin on a read-only store: %v", err)
	}
	if err := r.Commit(ctx, recovery.Epoch{Epoch: 2, Frontiers: []uint64{2}}); !errors.Is(err, recovery.ErrReadOnly) {
		t.Errorf("Commit on a read-only store: %v", err)
	}
	commit(t, w, 1, 2, snap("s", "k", 2, "v2"))
	if c, err := r.Committed(ctx); err != nil || c.Epoch != 2 {
		t.Errorf("read-only Committed() = %+v, %v", c, err)
	}
	if got := loadAll(t, r, "s"); !reflect.DeepEqual(got, map[string]entry{"k": {2, "v2"}}) {
		t.Errorf("read-only Load = %v", got)
	}
	r.Close()
	w.Close()
	r = mustOpen(t, open, Config{ReadOnly: true})
	if got := loadAll(t, r, "s"); !reflect.DeepEqual(got, map[string]entry{"k": {2, "v2"}}) {
		t.Errorf("read-only Load of a closed store = %v", got)
	}
	if xs, err := r.Executions(ctx); err != nil || len(xs) != 1 {
		t.Errorf("read-only Executions() = %+v, %v", xs, err)
	}
	r.Close()

	// A read-only open of a store that does not exist is refused with ErrNoStore.
	if s, err := su.h.New(t)(Config{ReadOnly: true}); !errors.Is(err, recovery.ErrNoStore) {
		if err == nil {
			s.Close()
		}
		t.Errorf("read-only open of a missing store: %v, want ErrNoStore", err)
	}
}

// secondWriter: a second read-write open is refused with ErrInUse while the first is open,
// and works once it is closed; a read-only open works meanwhile (if the store has them).
func (su suite) secondWriter(t *testing.T) {
	ctx := context.Background()
	open := su.h.New(t)
	w := mustOpen(t, open, Config{})
	begin(t, w, "f", 1)
	s, err := open(Config{})
	if err == nil {
		s.Close()
	}
	if !errors.Is(err, recovery.ErrInUse) || !strings.Contains(err.Error(), su.h.Name(w)) {
		t.Fatalf("second open: %v, want ErrInUse naming %s", err, su.h.Name(w))
	}
	if su.h.ReadOnly {
		r := mustOpen(t, open, Config{ReadOnly: true})
		if _, err := r.Executions(ctx); err != nil {
			t.Errorf("read-only open of a store in use: %v", err)
		}
		r.Close()
	}
	w.Close()
	w2 := mustOpen(t, open, Config{})
	if xs, err := w2.Executions(ctx); err != nil || len(xs) != 1 {
		t.Errorf("after the first store closed: executions %v, %v", xs, err)
	}
}
