package sqstest

import (
	"context"
	"path"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The emulator process serves SQS; Counts and ExpireAll see and change its state; a Restart
// cuts the endpoint for its down time and keeps the queue and its messages; Close ends the
// process.
func TestEmulatorProcess(t *testing.T) {
	e, err := Start()
	if err != nil {
		t.Fatal(err)
	}
	exercise(t, e)
}

// The same with the emulator in this process.
func TestEmulatorInProcess(t *testing.T) {
	e, err := StartInProcess()
	if err != nil {
		t.Fatal(err)
	}
	exercise(t, e)
}

func exercise(t *testing.T, e *Emulator) {
	closed := false
	defer func() {
		if !closed {
			e.Close()
		}
	}()
	ctx := context.Background()
	q := e.MustQueue(t, "proc", QueueOptions{Visibility: 30 * time.Second})
	if err := e.SendBodies(ctx, q, "", "a", "b", "c"); err != nil {
		t.Fatal(err)
	}
	counts := func() (int, int) {
		t.Helper()
		v, f, err := e.Counts(q)
		if err != nil {
			t.Fatal(err)
		}
		return v, f
	}
	if v, f := counts(); v != 3 || f != 0 {
		t.Fatalf("after sending 3: %d visible, %d in flight", v, f)
	}
	if _, _, err := e.Counts(q + "-none"); err == nil {
		t.Fatal("Counts of a queue that does not exist: no error")
	}
	got, err := e.Client.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{QueueUrl: aws.String(q), MaxNumberOfMessages: 2})
	if err != nil {
		t.Fatal(err)
	}
	if v, f := counts(); len(got.Messages) != 2 || v != 1 || f != 2 {
		t.Fatalf("after receiving %d of 3: %d visible, %d in flight", len(got.Messages), v, f)
	}
	if err := e.ExpireAll(q); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if v, f := counts(); v == 3 && f == 0 {
			break
		}
		if time.Now().After(deadline) {
			v, f := counts()
			t.Fatalf("10 s after ExpireAll: %d visible, %d in flight, want 3 visible", v, f)
		}
	}

	restarted := make(chan error, 1)
	go func() { restarted <- e.Restart(time.Second) }()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		short, cancel := context.WithTimeout(ctx, time.Second)
		_, err := e.Client.GetQueueUrl(short, &sqs.GetQueueUrlInput{QueueName: aws.String(path.Base(q))})
		cancel()
		if err != nil {
			break // the endpoint is down
		}
		if time.Now().After(deadline) {
			t.Fatal("the endpoint kept answering during Restart")
		}
	}
	if err := <-restarted; err != nil {
		t.Fatal(err)
	}
	if v, f := counts(); v != 3 || f != 0 {
		t.Fatalf("after the restart: %d visible, %d in flight, want the 3 messages kept", v, f)
	}
	if got, err := e.Client.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{QueueUrl: aws.String(q), MaxNumberOfMessages: 10}); err != nil || len(got.Messages) == 0 {
		t.Fatalf("receive after the restart: %v, %d messages", err, len(got.Messages))
	}

	if e.cmd == nil {
		return
	}
	pid := e.cmd.Process.Pid
	e.Close()
	closed = true
	if err := syscall.Kill(pid, 0); err == nil {
		t.Fatalf("the emulator process %d still runs after Close", pid)
	}
}
