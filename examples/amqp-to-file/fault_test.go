package main

import (
	"bytes"

	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"
)

// The broker faults of these tests happen to a RabbitMQ node of the test's own, started on free
// ports with its own files, never to the shared broker on 5672.

const rabbitBin = "/usr/lib/rabbitmq/bin"

// rabbitNode is a RabbitMQ node that the test started and stops.
type rabbitNode struct {
	name string // rabbit-fault-PORT@localhost
	home string // HOME of the node (its Erlang cookie), needed by rabbitmqctl
	port int
	cmd  *exec.Cmd
	out  string // the server's output file
}

// freePort returns a loopback port nothing listens on (at the time of the call).
func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// startNode starts a node of the test's own on a free port and waits (up to 2 minutes, for a
// loaded machine) until it accepts AMQP connections. It is stopped at the end of the test.
func startNode(t *testing.T) *rabbitNode {
	t.Helper()
	if _, err := os.Stat(filepath.Join(rabbitBin, "rabbitmq-server")); err != nil {
		t.Fatalf("rabbitmq-server is needed for the broker fault tests (apt-get install rabbitmq-server): %v", err)
	}
	d := t.TempDir()
	for _, sub := range []string{"mnesia", "log"} {
		if err := os.MkdirAll(filepath.Join(d, sub), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	port, dist := freePort(t), freePort(t)
	n := &rabbitNode{name: fmt.Sprintf("rabbit-fault-%d@localhost", port), home: d, port: port, out: filepath.Join(d, "server.out")}
	must := func(err error) {
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.WriteFile(filepath.Join(d, "enabled_plugins"), []byte("[].\n"), 0o644))
	must(os.WriteFile(filepath.Join(d, "rabbitmq.conf"), fmt.Appendf(nil, "listeners.tcp.default = 127.0.0.1:%d\nloopback_users = none\n", port), 0o644))
	out, err := os.Create(n.out)
	must(err)
	defer out.Close()
	n.cmd = exec.Command(filepath.Join(rabbitBin, "rabbitmq-server"))
	n.cmd.Env = append(os.Environ(), "HOME="+d, "ERL_EPMD_ADDRESS=127.0.0.1", "RABBITMQ_NODENAME="+n.name,
		"RABBITMQ_NODE_PORT="+strconv.Itoa(port), "RABBITMQ_DIST_PORT="+strconv.Itoa(dist),
		"RABBITMQ_MNESIA_BASE="+filepath.Join(d, "mnesia"), "RABBITMQ_LOG_BASE="+filepath.Join(d, "log"),
		"RABBITMQ_ENABLED_PLUGINS_FILE="+filepath.Join(d, "enabled_plugins"), "RABBITMQ_CONFIG_FILE="+filepath.Join(d, "rabbitmq"),
		"RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS=-kernel inet_dist_use_interface {127,0,0,1}")
	n.cmd.Stdout, n.cmd.Stderr = out, out
	n.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // its own group, to kill the node and its helpers
	must(n.cmd.Start())
	exited := make(chan struct{})
	go func() { n.cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		// A graceful stop first; then the process group the test started.
		stop := exec.Command(filepath.Join(rabbitBin, "rabbitmqctl"), "-q", "-n", n.name, "stop")
		stop.Env = append(os.Environ(), "HOME="+d)
		stop.Run()
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			syscall.Kill(-n.cmd.Process.Pid, syscall.SIGKILL)
			<-exited
		}
	})
	deadline := time.Now().Add(2 * time.Minute)
	for !n.answers() {
		select {
		case <-exited:
			b, _ := os.ReadFile(n.out)
			t.Fatalf("the test's RabbitMQ node %s exited at start:\n%s", n.name, b)
		default:
		}
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(n.out)
			t.Fatalf("the test's RabbitMQ node %s did not answer on port %d within 2 minutes:\n%s", n.name, port, b)
		}
		time.Sleep(200 * time.Millisecond)
	}
	n.ctl(t, "await_startup", "--timeout", "120")
	return n
}

// url is the node's AMQP URL.
func (n *rabbitNode) url() string { return fmt.Sprintf("amqp://guest:guest@127.0.0.1:%d/", n.port) }

// answers says whether an AMQP handshake with the node succeeds.
func (n *rabbitNode) answers() bool {
	c, err := amqp091.DialConfig(n.url(), amqp091.Config{Dial: amqp091.DefaultDial(2 * time.Second)})
	if err != nil {
		return false
	}
	c.Close()
	return true
}

// ctl runs rabbitmqctl against the node, bounded by 2 minutes.
func (n *rabbitNode) ctl(t *testing.T, args ...string) {
	t.Helper()
	cmd := flowCommand(filepath.Join(rabbitBin, "rabbitmqctl"), append([]string{"-q", "-n", n.name, "--timeout", "120"}, args...)...)
	cmd.Env = append(os.Environ(), "HOME="+n.home)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("rabbitmqctl %s: %v\n%s", strings.Join(args, " "), err, b)
	}
}

// nodeChannel opens a channel on the node.
func nodeChannel(t *testing.T, url string) (*amqp091.Connection, *amqp091.Channel) {
	t.Helper()
	conn, err := amqp091.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	ch, err := conn.Channel()
	if err != nil {
		conn.Close()
		t.Fatal(err)
	}
	return conn, ch
}

// publishPersistent publishes "0" .. "n-1" as persistent messages, each with its number as
// message id, with confirms, to the queue at url.
func publishPersistent(t *testing.T, url, queue string, n int) {
	t.Helper()
	conn, ch := nodeChannel(t, url)
	defer conn.Close()
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	var pending []*amqp091.DeferredConfirmation
	flush := func(keep int) {
		for len(pending) > keep {
			if !pending[0].Wait() {
				t.Fatal("publish nacked")
			}
			pending = pending[1:]
		}
	}
	for i := range n {
		s := strconv.Itoa(i)
		dc, err := ch.PublishWithDeferredConfirm("", queue, true, false, amqp091.Publishing{
			Body: []byte(s), MessageId: s, DeliveryMode: amqp091.Persistent})
		if err != nil {
			t.Fatal(err)
		}
		pending = append(pending, dc)
		if len(pending) >= 4096 {
			flush(2048)
		}
	}
	flush(0)
}

// queueCounts returns the queue's ready count and its consumer count.
func queueCounts(t *testing.T, url, queue string) (ready, consumers int) {
	t.Helper()
	conn, ch := nodeChannel(t, url)
	defer conn.Close()
	q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	return q.Messages, q.Consumers
}

// syncBuffer is an io.Writer for a subprocess's output that the test reads while it runs.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// lineCount counts the lines of a file (0 if it does not exist yet).
func lineCount(path string) int {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	return bytes.Count(b, []byte("\n"))
}

// waitUntil polls cond every 50 ms until it holds; it fails the test after d, or when the run
// ended (done is closed) before cond held.
func waitUntil(t *testing.T, d time.Duration, done <-chan struct{}, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		select {
		case <-done:
			t.Fatalf("the run ended while waiting for %s", what)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Acceptance fault test: the test's own broker node is stopped (rabbitmqctl stop_app) and
// started again twice while amqp-to-file copies 50,000 persistent messages of a durable queue.
// The program does not exit: its source reconnects each time, within -reconnect-max (plus
// slack for a loaded machine) of the broker's return, and in the end every message is in the
// file exactly once and the queue is empty.
func TestBrokerRestartedTwice(t *testing.T) {
	// Alongside TestCopySurvivesKill9 (after the other tests): this broker node is its own.
	t.Parallel()
	const n = 50_000
	bin := buildBinary(t)
	node := startNode(t)
	url := node.url()
	q := "epochflow-fault-" + strconv.Itoa(node.port)
	conn, ch := nodeChannel(t, url)
	if _, err := ch.QueueDeclare(q, true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	conn.Close()
	start := time.Now()
	publishPersistent(t, url, q, n)
	t.Logf("published %d persistent messages in %v", n, time.Since(start))

	dir := t.TempDir()
	out := filepath.Join(dir, "out.txt")
	// A small prefetch per commit keeps the copy running long enough for two restarts: at
	// most 200 messages per 100 ms epoch, so 50,000 take at least 25 s. The program is
	// also paused while the node stops (below), as rabbitmqctl can take longer than that.
	const reconnectMax = time.Second
	cmd := flowCommand(bin, "-url", url, "-queue", q, "-output", out, "-recovery", filepath.Join(dir, "store"),
		"-epoch-interval", "100ms", "-prefetch", "200", "-idle-exit", "3s", "-log-level", "info",
		"-reconnect-min", "50ms", "-reconnect-max", reconnectMax.String())
	var logs syncBuffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	defer func() {
		if t.Failed() {
			t.Logf("program output:\n%s", logs.String())
		}
	}()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	var runErr error
	go func() { runErr = cmd.Wait(); close(done) }()
	defer func() {
		cmd.Process.Kill()
		<-done
	}()
	reconnects := func() int { return strings.Count(logs.String(), "amqp source: reconnected") }

	start = time.Now()
	for restart := range 2 {
		// 4,000 lines into the copy, or a third of what is left if that is less.
		lines := lineCount(out)
		at := lines + min(4000, (n-lines)/3)
		waitUntil(t, 2*time.Minute, done, fmt.Sprintf("%d lines before restart %d", at, restart+1), func() bool { return lineCount(out) >= at })
		before := reconnects()
		// The program is paused (SIGSTOP) while rabbitmqctl stops the node, and continued
		// once the node is gone: on a loaded machine stop_app took over 20 s, in which the
		// copy ran to its end (CI: "the copy had ended before the broker stopped"). The
		// program still loses the broker mid-copy, with an epoch's messages unacknowledged,
		// and it sees the closed connection as soon as it runs again.
		if err := cmd.Process.Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		node.ctl(t, "stop_app")
		waitUntil(t, time.Minute, done, "the node to stop answering", func() bool { return !node.answers() })
		if lines := lineCount(out); lines >= n {
			t.Fatalf("restart %d: the copy had ended (%d lines) before the broker stopped: it tests no restart", restart+1, lines)
		}
		if err := cmd.Process.Signal(syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
		down := time.Now()
		// Down long enough for the source's back-off to reach its maximum.
		for time.Since(down) < 4*reconnectMax {
			time.Sleep(50 * time.Millisecond)
		}
		if ready, _ := queueCountsIfUp(node, q); ready >= 0 {
			t.Fatal("the node answers AMQP after stop_app")
		}
		node.ctl(t, "start_app")
		back := time.Now()
		waitUntil(t, time.Minute, done, fmt.Sprintf("the source to reconnect after restart %d", restart+1), func() bool { return reconnects() > before })
		if wait := time.Since(back); wait > reconnectMax+4*time.Second {
			t.Errorf("restart %d: the source reconnected %v after the broker was back, want within -reconnect-max %v (plus 4 s of slack)", restart+1, wait, reconnectMax)
		}
		t.Logf("restart %d at %d lines: broker down %v after the program continued, source reconnected %v after start_app returned",
			restart+1, at, back.Sub(down).Round(time.Millisecond), time.Since(back).Round(time.Millisecond))
	}
	select {
	case <-done:
	case <-time.After(3 * time.Minute):
		t.Fatal("the program did not exit within 3 minutes after the second restart")
	}
	if runErr != nil {
		t.Fatalf("the program failed: %v", runErr)
	}
	t.Logf("copied %d messages with two broker restarts in %v", n, time.Since(start))
	checkOutput(t, out, n)
	if ready, consumers := queueCounts(t, url, q); ready != 0 || consumers != 0 {
		t.Fatalf("after the run the queue holds %d ready messages and %d consumers, want none", ready, consumers)
	}
}

// queueCountsIfUp is queueCounts that returns -1 when the node does not answer.
func queueCountsIfUp(n *rabbitNode, queue string) (ready, consumers int) {
	c, err := amqp091.DialConfig(n.url(), amqp091.Config{Dial: amqp091.DefaultDial(2 * time.Second)})
	if err != nil {
		return -1, -1
	}
	defer c.Close()
	ch, err := c.Channel()
	if err != nil {
		return -1, -1
	}
	q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	if err != nil {
		return -1, -1
	}
	return q.Messages, q.Consumers
}
