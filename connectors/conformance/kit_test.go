package conformance

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/epochflow/epochflow/connectors/flowtest"
	"github.com/epochflow/epochflow/dataflow"
)

// memQueue is an in-memory queue with SQS-like acknowledgement: a partition takes messages
// in flight, its snapshot lists what it took, Commit deletes those messages (also a copy
// that a crash put back), and Close puts what is still in flight back.
type memQueue struct {
	mu        sync.Mutex
	ready     []string
	inflight  map[string]bool
	ackInNext bool // broken: a message is deleted as soon as Next hands it out
}

func newMemQueue() *memQueue { return &memQueue{inflight: map[string]bool{}} }

func (q *memQueue) send(ids []string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.ready = append(q.ready, ids...)
}

func (q *memQueue) remaining() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.ready) + len(q.inflight)
}

func (q *memQueue) Parts(context.Context) ([]string, error) { return []string{"c0", "c1"}, nil }

func (q *memQueue) Build(_ context.Context, _ string, resume *[]string) (dataflow.StatefulSource[string, []string], error) {
	p := &memPart{q: q, last: time.Now()}
	if resume != nil {
		p.taken = slices.Clone(*resume)
	}
	return p, nil
}

type memPart struct {
	q     *memQueue
	taken []string // every message this partition (and the run it resumes) took
	last  time.Time
}

func (p *memPart) Next(context.Context) ([]string, error) {
	q := p.q
	q.mu.Lock()
	defer q.mu.Unlock()
	n := min(3, len(q.ready))
	if n == 0 {
		if time.Since(p.last) > 150*time.Millisecond {
			return nil, io.EOF
		}
		return nil, nil
	}
	batch := slices.Clone(q.ready[:n])
	q.ready = q.ready[n:]
	if !q.ackInNext {
		for _, id := range batch {
			q.inflight[id] = true
		}
		p.taken = append(p.taken, batch...)
	}
	p.last = time.Now()
	return batch, nil
}

func (p *memPart) NextAwake() time.Time { return time.Now().Add(time.Millisecond) }

func (p *memPart) Snapshot() []string { return slices.Clone(p.taken) }

func (p *memPart) Commit(_ context.Context, s []string) error {
	q := p.q
	q.mu.Lock()
	defer q.mu.Unlock()
	done := map[string]bool{}
	for _, id := range s {
		delete(q.inflight, id)
		done[id] = true
	}
	q.ready = slices.DeleteFunc(q.ready, func(id string) bool { return done[id] })
	return nil
}

func (p *memPart) Close() error {
	q := p.q
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, id := range p.taken {
		if q.inflight[id] {
			delete(q.inflight, id)
			q.ready = append(q.ready, id)
		}
	}
	return nil
}

func queueKit(broken bool) SourceKit[string, []string] {
	return SourceKit[string, []string]{
		Setup: func(t *testing.T) SourceSystem[string, []string] {
			q := newMemQueue()
			q.ackInNext = broken
			return SourceSystem[string, []string]{
				New:       func() dataflow.PartitionedSource[string, []string] { return q },
				Produce:   q.send,
				Remaining: q.remaining,
			}
		},
		ID:        func(s string) string { return s },
		Guarantee: ExactlyOnce,
	}
}

// repeatSink is a two-phase sink whose Commit repeats the newest transaction when it is
// called again with the same number: not idempotent, otherwise right.
type repeatSink struct {
	mu       sync.Mutex
	visible  []string
	prepared map[uint64][]string
	open     []string
	seq      uint64
	last     uint64
}

func (s *repeatSink) Parts(context.Context) ([]string, error) { return []string{"tx"}, nil }
func (s *repeatSink) PartFor(string, int) int                 { return 0 }
func (s *repeatSink) Build(_ context.Context, _ string, resume *uint64) (dataflow.StatefulSink[string, uint64], error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if resume != nil {
		s.commitLocked(*resume)
		s.seq = *resume
	} else {
		s.seq = s.last
	}
	s.open = nil
	return s, nil
}
func (s *repeatSink) commitLocked(seq uint64) {
	if seq == s.last && seq > 0 {
		s.visible = append(s.visible, s.prepared[seq]...) // the bug
	}
	for n := s.last + 1; n <= seq; n++ {
		s.visible = append(s.visible, s.prepared[n]...)
	}
	s.last = max(s.last, seq)
}
func (s *repeatSink) Write(_ context.Context, b []string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.open = append(s.open, b...)
	return nil
}
func (s *repeatSink) Snapshot() (uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.seq++
	s.prepared[s.seq] = s.open
	s.open = nil
	return s.seq, nil
}
func (s *repeatSink) Commit(_ context.Context, seq uint64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.commitLocked(seq)
	return nil
}
func (s *repeatSink) Close() error { return nil }
func (s *repeatSink) Visible() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.visible)
}

func twoPhaseKit() SinkKit[string, uint64] {
	return SinkKit[string, uint64]{
		Setup: func(t *testing.T) SinkSystem[string, uint64] {
			s := flowtest.NewTwoPhaseSink[string](nil)
			return SinkSystem[string, uint64]{
				New:     func() dataflow.PartitionedSink[string, uint64] { return s },
				Item:    func(id string) string { return id },
				Visible: s.Visible,
			}
		},
		Guarantee: ExactlyOnce,
	}
}

func TestKitPassesACorrectQueueSource(t *testing.T) { TestSource(t, queueKit(false)) }

func TestKitPassesACorrectTwoPhaseSink(t *testing.T) { TestSink(t, twoPhaseKit()) }

// recorder is a reporter that keeps the failures of a check instead of failing the test.
type recorder struct {
	*testing.T
	mu     sync.Mutex
	errors []string
}

type fatal struct{}

func (r *recorder) Helper() {}
func (r *recorder) Errorf(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.errors = append(r.errors, fmt.Sprintf(format, args...))
}
func (r *recorder) Fatalf(format string, args ...any) {
	r.Errorf(format, args...)
	panic(fatal{})
}

func (r *recorder) failures() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return strings.Join(r.errors, "\n")
}

// expectFailure runs check against a broken connector and fails the test unless the check
// fails with a message containing want.
func expectFailure(t *testing.T, want string, check func(r reporter)) {
	t.Helper()
	r := &recorder{T: t}
	func() {
		defer func() {
			if v := recover(); v != nil {
				if _, ok := v.(fatal); !ok {
					panic(v)
				}
			}
		}()
		check(r)
	}()
	got := r.failures()
	if !strings.Contains(got, want) {
		t.Fatalf("the kit's check gave %q on a broken connector, want a failure containing %q", got, want)
	}
	t.Logf("the kit caught it: %s", got)
}

// A source that acknowledges in Next, before the epoch commits, fails the crash checks: a
// crash loses what it had acknowledged.
func TestKitCatchesASourceThatAcksInNext(t *testing.T) {
	kit := queueKit(true)
	kit.defaults()
	for _, c := range checks("Next") {
		// At inside-commit the first epoch with items is committed: if the source read every
		// item in it, nothing was acknowledged early, so that point proves nothing here.
		if !strings.HasPrefix(c.name, "crash/") || c.name == "crash/inside-commit" {
			continue
		}
		t.Run(c.name, func(t *testing.T) {
			expectFailure(t, "acknowledged before their epoch committed", func(r reporter) { srcRun(r, kit.Setup(t), &kit, c) })
		})
	}
}

// A sink whose Commit is not idempotent fails commit-twice.
func TestKitCatchesANonIdempotentSinkCommit(t *testing.T) {
	kit := SinkKit[string, uint64]{
		Setup: func(t *testing.T) SinkSystem[string, uint64] {
			s := &repeatSink{prepared: map[uint64][]string{}}
			return SinkSystem[string, uint64]{New: func() dataflow.PartitionedSink[string, uint64] { return s }, Item: func(id string) string { return id }, Visible: s.Visible}
		},
		Guarantee: ExactlyOnce,
	}
	kit.defaults()
	for _, c := range checks("Write") {
		if c.name != "commit-twice" {
			continue
		}
		t.Run(c.name, func(t *testing.T) {
			expectFailure(t, "delivered more than once", func(r reporter) { sinkRun(r, kit.Setup(t), &kit, c) })
		})
	}
}

// leakyQueue starts a goroutine in Build that Close does not stop.
type leakyQueue struct {
	*memQueue
	stop chan struct{}
}

func (q leakyQueue) Build(ctx context.Context, part string, resume *[]string) (dataflow.StatefulSource[string, []string], error) {
	go func() { <-q.stop }()
	return q.memQueue.Build(ctx, part, resume)
}

// A source whose goroutine outlives Close fails the check.
func TestKitCatchesALeakedGoroutine(t *testing.T) {
	stop := make(chan struct{})
	t.Cleanup(func() { close(stop) })
	kit := queueKit(false)
	kit.Setup = func(t *testing.T) SourceSystem[string, []string] {
		q := newMemQueue()
		return SourceSystem[string, []string]{
			New:       func() dataflow.PartitionedSource[string, []string] { return leakyQueue{q, stop} },
			Produce:   q.send,
			Remaining: q.remaining,
		}
	}
	kit.defaults()
	expectFailure(t, "goroutines left after the runs ended", func(r reporter) { srcRun(r, kit.Setup(t), &kit, checks("Next")[0]) })
}

// checkNamed returns the kit's check of that name.
func checkNamed(t *testing.T, data, name string) check {
	t.Helper()
	for _, c := range checks(data) {
		if c.name == name {
			return c
		}
	}
	t.Fatalf("no check %q", name)
	return check{}
}

// keepOpenSink is a two-phase sink whose Build, on a resume, also makes visible what the
// crashed run wrote in its open epoch (never snapshotted, so written again by the resumed
// run): a bug that only a crash in the middle of an epoch shows.
type keepOpenSink struct {
	mu       sync.Mutex
	visible  []string
	prepared map[uint64][]string
	open     []string
	seq      uint64
}

func (s *keepOpenSink) Parts(context.Context) ([]string, error) { return []string{"tx"}, nil }
func (s *keepOpenSink) PartFor(string, int) int                 { return 0 }
func (s *keepOpenSink) Build(_ context.Context, _ string, resume *uint64) (dataflow.StatefulSink[string, uint64], error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var upTo uint64
	if resume != nil {
		upTo = *resume
	}
	s.commitLocked(upTo)
	s.visible = append(s.visible, s.open...) // the bug: the open epoch is not the resume's
	clear(s.prepared)
	s.open, s.seq = nil, upTo
	return s, nil
}
func (s *keepOpenSink) commitLocked(upTo uint64) {
	for n := uint64(1); n <= upTo; n++ {
		s.visible = append(s.visible, s.prepared[n]...)
		delete(s.prepared, n)
	}
}
func (s *keepOpenSink) Write(_ context.Context, b []string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.open = append(s.open, b...)
	return nil
}
func (s *keepOpenSink) Snapshot() (uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.seq++
	s.prepared[s.seq] = s.open
	s.open = nil
	return s.seq, nil
}
func (s *keepOpenSink) Commit(_ context.Context, seq uint64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.commitLocked(seq)
	return nil
}
func (s *keepOpenSink) Close() error { return nil }
func (s *keepOpenSink) Visible() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.visible)
}

// A sink that keeps what a crashed run wrote in its open epoch fails the crash in the middle
// of an epoch (the engine has no crash point there; the kit's wrapper makes one).
func TestKitCatchesASinkThatKeepsTheOpenEpoch(t *testing.T) {
	kit := SinkKit[string, uint64]{
		Setup: func(t *testing.T) SinkSystem[string, uint64] {
			s := &keepOpenSink{prepared: map[uint64][]string{}}
			return SinkSystem[string, uint64]{New: func() dataflow.PartitionedSink[string, uint64] { return s }, Item: func(id string) string { return id }, Visible: s.Visible}
		},
		Guarantee: ExactlyOnce,
	}
	kit.defaults()
	c := checkNamed(t, "Write", "crash/"+midEpoch)
	expectFailure(t, "delivered more than once", func(r reporter) { sinkRun(r, kit.Setup(t), &kit, c) })
}

// stuckQueue's partitions wait in Close until a Commit has covered everything they took, as a
// source that waits for its last acknowledgement without a bound would: after a failure that
// Commit never comes.
type stuckQueue struct {
	*memQueue
	stop chan struct{}
}

func (q stuckQueue) Build(ctx context.Context, part string, resume *[]string) (dataflow.StatefulSource[string, []string], error) {
	p, err := q.memQueue.Build(ctx, part, resume)
	if err != nil {
		return nil, err
	}
	return &stuckPart{memPart: p.(*memPart), stop: q.stop}, nil
}

type stuckPart struct {
	*memPart
	stop      chan struct{}
	mu        sync.Mutex
	committed int
}

func (p *stuckPart) Commit(ctx context.Context, s []string) error {
	p.mu.Lock()
	p.committed = len(s)
	p.mu.Unlock()
	return p.memPart.Commit(ctx, s)
}

func (p *stuckPart) Close() error {
	for {
		p.mu.Lock()
		done := p.committed >= len(p.taken)
		p.mu.Unlock()
		if done {
			return p.memPart.Close()
		}
		select {
		case <-p.stop:
			return p.memPart.Close()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// A source whose Close waits for a commit that a failure stops fails the Close-after-failure
// checks, whether the failure came in Next or in Commit.
func TestKitCatchesACloseThatWaitsAfterAFailure(t *testing.T) {
	defer func(d, g time.Duration) { closeLimit, leakGrace = d, g }(closeLimit, leakGrace)
	closeLimit, leakGrace = 500*time.Millisecond, 500*time.Millisecond // the stuck Closes leak too
	stop := make(chan struct{})
	t.Cleanup(func() { close(stop) })
	kit := queueKit(false)
	kit.Setup = func(t *testing.T) SourceSystem[string, []string] {
		q := newMemQueue()
		return SourceSystem[string, []string]{
			New:       func() dataflow.PartitionedSource[string, []string] { return stuckQueue{q, stop} },
			Produce:   q.send,
			Remaining: q.remaining,
		}
	}
	kit.defaults()
	for _, name := range []string{"close-after-failure/next", "close-after-failure/commit"} {
		c := checkNamed(t, "Next", name)
		t.Run(name, func(t *testing.T) {
			expectFailure(t, "Close did not return within", func(r reporter) { srcRun(r, kit.Setup(t), &kit, c) })
		})
	}
}

// leakOnFailureQueue's partitions start a goroutine that ends at the partition's last
// Commit, which Close does not stop: after a failure that Commit never comes.
type leakOnFailureQueue struct {
	*memQueue
	stop chan struct{}
}

func (q leakOnFailureQueue) Build(ctx context.Context, part string, resume *[]string) (dataflow.StatefulSource[string, []string], error) {
	p, err := q.memQueue.Build(ctx, part, resume)
	if err != nil {
		return nil, err
	}
	lp := &leakPart{memPart: p.(*memPart), final: make(chan struct{})}
	go func() {
		select {
		case <-lp.final:
		case <-q.stop:
		}
	}()
	return lp, nil
}

type leakPart struct {
	*memPart
	final chan struct{}
	once  sync.Once
}

func (p *leakPart) Next(ctx context.Context) ([]string, error) {
	b, err := p.memPart.Next(ctx)
	if errors.Is(err, io.EOF) {
		p.once.Do(func() { close(p.final) }) // read to the end: the goroutine's work is done
	}
	return b, err
}

// A source whose goroutine outlives Close after a failure fails the Close-after-failure
// checks with the goroutines it left.
func TestKitCatchesAGoroutineLeftAfterAFailure(t *testing.T) {
	defer func(g time.Duration) { leakGrace = g }(leakGrace)
	leakGrace = 500 * time.Millisecond
	stop := make(chan struct{})
	t.Cleanup(func() { close(stop) })
	kit := queueKit(false)
	kit.Setup = func(t *testing.T) SourceSystem[string, []string] {
		q := newMemQueue()
		return SourceSystem[string, []string]{
			New:       func() dataflow.PartitionedSource[string, []string] { return leakOnFailureQueue{q, stop} },
			Produce:   q.send,
			Remaining: q.remaining,
		}
	}
	kit.defaults()
	c := checkNamed(t, "Next", "close-after-failure/next")
	expectFailure(t, "goroutines were left once the run had closed its partitions", func(r reporter) { srcRun(r, kit.Setup(t), &kit, c) })
}

// forgetfulQueue's partitions take the resume state over and clear the one they were given,
// so the engine's Commit of the resume state, which repeats a commit the crash may have lost,
// commits nothing.
type forgetfulQueue struct{ *memQueue }

func (q forgetfulQueue) Build(ctx context.Context, part string, resume *[]string) (dataflow.StatefulSource[string, []string], error) {
	p, err := q.memQueue.Build(ctx, part, resume)
	if resume != nil {
		*resume = nil // the bug
	}
	return p, err
}

// A source that changes the resume state it was given fails the check that the first Commit
// after a resume carries it, at each crash after which every partition resumes from a state.
func TestKitCatchesASourceThatChangesItsResumeState(t *testing.T) {
	kit := queueKit(false)
	kit.Setup = func(t *testing.T) SourceSystem[string, []string] {
		q := newMemQueue()
		return SourceSystem[string, []string]{
			New:       func() dataflow.PartitionedSource[string, []string] { return forgetfulQueue{q} },
			Produce:   q.send,
			Remaining: q.remaining,
		}
	}
	kit.defaults()
	for _, c := range checks("Next") {
		if !c.resumes {
			continue
		}
		t.Run(c.name, func(t *testing.T) {
			expectFailure(t, "the first Commit after the resume carried", func(r reporter) { srcRun(r, kit.Setup(t), &kit, c) })
		})
	}
}
