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
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// publishWithPoison publishes "0" .. "n-1" to the stream, with a poison message (a payload with
// a line break) before every poisonEvery-th number, and returns the stream sequences of the
// poison messages, by sequence, with their payloads.
func publishWithPoison(t *testing.T, stream string, n, poisonEvery int) map[uint64]string {
	t.Helper()
	js := jsConn(t)
	poison := map[uint64]string{}
	seq := uint64(0)
	publish := func(data string) {
		seq++
		if _, err := js.PublishAsync(stream+".x", []byte(data)); err != nil {
			t.Fatal(err)
		}
		if seq%1000 == 0 { // in rounds, below the client's limit of outstanding publishes
			select {
			case <-js.PublishAsyncComplete():
			case <-time.After(2 * time.Minute):
				t.Fatal("publishing timed out")
			}
		}
	}
	for i := range n {
		if i%poisonEvery == poisonEvery/2 {
			p := fmt.Sprintf("poison\n%d", i)
			publish(p)
			poison[seq] = p
		}
		publish(strconv.Itoa(i))
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(2 * time.Minute):
		t.Fatal("publishing timed out")
	}
	return poison
}

// newDeadLetterStream creates a limits stream for dead letters and returns its subject.
func newDeadLetterStream(t *testing.T) (name, subject string) {
	t.Helper()
	name = fmt.Sprintf("D%d", rand.Uint32())
	js := jsConn(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{name + ".dead"}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { js.DeleteStream(context.Background(), name) })
	return name, name + ".dead"
}

// checkDeadLetters fails unless the dead-letter stream holds each poison message exactly once,
// with its payload and the headers that say where it was read and why.
func checkDeadLetters(t *testing.T, dlq, stream string, poison map[uint64]string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := jsConn(t).Stream(ctx, dlq)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[uint64]int{}
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if err != nil {
			t.Fatalf("dead letter %d: %v", seq, err)
		}
		from, err := strconv.ParseUint(m.Header.Get(headerSequence), 10, 64)
		want, ok := poison[from]
		if err != nil || !ok || m.Header.Get(headerStream) != stream || m.Header.Get(headerSubject) != stream+".x" ||
			!strings.Contains(m.Header.Get(headerError), "line break") || string(m.Data) != want {
			t.Fatalf("dead letter %d: payload %q, headers %v; want a poison message of stream %s with its sequence, subject and error", seq, m.Data, m.Header, stream)
		}
		seen[from]++
	}
	for seq := range poison {
		if seen[seq] != 1 {
			t.Errorf("poison message %d is in the dead-letter stream %d times, want once", seq, seen[seq])
		}
	}
}

// With -dead-letter SUBJECT, the poison messages among 1,000 others are published to that
// subject's stream, each once with where it came from and why, every other message is in the
// file exactly once, and the consumer has nothing pending.
func TestDeadLetterFlag(t *testing.T) {
	bin := buildBinary(t)
	st := newStream(t)
	dlq, subject := newDeadLetterStream(t)
	poison := publishWithPoison(t, st, 1000, 300)
	out := filepath.Join(t.TempDir(), "out.txt")
	cmd := flowCommand(bin, "-url", srvURL, "-stream", st, "-consumer", "c", "-output", out,
		"-epoch-interval", "50ms", "-idle-exit", "1s", "-log-level", "warn", "-dead-letter", subject)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("run: %v\n%s", err, b)
	}
	checkOutput(t, out, 1000)
	checkDeadLetters(t, dlq, st, poison)
	if i := consumerInfo(t, st); i.NumAckPending != 0 || i.NumPending != 0 {
		t.Fatalf("the consumer has %d messages pending acknowledgement and %d pending delivery, want 0 and 0", i.NumAckPending, i.NumPending)
	}
}

// Killed with SIGKILL at 8 random moments while it copies 5,000 messages among which 50 are
// poison, and restarted each time on the same recovery store: every number is in the file
// exactly once, and every poison message in the dead-letter stream exactly once (a replay
// publishes it again with the same Nats-Msg-Id, which the stream drops).
func TestDeadLetterSurvivesKill9(t *testing.T) {
	bin := buildBinary(t)
	st := newStream(t)
	dlq, subject := newDeadLetterStream(t)
	const n = 5000
	poison := publishWithPoison(t, st, n, n/50)
	dir := t.TempDir()
	out, rec := filepath.Join(dir, "out.txt"), filepath.Join(dir, "store")
	var logs bytes.Buffer
	run := func() *exec.Cmd {
		cmd := flowCommand(bin, "-url", srvURL, "-stream", st, "-consumer", "c", "-output", out, "-recovery", rec,
			"-epoch-interval", "50ms", "-idle-exit", "1s", "-log-level", "warn", "-dead-letter", subject)
		cmd.Stderr = &logs
		return cmd
	}
	defer func() {
		if t.Failed() {
			t.Logf("program output:\n%s", logs.String())
		}
	}()
	r := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 9))
	kills, finished := 0, 0
	for kills < 8 {
		cmd := run()
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		wait := make(chan error, 1)
		go func() { wait <- cmd.Wait() }()
		select {
		case err := <-wait:
			if err != nil {
				t.Fatalf("run %d: %v", kills+finished, err)
			}
			finished++
		case <-time.After(time.Duration(100+r.IntN(400)) * time.Millisecond):
			cmd.Process.Signal(syscall.SIGKILL)
			<-wait
			kills++
		}
	}
	if err := run().Run(); err != nil {
		t.Fatalf("last run: %v", err)
	}
	t.Logf("%d kills, %d runs finished on their own", kills, finished)
	checkOutput(t, out, n)
	checkDeadLetters(t, dlq, st, poison)
	if i := consumerInfo(t, st); i.NumAckPending != 0 || i.NumPending != 0 {
		t.Fatalf("the consumer has %d messages pending acknowledgement and %d pending delivery, want 0 and 0", i.NumAckPending, i.NumPending)
	}
}

// Without -dead-letter a poison message stops the program (exit 1) with an error that names
// the message, its stream and the consumer, the flag that would move it away, and warns that
// deleting it from the stream would lose the messages before it.
func TestPoisonErrorNamesDeadLetterFlag(t *testing.T) {
	bin := buildBinary(t)
	st := newStream(t)
	poison := publishWithPoison(t, st, 10, 10) // the poison message is the 6th
	out := filepath.Join(t.TempDir(), "out.txt")
	cmd := flowCommand(bin, "-url", srvURL, "-stream", st, "-consumer", "c", "-output", out, "-idle-exit", "1s", "-log-level", "warn")
	b, err := cmd.CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 {
		t.Fatalf("run with a poison message: %v, want exit 1\n%s", err, b)
	}
	for seq := range poison {
		for _, want := range []string{
			fmt.Sprintf("message %d of stream %q", seq, st),
			`consumer "c"`,
			"line break",
			"-dead-letter SUBJECT",
			"would lose the unacknowledged messages before it",
		} {
			if !strings.Contains(string(b), want) {
				t.Errorf("the error does not say %q:\n%s", want, b)
			}
		}
	}
}

// A -dead-letter subject that no stream holds, or that the stream read holds, is refused
// before anything is read (exit 1, naming the flag), and so is one with a space (exit 1).
func TestDeadLetterSubjectChecked(t *testing.T) {
	bin := buildBinary(t)
	st := newStream(t)
	publishWithPoison(t, st, 10, 10)
	for _, c := range []struct{ subject, want string }{
		{"nowhere.dead", "no stream holds this subject"},
		{st + ".dead", fmt.Sprintf("belongs to stream %q, which this program reads", st)},
		{"a b", "invalid value"},
	} {
		out := filepath.Join(t.TempDir(), "out.txt")
		cmd := flowCommand(bin, "-url", srvURL, "-stream", st, "-consumer", "c", "-output", out, "-idle-exit", "1s",
			"-log-level", "warn", "-dead-letter", c.subject)
		b, err := cmd.CombinedOutput()
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 || !strings.Contains(string(b), "-dead-letter") ||
			!strings.Contains(string(b), c.want) {
			t.Errorf("-dead-letter %q: %v, want exit 1 naming the flag and saying %q:\n%s", c.subject, err, c.want, b)
		}
	}
	if i := consumerInfo(t, st); i.Delivered.Stream != 0 {
		t.Errorf("the refused runs had %d messages delivered, want none", i.Delivered.Stream)
	}
}
