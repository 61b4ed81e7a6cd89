package operators_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/epochflow/epochflow/connectors/flowtest"
	"github.com/epochflow/epochflow/dataflow"
)

// workerCounts are the numbers of workers every semantic test runs with.
var workerCounts = []int{1, 3}

// epochInterval is short, so that a flowtest.Pause of a few times it closes epochs.
const epochInterval = 5 * time.Millisecond

// tb is what the helpers need of a *testing.T, *testing.B or *rapid.T.
type tb interface {
	Helper()
	Fatalf(format string, args ...any)
}

// runFlow runs f with workers workers and a short epoch interval.
func runFlow(t tb, f *dataflow.Flow, workers int) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return dataflow.Run(ctx, f, dataflow.Options{Workers: workers, EpochInterval: epochInterval})
}

func mustRun(t tb, f *dataflow.Flow, workers int) {
	t.Helper()
	if err := runFlow(t, f, workers); err != nil {
		t.Fatalf("Run: %v", err)
	}
}

// strs prints every item with %v and sorts the result, for comparisons that ignore order.
func strs[T any](items []T) []string {
	out := make([]string, len(items))
	for i, it := range items {
		out[i] = fmt.Sprintf("%v", it)
	}
	slices.Sort(out)
	return out
}

// eachWorkers runs fn as a subtest per worker count.
func eachWorkers(t *testing.T, fn func(t *testing.T, workers int)) {
	for _, w := range workerCounts {
		t.Run(fmt.Sprintf("workers=%d", w), func(t *testing.T) { fn(t, w) })
	}
}

func kv[V any](k string, v V) dataflow.KV[V] { return dataflow.KV[V]{Key: k, Value: v} }

// oneShot builds a flow reading items from one partition in batches of batch, applies op, and
// returns what the sink collected after the run.
func oneShot[T, U any](t *testing.T, workers, batch int, items []T, op func(dataflow.Stream[T]) dataflow.Stream[U]) []U {
	t.Helper()
	f := dataflow.New("t")
	in := dataflow.Input(f, "in", flowtest.NewSource(batch, []flowtest.Event[T]{flowtest.Items(items...)}).Input())
	sink := flowtest.NewSink[U]()
	dataflow.Output("out", op(in), sink.Output())
	mustRun(t, f, workers)
	return sink.Items()
}

// epochOf returns, for every item of the sink, the epoch it was written in.
func epochOf[T comparable](byEpoch map[uint64][]T) map[T]uint64 {
	out := map[T]uint64{}
	for e, items := range byEpoch {
		for _, it := range items {
			out[it] = e
		}
	}
	return out
}
