package amqp

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"net"
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
	// ConfirmTimeout bounds the wait for the broker's confirms in Write and Snapshot; 0 means
	// DefaultConfirmTimeout.
	ConfirmTimeout time.Duration
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
	p := &publisher[T]{cfg: cfg, part: part, encode: s.encode}
	if resume != nil {
		p.confirmed = *resume
	}
	props := amqp091.NewConnectionProperties()
	props.SetClientConnectionName("epochflow " + part)
	conn, err := amqp091.DialConfig(cfg.URL, amqp091.Config{
		Heartbeat: 10 * time.Second, Locale: "en_US", Properties: props,
		Dial: func(network, addr string) (net.Conn, error) {
			d := net.Dialer{Timeout: dialTimeout}
			nc, err := d.DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			nc.SetDeadline(time.Now().Add(dialTimeout))
			return nc, nil
		},
	})
	if err != nil {
		return nil, fmt.Errorf("amqp sink: connecting to %s: %w", redact(cfg.URL), err)
	}
	ch, err := conn.Channel()
	if err == nil {
		err = ch.Confirm(false)
	}
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("amqp sink: opening a channel in confirm mode: %w", err)
	}
	p.conn, p.ch = conn, ch
	p.closed = ch.NotifyClose(make(chan *amqp091.Error, 1))
	// Returns arrive before the confirm of their message; the channel holds more than can be
	// outstanding between two drains (see drainReturns), so the broker's reader never blocks.
	p.returns = ch.NotifyReturn(make(chan amqp091.Return, cfg.MaxUnconfirmed+drainEvery+16))
	return p, nil
}

// drainEvery is how many publishes Write makes between two looks at returned messages.
const drainEvery = 256

// publisher is one sink partition: a connection and a channel in confirm mode.
type publisher[T any] struct {
	cfg       SinkConfig
	part      string
	encode    func(T) (Outgoing, error)
	conn      *amqp091.Connection
	ch        *amqp091.Channel
	closed    chan *amqp091.Error
	returns   chan amqp091.Return
	pending   []*amqp091.DeferredConfirmation
	sinceLook int
	confirmed uint64
	err       error // the first failure; every later call returns it
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
		dc, err := p.ch.PublishWithDeferredConfirm(o.Exchange, o.RoutingKey, !p.cfg.AllowUnroutable, false, o.Msg)
		if err != nil {
			return p.failf("publishing to exchange %q with routing key %q: %w", o.Exchange, o.RoutingKey, p.why(err))
		}
		p.pending = append(p.pending, dc)
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

// why adds the channel's close reason to an error, if the channel is closed.
func (p *publisher[T]) why(err error) error {
	select {
	case e := <-p.closed:
		if e != nil {
			return fmt.Errorf("%w (the channel was closed: %v)", err, e)
		}
	default:
	}
	return err
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

// await waits for confirms until at most keep messages are unconfirmed.
func (p *publisher[T]) await(ctx context.Context, keep int) error {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.ConfirmTimeout)
	defer cancel()
	n := len(p.pending) - keep
	for i, dc := range p.pending[:n] {
		ok, err := dc.WaitContext(ctx)
		if err != nil {
			return p.failf("%d messages not confirmed after %v: %w", n-i, p.cfg.ConfirmTimeout, err)
		}
		if !ok {
			if e := p.why(errors.New("nacked")); p.ch.IsClosed() {
				return p.failf("%d messages unconfirmed when the channel closed: %w", n-i, e)
			}
			return p.failf("the broker nacked a message (delivery tag %d): it may not have been stored", dc.DeliveryTag)
		}
	}
	p.confirmed += uint64(n)
	clear(p.pending[:n])
	p.pending = append(p.pending[:0], p.pending[n:]...)
	return p.drainReturns()
}

// Snapshot waits until the broker confirmed every message published so far (an error if it
// nacked one, returned one as unroutable, or the connection was lost) and returns the number
// of confirmed messages.
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
