package dataflow

import (
	"fmt"

	"github.com/epochflow/epochflow/dataflow/internal/engine"
)

// maxCombined is how many keys a combiner holds before it emits them early.
const maxCombined = 1 << 16

// Combine adds a step that merges, on every worker and within every epoch, the values of
// items that share a key (key(item), value(item)) with merge, and emits one KV per key and
// epoch: at the epoch's end, at EOF, before a graceful stop, or early when it holds 65,536
// keys. It is the local half of a local-global aggregation (a combiner): placed before a keyed
// stateful step that applies the same merge, it cuts what crosses the exchange to a key per
// worker and epoch, and spreads a hot key's work over all workers. merge must be associative
// and commutative (a sum, a count, a max).
//
// State: none between epochs (nothing to snapshot). Epochs: an output item carries the epoch
// of the items it merges. EOF: what is held is emitted, then the output ends.
func Combine[T, V any](name string, in Stream[T], key func(T) string, value func(T) V, merge func(acc, v V) V) Stream[KV[V]] {
	if !in.valid() {
		return Stream[KV[V]]{}
	}
	if key == nil || value == nil || merge == nil {
		in.flow.fail(fmt.Errorf("step %q: Combine needs a key, a value and a merge function", name))
		return Stream[KV[V]]{}
	}
	s := in.flow.add(name, &engine.Step{Kind: "combine", Inputs: []engine.Edge{in.edge()}, Outputs: 1,
		New: func(env *engine.Env, _ any) (engine.Node, error) {
			return &combineNode[T, V]{env: env, key: key, value: value, merge: merge, index: map[string]int{}}, nil
		}})
	if s == nil {
		return Stream[KV[V]]{}
	}
	return Stream[KV[V]]{flow: in.flow, step: s}
}

type combineNode[T, V any] struct {
	env   *engine.Env
	key   func(T) string
	value func(T) V
	merge func(V, V) V
	index map[string]int // key -> position in acc
	acc   []KV[V]
}

func (n *combineNode[T, V]) OnBatch(_ int, epoch uint64, batch any) (err error) {
	items := batch.([]T)
	i := 0
	defer func() {
		if p := recover(); p != nil {
			err = ItemErr(items[i], PanicErr(p))
		}
	}()
	for ; i < len(items); i++ {
		k := n.key(items[i])
		v := n.value(items[i])
		if j, ok := n.index[k]; ok {
			n.acc[j].Value = n.merge(n.acc[j].Value, v)
			continue
		}
		n.index[k] = len(n.acc)
		n.acc = append(n.acc, KV[V]{Key: k, Value: v})
	}
	if len(n.acc) >= maxCombined {
		return n.flush(epoch)
	}
	return nil
}

func (n *combineNode[T, V]) flush(epoch uint64) error {
	if len(n.acc) == 0 {
		return nil
	}
	out := n.acc
	n.acc = nil
	clear(n.index)
	return n.env.Emit(0, epoch, out)
}

func (n *combineNode[T, V]) OnEpochEnd(epoch uint64) error { return n.flush(epoch) }
func (n *combineNode[T, V]) OnEOF(epoch uint64) error      { return n.flush(epoch) }
func (n *combineNode[T, V]) OnClose(uint64) error          { return nil }
func (n *combineNode[T, V]) Close() error                  { return nil }

// ConsumesBatches: the node copies what it keeps.
func (n *combineNode[T, V]) ConsumesBatches() {}
