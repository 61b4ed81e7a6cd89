package amqp

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"
)

// The tests need a RabbitMQ: EPOCHFLOW_AMQP_URL, or DefaultURL (guest on 127.0.0.1:5672, as
// scripts/services/rabbitmq starts it). Without one they fail.
func brokerURL() string {
	if u := os.Getenv("EPOCHFLOW_AMQP_URL"); u != "" {
		return u
	}
	return DefaultURL
}

// dial connects to the test broker or fails the test.
func dial(t testing.TB) *amqp091.Connection {
	t.Helper()
	conn, err := amqp091.Dial(brokerURL())
	if err != nil {
		t.Fatalf("RabbitMQ is needed at %s (start it with scripts/services/rabbitmq): %v", redact(brokerURL()), err)
	}
	return conn
}

// newQueue declares a queue with a name unique to this test and deletes it at the end.
func newQueue(t testing.TB, args amqp091.Table) string {
	t.Helper()
	name := fmt.Sprintf("epochflow-test-%s-%d", strings.NewReplacer("/", "-", " ", "-").Replace(t.Name()), rand.Uint32())
	conn := dial(t)
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare(name, false, false, false, false, args); err != nil {
		t.Fatalf("declaring queue %s: %v", name, err)
	}
	t.Cleanup(func() {
		conn := dial(t)
		defer conn.Close()
		ch, err := conn.Channel()
		if err == nil {
			ch.QueueDelete(name, false, false, false)
		}
	})
	return name
}

// newDurableQueue declares a durable queue with a name unique to this test and deletes it at
// the end.
func newDurableQueue(t testing.TB) string {
	t.Helper()
	name := fmt.Sprintf("epochflow-test-%s-durable-%d", strings.NewReplacer("/", "-", " ", "-").Replace(t.Name()), rand.Uint32())
	conn := dial(t)
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare(name, true, false, false, false, nil); err != nil {
		t.Fatalf("declaring queue %s: %v", name, err)
	}
	t.Cleanup(func() {
		conn := dial(t)
		defer conn.Close()
		if ch, err := conn.Channel(); err == nil {
			ch.QueueDelete(name, false, false, false)
		}
	})
	return name
}

// publish sends the bodies to queue (through the default exchange) with publisher confirms,
// transient or persistent, each with its position as message id.
func publish(t testing.TB, queue string, persistent bool, bodies ...string) {
	t.Helper()
	conn := dial(t)
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	mode := amqp091.Transient
	if persistent {
		mode = amqp091.Persistent
	}
	const window = 2048
	var pending []*amqp091.DeferredConfirmation
	wait := func(keep int) {
		for len(pending) > keep {
			if !pending[0].Wait() {
				t.Fatalf("publishing to %s: nacked", queue)
			}
			pending = pending[1:]
		}
	}
	for i, b := range bodies {
		dc, err := ch.PublishWithDeferredConfirm("", queue, true, false, amqp091.Publishing{
			Body: []byte(b), DeliveryMode: mode, MessageId: strconv.Itoa(i)})
		if err != nil {
			t.Fatalf("publishing to %s: %v", queue, err)
		}
		pending = append(pending, dc)
		if len(pending) >= window {
			wait(window / 2)
		}
	}
	wait(0)
}

// numbered returns "0" .. "n-1".
func numbered(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = strconv.Itoa(i)
	}
	return out
}

// counts returns the queue's ready and unacknowledged message counts, read with rabbitmqctl
// (AMQP itself tells only the ready count). For a node that scripts/services/rabbitmq started
// on its own, rabbitmqctl needs that node's HOME and name, which the script leaves in
// /tmp/epochflow-rabbitmq-PORT.home (and the plain CLI, since /usr/sbin/rabbitmqctl switches to
// the rabbitmq user and its HOME).
func counts(t testing.TB, queue string) (ready, unacked int) {
	t.Helper()
	cmd := exec.Command("rabbitmqctl", "-q", "list_queues", "name", "messages_ready", "messages_unacknowledged")
	if u, err := amqp091.ParseURI(brokerURL()); err == nil {
		if b, err := os.ReadFile(fmt.Sprintf("/tmp/epochflow-rabbitmq-%d.home", u.Port)); err == nil {
			if f := strings.Fields(string(b)); len(f) == 2 {
				if _, err := os.Stat(f[0]); err == nil {
					cmd = exec.Command("/usr/lib/rabbitmq/bin/rabbitmqctl", "-q", "-n", f[1], "list_queues", "name", "messages_ready", "messages_unacknowledged")
					cmd.Env = append(os.Environ(), "HOME="+f[0])
				}
			}
		}
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("rabbitmqctl list_queues: %v\n%s", err, out)
	}
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) == 3 && f[0] == queue {
			ready, _ = strconv.Atoi(f[1])
			unacked, _ = strconv.Atoi(f[2])
			return ready, unacked
		}
	}
	t.Fatalf("rabbitmqctl list_queues does not list %s:\n%s", queue, out)
	return 0, 0
}

// ready returns the queue's ready count through AMQP.
func ready(t testing.TB, queue string) int {
	t.Helper()
	conn := dial(t)
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	q, err := ch.QueueDeclarePassive(queue, false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	return q.Messages
}

// eventually polls cond every 50 ms until it holds or the timeout passes.
func eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// proxy is a TCP proxy to the broker that can cut every connection through it at once, as a
// network failure would.
type proxy struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	conns  map[net.Conn]bool
	wg     sync.WaitGroup
	cuts   int
	once   sync.Once
}

func newProxy(t testing.TB) *proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u, err := amqp091.ParseURI(brokerURL())
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{ln: ln, target: net.JoinHostPort(u.Host, strconv.Itoa(u.Port)), conns: map[net.Conn]bool{}}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

// url is the broker's URL with the proxy's address.
func (p *proxy) url(t testing.TB) string {
	u, err := amqp091.ParseURI(brokerURL())
	if err != nil {
		t.Fatal(err)
	}
	u.Host = "127.0.0.1"
	u.Port = p.ln.Addr().(*net.TCPAddr).Port
	return u.String()
}

func (p *proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		p.conns[c], p.conns[s] = true, true
		p.mu.Unlock()
		p.wg.Add(2)
		go p.pipe(c, s)
		go p.pipe(s, c)
	}
}

func (p *proxy) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	io.Copy(dst, src)
	dst.Close()
	src.Close()
	p.mu.Lock()
	delete(p.conns, dst)
	delete(p.conns, src)
	p.mu.Unlock()
}

// cut closes every connection through the proxy and returns how many pairs it closed.
func (p *proxy) cut() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := len(p.conns) / 2
	for c := range p.conns {
		c.Close()
	}
	p.cuts++
	return n
}

func (p *proxy) close() {
	p.once.Do(func() {
		p.ln.Close()
		p.cut()
		p.wg.Wait()
	})
}

// withTimeout returns a context for one test run.
func withTimeout(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}
