package dataflow

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/epochflow/epochflow/dataflow/internal/engine"
)

// Input adds a step that reads from src. The stream's items carry the epoch they were read in.
//
// Epochs: every worker closes its epoch on its own clock (the epoch interval) and when all of its
// partitions have ended; at each close it calls Snapshot on its partitions. Commit is called
// once the epoch is committed. EOF: the stream ends when every partition has returned io.EOF.
func Input[T any](f *Flow, name string, src Source[T]) Stream[T] {
	if f == nil || f.err != nil {
		return Stream[T]{}
	}
	if src.build == nil {
		f.fail(fmt.Errorf("step %q: the source is a zero dataflow.Source; build one with FromPartitioned or FromDynamic", name))
		return Stream[T]{}
	}
	s := f.add(name, &engine.Step{Kind: "source", Outputs: 1, Source: true, Setup: src.setup, New: src.build})
	if s == nil {
		return Stream[T]{}
	}
	return Stream[T]{flow: f, step: s}
}

// FromPartitioned turns a PartitionedSource into a Source for Input.
func FromPartitioned[T, S any](src PartitionedSource[T, S]) Source[T] {
	if src == nil {
		return Source[T]{}
	}
	return Source[T]{
		setup: func(ctx context.Context, workers int) (any, error) {
			return listParts(withWorkerCount(ctx, workers), src.Parts)
		},
		build: func(env *engine.Env, shared any) (engine.Node, error) {
			parts := shared.([]string)
			resume, dropped, err := restoredParts[S](env, parts, isConsumers(src))
			if err != nil {
				return nil, err
			}
			n := &partSourceNode[T, S]{env: env, codec: DefaultCodec[S](), dropped: dropped}
			for i, key := range parts {
				if i%env.Workers != env.Worker {
					continue
				}
				p, err := src.Build(env.Ctx, key, resume[key])
				if err != nil {
					n.Close()
					return nil, fmt.Errorf("partition %q: %w", key, err)
				}
				if p == nil {
					n.Close()
					return nil, fmt.Errorf("partition %q: Build returned a nil partition", key)
				}
				part := &sourcePart[T, S]{key: key, src: p}
				if r := resume[key]; r != nil {
					part.snaps = []snap[S]{{epoch: env.StartEpoch - 1, state: *r}}
				}
				n.parts = append(n.parts, part)
			}
			env.SetParts(len(n.parts))
			return n, nil
		},
	}
}

// restoredParts decodes the partition states a resumed run starts from. A partition the store
// knows but the source no longer lists is an error: its data would be silently skipped.
//
// A connector whose partitions are consumers (ConsumerPartitions) may list fewer partitions
// than the store holds; the state of the others is dropped: a tombstone, written by the worker
// that owns the key, deletes it at the first epoch end.
func restoredParts[S any](env *engine.Env, parts []string, consumers bool) (map[string]*S, []string, error) {
	if env.Recovery {
		if err := CheckCodec[S](); err != nil {
			return nil, nil, fmt.Errorf("partition state: %w", err)
		}
	}
	restored := env.Restored()
	if len(restored) == 0 {
		return nil, nil, nil
	}
	listed := make(map[string]bool, len(parts))
	for _, p := range parts {
		listed[p] = true
	}
	codec := DefaultCodec[S]()
	out := make(map[string]*S, len(restored))
	var dropped []string
	for _, r := range restored {
		if !listed[r.Key] {
			if !consumers {
				return nil, nil, fmt.Errorf("the recovery store holds the state of partition %q, which the connector no longer lists "+
					"(it lists %s): a partition named by a path changes when the working directory or the path given changes; "+
					"resume from the directory and with the paths of the run that wrote the store, or, to start over, give this run a new recovery directory",
					r.Key, quoteList(parts, 10))
			}
			if WorkerForKey(r.Key, env.Workers) == env.Worker {
				dropped = append(dropped, r.Key)
			}
			continue
		}
		s, err := codec.Decode(r.Key, r.State)
		if err != nil {
			return nil, nil, fmt.Errorf("partition %q: restoring state: %w", r.Key, err)
		}
		out[r.Key] = &s
	}
	if len(dropped) > 0 {
		env.Logger.Info("dropping the state of partitions the connector no longer lists", "step", env.StepID, "partitions", dropped)
	}
	return out, dropped, nil
}

// quoteList quotes the first max keys, and says how many more there are.
func quoteList(keys []string, max int) string {
	if len(keys) == 0 {
		return "none"
	}
	var b strings.Builder
	for i, k := range keys {
		if i == max {
			fmt.Fprintf(&b, " and %d more", len(keys)-max)
			break
		}
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%q", k)
	}
	return b.String()
}

// ConsumerPartitions is implemented by a PartitionedSource or PartitionedSink whose partitions
// are consumers rather than data (one per worker, reading a shared queue), so that their state
// is only a counter: when the flow resumes with fewer workers and Parts lists fewer partitions
// than the recovery store holds, the state of the others is dropped instead of refusing to
// start.
type ConsumerPartitions interface {
	ConsumerPartitions()
}

func isConsumers(v any) bool { _, ok := v.(ConsumerPartitions); return ok }

func listParts(ctx context.Context, parts func(context.Context) ([]string, error)) ([]string, error) {
	keys, err := parts(ctx)
	if err != nil {
		return nil, fmt.Errorf("listing partitions: %w", err)
	}
	seen := make(map[string]bool, len(keys))
	for _, k := range keys {
		if seen[k] {
			return nil, fmt.Errorf("partition %q is listed twice", k)
		}
		seen[k] = true
	}
	return keys, nil
}

// FromDynamic turns a DynamicSource into a Source for Input.
func FromDynamic[T any](src DynamicSource[T]) Source[T] {
	if src == nil {
		return Source[T]{}
	}
	return Source[T]{
		build: func(env *engine.Env, _ any) (engine.Node, error) {
			s, err := src.Build(env.Ctx, Worker{Index: env.Worker, Count: env.Workers})
			if err != nil {
				return nil, err
			}
			if s == nil {
				return nil, errors.New("the source's Build returned a nil WorkerSource")
			}
			// No codec: a dynamic source has no state to store.
			env.SetParts(1)
			return &partSourceNode[T, struct{}]{env: env, parts: []*sourcePart[T, struct{}]{
				{key: fmt.Sprintf("worker-%d", env.Worker), src: dynamicPart[T]{s}}}}, nil
		},
	}
}

// dynamicPart adapts a WorkerSource to the partition interface with no state.
type dynamicPart[T any] struct{ WorkerSource[T] }

func (dynamicPart[T]) Snapshot() struct{}                     { return struct{}{} }
func (dynamicPart[T]) Commit(context.Context, struct{}) error { return nil }
func (d dynamicPart[T]) inner() any                           { return d.WorkerSource }

type snap[S any] struct {
	epoch uint64
	state S
}

type sourcePart[T, S any] struct {
	key       string
	src       StatefulSource[T, S]
	eof       bool
	notBefore time.Time
	backoff   time.Duration
	snaps     []snap[S]
}

// innerOf returns what implements the optional interfaces (Waiter, Awaker).
func (p *sourcePart[T, S]) innerOf() any {
	if d, ok := any(p.src).(interface{ inner() any }); ok {
		return d.inner()
	}
	return p.src
}

type partSourceNode[T, S any] struct {
	env     *engine.Env
	codec   Codec[S]
	parts   []*sourcePart[T, S]
	dropped []string // partitions whose stored state is deleted at the first epoch end
}

const maxBackoff = 50 * time.Millisecond

func (n *partSourceNode[T, S]) Poll(epoch uint64) (progress, eof bool, err error) {
	var now time.Time
	live := 0
	for i, p := range n.parts {
		if p.eof {
			continue
		}
		if !p.notBefore.IsZero() {
			if now.IsZero() {
				now = time.Now()
			}
			if now.Before(p.notBefore) {
				live++
				continue
			}
		}
		batch, err := p.src.Next(n.env.Ctx)
		if err != nil && !errors.Is(err, io.EOF) {
			return progress, false, fmt.Errorf("partition %q: %w", p.key, err)
		}
		if len(batch) > 0 {
			// Tagged with the partition, for the event-time clocks downstream (Clock).
			if err := n.env.EmitPart(0, epoch, batch, i); err != nil {
				return progress, false, err
			}
			progress = true
		}
		if err != nil { // io.EOF
			p.eof = true
			n.env.PartEnded(i)
			continue
		}
		live++
		inner := p.innerOf()
		switch {
		case isAwaker(inner):
			p.notBefore = inner.(Awaker).NextAwake()
		case len(batch) > 0:
			p.notBefore, p.backoff = time.Time{}, 0
		case isWaiter(inner):
			p.notBefore = time.Time{}
		default:
			p.backoff = min(max(2*p.backoff, time.Millisecond), maxBackoff)
			p.notBefore = time.Now().Add(p.backoff)
		}
	}
	return progress, live == 0, nil
}

func isAwaker(v any) bool { _, ok := v.(Awaker); return ok }
func isWaiter(v any) bool { _, ok := v.(Waiter); return ok }

func (n *partSourceNode[T, S]) Awake() (time.Time, []<-chan struct{}) {
	var at time.Time
	var chans []<-chan struct{}
	for _, p := range n.parts {
		if p.eof {
			continue
		}
		if w, ok := p.innerOf().(Waiter); ok {
			chans = append(chans, w.Wait())
		}
		if !p.notBefore.IsZero() && (at.IsZero() || p.notBefore.Before(at)) {
			at = p.notBefore
		}
	}
	return at, chans
}

func (n *partSourceNode[T, S]) OnBatch(int, uint64, any) error {
	return errors.New("engine: a source got input")
}

func (n *partSourceNode[T, S]) OnEOF(uint64) error { return nil }

func (n *partSourceNode[T, S]) OnClose(epoch uint64) error {
	dropParts(n.env, epoch, &n.dropped)
	for _, p := range n.parts {
		s := p.src.Snapshot()
		p.snaps = append(p.snaps, snap[S]{epoch, s})
		if err := savePart(n.env, n.codec, epoch, p.key, s); err != nil {
			return err
		}
	}
	return nil
}

// dropParts writes tombstones for the stored state of partitions that are no longer listed.
func dropParts(env *engine.Env, epoch uint64, dropped *[]string) {
	for _, key := range *dropped {
		env.Save(epoch, key, nil, true)
	}
	*dropped = nil
}

// savePart stores a partition's snapshot in the recovery store (when there is one).
func savePart[S any](env *engine.Env, codec Codec[S], epoch uint64, key string, s S) error {
	if !env.Recovery || codec == nil {
		return nil
	}
	b, err := codec.Encode(s)
	if err != nil {
		return fmt.Errorf("partition %q: encoding snapshot: %w", key, err)
	}
	env.Save(epoch, key, b, false)
	return nil
}

func (n *partSourceNode[T, S]) Commit(ctx context.Context, epoch uint64) error {
	for _, p := range n.parts {
		if err := commitUpTo(ctx, &p.snaps, epoch, p.src.Commit); err != nil {
			return fmt.Errorf("partition %q: commit: %w", p.key, err)
		}
	}
	return nil
}

// commitUpTo calls commit with the newest snapshot of an epoch <= epoch and forgets those.
func commitUpTo[S any](ctx context.Context, snaps *[]snap[S], epoch uint64, commit func(context.Context, S) error) error {
	i := 0
	for i < len(*snaps) && (*snaps)[i].epoch <= epoch {
		i++
	}
	if i == 0 {
		return nil
	}
	st := (*snaps)[i-1].state
	*snaps = append((*snaps)[:0], (*snaps)[i:]...)
	return commit(ctx, st)
}

func (n *partSourceNode[T, S]) Close() error {
	var errs []error
	for _, p := range n.parts {
		if err := p.src.Close(); err != nil {
			errs = append(errs, fmt.Errorf("partition %q: close: %w", p.key, err))
		}
	}
	return errors.Join(errs...)
}
