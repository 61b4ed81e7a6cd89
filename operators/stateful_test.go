package operators_test

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/epochflow/epochflow/connectors/flowtest"
	"github.com/epochflow/epochflow/dataflow"
	"github.com/epochflow/epochflow/operators"
)

type KI = dataflow.KV[int]

// perKey groups keyed items by key, printing the values with %v in the order they came.
func perKey[V any](items []dataflow.KV[V]) map[string][]string {
	out := map[string][]string{}
	for _, kv := range items {
		out[kv.Key] = append(out[kv.Key], fmt.Sprintf("%v", kv.Value))
	}
	return out
}

func checkPerKey[V any](t *testing.T, items []dataflow.KV[V], want map[string][]string) {
	t.Helper()
	if got := perKey(items); !maps.EqualFunc(got, want, slices.Equal) {
		t.Fatalf("got  %v\nwant %v", got, want)
	}
}

// keyedFlow reads keyed items played by script from one partition, in batches of batch.
func keyedFlow[V any](batch int, script ...flowtest.Event[dataflow.KV[V]]) (*dataflow.Flow, dataflow.Stream[dataflow.KV[V]]) {
	f := dataflow.New("t")
	return f, operators.Input(f, "in", flowtest.NewSource(batch, script).Input())
}

func keys(ks ...string) []dataflow.KV[string] {
	out := make([]dataflow.KV[string], len(ks))
	for i, k := range ks {
		out[i] = kv(k, k+fmt.Sprint(i))
	}
	return out
}

func counter(n int, _ string) (int, int, bool) { n++; return n, n, true }

func TestStatefulMap(t *testing.T) {
	eachWorkers(t, func(t *testing.T, workers int) {
		got := oneShot(t, workers, 2, keys("a", "b", "a", "a", "b", "c"), func(in KS) dataflow.Stream[KI] {
			return operators.StatefulMap("count", in, counter)
		})
		checkPerKey(t, got, map[string][]string{"a": {"1", "2", "3"}, "b": {"1", "2"}, "c": {"1"}})
	})
}

func TestStatefulMapDiscard(t *testing.T) {
	eachWorkers(t, func(t *testing.T, workers int) {
		got := oneShot(t, workers, 2, keys("a", "a", "b", "a", "a", "a"), func(in KS) dataflow.Stream[KI] {
			// Emit the count, and forget the key when it reaches 2.
			return operators.StatefulMap("count", in, func(n int, _ string) (int, int, bool) {
				n++
				return n, n, n < 2
			})
		})
		checkPerKey(t, got, map[string][]string{"a": {"1", "2", "1", "2", "1"}, "b": {"1"}})
	})
}

// TestStatefulMapEpochs checks that state carries across an epoch boundary and that every
// output carries its item's epoch.
func TestStatefulMapEpochs(t *testing.T) {
	eachWorkers(t, func(t *testing.T, workers int) {
		f, in := keyedFlow(10,
			flowtest.Items(keys("a", "a", "b")...),
			flowtest.Pause[dataflow.KV[string]](20*epochInterval),
			flowtest.Items(keys("a", "b")...))
		sink := flowtest.NewSink[KI]()
		operators.Output("out", operators.StatefulMap("count", in, counter), sink.Output())
		mustRun(t, f, workers)
		checkPerKey(t, sink.Items(), map[string][]string{"a": {"1", "2", "3"}, "b": {"1", "2"}})
		ep := epochOf(sink.ByEpoch())
		first := ep[kv("a", 1)]
		if ep[kv("a", 2)] != first || ep[kv("b", 1)] != first {
			t.Fatalf("the first batch's outputs are in several epochs: %v", sink.ByEpoch())
		}
		if ep[kv("a", 3)] <= first || ep[kv("b", 2)] != ep[kv("a", 3)] {
			t.Fatalf("the outputs after the pause are not in one later epoch: %v", sink.ByEpoch())
		}
	})
}

func TestStatefulMapErr(t *testing.T) {
	eachWorkers(t, func(t *testing.T, workers int) {
		got := oneShot(t, workers, 2, keys("a", "b", "a"), func(in KS) dataflow.Stream[dataflow.KV[string]] {
			return operators.StatefulMapErr("concat", in, func(s string, v string) (string, string, bool, error) {
				s += v
				return s, s, true, nil
			})
		})
		checkPerKey(t, got, map[string][]string{"a": {"a0", "a0a2"}, "b": {"b1"}})
	})
}

func TestStatefulFlatMap(t *testing.T) {
	eachWorkers(t, func(t *testing.T, workers int) {
		got := oneShot(t, workers, 2, keys("a", "b", "a", "a"), func(in KS) dataflow.Stream[dataflow.KV[string]] {
			// The n-th item of a key is emitted n times, and the key is forgotten after the
			// second.
			return operators.StatefulFlatMap("rep", in, func(n int, v string) (int, []string, bool) {
				n++
				return n, slices.Repeat([]string{v}, n), n < 2
			})
		})
		checkPerKey(t, got, map[string][]string{"a": {"a0", "a2", "a2", "a3"}, "b": {"b1"}})
	})
}

// sumLogic sums a key's values, emits the sum and asks to be discarded once it reaches 10,
// emits "timeout" with the sum when no value came for a while, and "eof" with the sum at EOF.
type sumLogic struct {
	key     string
	sum     int
	timeout time.Duration
	at      time.Time
}

func (l *sumLogic) OnItem(v int) ([]string, bool, error) {
	l.sum += v
	if l.timeout > 0 {
		l.at = time.Now().Add(l.timeout)
	}
	if l.sum >= 10 {
		return []string{fmt.Sprintf("full:%d", l.sum)}, true, nil
	}
	return nil, false, nil
}

func (l *sumLogic) OnNotify(time.Time) ([]string, bool, error) {
	return []string{fmt.Sprintf("timeout:%d", l.sum)}, true, nil
}

func (l *sumLogic) OnEOF() ([]string, bool, error) {
	return []string{fmt.Sprintf("eof:%d", l.sum)}, true, nil
}

func (l *sumLogic) NotifyAt() time.Time { return l.at }
func (l *sumLogic) Snapshot() int       { return l.sum }

func TestStatefulLogic(t *testing.T) {
	eachWorkers(t, func(t *testing.T, workers int) {
		var builds atomic.Int32
		f, in := keyedFlow(3,
			flowtest.Items(kv("a", 4), kv("b", 1), kv("a", 7), kv("a", 1), kv("c", 20)),
			flowtest.Pause[KI](20*epochInterval),
			flowtest.Items(kv("a", 2)))
		out := operators.Stateful("sum", in, func(key string, resume *int) (operators.Logic[int, string, int], error) {
			builds.Add(1)
			if resume != nil {
				return nil, fmt.Errorf("unexpected resume state %d", *resume)
			}
			return &sumLogic{key: key}, nil
		})
		sink := flowtest.NewSink[dataflow.KV[string]]()
		operators.Output("out", out, sink.Output())
		mustRun(t, f, workers)
		checkPerKey(t, sink.Items(), map[string][]string{
			"a": {"full:11", "eof:3"}, "b": {"eof:1"}, "c": {"full:20"},
		})
		if n := builds.Load(); n != 4 { // a, b, c, and a again after its discard
			t.Errorf("build was called %d times, want 4", n)
		}
		ep := epochOf(sink.ByEpoch())
		if ep[kv("a", "eof:3")] <= ep[kv("a", "full:11")] {
			t.Errorf("EOF output is not after the pause: %v", sink.ByEpoch())
		}
	})
}

// TestStatefulLogicNotify checks that a Logic's timer fires on the worker loop while the input
// is idle, and that its output carries the epoch open at that time.
func TestStatefulLogicNotify(t *testing.T) {
	eachWorkers(t, func(t *testing.T, workers int) {
		f, in := keyedFlow(10,
			flowtest.Items(kv("a", 1), kv("b", 2), kv("a", 3)),
			flowtest.Pause[KI](300*time.Millisecond),
			flowtest.Items(kv("a", 5)))
		out := operators.Stateful("sum", in, func(key string, _ *int) (operators.Logic[int, string, int], error) {
			return &sumLogic{key: key, timeout: 20 * time.Millisecond}, nil
		})
		sink := flowtest.NewSink[dataflow.KV[string]]()
		operators.Output("out", out, sink.Output())
		mustRun(t, f, workers)
		checkPerKey(t, sink.Items(), map[string][]string{"a": {"timeout:4", "eof:5"}, "b": {"timeout:2"}})
		ep := epochOf(sink.ByEpoch())
		if ep[kv("a", "eof:5")] <= ep[kv("a", "timeout:4")] {
			t.Errorf("the timeout did not fire during the pause: %v", sink.ByEpoch())
		}
	})
}

// baseOnly is a Logic with only OnItem and Snapshot of its own.
type baseOnly struct {
	operators.BaseLogic[int]
	n int
}

func (l *baseOnly) OnItem(int) ([]int, bool, error) { l.n++; return []int{l.n}, false, nil }
func (l *baseOnly) Snapshot() int                   { return l.n }

func TestStatefulBaseLogic(t *testing.T) {
	eachWorkers(t, func(t *testing.T, workers int) {
		got := oneShot(t, workers, 2, []KI{kv("a", 0), kv("a", 0), kv("b", 0)}, func(in dataflow.Stream[KI]) dataflow.Stream[KI] {
			return operators.Stateful("n", in, func(string, *int) (operators.Logic[int, int, int], error) {
				return &baseOnly{}, nil
			})
		})
		checkPerKey(t, got, map[string][]string{"a": {"1", "2"}, "b": {"1"}})
	})
}

// TestFinal checks the operators that emit one item per key at EOF: nothing before, every key
// once, in the epoch open at EOF on the key's worker (not before the last input's epoch).
func TestFinal(t *testing.T) {
	first := []KI{kv("a", 3), kv("b", -1), kv("a", 9), kv("c", 0)}
	second := []KI{kv("a", -4), kv("b", 5), kv("a", 9)}
	cases := []struct {
		name string
		op   func(dataflow.Stream[KI]) dataflow.Stream[dataflow.KV[string]]
		want map[string][]string
	}{
		{"Reduce", func(in dataflow.Stream[KI]) dataflow.Stream[dataflow.KV[string]] {
			return str(operators.Reduce("op", in, func(a, b int) int { return a*10 + b }))
		}, map[string][]string{"a": {"3869"}, "b": {"-5"}, "c": {"0"}}},
		{"Fold", func(in dataflow.Stream[KI]) dataflow.Stream[dataflow.KV[string]] {
			return operators.Fold("op", in, func(key string) string { return key + ":" },
				func(acc string, v int) string { return acc + fmt.Sprint(v) + "," })
		}, map[string][]string{"a": {"a:3,9,-4,9,"}, "b": {"b:-1,5,"}, "c": {"c:0,"}}},
		{"Count", func(in dataflow.Stream[KI]) dataflow.Stream[dataflow.KV[string]] {
			return str(operators.Count("op", in, func(kv KI) string { return kv.Key }))
		}, map[string][]string{"a": {"4"}, "b": {"2"}, "c": {"1"}}},
		{"Max", func(in dataflow.Stream[KI]) dataflow.Stream[dataflow.KV[string]] {
			return str(operators.Max("op", in))
		}, map[string][]string{"a": {"9"}, "b": {"5"}, "c": {"0"}}},
		{"Min", func(in dataflow.Stream[KI]) dataflow.Stream[dataflow.KV[string]] {
			return str(operators.Min("op", in))
		}, map[string][]string{"a": {"-4"}, "b": {"-1"}, "c": {"0"}}},
		{"MaxBy", func(in dataflow.Stream[KI]) dataflow.Stream[dataflow.KV[string]] {
			// By absolute value: a's -4 loses to 9; the first 9 is kept.
			return str(operators.MaxBy("op", in, func(a, b int) bool { return abs(a) < abs(b) }))
		}, map[string][]string{"a": {"9"}, "b": {"5"}, "c": {"0"}}},
		{"MinBy", func(in dataflow.Stream[KI]) dataflow.Stream[dataflow.KV[string]] {
			return str(operators.MinBy("op", in, func(a, b int) bool { return abs(a) < abs(b) }))
		}, map[string][]string{"a": {"3"}, "b": {"-1"}, "c": {"0"}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			eachWorkers(t, func(t *testing.T, workers int) {
				f, in := keyedFlow(2, flowtest.Items(first...), flowtest.Pause[KI](20*epochInterval), flowtest.Items(second...))
				seen := flowtest.NewSink[KI]()
				operators.Output("seen", in, seen.Output())
				sink := flowtest.NewSink[dataflow.KV[string]]()
				operators.Output("out", c.op(in), sink.Output())
				mustRun(t, f, workers)
				checkPerKey(t, sink.Items(), c.want)
				// Each worker emits its keys at EOF in the epoch open on it then: with one
				// worker, that is one epoch.
				byEpoch := sink.ByEpoch()
				if workers == 1 && len(byEpoch) != 1 {
					t.Fatalf("outputs in several epochs: %v", byEpoch)
				}
				inEpochs := slices.Sorted(maps.Keys(seen.ByEpoch()))
				if len(inEpochs) < 2 {
					t.Fatalf("the pause did not close an epoch: %v", seen.ByEpoch())
				}
				for e := range byEpoch {
					if e < inEpochs[len(inEpochs)-1] {
						t.Fatalf("outputs in epoch %d, before the last input's epoch %d", e, inEpochs[len(inEpochs)-1])
					}
				}
			})
		})
	}
}

func abs(n int) int { return max(n, -n) }

// str prints the values of a keyed stream, to compare operators of several types in a table.
func str[V any](in dataflow.Stream[dataflow.KV[V]]) dataflow.Stream[dataflow.KV[string]] {
	return operators.MapValue("str", in, func(v V) string { return fmt.Sprint(v) })
}

func TestMaxMinNaNAndStrings(t *testing.T) {
	eachWorkers(t, func(t *testing.T, workers int) {
		nan := []dataflow.KV[float64]{kv("x", 1.5), kv("x", -2.0), kv("y", 0.0)}
		f, in := keyedFlow(2, flowtest.Items(nan...))
		smax, smin := flowtest.NewSink[dataflow.KV[float64]](), flowtest.NewSink[dataflow.KV[float64]]()
		operators.Output("max", operators.Max("mx", in), smax.Output())
		operators.Output("min", operators.Min("mn", in), smin.Output())
		mustRun(t, f, workers)
		checkPerKey(t, smax.Items(), map[string][]string{"x": {"1.5"}, "y": {"0"}})
		checkPerKey(t, smin.Items(), map[string][]string{"x": {"-2"}, "y": {"0"}})

		got := oneShot(t, workers, 2, keys("k", "k", "k"), func(in KS) KS { return operators.Max("mx", in) })
		checkPerKey(t, got, map[string][]string{"k": {"k2"}})
	})
}

func TestCountWords(t *testing.T) {
	eachWorkers(t, func(t *testing.T, workers int) {
		lines := []string{"the cat", "the dog the end", "", "cat"}
		got := oneShot(t, workers, 1, lines, func(in S) dataflow.Stream[KI] {
			return operators.Count("count", operators.FlatMap("split", in, strings.Fields), strings.ToUpper)
		})
		checkPerKey(t, got, map[string][]string{"THE": {"3"}, "CAT": {"2"}, "DOG": {"1"}, "END": {"1"}})
	})
}

func TestCollectByCount(t *testing.T) {
	eachWorkers(t, func(t *testing.T, workers int) {
		items := []KI{kv("a", 1), kv("a", 2), kv("b", 1), kv("a", 3), kv("a", 4), kv("a", 5), kv("b", 2), kv("c", 1)}
		f, in := keyedFlow(2, flowtest.Items(items...), flowtest.Pause[KI](20*epochInterval), flowtest.Items(kv("c", 2)))
		sink := flowtest.NewSink[dataflow.KV[[]int]]()
		operators.Output("out", operators.Collect("collect", in, 2, 0), sink.Output())
		mustRun(t, f, workers)
		checkPerKey(t, sink.Items(), map[string][]string{
			"a": {"[1 2]", "[3 4]", "[5]"}, "b": {"[1 2]"}, "c": {"[1 2]"},
		})
		// Full lists carry the epoch of their last item; the remainder comes at EOF.
		byEpoch := sink.ByEpoch()
		var full, fin uint64
		for e, lists := range byEpoch {
			for _, l := range lists {
				switch fmt.Sprint(l) {
				case "{a [1 2]}":
					full = e
				case "{a [5]}":
					fin = e
				}
			}
		}
		if full == 0 || fin <= full {
			t.Fatalf("full list in epoch %d, EOF remainder in %d: %v", full, fin, byEpoch)
		}
	})
}

// TestCollectByTimeout checks that a list is emitted once the timeout has passed since its
// first item, while the source is paused, and that the key then starts a new list.
func TestCollectByTimeout(t *testing.T) {
	eachWorkers(t, func(t *testing.T, workers int) {
		f, in := keyedFlow(10,
			flowtest.Items(kv("a", 1), kv("b", 1), kv("a", 2)),
			flowtest.Pause[KI](300*time.Millisecond),
			flowtest.Items(kv("a", 3), kv("a", 4), kv("a", 5), kv("a", 6)))
		sink := flowtest.NewSink[dataflow.KV[[]int]]()
		// The first list must come during the pause, before the source reads a3: from the
		// timeout, not from the next item of its key.
		var firstList, a3Read atomic.Int64
		seen := operators.Inspect("read", in, func(kv KI) {
			if kv.Key == "a" && kv.Value == 3 {
				a3Read.CompareAndSwap(0, time.Now().UnixNano())
			}
		})
		out := operators.Inspect("when", operators.Collect("collect", seen, 3, 30*time.Millisecond), func(dataflow.KV[[]int]) {
			firstList.CompareAndSwap(0, time.Now().UnixNano())
		})
		operators.Output("out", out, sink.Output())
		mustRun(t, f, workers)
		checkPerKey(t, sink.Items(), map[string][]string{"a": {"[1 2]", "[3 4 5]", "[6]"}, "b": {"[1]"}})
		if firstList.Load() == 0 || firstList.Load() >= a3Read.Load() {
			t.Errorf("the first list came %v after a3 was read, not during the pause", time.Duration(firstList.Load()-a3Read.Load()))
		}
		ep := epochOf(flatten(sink.ByEpoch()))
		if !(ep["a[1 2]"] < ep["a[3 4 5]"] && ep["a[3 4 5]"] <= ep["a[6]"]) {
			t.Errorf("epochs: %v", ep)
		}
	})
}

func TestCollectTimeoutOnly(t *testing.T) {
	eachWorkers(t, func(t *testing.T, workers int) {
		f, in := keyedFlow(10,
			flowtest.Items(kv("a", 1), kv("a", 2), kv("a", 3)),
			flowtest.Pause[KI](200*time.Millisecond),
			flowtest.Items(kv("a", 4)))
		sink := flowtest.NewSink[dataflow.KV[[]int]]()
		operators.Output("out", operators.Collect("collect", in, 0, 20*time.Millisecond), sink.Output())
		mustRun(t, f, workers)
		checkPerKey(t, sink.Items(), map[string][]string{"a": {"[1 2 3]", "[4]"}})
	})
}

// flatten prints keyed lists as key+list, for epochOf.
func flatten[V any](byEpoch map[uint64][]dataflow.KV[V]) map[uint64][]string {
	out := map[uint64][]string{}
	for e, items := range byEpoch {
		for _, kv := range items {
			out[e] = append(out[e], kv.Key+fmt.Sprint(kv.Value))
		}
	}
	return out
}

// ticker asks to be notified 10ms after its item and after each notification, three times,
// then keeps returning the time of the last notification, which must not make the engine
// call OnNotify again.
type ticker struct {
	operators.BaseLogic[int]
	at time.Time
	n  int
}

func (l *ticker) OnItem(int) ([]int, bool, error) {
	l.at = time.Now().Add(10 * time.Millisecond)
	return nil, false, nil
}

func (l *ticker) OnNotify(now time.Time) ([]int, bool, error) {
	l.n++
	if l.n < 3 {
		l.at = now.Add(10 * time.Millisecond)
	}
	return []int{l.n}, false, nil
}

func (l *ticker) NotifyAt() time.Time { return l.at }
func (l *ticker) Snapshot() int       { return l.n }

func TestStatefulLogicRenotify(t *testing.T) {
	eachWorkers(t, func(t *testing.T, workers int) {
		f, in := keyedFlow(10, flowtest.Items(kv("a", 1), kv("b", 1)), flowtest.Pause[KI](200*time.Millisecond))
		out := operators.Stateful("tick", in, func(string, *int) (operators.Logic[int, int, int], error) {
			return &ticker{}, nil
		})
		sink := flowtest.NewSink[KI]()
		operators.Output("out", out, sink.Output())
		mustRun(t, f, workers)
		checkPerKey(t, sink.Items(), map[string][]string{"a": {"1", "2", "3"}, "b": {"1", "2", "3"}})
	})
}
