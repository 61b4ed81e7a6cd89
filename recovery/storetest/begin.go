package storetest

import (
	"context"
	"errors"
	"math"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/epochflow/epochflow/recovery"
)

// beginResume: Begin records executions and returns what the previous one left, across a
// close and a reopen; Committed and Executions report commits and frontiers
// (math.MaxUint64 included).
func (su suite) beginResume(t *testing.T) {
	ctx := context.Background()
	open := su.h.New(t)
	clk := newClock()
	s := mustOpen(t, open, Config{Now: clk.Now})
	r := begin(t, s, "wordcount", 2, "split", "count")
	if want := (recovery.Resume{Execution: 1}); !reflect.DeepEqual(r, want) {
		t.Errorf("fresh Begin = %+v, want %+v", r, want)
	}
	if c, err := s.Committed(ctx); err != nil || c != (recovery.CommitInfo{}) {
		t.Errorf("fresh Committed() = %+v, %v; want zero", c, err)
	}
	if ids, err := s.StepIDs(ctx); err != nil || len(ids) != 0 {
		t.Errorf("fresh StepIDs() = %q, %v; want none", ids, err)
	}
	if infos, err := s.Steps(ctx); err != nil || len(infos) != 0 {
		t.Errorf("fresh Steps() = %v, %v; want none", infos, err)
	}
	commit(t, s, 2, 1, snap("count", "a", 1, "1"))
	clk.Advance(time.Second)
	if err := s.Commit(ctx, recovery.Epoch{Epoch: 3, Frontiers: []uint64{3, math.MaxUint64}}); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if _, err := s.Begin(ctx, recovery.Execution{Flow: "wordcount", Workers: 1}); err == nil {
		t.Error("Begin on a closed store: no error")
	}

	clk.Advance(time.Minute)
	s = mustOpen(t, open, Config{Now: clk.Now})
	r = begin(t, s, "wordcount", 3, "count")
	want := recovery.Resume{Execution: 2, Committed: 3, Flow: "wordcount", Steps: []string{"split", "count"}, Workers: 2}
	if !reflect.DeepEqual(r, want) {
		t.Errorf("second Begin = %+v, want %+v", r, want)
	}
	c, err := s.Committed(ctx)
	if err != nil {
		t.Fatal(err)
	}
	start := newClock().Now()
	if want := (recovery.CommitInfo{Epoch: 3, Execution: 1, At: start.Add(time.Second)}); c != want {
		t.Errorf("Committed() = %+v, want %+v", c, want)
	}
	xs, err := s.Executions(ctx)
	if err != nil {
		t.Fatal(err)
	}
	wantXs := []recovery.ExecutionInfo{
		{Execution: 1, Flow: "wordcount", Steps: []string{"split", "count"}, Workers: 2, Started: start, Frontiers: []uint64{3, math.MaxUint64}},
		{Execution: 2, Flow: "wordcount", Steps: []string{"count"}, Workers: 3, Started: start.Add(time.Second + time.Minute)},
	}
	if !reflect.DeepEqual(xs, wantXs) {
		t.Errorf("Executions() =\n%+v\nwant\n%+v", xs, wantXs)
	}
	if got := loadAll(t, s, "count"); !reflect.DeepEqual(got, map[string]entry{"a": {1, "1"}}) {
		t.Errorf("Load = %v", got)
	}

	// A third execution without steps, then a fourth: Steps is empty, not nil.
	begin(t, s, "wordcount", 1)
	if r := begin(t, s, "wordcount", 1); r.Steps == nil || len(r.Steps) != 0 || r.Execution != 4 {
		t.Errorf("Begin after an execution without steps = %+v, want Execution 4 and empty Steps", r)
	}
}

// beginErrors: Begin of another flow is refused with ErrOtherFlow naming both flows and the
// store, and a Begin without a flow name or workers is refused; none writes anything.
func (su suite) beginErrors(t *testing.T) {
	ctx := context.Background()
	open := su.h.New(t)
	s := mustOpen(t, open, Config{})
	begin(t, s, "alpha", 1)
	commit(t, s, 1, 1, snap("s", "k", 1, "v"))
	s.Close()

	s = mustOpen(t, open, Config{})
	_, err := s.Begin(ctx, recovery.Execution{Flow: "beta", Workers: 1})
	if !errors.Is(err, recovery.ErrOtherFlow) || !strings.Contains(err.Error(), `flow "alpha", not "beta"`) || !strings.Contains(err.Error(), su.h.Name(s)) {
		t.Errorf("Begin of another flow: %v; want ErrOtherFlow naming both flows and the store %s", err, su.h.Name(s))
	}
	for _, e := range []recovery.Execution{{Flow: "", Workers: 1}, {Flow: "alpha", Workers: 0}} {
		if _, err := s.Begin(ctx, e); err == nil {
			t.Errorf("Begin(%+v): no error", e)
		}
	}
	if xs, err := s.Executions(ctx); err != nil || len(xs) != 1 {
		t.Errorf("Executions() after refused Begins = %d executions, %v; want 1", len(xs), err)
	}
	if c, err := s.Committed(ctx); err != nil || c.Epoch != 1 {
		t.Errorf("Committed() after refused Begins = %+v, %v; want epoch 1", c, err)
	}
}
