package conformance

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/epochflow/epochflow/dataflow"
)

// commitMode says how the kit's wrappers pass the engine's Commit calls on.
type commitMode int

const (
	commitAsIs      commitMode = iota
	commitTwice                // every Commit is passed on twice: it must be idempotent
	commitSkipFirst            // the first skipCommits Commits of a partition are dropped: a later one must cover them
)

// skipCommits is how many Commit calls commitSkipFirst drops per partition.
const skipCommits = 2

// failPoint says where a check injects a failure of the connector's system.
type failPoint int

const (
	failNone   failPoint = iota
	failData             // a Next (source) or Write (sink) returns errInjected instead of being passed on
	failCommit           // a Commit returns errInjected instead of being passed on
)

// errInjected is the failure the kit's wrappers inject in place of a call to the connector.
var errInjected = errors.New("conformance: a failure of the connector's system, injected by the kit")

// closeLimit bounds each Close after an injected failure (a variable for the kit's own tests).
var closeLimit = 10 * time.Second

// fault is what one run's wrapper does to the connector beyond passing calls on, shared by
// all its partitions: crash the run in the middle of an epoch (freeze: from the first batch
// with items on, no call is passed on, as after the death of the process), or inject one
// failure after the first batch with items; and what it found wrong.
type fault struct {
	mid  bool      // freeze after the first batch with items
	fail failPoint // inject one failure after the first batch with items

	mu       sync.Mutex
	items    int // items in the batches passed on
	frozen   bool
	injected bool
	resumed  int // partitions built with a resume state
	problems []string
}

// afterData counts a batch passed on, and freezes the connector after the first with items.
func (f *fault) afterData(n int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.items += n
	if f.mid && f.items > 0 {
		f.frozen = true
	}
}

// isFrozen tells whether the connector is frozen: its run is to crash at the next point.
func (f *fault) isFrozen() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.frozen
}

// inject tells whether this call (at point p) is the one to fail: the first such call once
// items have been passed on.
func (f *fault) inject(p failPoint) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fail != p || f.items == 0 || f.injected {
		return false
	}
	f.injected = true
	return true
}

func (f *fault) problem(format string, args ...any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.problems = append(f.problems, fmt.Sprintf(format, args...))
}

// report fails the check with the problems found in its run.
func (f *fault) report(r reporter, run int) {
	r.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, p := range f.problems {
		r.Errorf("run %d: %s", run, p)
	}
}

func (f *fault) resumedParts() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.resumed
}

// resumeCheck checks the contract of a resumed partition: its first call is Commit, with the
// resume state Build was given (the engine commits it again, as that commit may have been lost
// in the crash). A partition that changes the state it was given (in Build, or later through
// a slice or map it shares) commits something else there.
type resumeCheck struct {
	want []byte // the resume state as Build was given it, encoded; nil without one
	done bool
}

// newResumeCheck encodes the resume state before the connector's Build sees it.
func newResumeCheck[S any](f *fault, resume *S) resumeCheck {
	if resume == nil {
		return resumeCheck{}
	}
	f.mu.Lock()
	f.resumed++
	f.mu.Unlock()
	b, err := dataflow.DefaultCodec[S]().Encode(*resume)
	if err != nil {
		return resumeCheck{}
	}
	return resumeCheck{want: b}
}

// data notes a Next or Write call (what), which must not come first.
func (c *resumeCheck) data(f *fault, part, what string) {
	if c.want == nil || c.done {
		return
	}
	c.done = true
	f.problem("partition %q was resumed from a state, but its first call was %s, not Commit(resume state)", part, what)
}

// commit notes a Commit call with state s: the first must carry the resume state.
func commitCheck[S any](c *resumeCheck, f *fault, part string, s S) {
	if c.want == nil || c.done {
		return
	}
	c.done = true
	got, err := dataflow.DefaultCodec[S]().Encode(s)
	if err == nil && !bytes.Equal(got, c.want) {
		f.problem("partition %q: the first Commit after the resume carried %s, but the resume state given to Build was %s: the partition changed the state it was given (Build must neither modify *resume nor keep sharing its slices or maps), so the commit the crash may have lost is not repeated",
			part, got, c.want)
	}
}

// committer passes Commit calls on as its mode says and counts them.
type committer struct {
	mode    commitMode
	calls   int // Commit calls from the engine
	skipped int
}

func (c *committer) commit(do func() error) error {
	c.calls++
	switch c.mode {
	case commitTwice:
		if err := do(); err != nil {
			return err
		}
		return do()
	case commitSkipFirst:
		if c.skipped < skipCommits {
			c.skipped++
			return nil
		}
	}
	return do()
}

// closer closes a partition once: the engine closes what a run opened, except after a
// crash, when the kit closes what the crashed run left open (as the end of a process would).
// After an injected failure, a Close that takes longer than closeLimit is reported, and left
// running.
type closer struct {
	once sync.Once
	err  error
}

func (c *closer) close(f *fault, part string, do func() error) error {
	c.once.Do(func() {
		if f.fail == failNone {
			c.err = do()
			return
		}
		done := make(chan error, 1)
		go func() { done <- do() }()
		select {
		case c.err = <-done:
		case <-time.After(closeLimit):
			f.problem("partition %q: Close did not return within %v after the failure injected by the kit: Close must not wait for a commit or a reply that the failure stops", part, closeLimit)
			c.err = fmt.Errorf("partition %q: Close did not return within %v", part, closeLimit)
		}
	})
	return c.err
}

// wrappedSource is the source under test as the kit's flows see it.
type wrappedSource[T, S any] struct {
	inner dataflow.PartitionedSource[T, S]
	mode  commitMode
	f     *fault

	mu         sync.Mutex
	parts      []*srcPart[T, S]
	committers []*committer // the parts' own
}

func (w *wrappedSource[T, S]) Parts(ctx context.Context) ([]string, error) { return w.inner.Parts(ctx) }

func (w *wrappedSource[T, S]) Build(ctx context.Context, part string, resume *S) (dataflow.StatefulSource[T, S], error) {
	rc := newResumeCheck(w.f, resume)
	p, err := w.inner.Build(ctx, part, resume)
	if err != nil {
		return nil, err
	}
	sp := &srcPart[T, S]{inner: p, part: part, f: w.f, c: committer{mode: w.mode}, rc: rc}
	w.mu.Lock()
	w.parts = append(w.parts, sp)
	w.committers = append(w.committers, &sp.c)
	w.mu.Unlock()
	_, wait := p.(dataflow.Waiter)
	_, awake := p.(dataflow.Awaker)
	switch {
	case wait && awake:
		return srcPartWA[T, S]{sp}, nil
	case wait:
		return srcPartW[T, S]{sp}, nil
	case awake:
		return srcPartA[T, S]{sp}, nil
	}
	return sp, nil
}

// closeAll closes the partitions a run left open and returns their errors.
func (w *wrappedSource[T, S]) closeAll() error {
	w.mu.Lock()
	parts := append([]*srcPart[T, S](nil), w.parts...)
	w.mu.Unlock()
	var errs []error
	for _, p := range parts {
		errs = append(errs, p.Close())
	}
	return errors.Join(errs...)
}

// minCommits returns the fewest Commit calls a partition got.
func (w *wrappedSource[T, S]) minCommits() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return minCalls(w.committers)
}

type srcPart[T, S any] struct {
	inner dataflow.StatefulSource[T, S]
	part  string
	f     *fault
	c     committer
	cl    closer
	rc    resumeCheck
}

func (p *srcPart[T, S]) Next(ctx context.Context) ([]T, error) {
	if p.f.isFrozen() {
		return nil, nil
	}
	p.rc.data(p.f, p.part, "Next")
	if p.f.inject(failData) {
		return nil, errInjected
	}
	items, err := p.inner.Next(ctx)
	p.f.afterData(len(items))
	return items, err
}

func (p *srcPart[T, S]) Snapshot() S {
	if p.f.isFrozen() {
		var zero S // never recorded: the run crashes at the next point
		return zero
	}
	return p.inner.Snapshot()
}

func (p *srcPart[T, S]) Commit(ctx context.Context, s S) error {
	if p.f.isFrozen() {
		return nil
	}
	commitCheck(&p.rc, p.f, p.part, s)
	if p.f.inject(failCommit) {
		return errInjected
	}
	return p.c.commit(func() error { return p.inner.Commit(ctx, s) })
}

func (p *srcPart[T, S]) Close() error { return p.cl.close(p.f, p.part, p.inner.Close) }

type srcPartW[T, S any] struct{ *srcPart[T, S] }

func (p srcPartW[T, S]) Wait() <-chan struct{} { return p.inner.(dataflow.Waiter).Wait() }

type srcPartA[T, S any] struct{ *srcPart[T, S] }

func (p srcPartA[T, S]) NextAwake() time.Time { return p.inner.(dataflow.Awaker).NextAwake() }

type srcPartWA[T, S any] struct{ *srcPart[T, S] }

func (p srcPartWA[T, S]) Wait() <-chan struct{} { return p.inner.(dataflow.Waiter).Wait() }
func (p srcPartWA[T, S]) NextAwake() time.Time  { return p.inner.(dataflow.Awaker).NextAwake() }

// wrappedSink is the sink under test as the kit's flows see it.
type wrappedSink[T, S any] struct {
	inner dataflow.PartitionedSink[T, S]
	mode  commitMode
	f     *fault

	mu         sync.Mutex
	parts      []*sinkPart[T, S]
	committers []*committer // the parts' own
	// written counts the items written in this run; commitsAfterWrite counts the Commit
	// calls that returned after the first item was written.
	written           int
	commitsAfterWrite int
}

func (w *wrappedSink[T, S]) Parts(ctx context.Context) ([]string, error) { return w.inner.Parts(ctx) }
func (w *wrappedSink[T, S]) PartFor(item T, parts int) int               { return w.inner.PartFor(item, parts) }

func (w *wrappedSink[T, S]) Build(ctx context.Context, part string, resume *S) (dataflow.StatefulSink[T, S], error) {
	rc := newResumeCheck(w.f, resume)
	p, err := w.inner.Build(ctx, part, resume)
	if err != nil {
		return nil, err
	}
	sp := &sinkPart[T, S]{inner: p, part: part, w: w, c: committer{mode: w.mode}, rc: rc}
	w.mu.Lock()
	w.parts = append(w.parts, sp)
	w.committers = append(w.committers, &sp.c)
	w.mu.Unlock()
	return sp, nil
}

func (w *wrappedSink[T, S]) closeAll() error {
	w.mu.Lock()
	parts := append([]*sinkPart[T, S](nil), w.parts...)
	w.mu.Unlock()
	var errs []error
	for _, p := range parts {
		errs = append(errs, p.Close())
	}
	return errors.Join(errs...)
}

func (w *wrappedSink[T, S]) counts() (written, commitsAfterWrite int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.written, w.commitsAfterWrite
}

func (w *wrappedSink[T, S]) minCommits() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return minCalls(w.committers)
}

func (w *wrappedSink[T, S]) faults() *fault { return w.f }

type sinkPart[T, S any] struct {
	inner dataflow.StatefulSink[T, S]
	part  string
	w     *wrappedSink[T, S]
	c     committer
	cl    closer
	rc    resumeCheck
}

func (p *sinkPart[T, S]) Write(ctx context.Context, batch []T) error {
	f := p.w.f
	if f.isFrozen() {
		return nil
	}
	p.rc.data(f, p.part, "Write")
	if f.inject(failData) {
		return errInjected
	}
	err := p.inner.Write(ctx, batch)
	p.w.mu.Lock()
	p.w.written += len(batch)
	p.w.mu.Unlock()
	f.afterData(len(batch))
	return err
}

func (p *sinkPart[T, S]) Snapshot() (S, error) {
	if p.w.f.isFrozen() {
		var zero S // never recorded: the run crashes at the next point
		return zero, nil
	}
	return p.inner.Snapshot()
}

func (p *sinkPart[T, S]) Commit(ctx context.Context, s S) error {
	f := p.w.f
	if f.isFrozen() {
		return nil
	}
	commitCheck(&p.rc, f, p.part, s)
	if f.inject(failCommit) {
		return errInjected
	}
	err := p.c.commit(func() error { return p.inner.Commit(ctx, s) })
	p.w.mu.Lock()
	if p.w.written > 0 {
		p.w.commitsAfterWrite++
	}
	p.w.mu.Unlock()
	return err
}

func (p *sinkPart[T, S]) Close() error { return p.cl.close(p.w.f, p.part, p.inner.Close) }
