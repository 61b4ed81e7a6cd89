package operators_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/epochflow/epochflow/connectors/flowtest"
	"github.com/epochflow/epochflow/dataflow"
	"github.com/epochflow/epochflow/operators"
	"github.com/epochflow/epochflow/recovery"
)

// tally is a state the default codec cannot store (an unexported field).
type tally struct{ n int }

// tallyCodec stores a tally as a uvarint and counts its calls.
type tallyCodec struct{ encoded, decoded *atomic.Int64 }

func (c tallyCodec) Encode(s tally) ([]byte, error) {
	c.encoded.Add(1)
	return binary.AppendUvarint(nil, uint64(s.n)), nil
}

func (c tallyCodec) Decode(key string, b []byte) (tally, error) {
	c.decoded.Add(1)
	n, k := binary.Uvarint(b)
	if k <= 0 {
		return tally{}, fmt.Errorf("key %q: bad tally", key)
	}
	return tally{int(n)}, nil
}

// StatefulMap, StatefulMapErr, StatefulFlatMap and Stateful take a codec: with it, a state the
// default codec cannot store runs with recovery, is stored with the codec and restored from
// it by the next run.
func TestStatefulOperatorsTakeACodec(t *testing.T) {
	type op func(in dataflow.Stream[KI], c operators.StateOptions[tally]) dataflow.Stream[KI]
	for _, c := range []struct {
		name string
		op   op
	}{
		{"StatefulMap", func(in dataflow.Stream[KI], o operators.StateOptions[tally]) dataflow.Stream[KI] {
			return operators.StatefulMap("count", in, func(s tally, _ int) (tally, int, bool) { s.n++; return s, s.n, true }, o)
		}},
		{"StatefulMapErr", func(in dataflow.Stream[KI], o operators.StateOptions[tally]) dataflow.Stream[KI] {
			return operators.StatefulMapErr("count", in, func(s tally, _ int) (tally, int, bool, error) { s.n++; return s, s.n, true, nil }, o)
		}},
		{"StatefulFlatMap", func(in dataflow.Stream[KI], o operators.StateOptions[tally]) dataflow.Stream[KI] {
			return operators.StatefulFlatMap("count", in, func(s tally, _ int) (tally, []int, bool) { s.n++; return s, []int{s.n}, true }, o)
		}},
		{"Stateful", func(in dataflow.Stream[KI], o operators.StateOptions[tally]) dataflow.Stream[KI] {
			return operators.Stateful("count", in, func(_ string, resume *tally) (operators.Logic[int, int, tally], error) {
				l := &tallyLogic{}
				if resume != nil {
					l.c = *resume
				}
				return l, nil
			}, o)
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			var enc, dec atomic.Int64
			opts := operators.StateOptions[tally]{Codec: tallyCodec{&enc, &dec}}
			store, err := recovery.OpenSQLite(context.Background(), t.TempDir(), recovery.SQLiteOptions{})
			if err != nil {
				t.Fatal(err)
			}
			defer store.Close()
			// The second run's partition resumes after the first run's items: it reads one more.
			scripts := [][]flowtest.Event[KI]{
				{flowtest.Items(kv("a", 1), kv("a", 1))},
				{flowtest.Items(kv("a", 1), kv("a", 1)), flowtest.Items(kv("a", 1))},
			}
			var last int
			for run := range 2 {
				f := dataflow.New("t")
				in := operators.Input(f, "in", flowtest.NewSource(10, scripts[run]).Input())
				sink := flowtest.NewSink[KI]()
				operators.Output("out", c.op(in, opts), sink.Output())
				if err := dataflow.Run(context.Background(), f, dataflow.Options{Recovery: store, Logger: quiet}); err != nil {
					t.Fatalf("run %d: %v", run, err)
				}
				last = 0
				for _, kv := range sink.Items() {
					last = max(last, kv.Value)
				}
			}
			if last != 3 || enc.Load() == 0 || dec.Load() == 0 {
				t.Fatalf("second run counted %d (want 3: 2 restored, 1 read), %d encodes, %d decodes", last, enc.Load(), dec.Load())
			}
		})
	}
}

type tallyLogic struct {
	operators.BaseLogic[int]
	c tally
}

func (l *tallyLogic) OnItem(int) ([]int, bool, error) { l.c.n++; return []int{l.c.n}, false, nil }
func (l *tallyLogic) Snapshot() tally                 { return l.c }

// A state the default codec cannot store refuses to start with recovery, with an error that
// names the step and what takes a codec: the option of the operator, or for an operator
// without one, dataflow.Stateful.
func TestCodecErrorNamesWhatTakesACodec(t *testing.T) {
	for _, c := range []struct {
		name, want string
		op         func(in dataflow.Stream[KI]) dataflow.Stream[KI]
	}{
		{"StatefulMap", "pass operators.StateOptions{Codec: ...} to operators.StatefulMap", func(in dataflow.Stream[KI]) dataflow.Stream[KI] {
			return operators.StatefulMap("count", in, func(s tally, _ int) (tally, int, bool) { return s, s.n, true })
		}},
		{"Stateful", "pass operators.StateOptions{Codec: ...} to operators.Stateful", func(in dataflow.Stream[KI]) dataflow.Stream[KI] {
			return operators.Stateful("count", in, func(string, *tally) (operators.Logic[int, int, tally], error) {
				return &tallyLogic{}, nil
			})
		}},
		{"Fold", "operators.Fold takes no codec", func(in dataflow.Stream[KI]) dataflow.Stream[KI] {
			folded := operators.Fold("count", in, func(string) tally { return tally{} }, func(c tally, _ int) tally { return c })
			return operators.MapValue("n", folded, func(c tally) int { return c.n })
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			f, in := keyedFlow(1, flowtest.Items(kv("a", 1)))
			operators.Output("out", c.op(in), flowtest.NewSink[KI]().Output())
			store, err := recovery.OpenSQLite(context.Background(), t.TempDir(), recovery.SQLiteOptions{})
			if err != nil {
				t.Fatal(err)
			}
			defer store.Close()
			err = dataflow.Run(context.Background(), f, dataflow.Options{Recovery: store, Logger: quiet})
			var se *dataflow.StepError
			if !errors.As(err, &se) || se.Step != "t.count" || !strings.Contains(err.Error(), c.want) ||
				!strings.Contains(err.Error(), "field n is unexported") || strings.Contains(err.Error(), "give the step a codec") {
				t.Fatalf("got %v, want an error of step t.count saying %q", err, c.want)
			}
		})
	}
	// Two StateOptions are a build error.
	f, in := keyedFlow(1, flowtest.Items(kv("a", 1)))
	o := operators.StateOptions[int]{}
	operators.StatefulMap("count", in, func(s int, _ int) (int, int, bool) { return s, s, true }, o, o)
	if err := f.Err(); err == nil || !strings.Contains(err.Error(), "at most one StateOptions") {
		t.Fatalf("two StateOptions: %v", err)
	}
}
