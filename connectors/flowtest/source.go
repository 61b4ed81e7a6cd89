// Package flowtest holds a source and a sink for testing flows: a source that plays a script
// (items, pauses, the end of a partition, a simulated crash) and a sink that collects what it
// is given, with the epoch it was written in and what was committed.
package flowtest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/epochflow/epochflow/dataflow"
)

// ErrAbort is what Run's error wraps when a source reaches an Abort event.
var ErrAbort = errors.New("flowtest: abort")

type eventKind uint8

const (
	evItems eventKind = iota
	evPause
	evEOF
	evAbort
)

// Event is one entry of a test source's script.
type Event[T any] struct {
	kind  eventKind
	items []T
	pause time.Duration
}

// Items returns an event that yields items, in batches of the source's batch size.
func Items[T any](items ...T) Event[T] { return Event[T]{kind: evItems, items: items} }

// Pause returns an event that makes the partition yield nothing for d (the worker parks; it
// does not spin). With an epoch interval shorter than d, the epoch closes during the pause.
func Pause[T any](d time.Duration) Event[T] { return Event[T]{kind: evPause, pause: d} }

// EOF returns an event that ends the partition; events after it are never played.
func EOF[T any]() Event[T] { return Event[T]{kind: evEOF} }

// Abort returns an event that stops the flow with an error wrapping ErrAbort, as a crash would:
// nothing after the last commit is committed.
func Abort[T any]() Event[T] { return Event[T]{kind: evAbort} }

// Position is a test partition's resume state: the event and the item within it.
type Position struct {
	Event int
	Item  int
}

// Source is a partitioned source that plays one script per partition. Partition i is named
// "part-i". The end of a script ends the partition, as EOF does.
type Source[T any] struct {
	batch   int
	scripts [][]Event[T]

	mu      sync.Mutex
	commits map[string][]Position
}

// NewSource returns a source with one partition per script, yielding at most batch items per
// Next (batch < 1 means 1).
func NewSource[T any](batch int, scripts ...[]Event[T]) *Source[T] {
	return &Source[T]{batch: max(batch, 1), scripts: scripts, commits: map[string][]Position{}}
}

// List returns a source with one partition that yields items in batches of 10, then ends.
func List[T any](items ...T) dataflow.Source[T] {
	return NewSource(10, []Event[T]{Items(items...)}).Input()
}

// Input returns the source for dataflow.Input or operators.Input.
func (s *Source[T]) Input() dataflow.Source[T] {
	return dataflow.FromPartitioned[T, Position](s)
}

// Commits returns the positions Commit was called with, per partition, in order.
func (s *Source[T]) Commits() map[string][]Position {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string][]Position, len(s.commits))
	for k, v := range s.commits {
		out[k] = append([]Position(nil), v...)
	}
	return out
}

// Parts implements dataflow.PartitionedSource.
func (s *Source[T]) Parts(context.Context) ([]string, error) {
	parts := make([]string, len(s.scripts))
	for i := range parts {
		parts[i] = fmt.Sprintf("part-%d", i)
	}
	return parts, nil
}

// Build implements dataflow.PartitionedSource.
func (s *Source[T]) Build(_ context.Context, part string, resume *Position) (dataflow.StatefulSource[T, Position], error) {
	var i int
	if _, err := fmt.Sscanf(part, "part-%d", &i); err != nil || i < 0 || i >= len(s.scripts) {
		return nil, fmt.Errorf("flowtest: no partition %q", part)
	}
	p := &sourcePart[T]{src: s, key: part, script: s.scripts[i]}
	if resume != nil {
		p.pos = *resume
	}
	return p, nil
}

type sourcePart[T any] struct {
	src    *Source[T]
	key    string
	script []Event[T]
	pos    Position
	until  time.Time // end of the current pause
}

func (p *sourcePart[T]) Next(context.Context) ([]T, error) {
	for p.pos.Event < len(p.script) {
		ev := p.script[p.pos.Event]
		switch ev.kind {
		case evItems:
			if p.pos.Item >= len(ev.items) {
				p.pos = Position{Event: p.pos.Event + 1}
				continue
			}
			end := min(p.pos.Item+p.src.batch, len(ev.items))
			out := append([]T(nil), ev.items[p.pos.Item:end]...)
			p.pos.Item = end
			return out, nil
		case evPause:
			if p.until.IsZero() {
				p.until = time.Now().Add(ev.pause)
			}
			if time.Now().Before(p.until) {
				return nil, nil
			}
			p.until = time.Time{}
			p.pos = Position{Event: p.pos.Event + 1}
		case evEOF:
			return nil, io.EOF
		case evAbort:
			return nil, fmt.Errorf("partition %q at event %d: %w", p.key, p.pos.Event, ErrAbort)
		}
	}
	return nil, io.EOF
}

// NextAwake makes the engine sleep through a pause instead of polling.
func (p *sourcePart[T]) NextAwake() time.Time { return p.until }

func (p *sourcePart[T]) Snapshot() Position { return p.pos }

func (p *sourcePart[T]) Commit(_ context.Context, pos Position) error {
	p.src.mu.Lock()
	p.src.commits[p.key] = append(p.src.commits[p.key], pos)
	p.src.mu.Unlock()
	return nil
}

func (p *sourcePart[T]) Close() error { return nil }
