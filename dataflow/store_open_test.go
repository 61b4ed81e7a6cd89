package dataflow

import (
	"bytes"
	"context"
	"flag"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/epochflow/epochflow/internal/pgtest"
)

// collectSink keeps the values written to it.
type collectSink struct {
	mu  *sync.Mutex
	got *[]int
}

func (s collectSink) Build(context.Context, Worker) (WorkerSink[KV[int]], error) { return s, nil }
func (s collectSink) Write(_ context.Context, kvs []KV[int]) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, kv := range kvs {
		*s.got = append(*s.got, kv.Value)
	}
	return nil
}
func (collectSink) Close() error { return nil }

// countingFlow sums the items 1, 2, 3 of oneBatch under one key and writes each running sum.
func countingFlow(sink collectSink) *Flow {
	f := New("counting")
	in := Input(f, "in", FromDynamic[int](oneBatch{}))
	kv := Transform("key", in, func(b []int) ([]KV[int], error) {
		out := make([]KV[int], len(b))
		for i, v := range b {
			out[i] = KV[int]{Key: "k", Value: v}
		}
		return out, nil
	})
	sum := Stateful("sum", kv, StatefulLogic[int, int, int]{
		OnItem: func(_ string, state *int, _ bool, v int, out *Emitter[int]) (bool, error) {
			*state += v
			out.Emit(*state)
			return true, nil
		}})
	Output("out", sum, ToDynamic[KV[int]](sink))
	return f
}

// With -recovery postgres://..., a flow's state is kept in PostgreSQL (in the URL's schema):
// a second run resumes from it. The logs name the store without its password.
func TestMainRecoveryPostgres(t *testing.T) {
	pg, err := pgtest.Start()
	if err != nil {
		t.Fatal(err) // never skip: the tests need the PostgreSQL server binaries
	}
	defer pg.Stop()
	dsn, err := pg.CreateDB(context.Background(), "main_recovery")
	if err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword("postgres", "s3cret") // trust authentication: any password
	q := u.Query()
	q.Set("schema", "counting")
	u.RawQuery = q.Encode()

	var mu sync.Mutex
	for run, want := range [][]int{{1, 3, 6}, {7, 9, 12}} {
		var got []int
		var stdout, stderr bytes.Buffer
		fs := flag.NewFlagSet("test", flag.ContinueOnError)
		code := mainFunc(fs, []string{"-recovery", u.String()}, &stdout, &stderr, func() (*Flow, error) {
			return countingFlow(collectSink{&mu, &got}), nil
		})
		mu.Lock()
		slices.Sort(got)
		mu.Unlock()
		if code != 0 || !slices.Equal(got, want) {
			t.Fatalf("run %d: exit %d, wrote %v, want 0 and %v; stderr:\n%s", run+1, code, got, want, stderr.String())
		}
		if strings.Contains(stderr.String(), "s3cret") || !strings.Contains(stderr.String(), `recovery="postgres://postgres@127.0.0.1`) {
			t.Errorf("run %d: the logs do not name the store by its URL without the password:\n%s", run+1, stderr.String())
		}
		if run == 1 && !strings.Contains(stderr.String(), `msg="resuming from the recovery store"`) {
			t.Errorf("run 2 did not resume:\n%s", stderr.String())
		}
	}
	// A second writer of the same schema is refused while one runs: see recovery/pgstore.
}
