package stdio

import (
	"context"
	"io"
	"sync/atomic"
	"testing"
	"time"

	"github.com/epochflow/epochflow/dataflow"
)

// endless is a reader of endless lines that counts what it gave.
type endless struct{ n atomic.Int64 }

func (e *endless) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = 'x'
		if i%10 == 9 {
			p[i] = '\n'
		}
	}
	e.n.Add(int64(len(p)))
	return len(p), nil
}

// buffered returns how many lines the reader holds.
func buffered(lr *lineReader) int {
	lr.mu.Lock()
	defer lr.mu.Unlock()
	return len(lr.buf)
}

// waitFull waits until the reader's buffer is full.
func waitFull(t *testing.T, lr *lineReader) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for buffered(lr) < maxBufferedLines {
		if time.Now().After(deadline) {
			t.Fatalf("the buffer never filled: %d lines", buffered(lr))
		}
		time.Sleep(time.Millisecond)
	}
}

func TestBoundedBuffer(t *testing.T) {
	e := &endless{}
	src, err := (&lineSource{name: "test", r: e}).Build(context.Background(), dataflow.Worker{Index: 0, Count: 1})
	if err != nil {
		t.Fatal(err)
	}
	lr := src.(*lineReader)
	t.Cleanup(func() {
		lr.Close() // the goroutine waits for room: Close stops it
		select {
		case <-lr.exited:
		case <-time.After(5 * time.Second):
			t.Error("the goroutine did not stop")
		}
	})
	// Nobody takes lines: the reader fills its buffer and stops reading.
	const bound = maxBufferedLines*10 + readBufSize // the lines plus one bufio buffer
	waitFull(t, lr)
	time.Sleep(50 * time.Millisecond)
	if n := buffered(lr); n != maxBufferedLines {
		t.Fatalf("%d lines buffered, want the bound %d", n, maxBufferedLines)
	}
	if read := e.n.Load(); read > bound {
		t.Fatalf("read %d bytes with nobody taking lines, want at most %d", read, bound)
	}
	for range 3 {
		b, err := lr.Next(context.Background())
		if err != nil || len(b) != maxBatchLines || b[0] != "xxxxxxxxx" {
			t.Fatalf("Next: %d lines, %v; want a full batch of %d", len(b), err, maxBatchLines)
		}
	}
	// Next made room: the reader fills the buffer again, reading on.
	waitFull(t, lr)
	time.Sleep(50 * time.Millisecond)
	if read := e.n.Load(); read > bound+3*maxBatchLines*10 {
		t.Fatalf("read %d bytes, want at most %d", read, bound+3*maxBatchLines*10)
	}
}

func TestWaitSignals(t *testing.T) {
	pr, pw := io.Pipe()
	src, err := (&lineSource{name: "test", r: pr}).Build(context.Background(), dataflow.Worker{Index: 0, Count: 2})
	if err != nil {
		t.Fatal(err)
	}
	lr := src.(*lineReader)
	t.Cleanup(func() { pw.Close(); lr.Close() })
	ctx := context.Background()
	if b, err := lr.Next(ctx); len(b) != 0 || err != nil {
		t.Fatalf("Next on an idle input: %q, %v", b, err)
	}
	select {
	case <-lr.Wait():
		t.Fatal("Wait is ready with nothing to read")
	case <-time.After(20 * time.Millisecond):
	}
	go pw.Write([]byte("a\nb\n"))
	waitReady(t, lr)
	var got []string
	for len(got) < 2 {
		b, err := lr.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(b) == 0 {
			waitReady(t, lr)
		}
		got = append(got, b...)
	}
	pw.Close()
	waitReady(t, lr)
	if b, err := lr.Next(ctx); len(b) != 0 || err != io.EOF {
		t.Fatalf("Next after the end: %q, %v; want io.EOF", b, err)
	}
	if err := lr.Close(); err != nil {
		t.Fatal(err)
	}
	<-lr.exited

	other, err := (&lineSource{name: "test", r: pr}).Build(ctx, dataflow.Worker{Index: 1, Count: 2})
	if err != nil {
		t.Fatal(err)
	}
	if b, err := other.Next(ctx); len(b) != 0 || err != io.EOF {
		t.Fatalf("worker 1: %q, %v; want io.EOF at once", b, err)
	}
	other.Close()
}

func waitReady(t *testing.T, lr *lineReader) {
	t.Helper()
	select {
	case <-lr.Wait():
	case <-time.After(5 * time.Second):
		t.Fatal("Wait never became ready")
	}
}
