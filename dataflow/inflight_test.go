package dataflow_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/epochflow/epochflow/dataflow"
	"github.com/epochflow/epochflow/operators"
	"github.com/epochflow/epochflow/recovery"
)

// slowStore is a recovery store that falls behind: each Commit waits delay first. It records
// how many commits covered snapshots of several epochs.
type slowStore struct {
	recovery.Store
	delay time.Duration

	mu                 sync.Mutex
	commits, coalesced int
}

func (s *slowStore) Commit(ctx context.Context, e recovery.Epoch) error {
	time.Sleep(s.delay)
	epochs := map[uint64]bool{}
	s.mu.Lock()
	for sn := range e.All() {
		epochs[sn.Epoch] = true
	}
	s.commits++
	if len(epochs) > 1 {
		s.coalesced++
	}
	s.mu.Unlock()
	return s.Store.Commit(ctx, e)
}

// readLog is a source over lines that calls onRead before each read.
type readLog struct {
	parts  map[string][]string
	onRead func()
}

func (s readLog) Parts(ctx context.Context) ([]string, error) {
	return sliceSource{parts: s.parts}.Parts(ctx)
}

func (s readLog) Build(_ context.Context, part string, resume *int) (dataflow.StatefulSource[string, int], error) {
	p := &loggedPart{slicePart: slicePart{items: s.parts[part], batch: 32}, onRead: s.onRead}
	if resume != nil {
		p.pos = *resume
	}
	return p, nil
}

type loggedPart struct {
	slicePart
	onRead func()
}

func (p *loggedPart) Next(ctx context.Context) ([]string, error) {
	if p.pos < len(p.items) {
		p.onRead()
	}
	return p.slicePart.Next(ctx)
}

// With a store that falls behind, the snapshots waiting for it stay within the bounds: once
// they hold more than Options.MaxSnapshotBytesInFlight, no source reads until a commit brings
// them below it; they never span more than MaxEpochsInFlight epochs; a commit that covers
// several epochs gets a key's snapshot of each (the store keeps the newest); and the counts
// are exact.
func TestSnapshotsInFlightAreBounded(t *testing.T) {
	lines := benchText(100_000, 5_000, 12, false)
	want := countPlain(lines)
	const budget = 16 << 10
	const maxEpochs = 3

	var (
		mu                  sync.Mutex
		over                bool
		overs, readsOver    int
		reads               int
		maxHeld             uint64
		maxBytes, lastBytes int64
	)
	src := readLog{parts: map[string][]string{"0": lines[:len(lines)/2], "1": lines[len(lines)/2:]},
		onRead: func() {
			mu.Lock()
			reads++
			if over {
				readsOver++
			}
			mu.Unlock()
		}}
	f := dataflow.New("bounded")
	in := operators.Input(f, "read", dataflow.FromPartitioned[string, int](src))
	words := operators.FlatMapSeq("split", in, strings.FieldsSeq)
	counts := operators.Count("count", words, func(w string) string { return w })
	sink := &collect[dataflow.KV[int]]{}
	operators.Output("write", counts, dataflow.ToDynamic[dataflow.KV[int]](sink))

	sq, err := recovery.OpenSQLite(context.Background(), t.TempDir(), recovery.SQLiteOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer sq.Close()
	store := &slowStore{Store: sq, delay: 2 * time.Millisecond}
	// One worker: its reports and its reads are on one goroutine, so the order in which the
	// log sees them is the order in which they happened.
	opts := dataflow.Options{Workers: 1, EpochInterval: time.Millisecond, MaxEpochsInFlight: maxEpochs,
		MaxSnapshotBytesInFlight: budget, Recovery: store}
	dataflow.SetInFlightHook(&opts, func(epochs uint64, bytes int64) {
		mu.Lock()
		if bytes > budget && !over {
			overs++
		}
		over = bytes > budget
		maxHeld, maxBytes, lastBytes = max(maxHeld, epochs), max(maxBytes, bytes), bytes
		mu.Unlock()
	})
	if err := dataflow.Run(context.Background(), f, opts); err != nil {
		t.Fatal(err)
	}

	got := map[string]int{}
	for _, kv := range sink.items {
		got[kv.Key] += kv.Value
	}
	if len(got) != len(want) {
		t.Errorf("%d words counted, want %d", len(got), len(want))
	}
	for w, n := range want {
		if got[w] != n {
			t.Errorf("word %q: %d, want %d", w, got[w], n)
			break
		}
	}
	t.Logf("%d reads, %d times over the budget (at most %d bytes, %d epochs held), %d commits of which %d coalesced",
		reads, overs, maxBytes, maxHeld, store.commits, store.coalesced)
	if overs == 0 || store.coalesced == 0 {
		t.Fatalf("the premise failed: the snapshots went over the budget %d times, and %d commits covered several epochs; want both",
			overs, store.coalesced)
	}
	if readsOver > 0 {
		t.Errorf("%d of %d reads happened while the snapshots waiting for the store held more than %d bytes", readsOver, reads, budget)
	}
	if maxHeld > maxEpochs {
		t.Errorf("the snapshots waiting for the store spanned %d epochs, want at most %d", maxHeld, maxEpochs)
	}
	if lastBytes != 0 {
		t.Errorf("%d bytes of snapshots still counted in flight after the run", lastBytes)
	}
}
