package stdio_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/epochflow/epochflow/connectors/stdio"
	"github.com/epochflow/epochflow/dataflow"
)

// collect is a DynamicSink that keeps every item and reports each batch on a channel.
type collect[T any] struct {
	mu     sync.Mutex
	items  []T
	notify chan struct{}
}

func (c *collect[T]) Build(context.Context, dataflow.Worker) (dataflow.WorkerSink[T], error) {
	return c, nil
}

func (c *collect[T]) Write(_ context.Context, b []T) error {
	c.mu.Lock()
	c.items = append(c.items, b...)
	c.mu.Unlock()
	if c.notify != nil {
		select {
		case c.notify <- struct{}{}:
		default:
		}
	}
	return nil
}

func (c *collect[T]) Close() error { return nil }

func (c *collect[T]) snapshot() []T {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.items)
}

// readAll runs a flow that reads src until it ends and returns what arrived.
func readAll(ctx context.Context, src dataflow.Source[string], workers int, sink *collect[string]) ([]string, error) {
	f := dataflow.New("read")
	if sink == nil {
		sink = &collect[string]{}
	}
	dataflow.Output("out", dataflow.Input(f, "in", src), dataflow.ToDynamic[string](sink))
	err := dataflow.Run(ctx, f, dataflow.Options{Workers: workers, EpochInterval: time.Millisecond})
	return sink.items, err
}

func timeout(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestLinesFromWorkers(t *testing.T) {
	var b strings.Builder
	var want []string
	for i := range 10000 {
		l := fmt.Sprintf("line %d", i)
		want = append(want, l)
		b.WriteString(l + "\n")
	}
	long := strings.Repeat("x", 200<<10) // longer than bufio.Scanner's limit and the read buffer
	b.WriteString(long + "\r\n\n" + long + "\n")
	b.WriteString("last, without newline")
	want = append(want, long, "", long, "last, without newline")
	for _, workers := range []int{1, 2, 4} {
		t.Run(fmt.Sprint(workers), func(t *testing.T) {
			got, err := readAll(timeout(t), stdio.LinesFrom(strings.NewReader(b.String())), workers, nil)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, want) {
				t.Fatalf("got %d lines, want %d, in order", len(got), len(want))
			}
		})
	}
}

func TestLinesFromEdgeCases(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []string
	}{
		{"", nil},
		{"\n", []string{""}},
		{"a", []string{"a"}},
		{"a\r", []string{"a"}},
		{"a\r\r\nb\n", []string{"a\r", "b"}},
	} {
		got, err := readAll(timeout(t), stdio.LinesFrom(strings.NewReader(tc.in)), 2, nil)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("%q: got %q, want %q", tc.in, got, tc.want)
		}
	}
}

// TestLinesStdin reads the real os.Stdin, replaced by a pipe.
func TestLinesStdin(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	saved := os.Stdin
	os.Stdin = r
	defer func() { os.Stdin = saved }()
	go func() {
		fmt.Fprint(w, "one\ntwo\nthree")
		w.Close()
	}()
	got, err := readAll(timeout(t), stdio.Lines(), 3, nil)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"one", "two", "three"}; !slices.Equal(got, want) {
		t.Fatalf("got %q, want %q", got, want)
	}
}

// TestLinesFromIdle checks that lines written to an idle input are processed promptly and that
// the flow ends when the input does.
func TestLinesFromIdle(t *testing.T) {
	pr, pw := io.Pipe()
	sink := &collect[string]{notify: make(chan struct{}, 1)}
	done := make(chan error, 1)
	go func() {
		_, err := readAll(timeout(t), stdio.LinesFrom(pr), 2, sink)
		done <- err
	}()
	for i := range 5 {
		time.Sleep(20 * time.Millisecond) // the worker parks in between
		start := time.Now()
		fmt.Fprintf(pw, "line %d\n", i)
		for len(sink.snapshot()) < i+1 {
			select {
			case <-sink.notify:
			case <-time.After(5 * time.Second):
				t.Fatalf("line %d did not arrive", i)
			}
		}
		if d := time.Since(start); d > time.Second {
			t.Errorf("line %d took %v to arrive", i, d)
		}
	}
	pw.Close()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got := sink.snapshot(); len(got) != 5 || got[4] != "line 4" {
		t.Fatalf("got %q", got)
	}
}

// TestCloseInterruptsDeadline checks that the end of a run stops a goroutine blocked in the
// Read of a reader with read deadlines, at once, and leaves the reader usable.
func TestCloseInterruptsDeadline(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	ctx, cancel := context.WithCancel(timeout(t))
	sink := &collect[string]{notify: make(chan struct{}, 1)}
	done := make(chan error, 1)
	go func() {
		_, err := readAll(ctx, stdio.LinesFrom(r), 1, sink)
		done <- err
	}()
	fmt.Fprint(w, "hello\n")
	<-sink.notify
	cancel() // the reader is now blocked in r.Read
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Run: %v, want context.Canceled", err)
	}
	goleak.VerifyNone(t)
	// The deadline was cleared: r can be read again.
	fmt.Fprint(w, "again\n")
	buf := make([]byte, 16)
	n, err := r.Read(buf)
	if err != nil || string(buf[:n]) != "again\n" {
		t.Fatalf("reading after the run: %q, %v", buf[:n], err)
	}
}

// TestCloseUninterruptible checks that a goroutine blocked in a Read that cannot be
// interrupted returns once that Read does.
func TestCloseUninterruptible(t *testing.T) {
	pr, pw := io.Pipe()
	ctx, cancel := context.WithCancel(timeout(t))
	sink := &collect[string]{notify: make(chan struct{}, 1)}
	done := make(chan error, 1)
	go func() {
		_, err := readAll(ctx, stdio.LinesFrom(pr), 2, sink)
		done <- err
	}()
	fmt.Fprint(pw, "hello\n")
	<-sink.notify
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Run: %v, want context.Canceled", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return while the reader was blocked")
	}
	if err := goleak.Find(); err == nil {
		t.Fatal("expected the reading goroutine to be still blocked in Read")
	}
	pw.Close() // the Read returns and the goroutine with it
	goleak.VerifyNone(t)
}

type failingReader struct {
	data string
	err  error
}

func (r *failingReader) Read(p []byte) (int, error) {
	if r.data == "" {
		return 0, r.err
	}
	n := copy(p, r.data)
	r.data = r.data[n:]
	return n, nil
}

func TestLinesFromReadError(t *testing.T) {
	boom := errors.New("boom")
	sink := &collect[string]{}
	_, err := readAll(timeout(t), stdio.LinesFrom(&failingReader{data: "a\nb\n", err: boom}), 2, sink)
	if !errors.Is(err, boom) || !strings.Contains(err.Error(), "stdio.LinesFrom reader") {
		t.Fatalf("Run: %v, want an error naming the reader and wrapping boom", err)
	}
	if got := sink.snapshot(); !slices.Equal(got, []string{"a", "b"}) {
		t.Fatalf("lines before the error: %q", got)
	}
}
