package main

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/epochflow/epochflow/internal/sqstest"
)

// The SQS redelivery storm of issue 9, through the program: -visibility 2s, -epoch-interval
// 5s and a -max-in-flight above the whole queue, so that only the source's own cap stands
// between the receiver and the 10,000 messages, and every message needs extensions (single
// ChangeMessageVisibility calls on goaws, each scanning the queue) to stay invisible until
// its epoch commits. The run took 78 s with 78,060 stale deletes and 39,404 failed
// extensions (7.8 stale deletes per message). Now every message is in the file exactly once,
// the queue ends empty, and the counters line bounds the storm: stale deletes, messages whose
// visibility was lost and redeliveries (received beyond the 10,000) at most a quarter of the
// messages each (the reasoning of connectors/sqs's TestExtensionsBehindPauseReceiving: what can
// lose its visibility is what slow start received beyond what the extensions sustain when they
// first fell behind, at most half of the population then, plus at most a ninth of an epoch's
// population at a later cut). With the source from before its adaptive cap (the parent of
// commit c516141) this test fails as the run did: 82,358 stale deletes, 38,070
// messages whose visibility was lost, 85 s; with today's, 0 stale deletes in 36 s at a load
// of 13 on 2 cores, the idle end's 10 s included.
func TestRedeliveryStormBounded(t *testing.T) {
	t.Parallel()
	const n = 10_000
	bin := buildBinary(t)
	queue := emu.MustQueue(t, "storm", sqstest.QueueOptions{Visibility: 30 * time.Second})
	want := sendNumbered(t, queue, n)
	dir := t.TempDir()
	out := filepath.Join(dir, "out.txt")
	// The idle end waits beyond a visibility timeout and its extensions' stretch (up to 4
	// times it), so that no message that lost its visibility comes back after the end.
	cmd := command(bin, queue, out, filepath.Join(dir, "rec"), 10*time.Second)
	setFlag(cmd, "-epoch-interval", "5s")
	setFlag(cmd, "-visibility", "2s")
	setFlag(cmd, "-max-in-flight", "100000")
	setFlag(cmd, "-log-level", "info") // the counters line
	logs := &programLog{}
	cmd.Stderr = logs
	start := time.Now()
	if err := cmd.Run(); err != nil {
		t.Fatalf("run: %v; the program's last lines:\n%s", err, logs.Tail())
	}
	took := time.Since(start)
	checkOutput(t, out, queue, want)
	c := logs.Counters(t)
	t.Logf("%v; counters: %v", took.Round(time.Millisecond), c)
	if c["extended"] == 0 {
		t.Fatalf("no visibility extension: the epochs did not outlast the visibility, so the test shows nothing")
	}
	const bound = n / 4
	if c["stale_deletes"] > bound || c["visibility_lost"] > bound || c["received"]-n > bound {
		t.Errorf("%d stale deletes, %d messages whose visibility was lost, %d redeliveries; want at most %d each",
			c["stale_deletes"], c["visibility_lost"], c["received"]-n, bound)
	}
}
