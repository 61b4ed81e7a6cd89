package emulator_test

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"go.uber.org/goleak"

	"github.com/epochflow/epochflow/internal/sqstest"
	"github.com/epochflow/epochflow/internal/sqstest/emulator"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// Queues created while other clients send, receive and long-poll: goaws alone races here (its
// queue table is read without its lock); the emulator must not, served in this process under
// go test -race. Long polls
// still wait for a message and still return one that arrives during the wait.
func TestCreateWhileReceiving(t *testing.T) {
	s, err := emulator.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	e := &client{Client: sqstest.NewClient(s.URL)}
	defer e.Client.Options().HTTPClient.(*http.Client).CloseIdleConnections()
	ctx := context.Background()
	q := e.mustQueue(t, "busy")

	var wg sync.WaitGroup
	stop := make(chan struct{})
	errs := make(chan error, 8)
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				var err error
				if w%2 == 0 {
					_, err = e.SendMessage(ctx, &sqs.SendMessageInput{QueueUrl: &q, MessageBody: aws.String(fmt.Sprint(i))})
				} else {
					_, err = e.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{QueueUrl: &q, MaxNumberOfMessages: 10, WaitTimeSeconds: 1})
				}
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	for range 40 {
		e.mustQueue(t, "created")
	}
	close(stop)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}

	// A long poll on an empty queue returns the message sent during its wait.
	empty := e.mustQueue(t, "empty")
	go func() {
		time.Sleep(300 * time.Millisecond)
		e.SendMessage(ctx, &sqs.SendMessageInput{QueueUrl: &empty, MessageBody: aws.String("late")})
	}()
	out, err := e.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{QueueUrl: &empty, WaitTimeSeconds: 5})
	if err != nil {
		t.Fatal(err)
	}
	if len(out.Messages) != 1 || aws.ToString(out.Messages[0].Body) != "late" {
		t.Fatalf("long poll got %d messages, want the one sent during the wait", len(out.Messages))
	}
	// And one that finds nothing waits out its time and returns none.
	start := time.Now()
	out, err = e.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{QueueUrl: &empty, WaitTimeSeconds: 1})
	if err != nil {
		t.Fatal(err)
	}
	if len(out.Messages) != 0 || time.Since(start) < 900*time.Millisecond {
		t.Fatalf("long poll on an empty queue returned %d messages after %v, want none after its wait", len(out.Messages), time.Since(start))
	}
}

type client struct {
	*sqs.Client
	n int
}

// mustQueue creates a queue named prefix-N and returns its URL.
func (c *client) mustQueue(t *testing.T, prefix string) string {
	t.Helper()
	c.n++
	out, err := c.CreateQueue(context.Background(), &sqs.CreateQueueInput{QueueName: aws.String(fmt.Sprintf("%s-%d", prefix, c.n))})
	if err != nil {
		t.Fatal(err)
	}
	return aws.ToString(out.QueueUrl)
}
