package amqp

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/epochflow/epochflow/dataflow"
)

// Defaults of SinkConfig.
const (
	// DefaultMaxUnconfirmed is how many messages a publisher may have sent and not yet seen
	// confirmed before Write waits for confirms, when SinkConfig.MaxUnconfirmed is 0.
	DefaultMaxUnconfirmed = 4096
	// DefaultConfirmTimeout bounds the wait for confirms when SinkConfig.ConfirmTimeout is 0.
	DefaultConfirmTimeout = time.Minute
)

// Outgoing is a message for the sink to publish: the exchange ("" is the default exchange,
// which routes to the queue named by the routing key), the routing key, and the message
// with its properties (set DeliveryMode to amqp091.Persistent for messages that must survive
// a broker restart).
type Outgoing struct {
	Exchange   string
	RoutingKey string
	Msg        amqp091.Publishing
}

// SinkConfig says where a sink publishes and how.
type SinkConfig struct {
	// URL is the broker's AMQP URI, as in SourceConfig; empty means DefaultURL.
	URL string
	// Publishers is the number of sink partitions ("publisher-0" ...), each with its own
	// connection and channel; 0 means one per worker. A message goes to the partition
	// picked by a hash of its exchange and routing key, so messages with the same exchange and
	// routing key keep their order.
	Publishers int
	// AllowUnroutable publishes without the mandatory flag: a message that no queue is bound
	// to receive is then dropped by the broker. By default messages are mandatory, and one
	// that comes back unroutable fails the flow with an error naming its exchange and routing
	// key.
	AllowUnroutable bool
	// MaxUnconfirmed bounds the messages published and not yet confirmed; 0 means
	// DefaultMaxUnconfirmed.
	MaxUnconfirmed int
	// ConfirmTimeout bounds the wait for the broker's confirms in Write and Snapshot, and the
	// time spent reconnecting after a lost connection; 0 means DefaultConfirmTimeout.
	ConfirmTimeout time.Duration
	// ReconnectMin and ReconnectMax bound the back-off between reconnection attempts after a
	// lost connection or channel; 0 means DefaultReconnectMin and DefaultReconnectMax.
	ReconnectMin, ReconnectMax time.Duration
}

func (c *SinkConfig) check() error {
	if c.URL == "" {
		c.URL = DefaultURL
	}
	if _, err := amqp091.ParseURI(c.URL); err != nil {
		return fmt.Errorf("amqp sink: SinkConfig.URL %s: %w", redact(c.URL), err)
	}
	if c.Publishers < 0 {
		return fmt.Errorf("amqp sink: SinkConfig.Publishers is %d, want 0 (one per worker) or more", c.Publishers)
	}
	if c.MaxUnconfirmed < 0 {
		return fmt.Errorf("amqp sink: SinkConfig.MaxUnconfirmed is %d, want 0 (the default) or more", c.MaxUnconfirmed)
	}
	if c.MaxUnconfirmed == 0 {
		c.MaxUnconfirmed = DefaultMaxUnconfirmed
	}
	if c.ConfirmTimeout < 0 {
		return fmt.Errorf("amqp sink: SinkConfig.ConfirmTimeout is %v, want 0 (the default) or more", c.ConfirmTimeout)
	}
	if c.ConfirmTimeout == 0 {
		c.ConfirmTimeout = DefaultConfirmTimeout
	}
	if c.ReconnectMin < 0 || c.ReconnectMax < 0 {
		return fmt.Errorf("amqp sink: SinkConfig.ReconnectMin and ReconnectMax must not be negative")
	}
	if c.ReconnectMin == 0 {
		c.ReconnectMin = DefaultReconnectMin
	}
	if c.ReconnectMax == 0 {
		c.ReconnectMax = DefaultReconnectMax
	}
	c.ReconnectMax = max(c.ReconnectMax, c.ReconnectMin)
	return nil
}

// Publish returns a sink that publishes every Outgoing item with publisher confirms. See the
// package documentation for its partitions, state and delivery guarantee.
func Publish(cfg SinkConfig) dataflow.Sink[Outgoing] {
	return dataflow.ToPartitioned[Outgoing, uint64](NewSink(cfg, func(o Outgoing) (Outgoing, error) { return o, nil }))
}

// PublishEncoded returns a sink that publishes encode(item) for every item. An item encode
// rejects stops the flow with an error naming the item. encode must be a pure function: it may
// be called more than once per item (once to pick the partition, once to publish).
func PublishEncoded[T any](cfg SinkConfig, encode func(T) (Outgoing, error)) dataflow.Sink[T] {
	return dataflow.ToPartitioned[T, uint64](NewSink(cfg, encode))
}

// Sink is the dataflow.PartitionedSink behind Publish and PublishEncoded. Its partitions are
// publishers; their state is the number of messages they published and saw confirmed (a
// uint64, for information: nothing is resumed from it).
type Sink[T any] struct {
	cfg    SinkConfig
	encode func(T) (Outgoing, error)
}

// NewSink returns the sink of PublishEncoded.
func NewSink[T any](cfg SinkConfig, encode func(T) (Outgoing, error)) *Sink[T] {
	return &Sink[T]{cfg: cfg, encode: encode}
}

// ConsumerPartitions tells the engine that the partitions are publishers whose state is only
// a counter, so a run may resume with fewer of them.
func (s *Sink[T]) ConsumerPartitions() {}

// Parts returns "publisher-0" ... "publisher-(n-1)", n being SinkConfig.Publishers or, when it
// is 0, the number of workers of the run.
func (s *Sink[T]) Parts(ctx context.Context) ([]string, error) {
	cfg := s.cfg
	if err := cfg.check(); err != nil {
		return nil, err
	}
	if s.encode == nil {
		return nil, errors.New("amqp sink: no encode function")
	}
	n := cfg.Publishers
	if n == 0 {
		n = max(dataflow.WorkerCount(ctx), 1)
	}
	parts := make([]string, n)
	for i := range parts {
		parts[i] = fmt.Sprintf("publisher-%d", i)
	}
	return parts, nil
}

// PartFor picks the partition by a hash of the item's exchange and routing key. An item that
// encode rejects goes to partition 0, whose Write reports the error.
func (s *Sink[T]) PartFor(item T, parts int) int {
	o, err := s.encode(item)
	if err != nil {
		return 0
	}
	h := fnv.New32a()
	h.Write([]byte(o.Exchange))
	h.Write([]byte{0})
	h.Write([]byte(o.RoutingKey))
	return int(h.Sum32() % uint32(parts))
}

// Build connects the publisher: a connection and a channel in confirm mode.
func (s *Sink[T]) Build(ctx context.Context, part string, resume *uint64) (dataflow.StatefulSink[T, uint64], error) {
	cfg := s.cfg
	if err := cfg.check(); err != nil {
		return nil, err
	}
	p := &publisher[T]{cfg: cfg, part: part, encode: s.encode, log: dataflow.Logger(ctx)}
	if resume != nil {
		p.confirmed = *resume
	}
	if err := p.connect(ctx); err != nil {
		return nil, fmt.Errorf("amqp sink: %w", err)
	}
	return p, nil
}

// connect opens the publisher's connection and channel in confirm mode, with the
// notifications of closes and returned messages.
func (p *publisher[T]) connect(ctx context.Context) error {
	conn, err := dialBroker(ctx, p.cfg.URL, "epochflow "+p.part, false)
	if err != nil {
		return err
	}
	ch, err := conn.Channel()
	if err == nil {
		err = ch.Confirm(false)
	}
	if err != nil {
		conn.Close()
		return fmt.Errorf("opening a channel in confirm mode: %w", err)
	}
	p.conn, p.ch = conn, ch
	p.why, p.down = nil, false
	p.closed = ch.NotifyClose(make(chan *amqp091.Error, 1))
	p.connClosed = conn.NotifyClose(make(chan *amqp091.Error, 1))
	// Returns arrive before the confirm of their message; the channel holds more than can be
	// outstanding between two drains (see drainReturns), so the broker's reader never blocks.
	p.returns = ch.NotifyReturn(make(chan amqp091.Return, p.cfg.MaxUnconfirmed+drainEvery+16))
	return nil
}

// drainEvery is how many publishes Write makes between two looks at returned messages.
const drainEvery = 256

// publisher is one sink partition: a connection and a channel in confirm mode. After a lost
// connection or channel it reconnects and publishes again what was not confirmed.
type publisher[T any] struct {
	cfg        SinkConfig
	part       string
	encode     func(T) (Outgoing, error)
	log        *slog.Logger
	conn       *amqp091.Connection
	ch         *amqp091.Channel
	closed     chan *amqp091.Error // the channel's close
	connClosed chan *amqp091.Error // the connection's close
	returns    chan amqp091.Return
	pending    []outstanding // published, not yet confirmed, in publishing order
	sinceLook  int
	confirmed  uint64
	reconnects int
	why        *amqp091.Error // why the channel closed, once down
	down       bool           // the channel or connection is known to be closed
	err        error          // the first failure; every later call returns it
}

// outstanding is a published message awaiting its confirm, kept to publish it again on a new
// channel if the old one dies first.
type outstanding struct {
	dc  *amqp091.DeferredConfirmation
	out Outgoing
}

func (p *publisher[T]) failf(format string, args ...any) error {
	if p.err == nil {
		p.err = fmt.Errorf("amqp sink: "+format, args...)
	}
	return p.err
}

// Write publishes the batch (mandatory unless SinkConfig.AllowUnroutable), waiting for confirms
// whenever SinkConfig.MaxUnconfirmed messages are outstanding.
func (p *publisher[T]) Write(ctx context.Context, batch []T) error {
	if p.err != nil {
		return p.err
	}
	for _, item := range batch {
		o, err := p.encode(item)
		if err != nil {
			return p.failf("encoding item %s: %w", dataflow.FormatItem(item), err)
		}
		if err := p.publish(ctx, o); err != nil {
			return err
		}
		if p.sinceLook++; p.sinceLook >= drainEvery {
			if err := p.drainReturns(); err != nil {
				return err
			}
		}
		if len(p.pending) >= p.cfg.MaxUnconfirmed {
			if err := p.await(ctx, len(p.pending)/2); err != nil {
				return err
			}
		}
	}
	return nil
}

// publish publishes o, reconnecting first if the channel is lost.
func (p *publisher[T]) publish(ctx context.Context, o Outgoing) error {
	for {
		dc, err := p.ch.PublishWithDeferredConfirm(o.Exchange, o.RoutingKey, !p.cfg.AllowUnroutable, false, o.Msg)
		if err == nil {
			p.pending = append(p.pending, outstanding{dc: dc, out: o})
			return nil
		}
		if rerr := p.recover(ctx, fmt.Errorf("publishing to exchange %q with routing key %q: %w", o.Exchange, o.RoutingKey, err), true); rerr != nil {
			return rerr
		}
	}
}

// lost returns why the channel or its connection closed, and whether it did (a nil reason
// with true is a close without one, by the client or a dropped socket). The answer is kept
// until the next connect. With wait, a channel that is not known to be closed yet is given a
// second to say so: a failed publish means the channel or the connection is going down.
func (p *publisher[T]) lost(wait bool) (*amqp091.Error, bool) {
	if p.down {
		return p.why, true
	}
	select {
	case e := <-p.closed:
		p.why, p.down = e, true
	case e := <-p.connClosed:
		p.why, p.down = e, true
	default:
		if !wait && !p.ch.IsClosed() && !p.conn.IsClosed() {
			return nil, false
		}
		t := time.NewTimer(time.Second)
		defer t.Stop()
		select {
		case e := <-p.closed:
			p.why, p.down = e, true
		case e := <-p.connClosed:
			p.why, p.down = e, true
		case <-t.C:
			p.down = true
		}
	}
	return p.why, p.down
}

// recover handles the failure cause of a publish or a confirm wait. If the channel was lost
// to something other than a refusal (a dropped connection, a broker restart), it reconnects
// with back-off for up to SinkConfig.ConfirmTimeout and publishes every unconfirmed message
// again on the new channel (at least once: the broker may have stored some of them); a
// refused operation (a missing exchange, access refused) or a channel that is still open
// fails the publisher.
func (p *publisher[T]) recover(ctx context.Context, cause error, wait bool) error {
	why, closed := p.lost(wait)
	if !closed {
		return p.failf("%w", cause)
	}
	if why != nil && fatal(why) {
		return p.failf("%w (the channel was closed: %v)", cause, why)
	}
	// A return that came before the close still fails the flow.
	if err := p.drainReturns(); err != nil {
		return err
	}
	deadline := time.Now().Add(p.cfg.ConfirmTimeout)
	backoff := p.cfg.ReconnectMin
	for attempt := 1; ; attempt++ {
		p.conn.Close()
		err := p.connect(ctx)
		if err == nil {
			err = p.republish()
			if err == nil {
				p.reconnects++
				p.log.Warn("amqp sink: lost the connection or channel; reconnected and published the unconfirmed messages again",
					"publisher", p.part, "cause", cause, "reason", why, "republished", len(p.pending), "attempts", attempt)
				return nil
			}
		}
		var ae *amqp091.Error
		if errors.As(err, &ae) && fatal(ae) {
			return p.failf("reconnecting after %v: %w", cause, err)
		}
		if time.Now().Add(backoff).After(deadline) {
			return p.failf("%v; reconnecting failed for %v: %w", cause, p.cfg.ConfirmTimeout, err)
		}
		t := time.NewTimer(backoff)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return p.failf("%v; reconnecting: %w", cause, ctx.Err())
		}
		backoff = min(2*backoff, p.cfg.ReconnectMax)
	}
}

// republish publishes the unconfirmed messages again, in order, on the current channel.
func (p *publisher[T]) republish() error {
	for i := range p.pending {
		o := p.pending[i].out
		dc, err := p.ch.PublishWithDeferredConfirm(o.Exchange, o.RoutingKey, !p.cfg.AllowUnroutable, false, o.Msg)
		if err != nil {
			return err
		}
		p.pending[i].dc = dc
	}
	return nil
}

// drainReturns fails on the first message the broker returned as unroutable.
func (p *publisher[T]) drainReturns() error {
	p.sinceLook = 0
	select {
	case r, ok := <-p.returns:
		if !ok {
			return nil
		}
		return p.failf("message %q returned by the broker: exchange %q, routing key %q: %d %s (no queue is bound to receive it; declare and bind one, or set SinkConfig.AllowUnroutable)",
			r.MessageId, r.Exchange, r.RoutingKey, r.ReplyCode, r.ReplyText)
	default:
		return nil
	}
}

// await waits for confirms until at most keep messages are unconfirmed, reconnecting and
// publishing again when the channel is lost.
func (p *publisher[T]) await(ctx context.Context, keep int) error {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.ConfirmTimeout)
	defer cancel()
	for len(p.pending) > keep {
		n := len(p.pending) - keep
		done := 0
		for _, m := range p.pending[:n] {
			ok, err := m.dc.WaitContext(ctx)
			if err != nil {
				return p.failf("%d messages not confirmed after %v: %w", n-done, p.cfg.ConfirmTimeout, err)
			}
			if !ok {
				break
			}
			done++
		}
		p.confirmed += uint64(done)
		clear(p.pending[:done])
		p.pending = append(p.pending[:0], p.pending[done:]...)
		if done == n {
			break
		}
		// A nack: the broker refused the message, or the channel died.
		if _, closed := p.lost(false); !closed {
			return p.failf("the broker nacked a message (delivery tag %d): it may not have been stored", p.pending[0].dc.DeliveryTag)
		}
		if err := p.recover(ctx, fmt.Errorf("%d messages unconfirmed when the channel closed", len(p.pending)), false); err != nil {
			return err
		}
	}
	return p.drainReturns()
}

// Snapshot waits until the broker confirmed every message published so far (an error if it
// nacked one, returned one as unroutable, or the connection was lost and could not be made
// again) and returns the number of confirmed messages.
func (p *publisher[T]) Snapshot() (uint64, error) {
	if p.err != nil {
		return 0, p.err
	}
	if err := p.await(context.Background(), 0); err != nil {
		return 0, err
	}
	return p.confirmed, nil
}

// Commit does nothing: what was published is already confirmed.
func (p *publisher[T]) Commit(context.Context, uint64) error { return p.err }

// Close closes the channel and the connection.
func (p *publisher[T]) Close() error {
	if p.conn == nil {
		return nil
	}
	p.conn.Close()
	p.conn = nil
	return nil
}
