package dataflow

import (
	"context"
	"flag"
	"io"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// With -status-interval, the program logs a progress line at that interval, with the items
// read and written so far, and none once it has returned.
func TestMainLogsProgress(t *testing.T) {
	defer goleak.VerifyNone(t)
	const items = 700
	src := &heldSource{n: items, gate: make(chan struct{}), release: make(chan struct{})}
	close(src.gate)
	var stderr lockedBuffer
	code := make(chan int, 1)
	go func() {
		fs := flag.NewFlagSet("test", flag.ContinueOnError)
		code <- mainFunc(fs, []string{"-epoch-interval", "10ms", "-status-interval", "20ms"}, io.Discard, &stderr,
			func() (*Flow, error) {
				f := New("prog")
				Output("write", Input(f, "read", FromDynamic[int](src)), ToDynamic[int](oneSink{}))
				return f, nil
			})
	}()
	want := "msg=progress flow=prog items_read=700 items_written=700"
	deadline := time.Now().Add(60 * time.Second)
	for !strings.Contains(stderr.String(), want) {
		if time.Now().After(deadline) {
			close(src.release)
			<-code
			t.Fatalf("no %q in stderr:\n%s", want, stderr.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
	for _, attr := range []string{"read_per_s=", "written_per_s=", "epoch_open=", "epoch_committed=", "commit_latency=", "source_lag=0"} {
		if !strings.Contains(stderr.String(), attr) {
			t.Errorf("the progress lines lack %s:\n%s", attr, stderr.String())
		}
	}
	close(src.release)
	if c := <-code; c != 0 {
		t.Fatalf("exit %d; stderr:\n%s", c, stderr.String())
	}
	n := strings.Count(stderr.String(), "msg=progress")
	time.Sleep(100 * time.Millisecond) // five intervals: no line may come after the return
	if m := strings.Count(stderr.String(), "msg=progress"); m != n {
		t.Errorf("%d progress lines after mainFunc returned", m-n)
	}
}

type oneSink struct{}

func (oneSink) Build(_ context.Context, _ Worker) (WorkerSink[int], error) { return oneSink{}, nil }
func (oneSink) Write(context.Context, []int) error                         { return nil }
func (oneSink) Close() error                                               { return nil }
