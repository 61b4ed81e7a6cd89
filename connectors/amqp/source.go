package amqp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/epochflow/epochflow/dataflow"
)

// Defaults of SourceConfig.
const (
	// DefaultPrefetch is the prefetch count of each consumer when SourceConfig.Prefetch is 0.
	// It bounds the messages a consumer holds unacknowledged, across every epoch not yet
	// committed. See SourceConfig.Prefetch for how to size it.
	DefaultPrefetch = 20000
	// DefaultReconnectMin and DefaultReconnectMax bound the back-off between reconnection
	// attempts: it starts at the minimum and doubles up to the maximum. Since it doubles, the
	// wait between the broker's return and the reconnection is at most about as long as the
	// outage was, and never longer than the maximum: 5 s, a few failed dials a minute per
	// consumer against a broker that stays down, for a flow that resumes at most 5 s after it
	// is back.
	DefaultReconnectMin = 100 * time.Millisecond
	DefaultReconnectMax = 5 * time.Second
	// DefaultURL is the URL of a local RabbitMQ with its default account.
	DefaultURL = "amqp://guest:guest@127.0.0.1:5672/"
)

// maxPrefetch is the largest prefetch count AMQP 0-9-1 can carry (a 16-bit field).
const maxPrefetch = 65535

// dialTimeout bounds a TCP connect plus the AMQP handshake; closeGrace bounds the graceful close
// of a consumer (its last acks and the channel and connection close) before the connection is
// cut.
const (
	dialTimeout = 15 * time.Second
	closeGrace  = 10 * time.Second
)

// SourceConfig says which queue a source reads and how.
type SourceConfig struct {
	// URL is the broker's AMQP URI, with the credentials and the virtual host:
	// amqp://USER:PASSWORD@HOST:PORT/VHOST (amqps:// for TLS; reserved characters in the user
	// or password percent-encoded). Empty means DefaultURL. The password never appears in
	// errors or logs.
	URL string
	// Queue is the queue to read. Required.
	Queue string
	// Consumers is the number of consumers (source partitions, "consumer-0" ...); 0 means one
	// per worker of the run (dataflow.WorkerCount). The number may change from one run to the
	// next on the same recovery store (the source declares dataflow.ConsumerPartitions).
	Consumers int
	// Prefetch is each consumer's prefetch count (basic.qos): how many messages the broker
	// lets it hold unacknowledged. 0 means DefaultPrefetch; at most 65535.
	//
	// Messages are acknowledged only when their epoch commits, so a consumer holds every
	// message of its open epoch and of the epochs not yet committed (up to
	// dataflow.Options.MaxEpochsInFlight of them). Size it to at least the rate of one
	// consumer times about twice the epoch interval, plus some slack. When a consumer reaches
	// the limit, the broker stops sending until the next commit: throughput is then bounded by
	// Prefetch per commit interval, and the source says so in the log (at most once a minute).
	// The memory a consumer may use is about Prefetch times the message size.
	Prefetch int
	// Declare, if set, declares the queue with these options when a consumer connects (an
	// existing queue must have the same ones, else the broker refuses with 406). Nil means a
	// passive declaration: the queue must exist, and a missing one fails the run at start with
	// an error naming it.
	Declare *QueueOptions
	// DeadLetter says that the queue has a dead-letter exchange (an x-dead-letter-exchange
	// argument or policy), so messages that the decode function rejects may be nacked to it
	// with requeue=false. Without a dead-letter exchange the broker would drop such a message:
	// set this only when the queue has one. When false, a rejected message stops the flow with
	// an error naming the queue and the message.
	DeadLetter bool
	// IdleExit, if positive, ends each consumer's stream (io.EOF) once no message has arrived
	// for this long and the broker reports no ready message in the queue: for drains and
	// backfills. Zero means the source never ends.
	IdleExit time.Duration
	// ReconnectMin and ReconnectMax bound the back-off between reconnection attempts after a
	// lost connection or channel; 0 means DefaultReconnectMin and DefaultReconnectMax.
	ReconnectMin, ReconnectMax time.Duration
	// Logger receives the source's logs (reconnections, the prefetch limit, dead-lettered
	// messages); nil means the run's logger (dataflow.Logger).
	Logger *slog.Logger
	// FieldNames renames the fields of this struct in the source's errors and logs, for a
	// program whose users set them some other way: a command maps "Prefetch" to
	// "flag -prefetch", so that its users read the name of its own flag. A field mapped to ""
	// is one the program does not offer: a message that would advise setting it leaves that
	// advice out. A field missing from the map (or a nil map) is named as in Go,
	// "SourceConfig.Prefetch".
	FieldNames map[string]string
}

// name is how errors and logs name the field (see FieldNames); ok is false for a field the
// program does not offer.
func (c *SourceConfig) name(field string) (n string, ok bool) {
	if n, found := c.FieldNames[field]; found {
		return n, n != ""
	}
	return "SourceConfig." + field, true
}

// fieldName is name without ok, for a field an error must name even where the program does
// not offer it (a program that leaves a field out of its options never sets it wrong).
func (c *SourceConfig) fieldName(field string) string {
	if n, ok := c.name(field); ok {
		return n
	}
	return "SourceConfig." + field
}

// QueueOptions are the arguments of a queue declaration (see amqp091.Channel.QueueDeclare).
type QueueOptions struct {
	Durable    bool
	AutoDelete bool
	Exclusive  bool
	Args       amqp091.Table
}

// Consume returns a source of the messages of cfg.Queue. See the package documentation for
// its partitions, state, commit behaviour and delivery guarantee.
func Consume(cfg SourceConfig) dataflow.Source[Message] {
	return dataflow.FromPartitioned[Message, uint64](NewSource(cfg, func(m Message) (Message, error) { return m, nil }))
}

// ConsumeDecoded returns a source of the messages of cfg.Queue turned into T by decode. A
// message that decode rejects (returns an error for, or panics on) is not emitted: with
// cfg.DeadLetter it is nacked without requeue (so the broker moves it to the queue's
// dead-letter exchange) when its epoch commits, together with the acks of that epoch; without,
// the flow stops with an error naming the queue, the message and decode's error. decode is
// called on the partition's worker, one message at a time, never concurrently for one
// partition.
func ConsumeDecoded[T any](cfg SourceConfig, decode func(Message) (T, error)) dataflow.Source[T] {
	return dataflow.FromPartitioned[T, uint64](NewSource(cfg, decode))
}

// Source is the dataflow.PartitionedSource behind Consume and ConsumeDecoded, for tests and
// for composing it with other sources. Its partitions are consumers; their state is a
// snapshot sequence number (a uint64).
type Source[T any] struct {
	cfg    SourceConfig
	decode func(Message) (T, error)

	// onOp, if set, is called by a consumer goroutine for every ack or nack it sends (err is
	// what the send returned) and, with sent false, for every op it drops because the op's
	// channel is gone. Tests count acks per channel generation with it.
	onOp func(part string, op ackOp, sent bool, err error)
	// onSession, if set, is called with the generation of every channel a consumer opens.
	onSession func(part string, gen uint64)
}

// NewSource returns the source of ConsumeDecoded (decode nil means the identity, for T =
// Message).
func NewSource[T any](cfg SourceConfig, decode func(Message) (T, error)) *Source[T] {
	if decode == nil {
		decode = func(m Message) (T, error) {
			v, ok := any(m).(T)
			if !ok {
				var zero T
				return zero, fmt.Errorf("amqp source: no decode function to turn a Message into %T", zero)
			}
			return v, nil
		}
	}
	return &Source[T]{cfg: cfg, decode: decode}
}

// check validates the configuration, naming the field at fault.
func (c *SourceConfig) check() error {
	if c.Queue == "" {
		return fmt.Errorf("amqp source: %s is empty", c.fieldName("Queue"))
	}
	if c.URL == "" {
		c.URL = DefaultURL
	}
	if _, err := amqp091.ParseURI(c.URL); err != nil {
		return fmt.Errorf("amqp source: queue %q: %s %s: %w", c.Queue, c.fieldName("URL"), redact(c.URL), err)
	}
	if c.Prefetch == 0 {
		c.Prefetch = DefaultPrefetch
	}
	if c.Prefetch < 0 || c.Prefetch > maxPrefetch {
		return fmt.Errorf("amqp source: queue %q: %s is %d, want 1..%d (0 for the default %d)", c.Queue, c.fieldName("Prefetch"), c.Prefetch, maxPrefetch, DefaultPrefetch)
	}
	if c.Consumers < 0 {
		return fmt.Errorf("amqp source: queue %q: %s is %d, want 0 (one per worker) or more", c.Queue, c.fieldName("Consumers"), c.Consumers)
	}
	if c.IdleExit < 0 {
		return fmt.Errorf("amqp source: queue %q: %s is %v, want 0 (never) or more", c.Queue, c.fieldName("IdleExit"), c.IdleExit)
	}
	if c.ReconnectMin < 0 || c.ReconnectMax < 0 {
		return fmt.Errorf("amqp source: queue %q: %s is %v and %s is %v, want 0 (the default) or more", c.Queue,
			c.fieldName("ReconnectMin"), c.ReconnectMin, c.fieldName("ReconnectMax"), c.ReconnectMax)
	}
	if c.ReconnectMin == 0 {
		c.ReconnectMin = DefaultReconnectMin
	}
	if c.ReconnectMax == 0 {
		c.ReconnectMax = max(DefaultReconnectMax, c.ReconnectMin)
	}
	if c.ReconnectMax < c.ReconnectMin {
		c.ReconnectMax = c.ReconnectMin
	}
	return nil
}

// redact returns the URL without its password, for errors and logs.
func redact(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(an unparsable URL)"
	}
	return u.Redacted()
}

// ConsumerPartitions tells the engine that the partitions are consumers of one queue whose
// state is only a sequence number, so a run may resume with fewer of them.
func (s *Source[T]) ConsumerPartitions() {}

// Parts returns "consumer-0" ... "consumer-(n-1)", n being SourceConfig.Consumers or, when it is
// 0, the number of workers of the run.
func (s *Source[T]) Parts(ctx context.Context) ([]string, error) {
	cfg := s.cfg
	if err := cfg.check(); err != nil {
		return nil, err
	}
	n := cfg.Consumers
	if n == 0 {
		n = max(dataflow.WorkerCount(ctx), 1)
	}
	parts := make([]string, n)
	for i := range parts {
		parts[i] = fmt.Sprintf("consumer-%d", i)
	}
	return parts, nil
}

// Build connects the consumer named part: it dials the broker, declares (or passively checks) the
// queue, sets the prefetch and starts consuming, and fails if any of that fails. resume is the
// snapshot sequence number to continue from; no delivery tag is ever resumed.
func (s *Source[T]) Build(ctx context.Context, part string, resume *uint64) (dataflow.StatefulSource[T, uint64], error) {
	cfg := s.cfg
	if err := cfg.check(); err != nil {
		return nil, err
	}
	logger := cfg.Logger
	if logger == nil {
		logger = dataflow.Logger(ctx)
	}
	c := &consumer[T]{
		cfg:       cfg,
		part:      part,
		decode:    s.decode,
		log:       logger.With("queue", cfg.Queue, "consumer", part),
		onOp:      s.onOp,
		onSession: s.onSession,
		wake:      make(chan struct{}, 1),
		kick:      make(chan struct{}, 1),
		rearm:     make(chan struct{}, 1),
		done:      make(chan struct{}),
		exited:    make(chan struct{}),
		gen:       1,
	}
	c.led.setLive(1)
	c.lag = dataflow.Metrics(ctx)
	c.countsWaiting = part == "consumer-0"
	if resume != nil {
		c.led.resume(*resume)
	}
	// The run's context bounds the consumer: when the run ends without closing it (a
	// simulated crash) or is cancelled, the connection is cut, as a crash would, and the
	// broker requeues every message not acknowledged.
	c.ctx, c.cancel = context.WithCancel(context.Background())
	context.AfterFunc(ctx, c.cancel)
	sess, err := c.connect()
	if err != nil {
		c.cancel()
		return nil, fmt.Errorf("amqp source: queue %q: %w", cfg.Queue, err)
	}
	go c.run(sess)
	return c, nil
}

// delivery is a message received and not yet returned by Next, with its channel generation.
type delivery struct {
	gen uint64
	d   amqp091.Delivery
}

// consumer is one source partition: a connection with one channel consuming the queue, run by
// a goroutine of its own, and the bookkeeping of what Next returned, owned by the worker.
//
// The deliveries of a session are read by one goroutine at a time, so that they stay in the
// broker's order (a multiple ack at a commit must cover no message of a later epoch). While the
// queue is quiet the consumer's goroutine waits on them; when one arrives it hands it, and the
// stream, to the worker (serveOwns false), and the worker's Next reads what follows directly,
// without a hop through the goroutine, until the stream runs dry; then it hands the stream back
// (serveOwns true, a signal on rearm).
type consumer[T any] struct {
	cfg       SourceConfig
	part      string
	decode    func(Message) (T, error)
	log       *slog.Logger
	onOp      func(string, ackOp, bool, error)
	onSession func(string, uint64)

	// The source lag (see the package doc): the messages this consumer holds unacknowledged
	// (held, set by the worker), plus, for the first consumer (countsWaiting), the messages
	// ready in the queue, which the consumer's goroutine reads every lagInterval.
	lag           dataflow.MetricsHook
	countsWaiting bool
	held          atomic.Int64

	// Owned by the worker (Next, Snapshot, Commit).
	led       ledger
	spare     []delivery
	told      bool      // the failure in err was returned to the engine
	hitLimit  bool      // the open epoch reached the prefetch limit
	limitHits int       // epochs that reached it since the last warning
	limitLog  time.Time // when the last warning was logged

	ctx    context.Context // cancelled by Close: cuts connections and dials
	cancel context.CancelFunc
	wake   chan struct{} // Wait: deliveries (or an error, or the idle end) arrived
	kick   chan struct{} // ops were queued for the goroutine
	rearm  chan struct{} // the worker handed the stream back to the goroutine
	done   chan struct{} // closed by Close
	exited chan struct{} // closed when the goroutine has ended
	once   sync.Once

	mu        sync.Mutex // guards the fields below, shared with the goroutine
	buf       []delivery
	ops       []ackOp
	gen       uint64 // the live channel generation; lower ones are dead
	err       error  // a failure that stops the flow
	idle      bool   // IdleExit reached
	stream    <-chan amqp091.Delivery
	streamGen uint64 // the generation of stream
	serveOwns bool   // the goroutine reads stream; else the worker does
}

// session is one connection and channel consuming the queue.
type session struct {
	gen        uint64
	conn       *amqp091.Connection
	ch         *amqp091.Channel
	deliveries <-chan amqp091.Delivery
	connClosed chan *amqp091.Error
	chClosed   chan *amqp091.Error
}

func (s *session) close() {
	s.conn.Close()
}

// connect opens a session of the live generation.
func (c *consumer[T]) connect() (*session, error) {
	conn, err := dialBroker(c.ctx, c.cfg.URL, fmt.Sprintf("epochflow %s %s", c.cfg.Queue, c.part), true)
	if err != nil {
		return nil, err
	}
	fail := func(what string, err error) (*session, error) {
		conn.Close()
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	ch, err := conn.Channel()
	if err != nil {
		return fail("opening a channel", err)
	}
	if d := c.cfg.Declare; d != nil {
		_, err = ch.QueueDeclare(c.cfg.Queue, d.Durable, d.AutoDelete, d.Exclusive, false, d.Args)
		if err != nil {
			return fail("declaring the queue", err)
		}
	} else if _, err = ch.QueueDeclarePassive(c.cfg.Queue, false, false, false, false, nil); err != nil {
		if isCode(err, amqp091.NotFound) {
			advice := "declare it"
			if n, ok := c.cfg.name("Declare"); ok {
				advice += ", or set " + n
			}
			return fail("the queue does not exist ("+advice+")", err)
		}
		return fail("checking the queue", err)
	}
	if err := ch.Qos(c.cfg.Prefetch, 0, false); err != nil {
		return fail(fmt.Sprintf("setting the prefetch count to %d", c.cfg.Prefetch), err)
	}
	s := &session{conn: conn, ch: ch,
		connClosed: conn.NotifyClose(make(chan *amqp091.Error, 1)),
		chClosed:   ch.NotifyClose(make(chan *amqp091.Error, 1)),
	}
	s.deliveries, err = ch.Consume(c.cfg.Queue, "", false, false, false, false, nil)
	if err != nil {
		return fail("starting the consumer", err)
	}
	c.mu.Lock()
	s.gen = c.gen
	c.mu.Unlock()
	if c.onSession != nil {
		c.onSession(c.part, s.gen)
	}
	return s, nil
}

func isCode(err error, code int) bool {
	var e *amqp091.Error
	return errors.As(err, &e) && e.Code == code
}

// fatal tells whether a failure is one that retrying will not cure: a refused login, a missing
// queue, a refused declaration, or an ack the broker did not accept (a bug). The broker's
// consumer_timeout (a 406 whose reason says the acknowledgement timed out) is not: the channel
// is gone, its messages are requeued, and a new channel carries on.
func fatal(err error) bool {
	var e *amqp091.Error
	if !errors.As(err, &e) {
		return false
	}
	if e.Code == amqp091.PreconditionFailed && strings.Contains(e.Reason, "timed out") {
		return false
	}
	switch e.Code {
	case amqp091.AccessRefused, amqp091.NotFound, amqp091.PreconditionFailed, amqp091.NotAllowed, amqp091.InvalidPath:
		return true
	}
	return false
}

// run is the consumer's goroutine: it serves the session, and when the session dies it
// declares its generation dead and reconnects with back-off, until Close.
func (c *consumer[T]) run(sess *session) {
	defer close(c.exited)
	defer c.cancel()
	backoff := c.cfg.ReconnectMin
	for {
		if c.ctx.Err() != nil {
			if sess != nil {
				sess.close()
			}
			return
		}
		if sess == nil {
			var err error
			sess, err = c.connect()
			if err != nil {
				if fatal(err) {
					c.fail(fmt.Errorf("reconnecting: %w", err))
					return
				}
				c.log.Warn("amqp source: reconnecting failed; retrying", "error", err, "in", backoff)
				t := time.NewTimer(backoff)
				select {
				case <-t.C:
				case <-c.done:
					t.Stop()
					return
				case <-c.ctx.Done():
					t.Stop()
					return
				}
				backoff = min(2*backoff, c.cfg.ReconnectMax)
				continue
			}
			c.log.Info("amqp source: reconnected", "generation", sess.gen)
			backoff = c.cfg.ReconnectMin
		}
		err := c.serve(sess)
		select {
		case <-c.done:
			c.closeSession(sess)
			return
		default:
		}
		sess.close()
		c.mu.Lock()
		c.gen++ // the dead channel's tags are dropped, never acked
		clear(c.buf)
		c.buf = c.buf[:0]
		c.mu.Unlock()
		sess = nil
		if fatal(err) {
			c.fail(err)
			return
		}
		if c.ctx.Err() != nil {
			return // the run ended without closing the source
		}
		c.log.Warn("amqp source: lost the connection or channel; its unacknowledged messages go back to the queue; reconnecting", "error", err)
	}
}

// closeSession ends a session gracefully, so that the acks sent before are processed.
func (c *consumer[T]) closeSession(s *session) {
	s.ch.Close()
	s.conn.Close()
}

// fail records a failure that stops the flow; Next, Commit and Close report it.
func (c *consumer[T]) fail(err error) {
	c.mu.Lock()
	if c.err == nil {
		c.err = fmt.Errorf("amqp source: queue %q: %w", c.cfg.Queue, err)
	}
	c.mu.Unlock()
	c.signal()
}

func (c *consumer[T]) signal() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// maxDrain bounds the deliveries one Next reads from the stream.
const maxDrain = 2048

// lagInterval is how often a consumer reports its lag (and the first one reads the queue's
// ready count for it).
const lagInterval = time.Second

// maxYields is how many times in a row Next lets the library's goroutines run without a new
// delivery before it hands the stream back to the consumer's goroutine: under load that turns
// one wake-up of the worker per message or two into one per batch, at no cost in latency when
// the queue is quiet (while yielding keeps bringing messages, Next keeps yielding).
const maxYields = 3

// serve consumes and acknowledges on one session until it dies (the error says why) or the
// consumer is closed (after the last queued acks were sent).
func (c *consumer[T]) serve(s *session) error {
	var idle *time.Timer
	var idleC <-chan time.Time
	last := time.Now()
	if c.cfg.IdleExit > 0 {
		idle = time.NewTimer(c.cfg.IdleExit)
		defer idle.Stop()
		idleC = idle.C
	}
	c.mu.Lock()
	c.stream, c.streamGen, c.serveOwns = s.deliveries, s.gen, true
	c.mu.Unlock()
	lagTick := time.NewTicker(lagInterval)
	defer lagTick.Stop()
	waiting := 0
	watch := s.deliveries // nil while the worker reads the stream
	for {
		select {
		case <-lagTick.C:
			if c.countsWaiting {
				q, err := c.inspect(s)
				if err != nil {
					if isCode(err, amqp091.NotFound) {
						c.fail(fmt.Errorf("the queue was deleted: %w", err))
						continue
					}
					return err
				}
				waiting = q.Messages
			}
			c.lag.SourceLag(c.part, float64(waiting)+float64(c.held.Load()))
		case d, ok := <-watch:
			if !ok {
				return c.closedWhy(s, "the broker cancelled the consumer")
			}
			c.mu.Lock()
			c.buf = append(c.buf, delivery{gen: s.gen, d: d})
			c.serveOwns = false
			wasIdle := c.idle
			c.idle = false // a message came after all: not the end
			c.mu.Unlock()
			watch = nil
			c.signal()
			if idle != nil {
				last = time.Now()
				if wasIdle {
					idle.Reset(c.cfg.IdleExit)
					idleC = idle.C
				}
			}
		case <-c.rearm:
			c.mu.Lock()
			if c.serveOwns && c.streamGen == s.gen {
				watch = s.deliveries
				last = time.Now() // the worker read until the stream ran dry, just now
			}
			c.mu.Unlock()
		case <-c.kick:
			if err := c.sendOps(s); err != nil {
				return err
			}
		case e := <-s.chClosed:
			return closeErr("the channel was closed", e)
		case e := <-s.connClosed:
			return closeErr("the connection was closed", e)
		case <-idleC:
			if watch == nil {
				// The worker holds the stream: deliveries are flowing (or wait for a
				// worker held up downstream), which is not idleness.
				idle.Reset(c.cfg.IdleExit)
				continue
			}
			if wait := c.cfg.IdleExit - time.Since(last); wait > 0 {
				idle.Reset(wait)
				continue
			}
			q, err := c.inspect(s)
			if err != nil {
				if isCode(err, amqp091.NotFound) {
					c.fail(fmt.Errorf("the queue was deleted: %w", err))
					idleC = nil
					continue
				}
				return err
			}
			if q.Messages > 0 {
				idle.Reset(c.cfg.IdleExit)
				continue
			}
			c.mu.Lock()
			c.idle = true
			c.mu.Unlock()
			c.signal()
			idleC = nil
		case <-c.done:
			return c.sendOps(s)
		}
	}
}

// inspect reads the queue's counts on a channel of its own (a failed passive declaration
// closes the channel it was sent on).
func (c *consumer[T]) inspect(s *session) (amqp091.Queue, error) {
	ch, err := s.conn.Channel()
	if err != nil {
		return amqp091.Queue{}, err
	}
	defer ch.Close()
	return ch.QueueDeclarePassive(c.cfg.Queue, false, false, false, false, nil)
}

// closedWhy waits briefly for the reason a session's deliveries stopped.
func (c *consumer[T]) closedWhy(s *session, what string) error {
	t := time.NewTimer(time.Second)
	defer t.Stop()
	select {
	case e := <-s.chClosed:
		return closeErr("the channel was closed", e)
	case e := <-s.connClosed:
		return closeErr("the connection was closed", e)
	case <-t.C:
		return errors.New(what)
	}
}

func closeErr(what string, e *amqp091.Error) error {
	if e == nil {
		return errors.New(what)
	}
	return fmt.Errorf("%s: %w", what, e)
}

// sendOps sends the queued acks and nacks of the session's generation, in order, and drops
// those of dead generations.
func (c *consumer[T]) sendOps(s *session) error {
	c.mu.Lock()
	ops := c.ops
	c.ops = nil
	c.mu.Unlock()
	for _, op := range ops {
		if op.gen != s.gen {
			if c.onOp != nil {
				c.onOp(c.part, op, false, nil)
			}
			continue
		}
		var err error
		if op.nack {
			err = s.ch.Nack(op.tag, false, false)
		} else {
			err = s.ch.Ack(op.tag, true)
		}
		if c.onOp != nil {
			c.onOp(c.part, op, true, err)
		}
		if err != nil {
			// The channel is gone: the broker requeues what these ops were for.
			return fmt.Errorf("acknowledging: %w", err)
		}
	}
	return nil
}

// Wait returns a channel that is ready when messages (or a failure, or the idle end) arrived.
func (c *consumer[T]) Wait() <-chan struct{} { return c.wake }

// Next returns the messages received since the last call, decoded. It never blocks.
func (c *consumer[T]) Next(context.Context) ([]T, error) {
	c.mu.Lock()
	buf := c.buf
	c.buf = c.spare[:0]
	err, idle, live := c.err, c.idle, c.gen
	stream, sgen, owns := c.stream, c.streamGen, !c.serveOwns
	c.mu.Unlock()
	defer func() {
		clear(buf)
		c.spare = buf[:0]
	}()
	if err != nil {
		c.told = true
		return nil, err
	}
	if owns {
		buf = c.drain(buf, stream, sgen)
	}
	c.led.setLive(live)
	var out []T
	if len(buf) > 0 {
		out = make([]T, 0, len(buf))
	}
	for i := range buf {
		d := &buf[i]
		if d.gen < live {
			continue // its channel died: the broker redelivers it
		}
		m := newMessage(c.cfg.Queue, c.part, &d.d)
		v, derr := c.decodeSafe(m)
		if derr != nil {
			if !c.cfg.DeadLetter {
				how := ""
				if n, ok := c.cfg.name("DeadLetter"); ok {
					how = " (" + n + ")"
				}
				return nil, dataflow.Permanent(fmt.Errorf("amqp source: queue %q: %s was rejected by the decode function, and no dead-lettering is configured%s: %w", c.cfg.Queue, m, how, derr))
			}
			c.log.Warn("amqp source: message rejected by the decode function; it goes to the queue's dead-letter exchange when its epoch commits",
				"message_id", m.MessageId, "routing_key", m.RoutingKey, "redelivered", m.Redelivered, "error", derr)
			if err := c.led.deliver(d.gen, d.d.DeliveryTag, true); err != nil {
				return nil, fmt.Errorf("amqp source: queue %q: %w", c.cfg.Queue, err)
			}
			continue
		}
		if err := c.led.deliver(d.gen, d.d.DeliveryTag, false); err != nil {
			return nil, fmt.Errorf("amqp source: queue %q: %w", c.cfg.Queue, err)
		}
		out = append(out, v)
	}
	c.held.Store(int64(c.led.outstanding()))
	if c.led.outstanding() >= c.cfg.Prefetch {
		c.atLimit()
	}
	if len(buf) == 0 && idle && !owns {
		return nil, io.EOF // the goroutine watches the stream, and nothing came
	}
	return out, nil
}

// drain appends to buf the deliveries waiting on stream (of generation gen), which the worker
// reads while it holds it, and hands the stream back to the consumer's goroutine once it is
// dry (after maxYields yields that brought nothing) or closed. After maxDrain deliveries it
// keeps the stream and signals Wait, to be called again.
func (c *consumer[T]) drain(buf []delivery, stream <-chan amqp091.Delivery, gen uint64) []delivery {
	yields, n := 0, 0
	for n < maxDrain {
		select {
		case d, ok := <-stream:
			if !ok {
				c.giveBack(gen)
				return buf
			}
			buf = append(buf, delivery{gen: gen, d: d})
			n++
			yields = 0
		default:
			if yields == maxYields {
				c.giveBack(gen)
				return buf
			}
			yields++
			runtime.Gosched()
		}
	}
	c.signal()
	return buf
}

// giveBack hands the stream of generation gen back to the consumer's goroutine, unless a new
// session has replaced it.
func (c *consumer[T]) giveBack(gen uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.streamGen != gen || c.serveOwns {
		return
	}
	c.serveOwns = true
	select {
	case c.rearm <- struct{}{}:
	default:
	}
}

// decodeSafe calls decode, turning a panic into an error.
func (c *consumer[T]) decodeSafe(m Message) (v T, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("decode panicked: %v", p)
		}
	}()
	return c.decode(m)
}

// atLimit notes that the open epoch holds as many messages as the prefetch allows, and says so
// in the log at most once a minute.
func (c *consumer[T]) atLimit() {
	if c.hitLimit {
		return
	}
	c.hitLimit = true
	c.limitHits++
	if now := time.Now(); now.Sub(c.limitLog) >= time.Minute {
		c.log.Warn("amqp source: the consumer holds as many unacknowledged messages as its prefetch allows; the broker sends no more until an epoch commits, so throughput is bounded by the prefetch per commit interval: raise "+c.cfg.fieldName("Prefetch")+" (at most 65535), add consumers or shorten the epoch interval",
			"prefetch", c.cfg.Prefetch, "epochs_at_limit", c.limitHits)
		c.limitLog = now
		c.limitHits = 0
	}
}

// Snapshot closes the open epoch in memory and returns its sequence number.
func (c *consumer[T]) Snapshot() uint64 {
	c.hitLimit = false
	return c.led.snapshot()
}

// Commit hands the acks and nacks of every epoch up to seq to the consumer's goroutine, which
// sends them on the channel that delivered the messages, if it is still open. It returns at
// once.
func (c *consumer[T]) Commit(_ context.Context, seq uint64) error {
	ops, err := c.led.commit(seq)
	if err != nil {
		return fmt.Errorf("amqp source: queue %q: %w", c.cfg.Queue, err)
	}
	c.held.Store(int64(c.led.outstanding()))
	c.mu.Lock()
	ferr := c.err
	c.ops = append(c.ops, ops...)
	c.mu.Unlock()
	if ferr != nil {
		c.told = true
		return ferr
	}
	if len(ops) > 0 {
		select {
		case c.kick <- struct{}{}:
		default:
		}
	}
	return nil
}

// Close sends the acks of the last Commit, closes the channel and the connection (the broker
// requeues every message not acknowledged) and ends the goroutine. It returns the failure that
// stopped the consumer, unless Next or Commit already returned it.
func (c *consumer[T]) Close() error {
	c.once.Do(func() {
		close(c.done)
		t := time.NewTimer(closeGrace)
		select {
		case <-c.exited:
		case <-t.C:
			c.cancel() // cut the connection: the broker requeues what is unacked
			<-c.exited
		}
		t.Stop()
		c.cancel()
	})
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.told {
		return nil
	}
	return c.err
}
