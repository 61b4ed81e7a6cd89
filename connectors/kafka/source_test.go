package kafka

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"go.uber.org/goleak"

	"github.com/epochflow/epochflow/connectors/flowtest"
	"github.com/epochflow/epochflow/dataflow"
)

func runSource(t *testing.T, src dataflow.PartitionedSource[Record, int64], sink *flowtest.Sink[Record], opts dataflow.Options) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	f := dataflow.New("kafka-source")
	dataflow.Output("out", dataflow.Input(f, "in", dataflow.FromPartitioned(src)), sink.Output())
	if opts.Logger == nil {
		opts.Logger = quiet
	}
	return dataflow.Run(ctx, f, opts)
}

func values(rs []Record) []string {
	out := make([]string, len(rs))
	for i, r := range rs {
		out[i] = string(r.Value)
	}
	return out
}

// One partition per topic partition; every record is read once, in offset order within its
// partition; a second run on the same store reads exactly the records produced since; the
// consumer group holds the committed offsets.
func TestSourceResumesAtTheNextOffset(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	brokers := cluster(t, 3, "in")
	produceNumbers(t, brokers, "in", 0, 1000)
	st := store(t)
	cfg := SourceConfig{Brokers: brokers, Topics: []string{"in"}, IdleEOF: 300 * time.Millisecond, Group: "lag"}
	parts, err := NewSource(cfg).Parts(context.Background())
	if err != nil || !slices.Equal(parts, []string{"in/0", "in/1", "in/2"}) {
		t.Fatalf("Parts = %v, %v", parts, err)
	}
	sink := flowtest.NewSink[Record]()
	if err := runSource(t, NewSource(cfg), sink, dataflow.Options{Workers: 2, EpochInterval: 20 * time.Millisecond, Recovery: st}); err != nil {
		t.Fatal(err)
	}
	got := sink.Items()
	exactlyOnce(t, values(got), 1000)
	last := map[int32]int64{}
	for _, r := range got {
		if o, ok := last[r.Partition]; ok && r.Offset <= o {
			t.Fatalf("partition %d: offset %d after %d", r.Partition, r.Offset, o)
		}
		last[r.Partition] = r.Offset
	}
	produceNumbers(t, brokers, "in", 1000, 500)
	sink2 := flowtest.NewSink[Record]()
	if err := runSource(t, NewSource(cfg), sink2, dataflow.Options{EpochInterval: 20 * time.Millisecond, Recovery: st}); err != nil {
		t.Fatal(err)
	}
	got2 := values(sink2.Items())
	for i := range got2 {
		n, _ := strconv.Atoi(got2[i])
		got2[i] = strconv.Itoa(n - 1000)
	}
	exactlyOnce(t, got2, 500)
	// The group's offsets: the high watermarks, written by the commit goroutine after the
	// commits and, for the last one, at the latest by Close.
	adm := kadm.NewClient(client(t, brokers))
	ends, err := adm.ListEndOffsets(context.Background(), "in")
	if err != nil {
		t.Fatal(err)
	}
	os, err := adm.FetchOffsets(context.Background(), "lag")
	if err != nil {
		t.Fatal(err)
	}
	ends.Each(func(e kadm.ListedOffset) {
		o, ok := os.Lookup("in", e.Partition)
		if !ok || o.At != e.Offset {
			t.Errorf("group offset of in/%d: %v (found %v), want the end %d", e.Partition, o.At, ok, e.Offset)
		}
	})
}

// A crash (at each point of the protocol) and a resume: the records of committed epochs are
// not read again, those of the others are, so that the sink (which keeps everything it was
// given, also of epochs that never committed) holds each record at least once and the
// committed prefix exactly once.
func TestSourceCrashResume(t *testing.T) {
	for _, point := range []string{"after-snapshot", "after-commit-record", "inside-commit"} {
		t.Run(point, func(t *testing.T) {
			brokers := cluster(t, 2, "in")
			produceNumbers(t, brokers, "in", 0, 2000)
			st := store(t)
			cfg := SourceConfig{Brokers: brokers, Topics: []string{"in"}, IdleEOF: 300 * time.Millisecond, MaxBuffered: 100}
			var hits atomic.Int32
			hook := func(p string) bool { return p == point && hits.Add(1) == 5 }
			src := &killableSource{Source: NewSource(cfg)}
			sink := flowtest.NewSink[Record]()
			err := runSource(t, src, sink, dataflow.Options{EpochInterval: 5 * time.Millisecond, Recovery: st, CrashHook: hook})
			src.kill()
			if !errors.Is(err, dataflow.ErrCrashed) {
				t.Fatalf("first run: %v, want a crash", err)
			}
			committed := sink.Committed()
			var before []string
			for e, items := range sink.ByEpoch() {
				if e <= committed {
					before = append(before, values(items)...)
				}
			}
			sink2 := flowtest.NewSink[Record]()
			if err := runSource(t, NewSource(cfg), sink2, dataflow.Options{EpochInterval: 5 * time.Millisecond, Recovery: st}); err != nil {
				t.Fatal(err)
			}
			after := values(sink2.Items())
			all := append(slices.Clone(after), values(sink.Items())...)
			seen := map[string]bool{}
			for _, v := range all {
				seen[v] = true
			}
			if len(seen) != 2000 {
				t.Fatalf("%d distinct records read, want 2000", len(seen))
			}
			// Records of epochs the first sink saw committed are not read again... the
			// store's committed epoch may be later than the sink's last Commit (a crash
			// between), so only check that the second run is at most the rest.
			if len(after) > 2000-len(before) {
				t.Fatalf("second run read %d records, but %d were committed before the crash: %s", len(after), len(before), strings.Join(after[:5], ","))
			}
			t.Logf("crash at %s: %d records committed before, %d read after", point, len(before), len(after))
		})
	}
}
