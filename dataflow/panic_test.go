package dataflow_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/epochflow/epochflow/connectors/flowtest"
	"github.com/epochflow/epochflow/dataflow"
)

// panicLine is where explode panics, set by explode itself.
var panicLine struct {
	sync.Mutex
	at string
}

// explode panics (an index out of range) on "boom", six lines below the one it records.
func explode(s string) int {
	_, file, line, _ := runtime.Caller(0)
	panicLine.Lock()
	panicLine.at = fmt.Sprintf("%s:%d", filepath.Base(file), line+6)
	panicLine.Unlock()
	var none []int
	if s == "boom" {
		return none[len(s)]
	}
	return len(s)
}

// syncBuffer is a bytes.Buffer for a logger that several goroutines write to.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// A panic in a user function is reported with the user code's file:line (not the engine's nor
// the runtime's), in a Transform, a Stateful step, ForEach and a Stateful step's OnEOF; the
// whole stack is logged at debug level.
func TestPanicNamesTheUserFrame(t *testing.T) {
	for _, c := range []struct {
		name  string
		build func(in dataflow.Stream[string]) dataflow.Stream[int]
	}{
		{"Transform", func(in dataflow.Stream[string]) dataflow.Stream[int] {
			return dataflow.Transform("fn", in, func(b []string) ([]int, error) {
				out := make([]int, len(b))
				for i, s := range b {
					out[i] = explode(s)
				}
				return out, nil
			})
		}},
		{"ForEach", func(in dataflow.Stream[string]) dataflow.Stream[int] {
			return dataflow.Transform("fn", in, func(b []string) ([]int, error) {
				return nil, dataflow.ForEach(b, func(s string) error { explode(s); return nil })
			})
		}},
		{"Stateful", func(in dataflow.Stream[string]) dataflow.Stream[int] {
			kv := dataflow.Transform("key", in, func(b []string) ([]dataflow.KV[string], error) {
				out := make([]dataflow.KV[string], len(b))
				for i, s := range b {
					out[i] = dataflow.KV[string]{Key: s, Value: s}
				}
				return out, nil
			})
			st := dataflow.Stateful("fn", kv, dataflow.StatefulLogic[string, int, int]{
				OnItem: func(_ string, _ *int, _ bool, v string, _ *dataflow.Emitter[int]) (bool, error) {
					return explode(v) > 0, nil
				}})
			return dataflow.Transform("unkey", st, func(b []dataflow.KV[int]) ([]int, error) { return nil, nil })
		}},
		{"Stateful OnEOF", func(in dataflow.Stream[string]) dataflow.Stream[int] {
			kv := dataflow.Transform("key", in, func(b []string) ([]dataflow.KV[string], error) {
				out := make([]dataflow.KV[string], len(b))
				for i := range b {
					out[i] = dataflow.KV[string]{Key: "boom", Value: b[i]}
				}
				return out, nil
			})
			st := dataflow.Stateful("fn", kv, dataflow.StatefulLogic[string, int, int]{
				OnItem: func(string, *int, bool, string, *dataflow.Emitter[int]) (bool, error) { return true, nil },
				OnEOF: func(key string, _ *int, _ *dataflow.Emitter[int]) (bool, error) {
					return explode(key) > 0, nil
				}})
			return dataflow.Transform("unkey", st, func(b []dataflow.KV[int]) ([]int, error) { return nil, nil })
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := dataflow.New("panics")
			in := dataflow.Input(f, "in", flowtest.List("a", "bb", "boom"))
			dataflow.Output("out", c.build(in), flowtest.NewSink[int]().Output())
			var logs syncBuffer
			logger := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			err := dataflow.Run(ctx, f, dataflow.Options{Workers: 2, Logger: logger})
			var pe *dataflow.PanicError
			if !errors.As(err, &pe) {
				t.Fatalf("Run = %v, want a PanicError", err)
			}
			panicLine.Lock()
			want := panicLine.at
			panicLine.Unlock()
			if !strings.Contains(err.Error(), "panics.fn") || !strings.Contains(err.Error(), "index out of range") ||
				!strings.Contains(err.Error(), want+")") || filepath.Base(pe.Frame) != want {
				t.Errorf("Run = %v (frame %s), want the step, the panic and the frame %s", err, pe.Frame, want)
			}
			if l := logs.String(); !strings.Contains(l, "level=DEBUG msg=\"stack of the panic\"") ||
				!strings.Contains(l, "goroutine ") || !strings.Contains(l, "explode") {
				t.Errorf("the debug log has no stack of the panic:\n%s", l)
			}
		})
	}
}
