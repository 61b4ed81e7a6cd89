package sqs_test

import (
	"context"
	"testing"
	"time"

	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/epochflow/epochflow/connectors/flowtest"
	"github.com/epochflow/epochflow/connectors/sqs"
	"github.com/epochflow/epochflow/dataflow"
)

// The redelivery storm of issue 9, scaled down: a queue visibility of 2 s, epochs of 3 s and
// 1,000 messages that one partition receives within a second, so that every message needs one
// or two extensions before its epoch commits, more than goaws (single calls, each scanning the
// queue, here each 15 ms late, so that on a quiet machine too they fall behind) can do for all of them at once.
//
// Without a limit the receiver takes every message, the extensions fall behind, most messages
// lose their visibility and come again, and their deletes are refused as stale: more than one
// stale delete per message (the run: 78,060 for 10,000; here 4.9 per message),
// and a storm that repeats each epoch. With the limit, receiving stops as soon as an extension
// goes out with less than a quarter of the visibility left, and the in-flight cap halves. What
// can still lose its visibility is what was received beyond what the extensions sustain when
// they fell behind: the cap only doubles from a population whose extensions were all in time
// (slow start), so at the first cut at most half of the population is beyond it; afterwards the
// cap grows by an eighth per round trip, so at a later cut (at most one per epoch: none while
// more are in flight than the cap allows) at most a ninth of that epoch's population is. That
// is half of a few hundred (slow start from 200 meets a capacity of a few hundred calls a
// second here) plus a ninth of the messages: the bound is a quarter of them, for stale deletes,
// for visibility lost and for redeliveries each.
func TestExtensionsBehindPauseReceiving(t *testing.T) {
	q := emu.MustQueue(t, "storm", sqstestQueue{Visibility: 2 * time.Second})
	const n = 1000
	send(t, q, numbered("s", n)...)
	client := &slowVisibility{Client: emu.Client, delay: 15 * time.Millisecond}
	src := sqs.NewSource(client, q, func(m sqs.Message) (sqs.Message, error) { return m, nil },
		sqs.WaitTime(time.Second), sqs.IdleExit(3*time.Second), sqs.Logger(quiet))
	sink := flowtest.NewSink[sqs.Message]()
	start := time.Now()
	if err := runFlow(t, src.Input(), sink, dataflow.Options{EpochInterval: 3 * time.Second, Workers: 1}); err != nil {
		t.Fatal(err)
	}
	st := src.Stats()
	t.Logf("%v: %d items; stats %+v", time.Since(start), len(sink.Items()), st)
	if st.Extended == 0 {
		t.Fatalf("stats %+v: no extension: the test did not make the epochs outlast the visibility", st)
	}
	if st.ExtensionPauses == 0 || st.LimitCuts == 0 {
		t.Errorf("stats %+v: receiving never waited for the extensions: the test did not make them fall behind", st)
	}
	const bound = n / 4
	if st.StaleDeletes > bound || st.VisibilityLost > bound || st.Received-n > bound {
		t.Errorf("stats %+v: %d stale deletes, %d messages whose visibility was lost, %d redeliveries; want at most %d each",
			st, st.StaleDeletes, st.VisibilityLost, st.Received-n, bound)
	}
	if got := len(bodies(sink.Items())); got < n {
		t.Errorf("the sink got %d messages, want all %d", got, n)
	}
	if vis, fl := counts(t, q); vis+fl != 0 {
		t.Errorf("after the run: %d visible, %d in flight", vis, fl)
	}
}

// slowVisibility answers every ChangeMessageVisibility call after a delay, as a far region
// would: the calls' capacity is then much the same with or without the race detector, on a
// loaded machine or not.
type slowVisibility struct {
	*awssqs.Client
	delay time.Duration
}

func (s *slowVisibility) ChangeMessageVisibility(ctx context.Context, in *awssqs.ChangeMessageVisibilityInput, opts ...func(*awssqs.Options)) (*awssqs.ChangeMessageVisibilityOutput, error) {
	select {
	case <-time.After(s.delay):
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return s.Client.ChangeMessageVisibility(ctx, in, opts...)
}
