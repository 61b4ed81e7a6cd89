package operators_test

import (
	"context"
	"fmt"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/epochflow/epochflow/connectors/flowtest"
	"github.com/epochflow/epochflow/dataflow"
	"github.com/epochflow/epochflow/operators"
)

type order struct{ ID, Item string }
type payment struct {
	ID    string
	Cents int
}

func showRow2(kv dataflow.KV[operators.Row2[order, payment]]) string {
	l, r := "-", "-"
	if kv.Value.Left != nil {
		l = kv.Value.Left.Item
	}
	if kv.Value.Right != nil {
		r = fmt.Sprint(kv.Value.Right.Cents)
	}
	return kv.Key + " " + l + "/" + r
}

// TestJoin2Modes joins orders and payments (two types) by id in every insert and emit mode.
func TestJoin2Modes(t *testing.T) {
	orders := []order{{"o1", "hat"}, {"o2", "shoe"}, {"o1", "cap"}, {"o3", "sock"}}
	payments := []payment{{"o1", 100}, {"o2", 250}, {"o1", 120}}
	for _, tc := range []struct {
		opts operators.Join2Options
		want []string
	}{
		// Complete: the first time both sides have a value, then the key starts over.
		{operators.Join2Options{Insert: operators.InsertProduct, Emit: operators.EmitComplete}, nil},
		{operators.Join2Options{Insert: operators.InsertProduct, Emit: operators.EmitFinal},
			[]string{"o1 cap/100", "o1 cap/120", "o1 hat/100", "o1 hat/120", "o2 shoe/250", "o3 sock/-"}},
		{operators.Join2Options{Insert: operators.InsertLast, Emit: operators.EmitFinal},
			[]string{"o1 cap/120", "o2 shoe/250", "o3 sock/-"}},
		{operators.Join2Options{Insert: operators.InsertFirst, Emit: operators.EmitFinal},
			[]string{"o1 hat/100", "o2 shoe/250", "o3 sock/-"}},
	} {
		for _, workers := range []int{1, 3} {
			f := dataflow.New("j")
			os := operators.KeyOn("okey", operators.Input(f, "orders", flowtest.List(orders...)), func(o order) string { return o.ID })
			ps := operators.KeyOn("pkey", operators.Input(f, "payments", flowtest.List(payments...)), func(p payment) string { return p.ID })
			sink := flowtest.NewSink[string]()
			operators.Output("out", operators.Map("show", operators.Join2("join", tc.opts, os, ps), showRow2), sink.Output())
			mustRun(t, f, workers)
			got := strs(sink.Items())
			if tc.opts.Emit == operators.EmitComplete {
				// Which values meet first depends on how the two inputs interleave; every key
				// with both sides gives rows, o3 none.
				keys := map[string]bool{}
				for _, row := range got {
					keys[row[:2]] = true
				}
				if !keys["o1"] || !keys["o2"] || keys["o3"] {
					t.Errorf("complete, workers=%d: rows %v, want rows of o1 and o2 only", workers, got)
				}
				continue
			}
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Errorf("%+v, workers=%d:\n got  %v\n want %v", tc.opts, workers, got, tc.want)
			}
		}
	}
}

// heldSource has one partition: it yields its first item, then nothing until release is closed,
// then the rest.
type heldSource[T any] struct {
	items   []T
	release chan struct{}
}

func (s *heldSource[T]) Parts(context.Context) ([]string, error) { return []string{"p"}, nil }

func (s *heldSource[T]) Build(_ context.Context, _ string, _ *int) (dataflow.StatefulSource[T, int], error) {
	return &heldPart[T]{s: s}, nil
}

type heldPart[T any] struct {
	s   *heldSource[T]
	pos int
}

func (p *heldPart[T]) Next(context.Context) ([]T, error) {
	if p.pos == len(p.s.items) {
		return nil, io.EOF
	}
	if p.pos == 1 {
		select {
		case <-p.s.release:
		default:
			return nil, nil
		}
	}
	p.pos++
	return p.s.items[p.pos-1 : p.pos], nil
}

func (p *heldPart[T]) Snapshot() int                     { return p.pos }
func (p *heldPart[T]) Commit(context.Context, int) error { return nil }
func (p *heldPart[T]) Close() error                      { return nil }

// TestJoin2TTL: an order whose payment has not come within the TTL is emitted alone (EmitFinal)
// and its state dropped, so the payment that comes later starts a new key state; without a TTL
// they meet at EOF.
func TestJoin2TTL(t *testing.T) {
	for _, tc := range []struct {
		ttl  time.Duration
		want []string
	}{
		{0, []string{"o1 hat/100"}},
		{20 * time.Millisecond, []string{"o1 -/100", "o1 hat/-"}},
	} {
		// One source of both: an order, then (once released) a payment.
		src := &heldSource[dataflow.KV[string]]{items: []dataflow.KV[string]{{Key: "o1", Value: "order"}, {Key: "o1", Value: "payment"}},
			release: make(chan struct{})}
		var once sync.Once
		release := func() { once.Do(func() { close(src.release) }) }
		f := dataflow.New("j")
		in := operators.Input(f, "in", dataflow.FromPartitioned[dataflow.KV[string], int](src))
		// Without a TTL nothing is emitted before the end: release at once.
		if tc.ttl == 0 {
			release()
		}
		os := operators.FilterMap("orders", in, func(kv dataflow.KV[string]) (dataflow.KV[order], bool) {
			return dataflow.KV[order]{Key: kv.Key, Value: order{kv.Key, "hat"}}, kv.Value == "order"
		})
		ps := operators.FilterMap("payments", in, func(kv dataflow.KV[string]) (dataflow.KV[payment], bool) {
			return dataflow.KV[payment]{Key: kv.Key, Value: payment{kv.Key, 100}}, kv.Value == "payment"
		})
		rows := operators.Join2("join", operators.Join2Options{Emit: operators.EmitFinal, TTL: tc.ttl}, os, ps)
		// With one, release the payment once the TTL has emitted the order alone.
		rows = operators.Inspect("seen", rows, func(dataflow.KV[operators.Row2[order, payment]]) { release() })
		sink := flowtest.NewSink[string]()
		operators.Output("out", operators.Map("show", rows, showRow2), sink.Output())
		mustRun(t, f, 2)
		if got := strs(sink.Items()); fmt.Sprint(got) != fmt.Sprint(tc.want) {
			t.Errorf("ttl %v: got %v, want %v", tc.ttl, got, tc.want)
		}
	}
}
