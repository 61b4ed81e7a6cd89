package windows_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/epochflow/epochflow/connectors/flowtest"
	"github.com/epochflow/epochflow/dataflow"
	"github.com/epochflow/epochflow/operators"
	"github.com/epochflow/epochflow/recovery"
	"github.com/epochflow/epochflow/windows"
)

// distinct is an accumulator the default codec cannot store: its set is unexported.
type distinct struct{ seen map[int]bool }

func (d distinct) add(v int) distinct {
	if d.seen == nil {
		d.seen = map[int]bool{}
	}
	d.seen[v] = true
	return d
}

func (d distinct) sorted() []int {
	var out []int
	for v := range d.seen {
		out = append(out, v)
	}
	slices.Sort(out)
	return out
}

// distinctCodec stores a distinct as its values, comma-separated, and counts its decodes.
type distinctCodec struct{ decoded *atomic.Int64 }

func (c distinctCodec) Encode(d distinct) ([]byte, error) {
	var parts []string
	for _, v := range d.sorted() {
		parts = append(parts, strconv.Itoa(v))
	}
	return []byte(strings.Join(parts, ",")), nil
}

func (c distinctCodec) Decode(key string, b []byte) (distinct, error) {
	c.decoded.Add(1)
	var d distinct
	if len(b) == 0 {
		return d, nil
	}
	for _, s := range strings.Split(string(b), ",") {
		v, err := strconv.Atoi(s)
		if err != nil {
			return d, fmt.Errorf("key %q: %w", key, err)
		}
		d = d.add(v)
	}
	return d, nil
}

var errCrash = errors.New("crash")

// crashSource has one partition that yields its items one at a time; on a fresh start it
// stops before the item numbered crashAt until that position is committed, then fails as a
// crash would. Resumed, it goes on from where it is told.
type crashSource struct {
	items   []ev
	crashAt int
}

func (s crashSource) Parts(context.Context) ([]string, error) { return []string{"p"}, nil }

func (s crashSource) Build(_ context.Context, _ string, resume *int) (dataflow.StatefulSource[ev, int], error) {
	p := &crashPart{s: s, crash: resume == nil}
	if resume != nil {
		p.pos = *resume
	}
	return p, nil
}

type crashPart struct {
	s         crashSource
	pos       int
	crash     bool
	committed atomic.Int64
}

func (p *crashPart) Next(context.Context) ([]ev, error) {
	if p.crash && p.pos == p.s.crashAt {
		if p.committed.Load() >= int64(p.s.crashAt) {
			return nil, errCrash
		}
		return nil, nil
	}
	if p.pos == len(p.s.items) {
		return nil, io.EOF
	}
	p.pos++
	return p.s.items[p.pos-1 : p.pos], nil
}

func (p *crashPart) Snapshot() int { return p.pos }
func (p *crashPart) Commit(_ context.Context, pos int) error {
	p.committed.Store(int64(pos))
	return nil
}
func (p *crashPart) Close() error { return nil }

// TestLogicCodec: an accumulator with an unexported field cannot be stored by the default
// codec, so a run with recovery refuses to start and says to give the Logic a Codec; with one,
// the windows still open at a crash are stored through it and restored on resume (the codec
// decodes them), and every window's result counts its items of both runs, once.
func TestLogicCodec(t *testing.T) {
	items := []ev{e("a", 1, 1), e("a", 5, 2), e("a", 6, 1), e("b", 7, 3), e("a", 12, 4), e("a", 15, 4), e("b", 16, 5)}
	dir := t.TempDir()
	sink := flowtest.NewTwoPhaseSink[string](nil)
	var decoded atomic.Int64
	run := func(codec dataflow.Codec[distinct]) error {
		f := dataflow.New("t")
		in := operators.Input(f, "in", dataflow.FromPartitioned[ev, int](crashSource{items: items, crashAt: 4}))
		keyed := operators.KeyOn("key", in, func(x ev) string { return x.Key })
		// A wait of an hour: every window is open at the crash, and closes at EOF.
		res := windows.Apply("w", keyed, dataflow.EventClock(func(x ev) time.Time { return ms(x.T) }, time.Hour),
			windows.Tumbling(10*time.Millisecond, ms(0)), windows.Logic[ev, distinct, []int]{
				Add:   func(d distinct, x ev) distinct { return d.add(x.V) },
				Close: func(_ string, _ windows.Window, d distinct) []int { return d.sorted() },
				Codec: codec,
			})
		operators.Output("out", operators.Map("show", res.Results, show), sink.Output())
		store, err := recovery.OpenSQLite(context.Background(), dir, recovery.SQLiteOptions{})
		if err != nil {
			t.Fatal(err)
		}
		defer store.Close()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		return dataflow.Run(ctx, f, dataflow.Options{Workers: 2, EpochInterval: 2 * time.Millisecond, Recovery: store, Logger: quiet})
	}
	if err := run(nil); err == nil || !strings.Contains(err.Error(), "give the Logic a Codec") {
		t.Fatalf("without a codec: %v, want an error saying to give the Logic a Codec", err)
	}
	codec := distinctCodec{decoded: &decoded}
	if err := run(codec); !errors.Is(err, errCrash) {
		t.Fatalf("first run: %v, want the crash", err)
	}
	if err := run(codec); err != nil {
		t.Fatalf("resumed run: %v", err)
	}
	if decoded.Load() == 0 {
		t.Error("no accumulator was restored through the codec")
	}
	same(t, "results", sorted(sink.Visible()), []string{"a [0,10) [1 2]", "a [10,20) [4]", "b [0,10) [3]", "b [10,20) [5]"})
}
