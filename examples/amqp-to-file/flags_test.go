package main

import (
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"
)

// newDeadLetterQueue declares a queue whose dead-letter exchange is the default one, routing
// rejected messages to a second queue, and returns both names; both are deleted at the end.
func newDeadLetterQueue(t *testing.T) (queue, dlq string) {
	t.Helper()
	id := rand.Uint32()
	queue = fmt.Sprintf("epochflow-test-amqp-to-file-dlx-%d", id)
	dlq = queue + "-dead"
	conn, ch := channel(t)
	defer conn.Close()
	if _, err := ch.QueueDeclare(dlq, false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare(queue, false, false, false, false, amqp091.Table{
		"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn, ch := channel(t)
		defer conn.Close()
		ch.QueueDelete(queue, false, false, false)
		ch.QueueDelete(dlq, false, false, false)
	})
	return queue, dlq
}

// A poison message (a body with a line break) with -dead-letter goes to the queue's
// dead-letter exchange, and every other message is copied exactly once; the queue ends empty
// and the dead-letter queue holds the poison message alone.
func TestDeadLetterFlag(t *testing.T) {
	bin := buildBinary(t)
	q, dlq := newDeadLetterQueue(t)
	conn, ch := channel(t)
	for i := range 1001 {
		body, id := strconv.Itoa(i), strconv.Itoa(i)
		if i == 500 {
			body, id = "poison\nmessage", "poison"
		} else if i > 500 {
			body, id = strconv.Itoa(i-1), strconv.Itoa(i-1)
		}
		if err := ch.Publish("", q, true, false, amqp091.Publishing{Body: []byte(body), MessageId: id}); err != nil {
			t.Fatal(err)
		}
	}
	conn.Close()
	out := filepath.Join(t.TempDir(), "out.txt")
	cmd := flowCommand(bin, "-url", brokerURL(), "-queue", q, "-output", out, "-recovery", filepath.Join(t.TempDir(), "store"),
		"-dead-letter", "-epoch-interval", "50ms", "-idle-exit", "1s", "-log-level", "warn")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%v\n%s", err, b)
	}
	checkOutput(t, out, 1000)
	if r := queueReady(t, q); r != 0 {
		t.Fatalf("%d messages left in the queue", r)
	}
	conn, ch = channel(t)
	defer conn.Close()
	var dead []string
	for deadline := time.Now().Add(20 * time.Second); len(dead) == 0 && time.Now().Before(deadline); {
		m, ok, err := ch.Get(dlq, true)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			time.Sleep(50 * time.Millisecond)
			continue
		}
		dead = append(dead, m.MessageId)
		for {
			m, ok, err := ch.Get(dlq, true)
			if err != nil {
				t.Fatal(err)
			}
			if !ok {
				break
			}
			dead = append(dead, m.MessageId)
		}
	}
	if len(dead) != 1 || dead[0] != "poison" {
		t.Fatalf("dead-letter queue holds %q, want the poison message alone", dead)
	}
}

// The program's errors name its flags, never the fields of amqp.SourceConfig: a bad
// -prefetch, a poison message without -dead-letter (the error advises the flag), a missing
// queue (no advice to set a field the program has no flag for). None names "worker -1": the
// missing queue, found before any worker runs, was once reported as worker -1's.
func TestErrorsNameFlags(t *testing.T) {
	bin := buildBinary(t)
	q := newQueue(t)
	conn, ch := channel(t)
	if err := ch.Publish("", q, true, false, amqp091.Publishing{Body: []byte("a\nb"), MessageId: "m-1"}); err != nil {
		t.Fatal(err)
	}
	conn.Close()
	out := filepath.Join(t.TempDir(), "out.txt")
	for _, c := range []struct {
		args []string
		want []string
	}{
		{[]string{"-queue", q, "-prefetch", "70000"}, []string{"flag -prefetch", "70000"}},
		{[]string{"-queue", q}, []string{"flag -dead-letter", "message m-1"}},
		{[]string{"-queue", "epochflow-test-no-such-queue"}, []string{"epochflow-test-no-such-queue", "does not exist (declare it)"}},
		{[]string{"-queue", q, "-reconnect-min", "2s", "-reconnect-max", "1s"}, []string{"flag -reconnect-max"}},
	} {
		args := append([]string{"-url", brokerURL(), "-output", out, "-idle-exit", "1s", "-log-level", "warn"}, c.args...)
		b, err := flowCommand(bin, args...).CombinedOutput()
		if err == nil {
			t.Errorf("%v: exit 0, want a failure:\n%s", c.args, b)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(string(b), w) {
				t.Errorf("%v: output does not mention %q:\n%s", c.args, w, b)
			}
		}
		if strings.Contains(string(b), "SourceConfig") {
			t.Errorf("%v: output names a Go struct field:\n%s", c.args, b)
		}
		if strings.Contains(string(b), "worker -1") {
			t.Errorf("%v: output names worker -1, which does not exist:\n%s", c.args, b)
		}
	}
}
