package nats

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/epochflow/epochflow/dataflow"
)

// Defaults of SourceConfig.
const (
	// DefaultMaxInFlight is the in-flight cap of a queue-mode partition when
	// SourceConfig.MaxInFlight is 0: the MaxAckPending of the consumers the source creates,
	// and the least it expects of existing ones.
	DefaultMaxInFlight = 20000
	// DefaultMinAckWait is the least AckWait of a consumer the source creates; it uses four
	// epoch intervals when that is more.
	DefaultMinAckWait = 30 * time.Second
	// DefaultPullBatch is how many messages one pull request asks for.
	DefaultPullBatch = 500
)

const (
	ackTimeout = 5 * time.Second  // one ack-all request
	apiTimeout = 10 * time.Second // one JetStream API call
	closeGrace = 10 * time.Second // Close's wait for the last ack-all
)

// SourceConfig says which consumers of which stream a queue-mode source reads, and how.
type SourceConfig struct {
	// URL is the server's URL (nats://HOST:PORT, or several separated by commas); empty means
	// nats.DefaultURL (nats://127.0.0.1:4222).
	URL string
	// Options are extra connection options (credentials, TLS, a name).
	Options []natsgo.Option
	// Stream is the stream to read: interest retention (or limits, where acknowledging removes
	// nothing). Required. Work-queue streams are refused: see the package documentation.
	Stream string
	// Consumers are the durable pull consumers to read, one source partition each (the
	// partition keys are these names). Required. Each must have AckPolicy "all" and must be
	// read by this flow only (an ack-all by another client would acknowledge this flow's
	// messages). Several consumers of a work-queue stream need disjoint filter subjects.
	Consumers []string
	// Create, if set, creates a consumer that does not exist, with AckPolicy "all",
	// DeliverPolicy "all", the AckWait and MaxAckPending below and the filter subject of
	// Filters.
	Create bool
	// Filters gives the filter subject of a consumer that Create creates (by consumer name);
	// a consumer without one reads the whole stream.
	Filters map[string]string
	// EpochInterval is the epoch interval to size AckWait and to check the consumers against;
	// 0 means the run's (dataflow.Options.EpochInterval, as dataflow.EpochInterval tells
	// Build), or dataflow.DefaultEpochInterval outside a run.
	EpochInterval time.Duration
	// AckWait is the AckWait of the consumers Create creates; 0 means the larger of
	// DefaultMinAckWait and four epoch intervals. A message held longer than its AckWait
	// minus a margin (an epoch not yet committed, or a commit whose ack-all cannot reach it
	// yet) is kept alive with in-progress signals, so a short AckWait costs traffic, not
	// redeliveries.
	AckWait time.Duration
	// MaxInFlight is the in-flight cap of each partition: the MaxAckPending of the consumers
	// Create creates, and the least an existing consumer should have (the source warns when
	// it has less). A consumer holds every message of the open epoch and of the epochs not yet
	// committed: size it to at least the rate of one consumer times two epoch intervals. When
	// the server's MaxAckPending is reached it sends nothing more until a commit acks, and the
	// source says so in the log (at most once a minute). 0 means DefaultMaxInFlight.
	MaxInFlight int
	// PullBatch is how many messages one pull request asks for; 0 means DefaultPullBatch.
	PullBatch int
	// IdleExit, if positive, ends each partition (io.EOF) once no message has arrived for
	// this long and the server reports nothing more for it (no message pending delivery and
	// none delivered that the partition does not hold): for drains and backfills.
	IdleExit time.Duration
	// Logger receives the source's logs; nil means the run's logger (dataflow.Logger).
	Logger *slog.Logger
}

// check validates the config and fills in its defaults; run is the run's epoch interval (0
// when unknown), which an unset EpochInterval takes.
func (c *SourceConfig) check(run time.Duration) error {
	if c.Stream == "" {
		return errors.New("nats source: SourceConfig.Stream is empty")
	}
	if len(c.Consumers) == 0 {
		return fmt.Errorf("nats source: stream %q: SourceConfig.Consumers is empty", c.Stream)
	}
	for _, n := range c.Consumers {
		if n == "" || strings.ContainsAny(n, ".*> \t") {
			return fmt.Errorf("nats source: stream %q: consumer name %q in SourceConfig.Consumers is not a valid durable name", c.Stream, n)
		}
	}
	if c.URL == "" {
		c.URL = natsgo.DefaultURL
	}
	if c.EpochInterval <= 0 {
		c.EpochInterval = run
	}
	if c.EpochInterval <= 0 {
		c.EpochInterval = dataflow.DefaultEpochInterval
	}
	if c.AckWait < 0 || c.MaxInFlight < 0 || c.PullBatch < 0 || c.IdleExit < 0 {
		return fmt.Errorf("nats source: stream %q: SourceConfig.AckWait, MaxInFlight, PullBatch and IdleExit must not be negative", c.Stream)
	}
	if c.AckWait == 0 {
		c.AckWait = max(DefaultMinAckWait, 4*c.EpochInterval)
	}
	if c.MaxInFlight == 0 {
		c.MaxInFlight = DefaultMaxInFlight
	}
	if c.PullBatch == 0 {
		c.PullBatch = DefaultPullBatch
	}
	c.PullBatch = min(c.PullBatch, c.MaxInFlight)
	return nil
}

// Consume returns a queue-mode source of the messages of cfg.Consumers. See the package
// documentation for its partitions, state, commit behaviour and delivery guarantee.
func Consume(cfg SourceConfig) dataflow.Source[Message] {
	return dataflow.FromPartitioned[Message, QueueState](NewSource[Message](cfg, nil))
}

// ConsumeDecoded is Consume with each message turned into T by decode. A message decode
// rejects stops the flow with an error naming it (JetStream has no dead-letter of its own).
func ConsumeDecoded[T any](cfg SourceConfig, decode func(Message) (T, error)) dataflow.Source[T] {
	return dataflow.FromPartitioned[T, QueueState](NewSource(cfg, decode))
}

// Source is the dataflow.PartitionedSource behind Consume: one partition per durable
// consumer, with a QueueState each.
type Source[T any] struct {
	cfg    SourceConfig
	decode func(Message) (T, error)

	// Test hooks, called from a partition's goroutine: onAck after every ack-all the server
	// confirmed (its stream sequence), onKeepAlive after every keep-alive round that sent
	// something (the in-progress signals it sent, all in one flush).
	onAck       func(part string, seq uint64)
	onKeepAlive func(part string, n int)
	// onStart, if set, is called by Build once it has read the consumer's state.
	onStart func(part string)
}

// NewSource returns the source of ConsumeDecoded (decode nil means the identity, for T =
// Message).
func NewSource[T any](cfg SourceConfig, decode func(Message) (T, error)) *Source[T] {
	if decode == nil {
		decode = func(m Message) (T, error) {
			v, ok := any(m).(T)
			if !ok {
				var zero T
				return zero, fmt.Errorf("nats source: no decode function to turn a Message into %T", zero)
			}
			return v, nil
		}
	}
	return &Source[T]{cfg: cfg, decode: decode}
}

// Parts returns the consumer names of SourceConfig.Consumers.
func (s *Source[T]) Parts(ctx context.Context) ([]string, error) {
	cfg := s.cfg
	if err := cfg.check(dataflow.EpochInterval(ctx)); err != nil {
		return nil, err
	}
	return append([]string(nil), cfg.Consumers...), nil
}

// Build connects the partition of consumer part: it connects, looks the consumer up (creating
// it if SourceConfig.Create), checks it and starts pulling. Failing any of that fails the run.
func (s *Source[T]) Build(ctx context.Context, part string, resume *QueueState) (dataflow.StatefulSource[T, QueueState], error) {
	cfg := s.cfg
	if err := cfg.check(dataflow.EpochInterval(ctx)); err != nil {
		return nil, err
	}
	logger := cfg.Logger
	if logger == nil {
		logger = dataflow.Logger(ctx)
	}
	c := &queuePart[T]{
		cfg: cfg, name: part, decode: s.decode,
		log:         logger.With("stream", cfg.Stream, "consumer", part),
		onAck:       s.onAck,
		onKeepAlive: s.onKeepAlive,
		led:         newLedger(resume),
		wake:        make(chan struct{}, 1),
		kick:        make(chan struct{}, 1),
		done:        make(chan struct{}),
		last:        time.Now(),
		metrics:     dataflow.Metrics(ctx),
	}
	wrap := func(what string, err error) error {
		return fmt.Errorf("nats source: stream %q, consumer %q: %s: %w", cfg.Stream, part, what, err)
	}
	nc, err := natsgo.Connect(cfg.URL, append([]natsgo.Option{natsgo.Name("epochflow " + cfg.Stream + " " + part), natsgo.MaxReconnects(-1)}, cfg.Options...)...)
	if err != nil {
		return nil, wrap("connecting to "+redact(cfg.URL), err)
	}
	c.nc = nc
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, wrap("opening JetStream", err)
	}
	actx, cancel := context.WithTimeout(ctx, apiTimeout)
	defer cancel()
	stream, err := js.Stream(actx, cfg.Stream)
	if err != nil {
		nc.Close()
		return nil, wrap("looking the stream up", err)
	}
	if stream.CachedInfo().Config.Retention == jetstream.WorkQueuePolicy {
		nc.Close()
		return nil, wrap("checking the stream", errors.New("it has work-queue retention, and the server refuses AckPolicy all on work-queue streams (error 10098), so one ack-all per commit is impossible: use interest retention (a message is removed once the consumers acknowledged it, as in a work queue), or read a limits stream with ReadLog"))
	}
	cons, err := stream.Consumer(actx, part)
	if errors.Is(err, jetstream.ErrConsumerNotFound) && cfg.Create {
		cons, err = stream.CreateConsumer(actx, jetstream.ConsumerConfig{
			Durable:       part,
			AckPolicy:     jetstream.AckAllPolicy,
			DeliverPolicy: jetstream.DeliverAllPolicy,
			AckWait:       cfg.AckWait,
			MaxAckPending: cfg.MaxInFlight,
			MaxDeliver:    -1,
			FilterSubject: cfg.Filters[part],
		})
		if err != nil {
			nc.Close()
			return nil, wrap("creating the consumer", err)
		}
	} else if err != nil {
		nc.Close()
		if errors.Is(err, jetstream.ErrConsumerNotFound) {
			return nil, wrap("the consumer does not exist (create it with AckPolicy all, or set SourceConfig.Create)", err)
		}
		return nil, wrap("looking the consumer up", err)
	}
	info := cons.CachedInfo()
	if err := c.checkConsumer(info); err != nil {
		nc.Close()
		return nil, wrap("checking the consumer", err)
	}
	c.led.start(info.AckFloor.Stream, info.Delivered.Stream, info.NumAckPending)
	if s.onStart != nil {
		s.onStart(part)
	}
	if info.NumAckPending > 0 {
		c.log.Info("nats source: the consumer has messages delivered before and not acknowledged; no ack-all passes its ack floor until the server has redelivered them all (within its AckWait)",
			"pending", info.NumAckPending, "ack_floor", info.AckFloor.Stream, "ack_wait", info.Config.AckWait)
	}
	c.cons = cons
	c.it, err = cons.Messages(jetstream.PullMaxMessages(cfg.PullBatch))
	if err != nil {
		nc.Close()
		return nil, wrap("starting to pull", err)
	}
	// The run's context bounds the partition: when the run ends without closing it (a
	// simulated crash) or is cancelled, the connection is cut as a crash would cut it, and
	// nothing more is acknowledged.
	c.ctx, c.cancel = context.WithCancel(context.Background())
	stop := context.AfterFunc(ctx, c.cancel)
	c.wg.Add(2)
	go c.pull()
	go c.manage(stop)
	return c, nil
}

// checkConsumer refuses a consumer whose acknowledgements would not be per epoch, and warns
// about limits that cannot hold an epoch.
func (c *queuePart[T]) checkConsumer(info *jetstream.ConsumerInfo) error {
	cc := info.Config
	if cc.AckPolicy != jetstream.AckAllPolicy {
		return fmt.Errorf("its AckPolicy is %q; the source needs \"all\" (one ack-all per commit): create the consumer with AckPolicy all", cc.AckPolicy)
	}
	if cc.DeliverSubject != "" {
		return errors.New("it is a push consumer; the source needs a pull consumer")
	}
	c.ackWait = cc.AckWait
	if c.ackWait <= 0 {
		c.ackWait = 30 * time.Second
	}
	c.maxPending = cc.MaxAckPending
	if c.maxPending > 0 && c.maxPending < c.cfg.MaxInFlight {
		c.log.Warn("nats source: the consumer's MaxAckPending is below SourceConfig.MaxInFlight: the server stops delivering, without an error, once that many messages wait for their epoch to commit (its default of 1000 bounds a flow to 1000 messages per commit interval); raise it with a consumer update",
			"max_ack_pending", c.maxPending, "max_in_flight", c.cfg.MaxInFlight)
	}
	if c.ackWait < 2*c.cfg.EpochInterval {
		c.log.Warn("nats source: the consumer's AckWait cannot hold an epoch (it is shorter than two epoch intervals): messages of open and uncommitted epochs are kept alive with in-progress signals, which costs a signal per held message every AckWait/4; raise AckWait with a consumer update to at least four epoch intervals",
			"ack_wait", c.ackWait, "epoch_interval", c.cfg.EpochInterval, "want_ack_wait", 4*c.cfg.EpochInterval)
	}
	if cc.MaxDeliver > 0 {
		c.log.Warn("nats source: the consumer has MaxDeliver set: a message the server gave up on is never read again, whatever its epoch", "max_deliver", cc.MaxDeliver)
	}
	return nil
}

// queuePart is one queue-mode partition: a connection pulling from one durable consumer, with
// two goroutines (pull: the messages into buf; manage: ack-alls, keep-alive and the idle
// check) and the ledger, shared under mu.
type queuePart[T any] struct {
	cfg         SourceConfig
	name        string
	decode      func(Message) (T, error)
	log         *slog.Logger
	onAck       func(string, uint64)
	onKeepAlive func(string, int)

	nc         *natsgo.Conn
	cons       jetstream.Consumer
	it         jetstream.MessagesContext
	ackWait    time.Duration
	maxPending int

	// Owned by the worker.
	told bool

	// Owned by the manager goroutine.
	limitLog  time.Time
	limitHits int
	lastCheck time.Time
	metrics   dataflow.MetricsHook // reportLag's

	ctx    context.Context
	cancel context.CancelFunc
	wake   chan struct{} // Wait
	kick   chan struct{} // an ack-all was queued
	done   chan struct{} // closed by Close
	once   sync.Once
	wg     sync.WaitGroup

	mu     sync.Mutex
	led    *ledger
	buf    []pulled  // pulled and not yet returned by Next (kept alive as well)
	last   time.Time // when the last message arrived
	target ackTarget // the ack-all to send (seq 0: none)
	err    error
	idle   bool
}

// pulled is a message pulled and not yet returned by Next, with the time its AckWait runs out.
type pulled struct {
	m   jetstream.Msg
	due time.Time
}

func (c *queuePart[T]) signal() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

func (c *queuePart[T]) fail(err error) {
	c.mu.Lock()
	if c.err == nil {
		c.err = fmt.Errorf("nats source: stream %q, consumer %q: %w", c.cfg.Stream, c.name, err)
	}
	c.mu.Unlock()
	c.signal()
}

// pull reads the pulled messages into buf until the iterator is stopped.
func (c *queuePart[T]) pull() {
	defer c.wg.Done()
	for {
		m, err := c.it.Next(jetstream.NextContext(c.ctx))
		if err != nil {
			if errors.Is(err, jetstream.ErrMsgIteratorClosed) || c.ctx.Err() != nil {
				return
			}
			if errors.Is(err, jetstream.ErrConsumerDeleted) || errors.Is(err, jetstream.ErrConsumerNotFound) {
				c.fail(fmt.Errorf("the consumer is gone: %w", err))
				return
			}
			// Missed heartbeats and the like: the iterator carries on (it reconnects).
			c.log.Warn("nats source: pulling", "error", err)
			continue
		}
		now := time.Now()
		c.mu.Lock()
		// The server's AckWait started when it sent the message, a little before now.
		c.buf = append(c.buf, pulled{m: m, due: now.Add(c.ackWait - c.keepAliveTick())})
		c.last = now
		c.idle = false
		c.mu.Unlock()
		c.signal()
	}
}

// keepAliveTick is how often the keep-alive round runs: a quarter of AckWait, within bounds.
func (c *queuePart[T]) keepAliveTick() time.Duration {
	return min(max(c.ackWait/4, 20*time.Millisecond), 5*time.Second)
}

// manage sends the ack-alls, keeps held messages alive and checks for the idle end, until
// Close (after the last ack-all, for up to closeGrace) or the end of the run.
func (c *queuePart[T]) manage(stop func() bool) {
	defer c.wg.Done()
	defer func() {
		stop()
		c.it.Stop()
		c.cancel()
		c.nc.Close()
	}()
	tick := time.NewTicker(c.keepAliveTick())
	defer tick.Stop()
	lagTick := time.NewTicker(lagInterval)
	defer lagTick.Stop()
	var replies []string
	for {
		select {
		case <-c.kick:
			c.sendAck(c.ctx)
		case <-tick.C:
			c.sendAck(c.ctx)
			replies = c.keepAlive(replies[:0])
			c.limitCheck()
			c.pendingCheck()
		case <-lagTick.C:
			c.reportLag()
		case <-c.done:
			ctx, cancel := context.WithTimeout(c.ctx, closeGrace)
			for c.sendAck(ctx) && ctx.Err() == nil {
				select {
				case <-ctx.Done():
				case <-time.After(50 * time.Millisecond):
				}
			}
			cancel()
			return
		case <-c.ctx.Done():
			return
		}
	}
}

// sendAck sends the queued ack-all as a request and waits for the server's confirmation. It
// reports whether one is still to be sent (it failed, and is retried at the next round).
func (c *queuePart[T]) sendAck(ctx context.Context) bool {
	c.mu.Lock()
	t := c.target
	c.mu.Unlock()
	if t.seq == 0 {
		return false
	}
	rctx, cancel := context.WithTimeout(ctx, ackTimeout)
	_, err := c.nc.RequestWithContext(rctx, t.reply, []byte("+ACK"))
	cancel()
	if err != nil {
		if ctx.Err() == nil {
			c.log.Warn("nats source: the ack-all was not confirmed; retrying", "sequence", t.seq, "error", err)
		}
		return true
	}
	c.mu.Lock()
	if c.target == t {
		c.target = ackTarget{}
	}
	more := c.target.seq != 0
	c.mu.Unlock()
	if c.onAck != nil {
		c.onAck(c.name, t.seq)
	}
	return more
}

// keepAlive sends an in-progress signal for every held message whose AckWait runs out within
// half of it, all in one flush.
func (c *queuePart[T]) keepAlive(replies []string) []string {
	now := time.Now()
	c.mu.Lock()
	soon, next := now.Add(c.ackWait/2), now.Add(c.ackWait)
	replies = c.led.due(soon, next, replies)
	for i := range c.buf {
		if p := &c.buf[i]; p.due.Before(soon) {
			replies = append(replies, p.m.Reply())
			p.due = next
		}
	}
	c.mu.Unlock()
	if len(replies) == 0 {
		return replies
	}
	for _, r := range replies {
		if err := c.nc.Publish(r, []byte("+WPI")); err != nil {
			c.log.Warn("nats source: sending in-progress signals", "error", err)
			return replies
		}
	}
	if err := c.nc.FlushTimeout(ackTimeout); err != nil {
		c.log.Warn("nats source: flushing in-progress signals", "error", err)
	}
	if c.onKeepAlive != nil {
		c.onKeepAlive(c.name, len(replies))
	}
	return replies
}

// limitCheck warns (at most once a minute) when the partition holds as many messages as the
// consumer's MaxAckPending: the server then sends nothing more, without an error, until a
// commit acknowledges some.
func (c *queuePart[T]) limitCheck() {
	if c.maxPending <= 0 {
		return
	}
	c.mu.Lock()
	holding := len(c.led.held) + len(c.buf)
	c.mu.Unlock()
	if holding < c.maxPending {
		return
	}
	c.limitHits++
	if now := time.Now(); now.Sub(c.limitLog) >= time.Minute {
		c.log.Warn("nats source: the partition holds as many messages as the consumer's MaxAckPending: the server sends no more until an epoch commits, so throughput is bounded by MaxAckPending per commit interval: raise MaxAckPending or shorten the epoch interval",
			"max_ack_pending", c.maxPending, "rounds_at_limit", c.limitHits)
		c.limitLog, c.limitHits = now, 0
	}
}

// pendingCheck reads the consumer's counts (at most once a second) while the partition is
// quiet for IdleExit or while pending messages of an earlier run are unseen. When the server
// counts no pending message the partition does not hold (and no ack-all was decided meanwhile),
// none of those is left: a message the stream dropped (a limit) is never redelivered, and
// waiting for it would hold every ack-all back for good. With nothing pending delivery either,
// a quiet partition has reached its idle end (Next returns io.EOF).
func (c *queuePart[T]) pendingCheck() {
	c.mu.Lock()
	quiet := c.cfg.IdleExit > 0 && time.Since(c.last) >= c.cfg.IdleExit && len(c.buf) == 0 && !c.idle
	old := c.led.oldLeft > 0
	if !quiet && !old || time.Since(c.lastCheck) < time.Second {
		c.mu.Unlock()
		return
	}
	count, acked := c.led.known(c.pulledSeqs()), c.led.acked
	c.mu.Unlock()
	c.lastCheck = time.Now()
	ctx, cancel := context.WithTimeout(c.ctx, apiTimeout)
	info, err := c.cons.Info(ctx)
	cancel()
	if err != nil {
		c.log.Warn("nats source: reading the consumer's state", "error", err)
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	known := c.led.acked == acked && info.NumAckPending <= count
	if known && c.led.oldLeft > 0 {
		// Those pulled and not yet returned by Next are not gone: they count until accepted.
		if gone := c.led.settleOld(c.pulledSeqs()); gone > 0 {
			c.log.Info("nats source: the server holds no other pending message for the consumer: the pending messages of an earlier run that did not come back are gone from the stream",
				"missing", gone)
		}
	}
	if quiet && known && info.NumPending == 0 && time.Since(c.last) >= c.cfg.IdleExit && len(c.buf) == 0 {
		c.idle = true
		c.signal()
	}
}

// pulledSeqs returns the stream sequences of the messages pulled and not yet returned by Next
// (those without JetStream metadata, which Next refuses, left out). Called with mu held.
func (c *queuePart[T]) pulledSeqs() []uint64 {
	seqs := make([]uint64, 0, len(c.buf))
	for _, p := range c.buf {
		if md, err := p.m.Metadata(); err == nil {
			seqs = append(seqs, md.Sequence.Stream)
		}
	}
	return seqs
}

// reportLag reports, every lagInterval, the consumer's backlog as its
// epochflow_source_lag: the messages the server has not delivered to it yet (NumPending) plus
// those delivered and not acknowledged (NumAckPending: held by open or uncommitted epochs), as
// the consumer's info tells. A failed lookup keeps the last value.
func (c *queuePart[T]) reportLag() {
	ctx, cancel := context.WithTimeout(c.ctx, apiTimeout)
	info, err := c.cons.Info(ctx)
	cancel()
	if err != nil {
		return
	}
	c.metrics.SourceLag(c.name, float64(info.NumPending)+float64(info.NumAckPending))
}

// lagInterval is how often a partition reports its lag.
const lagInterval = time.Second

// Wait returns a channel that is ready when messages (or a failure, or the idle end) arrived.
func (c *queuePart[T]) Wait() <-chan struct{} { return c.wake }

// Next returns the messages pulled since the last call, less the redeliveries the ledger
// drops, decoded. It never blocks.
func (c *queuePart[T]) Next(context.Context) ([]T, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		c.told = true
		return nil, c.err
	}
	buf := c.buf
	c.buf = nil
	if len(buf) == 0 && c.idle {
		return nil, io.EOF
	}
	var out []T
	for _, p := range buf {
		m := p.m
		md, err := m.Metadata()
		if err != nil {
			return nil, fmt.Errorf("nats source: stream %q, consumer %q: a message without JetStream metadata (reply %q): %w", c.cfg.Stream, c.name, m.Reply(), err)
		}
		if !c.led.accept(md.Sequence.Stream, m.Reply(), p.due) {
			continue
		}
		msg := Message{Stream: md.Stream, Consumer: md.Consumer, Subject: m.Subject(), Data: m.Data(), Header: m.Headers(),
			Sequence: md.Sequence.Stream, NumDelivered: md.NumDelivered, Timestamp: md.Timestamp}
		v, err := decodeSafe(c.decode, msg)
		if err != nil {
			return nil, dataflow.Permanent(fmt.Errorf("nats source: stream %q, consumer %q: %s was rejected by the decode function: %w", c.cfg.Stream, c.name, msg, err))
		}
		out = append(out, v)
	}
	return out, nil
}

func decodeSafe[T any](decode func(Message) (T, error), m Message) (v T, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("decode panicked: %v", p)
		}
	}()
	return decode(m)
}

// Snapshot closes the open epoch and returns its state.
func (c *queuePart[T]) Snapshot() QueueState {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.led.snapshot()
}

// Commit marks the epochs up to st committed and hands the ack-all they allow to the
// partition's goroutine, which sends it as a request and retries until the server confirms
// it. It returns at once.
func (c *queuePart[T]) Commit(_ context.Context, st QueueState) error {
	c.mu.Lock()
	t, ok := c.led.commit(st)
	if ok {
		c.target = t
	}
	err := c.err
	c.mu.Unlock()
	if err != nil {
		c.told = true
		return err
	}
	if ok {
		select {
		case c.kick <- struct{}{}:
		default:
		}
	}
	return nil
}

// Close sends the last queued ack-all (waiting up to 10 s for its confirmation), stops pulling,
// closes the connection and ends the goroutines. Messages not acknowledged stay pending on the
// consumer and are redelivered after their AckWait. It returns the failure that stopped the
// partition, unless Next or Commit already returned it.
func (c *queuePart[T]) Close() error {
	c.once.Do(func() {
		close(c.done)
		c.wg.Wait()
	})
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.told {
		return nil
	}
	return c.err
}

// redact returns the URL list without passwords, for errors and logs.
func redact(raw string) string {
	parts := strings.Split(raw, ",")
	for i, p := range parts {
		if at := strings.LastIndex(p, "@"); at >= 0 {
			if s := strings.Index(p, "://"); s >= 0 && s < at {
				parts[i] = p[:s+3] + "REDACTED" + p[at:]
			} else {
				parts[i] = "REDACTED" + p[at:]
			}
		}
	}
	return strings.Join(parts, ",")
}
