package stdio_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/epochflow/epochflow/connectors/stdio"
	"github.com/epochflow/epochflow/dataflow"
)

// parts is a partitioned source over fixed lists, so that several workers print.
type parts map[string][]int

func (p parts) Parts(context.Context) ([]string, error) {
	var keys []string
	for k := range p {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys, nil
}

func (p parts) Build(_ context.Context, part string, _ *int) (dataflow.StatefulSource[int, int], error) {
	return &listPart{items: p[part]}, nil
}

type listPart struct {
	items []int
	pos   int
}

func (l *listPart) Next(context.Context) ([]int, error) {
	if l.pos >= len(l.items) {
		return nil, io.EOF
	}
	end := min(l.pos+37, len(l.items))
	b := l.items[l.pos:end]
	l.pos = end
	return b, nil
}
func (l *listPart) Snapshot() int                     { return l.pos }
func (l *listPart) Commit(context.Context, int) error { return nil }
func (l *listPart) Close() error                      { return nil }

// recorder is a writer that keeps every Write call and notices overlapping calls.
type recorder struct {
	mu      sync.Mutex
	writes  []string
	inside  atomic.Int32
	overlap atomic.Bool
}

func (r *recorder) Write(p []byte) (int, error) {
	if r.inside.Add(1) > 1 {
		r.overlap.Store(true)
	}
	defer r.inside.Add(-1)
	r.mu.Lock()
	r.writes = append(r.writes, string(p))
	r.mu.Unlock()
	return len(p), nil
}

func printFlow(src parts, sink dataflow.Sink[int]) *dataflow.Flow {
	f := dataflow.New("print")
	dataflow.Output("print", dataflow.Input(f, "in", dataflow.FromPartitioned[int, int](src)), sink)
	return f
}

func TestPrintToWorkers(t *testing.T) {
	src := parts{}
	var want []string
	for p := range 8 {
		for i := range 2000 {
			v := p*10000 + i
			src[fmt.Sprint(p)] = append(src[fmt.Sprint(p)], v)
			want = append(want, fmt.Sprintf("item %d", v))
		}
	}
	slices.Sort(want)
	for _, workers := range []int{1, 2, 4} {
		t.Run(fmt.Sprint(workers), func(t *testing.T) {
			rec := &recorder{}
			sink := stdio.PrintTo(rec, func(v int) string { return fmt.Sprintf("item %d", v) })
			if err := dataflow.Run(timeout(t), printFlow(src, sink), dataflow.Options{Workers: workers}); err != nil {
				t.Fatal(err)
			}
			if rec.overlap.Load() {
				t.Fatal("two Write calls overlapped")
			}
			var got []string
			for _, w := range rec.writes {
				if !strings.HasSuffix(w, "\n") {
					t.Fatalf("a Write call does not end with a whole line: %.40q", w)
				}
				got = append(got, strings.Split(strings.TrimSuffix(w, "\n"), "\n")...)
			}
			slices.Sort(got)
			if !slices.Equal(got, want) {
				t.Fatalf("got %d lines, want %d, each once", len(got), len(want))
			}
		})
	}
}

// badWriter fails or writes short.
type badWriter struct{ err error }

func (b badWriter) Write(p []byte) (int, error) {
	if b.err != nil {
		return 0, b.err
	}
	return len(p) - 1, nil
}

func TestPrintToErrors(t *testing.T) {
	src := parts{"a": {1, 2, 3}}
	boom := errors.New("boom")
	for _, tc := range []struct {
		name string
		sink dataflow.Sink[int]
		want error
		text string
	}{
		{"error", stdio.PrintTo[int](badWriter{boom}, nil), boom, "stdio.PrintTo stdio_test.badWriter: write"},
		{"short", stdio.PrintTo[int](badWriter{}, nil), io.ErrShortWrite, "short write"},
		{"nil writer", stdio.PrintTo[int](nil, nil), nil, "nil writer"},
		{"panic", stdio.PrintTo(io.Discard, func(v int) string { panic("no " + fmt.Sprint(v)) }), nil, "item 1: panic: no 1"},
	} {
		err := dataflow.Run(timeout(t), printFlow(src, tc.sink), dataflow.Options{Workers: 2})
		if err == nil || (tc.want != nil && !errors.Is(err, tc.want)) || !strings.Contains(err.Error(), tc.text) {
			t.Errorf("%s: Run: %v, want an error with %q", tc.name, err, tc.text)
		}
	}
}

func TestPrintDefaultFormat(t *testing.T) {
	var b strings.Builder
	f := dataflow.New("kv")
	in := dataflow.Input(f, "in", dataflow.FromPartitioned[int, int](parts{"a": {1, 2}}))
	kv := dataflow.Transform("kv", in, func(b []int) ([]dataflow.KV[int], error) {
		var out []dataflow.KV[int]
		for _, v := range b {
			out = append(out, dataflow.KV[int]{Key: fmt.Sprint("k", v), Value: v})
		}
		return out, nil
	})
	dataflow.Output("print", kv, stdio.PrintTo[dataflow.KV[int]](&b, nil))
	if err := dataflow.Run(timeout(t), f, dataflow.Options{}); err != nil {
		t.Fatal(err)
	}
	if got, want := b.String(), "{k1 1}\n{k2 2}\n"; got != want {
		t.Fatalf("got %q, want %q", got, want)
	}
}
