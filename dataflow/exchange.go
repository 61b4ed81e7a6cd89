package dataflow

import (
	"sync"

	"github.com/epochflow/epochflow/dataflow/internal/engine"
)

// KeyHash is the stable hash that routes a key to a worker: 64-bit FNV-1a of the key's bytes.
// It is the same in every process and every release, so state found in a recovery store can be
// routed to the worker that owns its key, whatever the number of workers.
func KeyHash(key string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(key); i++ {
		h ^= uint64(key[i])
		h *= 1099511628211
	}
	return h
}

// WorkerForKey returns the worker that owns key among workers.
func WorkerForKey(key string, workers int) int { return int(KeyHash(key) % uint64(workers)) }

// batchPool recycles the batches of one exchange edge: a receiver that is done with a batch
// hands it back, and a sender takes it for its next batch, so a busy exchange allocates
// (almost) nothing.
type batchPool[T any] struct {
	pool sync.Pool
	size int
}

func newBatchPool[T any](size int) *batchPool[T] { return &batchPool[T]{size: size} }

func (p *batchPool[T]) get() []T {
	if b, ok := p.pool.Get().(*[]T); ok {
		return (*b)[:0]
	}
	return make([]T, 0, p.size)
}

func (p *batchPool[T]) put(batch any) {
	b := batch.([]T)
	if cap(b) < p.size {
		return
	}
	clear(b)
	b = b[:0]
	p.pool.Put(&b)
}

// router buffers the items of one exchange edge on one sending worker, per destination.
type router[T any] struct {
	bufs  [][]T
	route func(T) (int, error)
	pool  *batchPool[T]
}

func newRouter[T any](total int, pool *batchPool[T], route func(T) (int, error)) *router[T] {
	return &router[T]{bufs: make([][]T, total), route: route, pool: pool}
}

func (r *router[T]) Route(batch any) error {
	for _, item := range batch.([]T) {
		d, err := r.route(item)
		if err != nil {
			return err
		}
		if r.bufs[d] == nil {
			r.bufs[d] = r.pool.get()
		}
		r.bufs[d] = append(r.bufs[d], item)
	}
	return nil
}

func (r *router[T]) Pending(dest int) int { return len(r.bufs[dest]) }

func (r *router[T]) Take(dest int) any {
	b := r.bufs[dest]
	r.bufs[dest] = nil
	return b
}

func (r *router[T]) Recycle(batch any) { r.pool.put(batch) }

// keyRouter routes a keyed stream by KeyHash.
type keyRouter[V any] struct {
	bufs  [][]KV[V]
	total uint64
	pool  *batchPool[KV[V]]
}

func (r *keyRouter[V]) Route(batch any) error {
	for _, kv := range batch.([]KV[V]) {
		d := KeyHash(kv.Key) % r.total
		if r.bufs[d] == nil {
			r.bufs[d] = r.pool.get()
		}
		r.bufs[d] = append(r.bufs[d], kv)
	}
	return nil
}

func (r *keyRouter[V]) Pending(dest int) int { return len(r.bufs[dest]) }

func (r *keyRouter[V]) Take(dest int) any {
	b := r.bufs[dest]
	r.bufs[dest] = nil
	return b
}

func (r *keyRouter[V]) Recycle(batch any) { r.pool.put(batch) }

const exchangeBatch = 1024

func byKey[V any]() func(self, total int, shared any) engine.Router {
	pool := newBatchPool[KV[V]](exchangeBatch)
	return func(self, total int, _ any) engine.Router {
		return &keyRouter[V]{bufs: make([][]KV[V], total), total: uint64(total), pool: pool}
	}
}
