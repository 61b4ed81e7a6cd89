package main

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// cluster starts an in-process Kafka cluster (kfake) on a loopback port that stays the same
// for the whole test, so that every run of the binary connects to it.
func cluster(t *testing.T, parts int32, topics ...string) string {
	t.Helper()
	_, brokers := kfakeCluster(t, parts, topics...)
	return brokers
}

func kfakeCluster(t *testing.T, parts int32, topics ...string) (*kfake.Cluster, string) {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(parts, topics...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c, strings.Join(c.ListenAddrs(), ",")
}

// slowFetches makes the cluster answer every fetch of topic with one record batch, after a
// pause of d, as a loaded broker far away would, until the function it returns is called:
// kfake in the test's process otherwise serves a copy of 100,000 records within a second of
// a run, and the kills of a crash test would all come after the copy ended. Fetch sessions
// are refused (every fetch is a full one that names its partitions), so that no fetch of
// topic escapes.
func slowFetches(t *testing.T, c *kfake.Cluster, brokers, topic string, d time.Duration) (stop func()) {
	t.Helper()
	topics, err := kadm.NewClient(client(t, brokers)).ListTopics(context.Background(), topic)
	if err != nil {
		t.Fatal(err)
	}
	id := topics[topic].ID
	var stopped atomic.Bool
	c.ControlKey(int16(kmsg.Fetch), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		if stopped.Load() {
			c.DropControl()
			return nil, nil, false
		}
		c.KeepControl()
		req := kreq.(*kmsg.FetchRequest)
		req.SessionID, req.SessionEpoch = 0, -1
		for _, rt := range req.Topics {
			if rt.Topic == topic || rt.TopicID == id {
				req.MaxBytes = 1 // the first batch, whatever its size
				c.SleepControl(func() { time.Sleep(d) })
				break
			}
		}
		return nil, nil, false // the cluster answers it
	})
	return func() { stopped.Store(true) }
}

func client(t *testing.T, brokers string, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(strings.Split(brokers, ",")...)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}

// produceNumbers produces "0" .. "n-1" (key and value) to topic, with the producer options
// given.
func produceNumbers(t *testing.T, brokers, topic string, n int, opts ...kgo.Opt) {
	t.Helper()
	cl := client(t, brokers, append([]kgo.Opt{kgo.DefaultProduceTopic(topic), kgo.MaxBufferedRecords(1 << 20)}, opts...)...)
	const chunk = 10000
	for from := 0; from < n; from += chunk {
		var recs []*kgo.Record
		for i := from; i < min(from+chunk, n); i++ {
			s := []byte(strconv.Itoa(i))
			recs = append(recs, &kgo.Record{Key: s, Value: s})
		}
		if err := cl.ProduceSync(context.Background(), recs...).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
}

// readCommitted reads topic with isolation read_committed until every partition's last stable
// offset has reached its high watermark (which must happen within the timeout: an open
// transaction holds it back) and nothing more comes, and returns the values.
func readCommitted(t *testing.T, brokers, topic string, timeout time.Duration) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	adm := kadm.NewClient(client(t, brokers))
	ends, err := adm.ListEndOffsets(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	want := map[int32]int64{}
	ends.Each(func(o kadm.ListedOffset) {
		if o.Offset > 0 {
			want[o.Partition] = o.Offset
		}
	})
	cl := client(t, brokers, kgo.ConsumeTopics(topic), kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	var out []string
	stable := map[int32]bool{}
	for len(stable) < len(want) {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("read_committed reading of %s did not reach the high watermarks %v within %v (an open transaction?); read %d values", topic, want, timeout, len(out))
		}
		fs.EachError(func(_ string, _ int32, err error) { t.Fatal(err) })
		fs.EachRecord(func(r *kgo.Record) { out = append(out, string(r.Value)) })
		fs.EachPartition(func(p kgo.FetchTopicPartition) {
			if w, ok := want[p.Partition]; ok && p.LastStableOffset >= w {
				stable[p.Partition] = true
			}
		})
	}
	for {
		pctx, pcancel := context.WithTimeout(ctx, 2*time.Second)
		fs := cl.PollFetches(pctx)
		pcancel()
		if fs.NumRecords() == 0 {
			return out
		}
		fs.EachRecord(func(r *kgo.Record) { out = append(out, string(r.Value)) })
	}
}

// openTxns lists the transactions that are neither empty nor complete.
func openTxns(t *testing.T, brokers string) []string {
	t.Helper()
	ls, err := kadm.NewClient(client(t, brokers)).ListTransactions(context.Background(), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	var open []string
	for _, tx := range ls.Sorted() {
		switch tx.State {
		case "Empty", "CompleteCommit", "CompleteAbort", "Dead":
		default:
			open = append(open, fmt.Sprintf("%s (%s)", tx.TxnID, tx.State))
		}
	}
	return open
}

// exactlyOnce fails unless values are "0" .. "n-1", each once.
func exactlyOnce(t *testing.T, values []string, n int) {
	t.Helper()
	seen := make([]int, n)
	for _, v := range values {
		i, err := strconv.Atoi(v)
		if err != nil || i < 0 || i >= n {
			t.Fatalf("unexpected value %q", v)
		}
		seen[i]++
	}
	for i, c := range seen {
		if c != 1 {
			t.Fatalf("%d was read %d times (%d values in all, want %d)", i, c, len(values), n)
		}
	}
}

// Copying 100,000 records while the program is killed with SIGKILL 20 times and restarted
// each time on the same recovery store, with one or two workers: in the end a read_committed
// reader of the target sees every record exactly once, and no transaction is left open. A
// third of the kills come at a random moment of the run (often while it starts and recovers),
// the others at a random moment shortly after it began writing records to the target, however
// long the start took on a loaded machine; at least half of the kills must land while the run
// was at work (it had written records). While the kills go on, the source topic is served
// slowly (slowFetches: one batch of about 50 records per fetch and partition every 100 ms, at
// most about 2,000 records a second), so that the copy lasts longer than the kills even when
// a loaded machine makes each run live longer; the last run copies the rest at full speed.
func TestCopySurvivesKill9(t *testing.T) {
	const n, kills, minBusy = 100_000, 20, 10
	bin := buildBinary(t)
	c, brokers := kfakeCluster(t, 4, "from", "to")
	start := time.Now()
	produceNumbers(t, brokers, "from", n, kgo.ProducerBatchMaxBytes(1<<10))
	t.Logf("produced %d records in %v", n, time.Since(start))
	fast := slowFetches(t, c, brokers, "from", 100*time.Millisecond)
	rec := filepath.Join(t.TempDir(), "store")
	var logs bytes.Buffer
	r := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 15))
	run := func() *exec.Cmd {
		cmd := flowCommand(bin, "-brokers", brokers, "-from", "from", "-to", "to", "-recovery", rec,
			"-workers", strconv.Itoa(1+r.IntN(2)), "-producers", "2", "-epoch-interval", "50ms", "-idle-exit", "1s", "-log-level", "warn")
		cmd.Stderr = &logs
		return cmd
	}
	defer func() {
		if t.Failed() {
			t.Logf("program output:\n%s", logs.String())
		}
	}()
	written := tailRecords(t, brokers, "to")
	killed, finished, busy := 0, 0, 0
	start = time.Now()
	for killed < kills {
		w0 := written()
		cmd := run()
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		wait := make(chan error, 1)
		go func() { wait <- cmd.Wait() }()
		// Once a run has ended on its own, everything is copied and no run writes again: the
		// remaining kills all come at a random moment (before -idle-exit can end the run), or
		// the loop would wait for writes that never come.
		kill := time.After(time.Duration(100+r.IntN(600)) * time.Millisecond)
		var began <-chan time.Time
		if killed%3 != 0 && finished == 0 {
			kill, began = nil, time.After(0)
		}
	watch:
		for {
			select {
			case err := <-wait:
				if err != nil {
					t.Fatalf("run %d: %v", killed+finished, err)
				}
				finished++
				break watch
			case <-began:
				if written() > w0 {
					kill = time.After(time.Duration(r.IntN(300)) * time.Millisecond)
					began = nil
				} else {
					began = time.After(5 * time.Millisecond)
				}
			case <-kill:
				cmd.Process.Signal(syscall.SIGKILL)
				<-wait
				killed++
				if written() > w0 {
					busy++
				}
				break watch
			}
		}
	}
	fast()
	left := written()
	if err := run().Run(); err != nil {
		t.Fatalf("last run: %v", err)
	}
	t.Logf("%d kills (%d after the run wrote records), %d runs finished on their own, %v; %d records written (committed or not) before the last run",
		killed, busy, finished, time.Since(start), left)
	exactlyOnce(t, readCommitted(t, brokers, "to", time.Minute), n)
	if open := openTxns(t, brokers); len(open) > 0 {
		t.Fatalf("transactions left open: %v", open)
	}
	if busy < minBusy {
		t.Fatalf("only %d of %d kills landed after the run wrote records, want at least %d: the copy ran out of work before the kills did (%d runs finished on their own)",
			busy, killed, minBusy, finished)
	}
}

// tailRecords reads topic with isolation read_uncommitted until the end of the test and
// returns a function that tells how many records it has read so far: every record a run
// produced, in transactions open, committed or aborted, and none of the markers that a
// run's recovery writes when it commits or aborts what a killed run left.
func tailRecords(t *testing.T, brokers, topic string) func() int64 {
	t.Helper()
	var count atomic.Int64
	cl := client(t, brokers, kgo.ConsumeTopics(topic), kgo.FetchIsolationLevel(kgo.ReadUncommitted()),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(100*time.Millisecond))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			fs := cl.PollFetches(ctx)
			count.Add(int64(fs.NumRecords()))
		}
	}()
	t.Cleanup(func() { cancel(); <-done }) // runs before the client's Close, registered earlier
	return func() int64 { return count.Load() }
}

// A plain copy with two workers ends on its own (-idle-exit) with every record once; a
// transaction timeout too short for the epoch interval is refused naming both flags.
func TestCopyAndFlags(t *testing.T) {
	bin := buildBinary(t)
	brokers := cluster(t, 3, "from", "to")
	produceNumbers(t, brokers, "from", 5000)
	cmd := flowCommand(bin, "-brokers", brokers, "-from", "from", "-to", "to", "-recovery", filepath.Join(t.TempDir(), "store"),
		"-workers", "2", "-epoch-interval", "20ms", "-idle-exit", "500ms", "-log-level", "warn")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%v\n%s", err, b)
	}
	exactlyOnce(t, readCommitted(t, brokers, "to", 30*time.Second), 5000)
	b, err := flowCommand(bin, "-brokers", brokers, "-from", "from", "-to", "to", "-epoch-interval", "10s", "-transaction-timeout", "40s").CombinedOutput()
	if err == nil {
		t.Fatalf("a 40s transaction timeout with 10s epochs was accepted:\n%s", b)
	}
	for _, want := range []string{"-transaction-timeout", "-epoch-interval", "1m20s"} {
		if !strings.Contains(string(b), want) {
			t.Errorf("output does not mention %q:\n%s", want, b)
		}
	}
}

// flowCommand is exec.Command for a run of the example that is killed if it has not ended
// after 3 minutes: a run that hangs fails its test instead of stalling the package.
func flowCommand(bin string, args ...string) *exec.Cmd {
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(3*time.Minute, cancel)
	return exec.CommandContext(ctx, bin, args...)
}
