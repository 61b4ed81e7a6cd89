package main

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// srvURL is the embedded JetStream server of this test binary; the program under test
// connects to it over loopback.
var srvURL string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "epochflow-nats-to-file")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	s, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: dir, NoSigs: true, NoLog: true})
	if err != nil {
		fmt.Fprintln(os.Stderr, "starting the embedded NATS server:", err)
		os.Exit(1)
	}
	go s.Start()
	if !s.ReadyForConnections(30 * time.Second) {
		fmt.Fprintln(os.Stderr, "the embedded NATS server did not start")
		os.Exit(1)
	}
	srvURL = s.ClientURL()
	code := m.Run()
	s.Shutdown()
	s.WaitForShutdown()
	os.RemoveAll(dir)
	removeBinary()
	os.Exit(code)
}

func jsConn(t *testing.T) jetstream.JetStream {
	t.Helper()
	nc, err := natsgo.Connect(srvURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// newStream creates an interest stream named after the test with a durable consumer "c"
// (AckPolicy all, AckWait 2 s so that a killed run's messages come back soon).
func newStream(t *testing.T) string {
	t.Helper()
	name := fmt.Sprintf("S%d", rand.Uint32())
	js := jsConn(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{name + ".>"}, Retention: jetstream.InterestPolicy}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateConsumer(ctx, name, jetstream.ConsumerConfig{Durable: "c", AckPolicy: jetstream.AckAllPolicy, AckWait: 2 * time.Second, MaxAckPending: 20000, MaxDeliver: -1}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { js.DeleteStream(context.Background(), name) })
	return name
}

// publishNumbers publishes "0" .. "n-1", each acknowledged by the stream.
func publishNumbers(t *testing.T, stream string, n int) {
	t.Helper()
	js := jsConn(t)
	// In rounds of 1,000, each awaited, so that a loaded machine never stalls the publisher.
	for i := 0; i < n; i++ {
		if _, err := js.PublishAsync(stream+".x", []byte(strconv.Itoa(i))); err != nil {
			t.Fatal(err)
		}
		if i%1000 == 999 || i == n-1 {
			select {
			case <-js.PublishAsyncComplete():
			case <-time.After(2 * time.Minute):
				t.Fatal("publishing timed out")
			}
		}
	}
}

func consumerInfo(t *testing.T, stream string) *jetstream.ConsumerInfo {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := jsConn(t).Consumer(ctx, stream, "c")
	if err != nil {
		t.Fatal(err)
	}
	return c.CachedInfo()
}

// checkOutput reads the output and fails unless it holds "0" .. "n-1" exactly once each.
func checkOutput(t *testing.T, path string, n int) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	seen := make([]int, n)
	lines := strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
	for _, l := range lines {
		i, err := strconv.Atoi(l)
		if err != nil || i < 0 || i >= n {
			t.Fatalf("unexpected line %q", l)
		}
		seen[i]++
	}
	for i, c := range seen {
		if c != 1 {
			t.Fatalf("%d is in the output %d times (%d lines in all)", i, c, len(lines))
		}
	}
}

// Copying 100,000 numbered messages while the program is killed with SIGKILL 20 times and
// restarted each time on the same recovery store: in the end every number is in the file
// exactly once, and the consumer has nothing pending, delivered or not. A third of the kills
// come at a random moment of the run (often while it starts and recovers), the others at a
// random moment shortly after the server began delivering to it, however long the start took
// on a loaded machine; at least half of the kills must land while the run was at work (it had
// been delivered messages and the stream still had messages for it).
func TestCopySurvivesKill9(t *testing.T) {
	const n, kills, minBusy = 100_000, 20, 10
	bin := buildBinary(t)
	st := newStream(t)
	start := time.Now()
	publishNumbers(t, st, n)
	t.Logf("published %d messages in %v", n, time.Since(start))
	dir := t.TempDir()
	out, rec := filepath.Join(dir, "out.txt"), filepath.Join(dir, "store")
	var logs bytes.Buffer
	r := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 5))
	run := func() *exec.Cmd {
		cmd := flowCommand(bin, "-url", srvURL, "-stream", st, "-consumer", "c", "-output", out, "-recovery", rec,
			"-epoch-interval", "50ms", "-idle-exit", "1s", "-log-level", "warn")
		cmd.Stderr = &logs
		return cmd
	}
	defer func() {
		if t.Failed() {
			t.Logf("program output:\n%s", logs.String())
		}
	}()
	// One connection for the polls below (consumerInfo opens one per call).
	ctx := context.Background()
	cons, err := jsConn(t).Consumer(ctx, st, "c")
	if err != nil {
		t.Fatal(err)
	}
	state := func() *jetstream.ConsumerInfo {
		ictx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		i, err := cons.Info(ictx)
		if err != nil {
			t.Fatal(err)
		}
		return i
	}
	killed, finished, busy := 0, 0, 0
	start = time.Now()
	for killed < kills {
		d0 := state().Delivered.Consumer // deliveries so far, redeliveries included
		cmd := run()
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		wait := make(chan error, 1)
		go func() { wait <- cmd.Wait() }()
		// Once a run has ended on its own, nothing is left to deliver: the remaining kills
		// come at a random moment (before -idle-exit can end the run), or the loop would wait
		// for deliveries that never come.
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
				if state().Delivered.Consumer > d0 {
					kill = time.After(time.Duration(r.IntN(200)) * time.Millisecond)
					began = nil
				} else {
					began = time.After(10 * time.Millisecond)
				}
			case <-kill:
				i := state()
				cmd.Process.Signal(syscall.SIGKILL)
				<-wait
				killed++
				if i.Delivered.Consumer > d0 && i.NumPending > 0 {
					busy++
				}
				break watch
			}
		}
	}
	left := state().NumPending
	if err := run().Run(); err != nil {
		t.Fatalf("last run: %v", err)
	}
	t.Logf("%d kills (%d while the run was at work), %d runs finished on their own, %v; %d messages not yet delivered before the last run",
		killed, busy, finished, time.Since(start), left)
	checkOutput(t, out, n)
	if i := consumerInfo(t, st); i.NumAckPending != 0 || i.NumPending != 0 {
		t.Fatalf("the consumer has %d messages pending acknowledgement and %d pending delivery, want 0 and 0", i.NumAckPending, i.NumPending)
	}
	if busy < minBusy {
		t.Fatalf("only %d of %d kills landed while the run was at work, want at least %d: the copy ran out of work before the kills did (%d runs finished on their own)",
			busy, killed, minBusy, finished)
	}
}

// A payload with a line break stops the program with an error naming the message.
func TestLineBreakFails(t *testing.T) {
	bin := buildBinary(t)
	st := newStream(t)
	js := jsConn(t)
	if _, err := js.Publish(context.Background(), st+".x", []byte("a\nb")); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "out.txt")
	cmd := flowCommand(bin, "-url", srvURL, "-stream", st, "-consumer", "c", "-output", out, "-idle-exit", "1s", "-log-level", "warn")
	b, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(b), "line break") || !strings.Contains(string(b), "message 1 of stream") {
		t.Fatalf("run: %v\n%s\nwant a failure naming the message and the line break", err, b)
	}
}

// flowCommand is exec.Command for a run of the example that is killed if it has not ended
// after 3 minutes: a run that hangs fails its test instead of stalling the package.
func flowCommand(bin string, args ...string) *exec.Cmd {
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(3*time.Minute, cancel)
	return exec.CommandContext(ctx, bin, args...)
}
