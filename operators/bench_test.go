package operators_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/epochflow/epochflow/connectors/flowtest"
	"github.com/epochflow/epochflow/dataflow"
	"github.com/epochflow/epochflow/operators"
)

// benchLines is the wordcount input: lines of 10 words out of 1000.
var benchLines = sync.OnceValue(func() []string {
	lines := make([]string, 20000)
	for i := range lines {
		var b strings.Builder
		for j := range 10 {
			fmt.Fprintf(&b, "w%d ", (i*7+j*13+i*j)%1000)
		}
		lines[i] = b.String()
	}
	return lines
})

func plainWordcount(lines []string) map[string]int {
	counts := map[string]int{}
	for _, l := range lines {
		for _, w := range strings.Fields(l) {
			counts[w]++
		}
	}
	return counts
}

func BenchmarkWordcountPlainGo(b *testing.B) {
	lines := benchLines()
	b.ReportAllocs()
	for b.Loop() {
		if len(plainWordcount(lines)) != 1000 {
			b.Fatal("bad count")
		}
	}
}

type countSink struct {
	mu sync.Mutex
	n  int
}

func (s *countSink) Build(context.Context, dataflow.Worker) (dataflow.WorkerSink[dataflow.KV[int]], error) {
	return s, nil
}
func (s *countSink) Write(_ context.Context, b []dataflow.KV[int]) error {
	s.mu.Lock()
	s.n += len(b)
	s.mu.Unlock()
	return nil
}
func (s *countSink) Close() error { return nil }

func benchWordcount(b *testing.B, workers int, build func(words dataflow.Stream[string]) dataflow.Stream[dataflow.KV[int]]) {
	lines := benchLines()
	b.ReportAllocs()
	for b.Loop() {
		f := dataflow.New("wc")
		src := flowtest.NewSource(1024, []flowtest.Event[string]{flowtest.Items(lines...)})
		ls := operators.Input(f, "read", src.Input())
		words := operators.FlatMap("split", ls, strings.Fields)
		sink := &countSink{}
		operators.Output("out", build(words), dataflow.ToDynamic[dataflow.KV[int]](sink))
		if err := dataflow.Run(context.Background(), f, dataflow.Options{Workers: workers, EpochInterval: time.Second}); err != nil {
			b.Fatal(err)
		}
		if sink.n != 1000 {
			b.Fatalf("%d counts", sink.n)
		}
	}
}

func identity(s string) string { return s }

func BenchmarkWordcountFlatMapCount(b *testing.B) {
	for _, w := range []int{1, 2} {
		b.Run(fmt.Sprintf("workers=%d", w), func(b *testing.B) {
			benchWordcount(b, w, func(words dataflow.Stream[string]) dataflow.Stream[dataflow.KV[int]] {
				return operators.Count("count", words, identity)
			})
		})
	}
}

func BenchmarkWordcountFlatMapKeyOnCount(b *testing.B) {
	benchWordcount(b, 1, func(words dataflow.Stream[string]) dataflow.Stream[dataflow.KV[int]] {
		keyed := operators.KeyOn("key", words, identity)
		return operators.Count("count", keyed, func(kv dataflow.KV[string]) string { return kv.Key })
	})
}

func BenchmarkWordcountKeyOnStatefulMap(b *testing.B) {
	benchWordcount(b, 1, func(words dataflow.Stream[string]) dataflow.Stream[dataflow.KV[int]] {
		keyed := operators.KeyOn("key", words, identity)
		return operators.Fold("count", keyed, func(string) int { return 0 }, func(n int, _ string) int { return n + 1 })
	})
}
