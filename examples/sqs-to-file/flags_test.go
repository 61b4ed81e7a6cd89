package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/epochflow/epochflow/internal/sqstest"
)

// A poison message (a body with a line break) with -dead-letter-queue goes to that queue, and
// every other message is copied exactly once; both queues end with nothing in flight.
func TestDeadLetterQueueFlag(t *testing.T) {
	t.Parallel()
	bin := buildBinary(t)
	queue := emu.MustQueue(t, "poison", sqstest.QueueOptions{Visibility: 30 * time.Second})
	dlq := emu.MustQueue(t, "poison-dead", sqstest.QueueOptions{Visibility: 30 * time.Second})
	want := make([]string, 1000)
	for i := range want {
		want[i] = fmt.Sprintf("n%05d", i)
	}
	all := append(append(append([]string{}, want[:500]...), "poison\nbody"), want[500:]...)
	if err := emu.SendBodies(context.Background(), queue, "g", all...); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	out := filepath.Join(dir, "out.txt")
	cmd := command(bin, queue, out, filepath.Join(dir, "rec"), 2*time.Second)
	cmd.Args = append(cmd.Args, "-dead-letter-queue", dlq)
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	checkOutput(t, out, queue, want)
	got, err := emu.Client.ReceiveMessage(context.Background(), &awssqs.ReceiveMessageInput{QueueUrl: aws.String(dlq), MaxNumberOfMessages: 10, WaitTimeSeconds: 1})
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Messages) != 1 || aws.ToString(got.Messages[0].Body) != "poison\nbody" {
		var bodies []string
		for _, m := range got.Messages {
			bodies = append(bodies, aws.ToString(m.Body))
		}
		t.Fatalf("dead-letter queue holds %q, want the poison message alone", bodies)
	}
}

// Without -dead-letter-queue the poison message stops the program with an error that names the
// message and the flag that would dead-letter it.
func TestPoisonWithoutDeadLetterQueue(t *testing.T) {
	t.Parallel()
	bin := buildBinary(t)
	// A visibility well inside the idle end: a receive whose response goaws lost on loopback
	// (see internal/sqstest) hides its messages only until they come again, not past the end.
	queue := emu.MustQueue(t, "poison-stop", sqstest.QueueOptions{Visibility: 3 * time.Second})
	if err := emu.SendBodies(context.Background(), queue, "g", "a", "poison\nbody", "b"); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	cmd := command(bin, queue, filepath.Join(dir, "out.txt"), filepath.Join(dir, "rec"), 8*time.Second)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Run(); err == nil {
		t.Fatalf("exit 0 on a poison message:\n%s", stderr.String())
	}
	for _, w := range []string{"line break", "rejected", "-dead-letter-queue"} {
		if !strings.Contains(stderr.String(), w) {
			t.Errorf("the error does not mention %q:\n%s", w, stderr.String())
		}
	}
}

// Bad values of the new flags are refused, naming the flag; -max-in-flight caps the messages
// in flight; -visibility is what a receive asks for: after a kill, the messages come back
// within it, not within the queue's 30 s.
func TestVisibilityAndMaxInFlightFlags(t *testing.T) {
	t.Parallel()
	bin := buildBinary(t)
	queue := emu.MustQueue(t, "flags", sqstest.QueueOptions{Visibility: 30 * time.Second})
	dir := t.TempDir()
	for _, c := range [][]string{{"-visibility", "1500ms"}, {"-max-in-flight", "0"}} {
		cmd := command(bin, queue, filepath.Join(dir, "out.txt"), filepath.Join(dir, "rec-bad"), time.Second)
		cmd.Args = append(cmd.Args, c...)
		var stderr strings.Builder
		cmd.Stderr = &stderr
		if err := cmd.Run(); err == nil || !strings.Contains(stderr.String(), "flag "+c[0]) {
			t.Errorf("%v: %v, want a failure naming flag %s:\n%s", c, err, c[0], stderr.String())
		}
	}

	want := sendNumbered(t, queue, 2000)
	cmd := command(bin, queue, filepath.Join(dir, "out.txt"), filepath.Join(dir, "rec"), 30*time.Second)
	// Epochs far longer than the run: nothing commits, so the messages stay in flight.
	for i, a := range cmd.Args {
		if a == "-epoch-interval" {
			cmd.Args[i+1] = "1m"
		}
	}
	cmd.Args = append(cmd.Args, "-visibility", "2s", "-max-in-flight", "300")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	wait := make(chan error, 1)
	go func() { wait <- cmd.Wait() }()
	// Sample the messages in flight for 3 s from the first receive (the program may take
	// seconds to start on a loaded machine), up to a minute.
	most := 0
	var first time.Time
	for start := time.Now(); ; time.Sleep(20 * time.Millisecond) {
		_, fl, err := emu.Counts(queue)
		if err != nil {
			t.Fatal(err)
		}
		most = max(most, fl)
		if fl > 0 && first.IsZero() {
			first = time.Now()
		}
		if !first.IsZero() && time.Since(first) > 3*time.Second {
			break
		}
		select {
		case err := <-wait:
			t.Fatalf("the program ended (%v) before the test killed it", err)
		default:
		}
		if first.IsZero() && time.Since(start) > time.Minute {
			t.Fatal("no message was in flight within a minute of the start")
		}
	}
	cmd.Process.Signal(syscall.SIGKILL)
	<-wait
	if most == 0 || most > 300 {
		t.Errorf("at most %d messages were in flight, want 1 to 300 (-max-in-flight 300)", most)
	}
	killed := time.Now()
	for {
		vis, fl, err := emu.Counts(queue)
		if err != nil {
			t.Fatal(err)
		}
		if fl == 0 && vis == len(want) {
			break
		}
		if time.Since(killed) > 15*time.Second {
			t.Fatalf("%d messages still in flight %v after the kill, want them back within the 2 s of -visibility (plus extensions of up to 4 times it, plus the emulator's 1 s checks)", fl, time.Since(killed))
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("at most %d in flight; back %v after the kill", most, time.Since(killed).Round(time.Millisecond))
	os.Remove(filepath.Join(dir, "out.txt"))
}
