package dataflow_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/epochflow/epochflow/dataflow"
)

// A timed step whose keys drop their state and come back, many of them never, so that the
// node keeps vacant slots for them and sweeps them (more than a thousand keys at once): every
// key starts from the zero state with exists=false after each drop, and from its own state
// with exists=true while it has one; nothing is lost or counted twice.
func TestTimedKeysComeAndGo(t *testing.T) {
	// Item i is at time i ms; key i/3 % keys for the first half (keys come back), key i/3 for
	// the second (each key once): three items per visit, then the key's wake-up closes it.
	const n, keys = 30_000, 2_000
	var lines []string
	want := map[string]int{}
	for i := range n {
		k := i / 3
		if i < n/2 {
			k %= keys
		}
		key := "k" + strconv.Itoa(k)
		lines = append(lines, key+" "+strconv.Itoa(i))
		want[key] += 1
	}
	for _, workers := range []int{1, 2} {
		t.Run(fmt.Sprint(workers), func(t *testing.T) {
			f := dataflow.New("slots")
			in := dataflow.Input(f, "in", dataflow.FromPartitioned[string, int](sliceSource{parts: map[string][]string{"0": lines}, batch: 100}))
			kv := dataflow.Transform("kv", in, func(b []string) ([]dataflow.KV[int64], error) {
				out := make([]dataflow.KV[int64], len(b))
				for i, l := range b {
					key, ts, _ := strings.Cut(l, " ")
					t, _ := strconv.ParseInt(ts, 10, 64)
					out[i] = dataflow.KV[int64]{Key: key, Value: t}
				}
				return out, nil
			})
			type visit struct{ First, N int64 }
			clock := dataflow.EventClock(func(t int64) time.Time { return time.UnixMilli(t) }, 0)
			out := dataflow.StatefulTime("visits", kv, clock, dataflow.TimedLogic[int64, visit, int64]{
				OnItem: func(key string, st *visit, exists bool, t int64, _, _ time.Time, _ *dataflow.Emitter[int64]) (bool, error) {
					if exists != (*st != visit{}) {
						return false, fmt.Errorf("key %s at %d: exists=%v with state %+v", key, t, exists, *st)
					}
					if !exists {
						st.First = t
					}
					st.N++
					return true, nil
				},
				WakeAt: func(_ string, st *visit) time.Time { return time.UnixMilli(st.First + 3) },
				OnWatermark: func(_ string, st *visit, _ time.Time, e *dataflow.Emitter[int64]) (bool, error) {
					e.Emit(st.N)
					return false, nil
				},
			})
			sink := &collect[dataflow.KV[int64]]{}
			dataflow.Output("out", out, dataflow.ToDynamic[dataflow.KV[int64]](sink))
			if err := dataflow.Run(context.Background(), f, dataflow.Options{Workers: workers}); err != nil {
				t.Fatal(err)
			}
			got := map[string]int{}
			for _, kv := range sink.items {
				if kv.Value != 3 {
					t.Fatalf("key %s: a visit of %d items, want 3", kv.Key, kv.Value)
				}
				got[kv.Key] += int(kv.Value)
			}
			if len(got) != len(want) {
				t.Fatalf("%d keys, want %d", len(got), len(want))
			}
			for k, v := range want {
				if got[k] != v {
					t.Fatalf("key %s: %d items, want %d", k, got[k], v)
				}
			}
		})
	}
}
