package dataflow_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/epochflow/epochflow/dataflow"
	"github.com/epochflow/epochflow/operators"
	"github.com/epochflow/epochflow/recovery"
)

// benchText returns lines of words drawn from a vocabulary of vocab words (Zipf-like, as in
// natural text), about wordsPerLine words a line, words words in all.
func benchText(words, vocab, wordsPerLine int) []string {
	r := rand.New(rand.NewPCG(1, 2))
	z := rand.NewZipf(r, 1.1, 1, uint64(vocab-1))
	dict := make([]string, vocab)
	for i := range dict {
		dict[i] = fmt.Sprintf("w%x", i*2654435761%1000003)
	}
	var lines []string
	var b strings.Builder
	for i := range words {
		if i > 0 && i%wordsPerLine == 0 {
			lines = append(lines, b.String())
			b.Reset()
		} else if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(dict[z.Uint64()])
	}
	return append(lines, b.String())
}

func countPlain(lines []string) map[string]int {
	m := map[string]int{}
	for _, l := range lines {
		for w := range strings.FieldsSeq(l) {
			m[w]++
		}
	}
	return m
}

// wordcountFlow builds the word count the wordcount example runs (FlatMap, then Count, which
// keys each word by itself and exchanges it to the worker that owns it), over lines split into
// parts partitions.
func wordcountFlow(lines []string, parts int, sink dataflow.Sink[dataflow.KV[int]]) *dataflow.Flow {
	src := sliceSource{parts: map[string][]string{}, batch: 256}
	for i := range parts {
		lo, hi := i*len(lines)/parts, (i+1)*len(lines)/parts
		src.parts[fmt.Sprint(i)] = lines[lo:hi]
	}
	f := dataflow.New("wordcount")
	in := operators.Input(f, "read", dataflow.FromPartitioned[string, int](src))
	// Lines go to whichever worker has the least backlog, so a worker that runs slower (a
	// busier vCPU, a GC cycle) gets fewer.
	words := operators.FlatMapSeq("split", operators.Redistribute("spread", in), strings.FieldsSeq)
	counts := operators.Count("count", words, func(w string) string { return w })
	operators.Output("write", counts, sink)
	return f
}

type discard[T any] struct{ n int }

func (d *discard[T]) Build(context.Context, dataflow.Worker) (dataflow.WorkerSink[T], error) {
	return &discard[T]{}, nil
}
func (d *discard[T]) Write(_ context.Context, b []T) error { d.n += len(b); return nil }
func (d *discard[T]) Close() error                         { return nil }

// BenchmarkWordcount counts the words of 2 million words from a 10,000-word vocabulary: as a
// plain loop over a Go map (baseline), and as a flow with 1 and 2 workers. events/s counts
// words. Both split lines with strings.FieldsSeq (the flow through operators.FlatMapSeq), so
// that neither allocates a slice per line: with strings.Fields, the garbage collector's work
// for those slices, which the baseline's idle second core absorbs for free, competes with the
// second worker and hides how the engine scales.
func BenchmarkWordcount(b *testing.B) {
	const words = 2_000_000
	lines := benchText(words, 10_000, 12)
	b.Run("baseline", func(b *testing.B) {
		for b.Loop() {
			countPlain(lines)
		}
		b.ReportMetric(float64(words)*float64(b.N)/b.Elapsed().Seconds(), "events/s")
	})
	for _, workers := range []int{1, 2} {
		b.Run(fmt.Sprintf("workers=%d", workers), func(b *testing.B) {
			for b.Loop() {
				f := wordcountFlow(lines, 2, dataflow.ToDynamic[dataflow.KV[int]](&discard[dataflow.KV[int]]{}))
				err := dataflow.Run(context.Background(), f, dataflow.Options{Workers: workers, EpochInterval: time.Second})
				if err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(words)*float64(b.N)/b.Elapsed().Seconds(), "events/s")
		})
	}
	// The same with durability: a SQLite recovery store (opened, begun and committed to in
	// every run, in a fresh directory) and 1 s epochs.
	b.Run("workers=2,recovery", func(b *testing.B) {
		for b.Loop() {
			store, err := recovery.OpenSQLite(context.Background(), b.TempDir(), recovery.SQLiteOptions{})
			if err != nil {
				b.Fatal(err)
			}
			f := wordcountFlow(lines, 2, dataflow.ToDynamic[dataflow.KV[int]](&discard[dataflow.KV[int]]{}))
			err = dataflow.Run(context.Background(), f, dataflow.Options{Workers: 2, EpochInterval: time.Second, Recovery: store})
			store.Close()
			if err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(words)*float64(b.N)/b.Elapsed().Seconds(), "events/s")
	})
}
