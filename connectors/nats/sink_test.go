package nats

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/epochflow/epochflow/connectors/flowtest"
	"github.com/epochflow/epochflow/dataflow"
)

// Every message is stored when the epoch's Snapshot returns; a replayed epoch (the same items
// again, from the same position) is dropped by the stream's duplicate window; the log-mode
// source reads the stream back in order and resumes after its snapshot.
func TestSinkDedupesAReplayedEpoch(t *testing.T) {
	checkLeaks(t)
	st := newStream(t, jetstream.LimitsPolicy)
	items := make([]OutMessage, 100)
	for i := range items {
		items[i] = OutMessage{Subject: st + ".out", Data: []byte(fmt.Sprint(i))}
	}
	sink := NewSink(SinkConfig{URL: srvURL, Flow: "f", Publishers: 1})
	for run := 0; run < 2; run++ { // the second run replays epoch 1 from no state
		ctx := withTimeout(t, time.Minute)
		p, err := sink.Build(ctx, "publisher-0", nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := p.Write(ctx, items); err != nil {
			t.Fatal(err)
		}
		s, err := p.Snapshot()
		if err != nil || s.Epoch != 1 {
			t.Fatalf("snapshot %+v, %v", s, err)
		}
		_, js := connect(t)
		stream, err := js.Stream(ctx, st)
		if err != nil {
			t.Fatal(err)
		}
		if n := stream.CachedInfo().State.Msgs; n != 100 {
			t.Fatalf("run %d: the stream holds %d messages after Snapshot, want 100", run, n)
		}
		p.Close()
	}
	out := flowtest.NewSink[Message]()
	src := NewLogSource(LogConfig{URL: srvURL, Stream: st, IdleExit: 300 * time.Millisecond})
	if err := dataflow.Run(withTimeout(t, time.Minute), flowOf(dataflow.FromPartitioned[Message, uint64](src), out.Output()), dataflow.Options{EpochInterval: 20 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	got := out.Items()
	if len(got) != 100 {
		t.Fatalf("read %d messages, want 100", len(got))
	}
	for i, m := range got {
		if string(m.Data) != fmt.Sprint(i) || m.MsgID() != fmt.Sprintf("f/publisher-0/%d", i+1) {
			t.Fatalf("message %d: %q id %q", i, m.Data, m.MsgID())
		}
	}
	// Resuming from the last sequence starts at the next one.
	p, err := src.Build(context.Background(), st, new(uint64(99)))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	var b []Message
	eventually(t, 20*time.Second, "the message after the resumed sequence", func() bool {
		n, _ := p.Next(context.Background())
		b = append(b, n...)
		return len(b) > 0
	})
	if len(b) != 1 || b[0].Sequence != 100 {
		t.Fatalf("resumed after 99, read %d messages, the first %d; want only 100", len(b), b[0].Sequence)
	}
}

// The sink warns, naming the stream, its window and the window to set, when a stream's
// duplicate window cannot cover a replay: at Build for SinkConfig.Stream, and at the first
// Snapshot for a stream it found by publishing, sized from the run's epoch interval. A window
// that covers a replay brings no warning.
func TestSinkWarnsAboutAShortDuplicateWindow(t *testing.T) {
	checkLeaks(t)
	const short = "shorter than the"
	_, js := connect(t)
	name := newStream(t, jetstream.LimitsPolicy) // the default window, 2 minutes
	shortWin := name + "W"
	if _, err := js.CreateStream(withTimeout(t, 10*time.Second), jetstream.StreamConfig{Name: shortWin, Subjects: []string{shortWin + ".>"}, Duplicates: 10 * time.Second}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { js.DeleteStream(context.Background(), shortWin) })

	// SinkConfig.Stream with a 10 s window, outside a run (1 s epochs: 35 s wanted): at Build.
	logs := &logBuf{}
	p, err := NewSink(SinkConfig{URL: srvURL, Flow: "f", Stream: shortWin, Logger: slog.New(logs)}).Build(withTimeout(t, time.Minute), "publisher-0", nil)
	if err != nil {
		t.Fatal(err)
	}
	p.Close()
	for _, want := range []string{short, `stream "` + shortWin + `"`, "is 10s", "at least 35s", "Duplicates"} {
		if !logs.hasAt(slog.LevelWarn, want) {
			t.Errorf("no warning at Build containing %q; logs: %q", want, logs.msgs)
		}
	}
	// A stream that does not exist fails Build, naming it.
	_, err = NewSink(SinkConfig{URL: srvURL, Flow: "f", Stream: name + "missing", Logger: slog.New(logs)}).Build(withTimeout(t, time.Minute), "publisher-0", nil)
	if err == nil || !strings.Contains(err.Error(), name+"missing") {
		t.Errorf("Build with a missing SinkConfig.Stream: %v, want an error naming it", err)
	}

	// The default window covers 1 s epochs: no warning, also once a publish found the stream.
	logs = &logBuf{}
	ctx := withTimeout(t, time.Minute)
	p, err = NewSink(SinkConfig{URL: srvURL, Flow: "f", Logger: slog.New(logs)}).Build(ctx, "publisher-0", nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Write(ctx, []OutMessage{{Subject: name + ".x", Data: []byte("a")}}); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Snapshot(); err != nil {
		t.Fatal(err)
	}
	p.Close()
	if logs.has(short) {
		t.Fatalf("a warning about the default window with 1 s epochs; logs: %q", logs.msgs)
	}

	// The same stream in a run with 30 s epochs (3 minutes wanted): warned about once the
	// sink's first publish to it is acknowledged.
	logs = &logBuf{}
	f := dataflow.New("window")
	in := dataflow.Input(f, "in", flowtest.List(OutMessage{Subject: name + ".x", Data: []byte("b")}))
	dataflow.Output("out", in, Publish(SinkConfig{URL: srvURL, Flow: "g", Publishers: 1, Logger: slog.New(logs)}))
	if err := dataflow.Run(withTimeout(t, time.Minute), f, dataflow.Options{EpochInterval: 30 * time.Second}); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{short, `stream "` + name + `"`, "is 2m0s", "at least 3m0s", "30s epochs"} {
		if !logs.hasAt(slog.LevelWarn, want) {
			t.Errorf("no warning in a run with 30 s epochs containing %q; logs: %q", want, logs.msgs)
		}
	}
}
