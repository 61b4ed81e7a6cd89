package dataflow_test

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/epochflow/epochflow/dataflow"
)

// sliceSource is a partitioned source over fixed lists, for tests of the dataflow package.
type sliceSource struct {
	parts map[string][]string
	batch int
}

func (s sliceSource) Parts(context.Context) ([]string, error) {
	var keys []string
	for k := range s.parts {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys, nil
}

func (s sliceSource) Build(_ context.Context, part string, resume *int) (dataflow.StatefulSource[string, int], error) {
	p := &slicePart{items: s.parts[part], batch: s.batch}
	if resume != nil {
		p.pos = *resume
	}
	return p, nil
}

type slicePart struct {
	items []string
	pos   int
	batch int
}

func (p *slicePart) Next(context.Context) ([]string, error) {
	if p.pos >= len(p.items) {
		return nil, io.EOF
	}
	end := min(p.pos+p.batch, len(p.items))
	b := p.items[p.pos:end]
	p.pos = end
	return b, nil
}
func (p *slicePart) Snapshot() int                     { return p.pos }
func (p *slicePart) Commit(context.Context, int) error { return nil }
func (p *slicePart) Close() error                      { return nil }

type collect[T any] struct {
	mu    sync.Mutex
	items []T
}

func (c *collect[T]) Build(context.Context, dataflow.Worker) (dataflow.WorkerSink[T], error) {
	return c, nil
}
func (c *collect[T]) Write(_ context.Context, b []T) error {
	c.mu.Lock()
	c.items = append(c.items, b...)
	c.mu.Unlock()
	return nil
}
func (c *collect[T]) Close() error { return nil }

func TestSmokeWordcount(t *testing.T) {
	for _, workers := range []int{1, 2, 3, 5} {
		t.Run(fmt.Sprint(workers), func(t *testing.T) {
			parts := map[string][]string{}
			want := map[string]int{}
			for p := range 3 {
				for i := range 1000 {
					line := fmt.Sprintf("w%d w%d x", i%17, (i*7+p)%13)
					parts[fmt.Sprint(p)] = append(parts[fmt.Sprint(p)], line)
					for _, w := range strings.Fields(line) {
						want[w]++
					}
				}
			}
			f := dataflow.New("wc")
			lines := dataflow.Input(f, "read", dataflow.FromPartitioned[string, int](sliceSource{parts: parts, batch: 7}))
			kv := dataflow.Transform("split", lines, func(b []string) ([]dataflow.KV[int], error) {
				var out []dataflow.KV[int]
				for _, l := range b {
					for _, w := range strings.Fields(l) {
						out = append(out, dataflow.KV[int]{Key: w, Value: 1})
					}
				}
				return out, nil
			})
			counts := dataflow.Stateful("count", kv, dataflow.StatefulLogic[int, int, int]{
				OnItem: func(_ string, s *int, _ bool, v int, _ *dataflow.Emitter[int]) (bool, error) {
					*s += v
					return true, nil
				},
				OnEOF: func(_ string, s *int, out *dataflow.Emitter[int]) (bool, error) {
					out.Emit(*s)
					return false, nil
				},
			})
			sink := &collect[dataflow.KV[int]]{}
			dataflow.Output("out", counts, dataflow.ToDynamic[dataflow.KV[int]](sink))
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			if err := dataflow.Run(ctx, f, dataflow.Options{Workers: workers, EpochInterval: time.Millisecond}); err != nil {
				t.Fatal(err)
			}
			got := map[string]int{}
			for _, kv := range sink.items {
				if _, dup := got[kv.Key]; dup {
					t.Errorf("key %q emitted twice", kv.Key)
				}
				got[kv.Key] = kv.Value
			}
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Fatalf("got %v\nwant %v", got, want)
			}
		})
	}
}
