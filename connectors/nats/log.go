package nats

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/epochflow/epochflow/dataflow"
)

// LogConfig says which stream a log-mode source reads.
type LogConfig struct {
	// URL is the server's URL; empty means nats.DefaultURL.
	URL string
	// Options are extra connection options.
	Options []natsgo.Option
	// Stream is the stream to read (limits retention: reading removes nothing). Required.
	Stream string
	// FilterSubjects, if any, restrict the read to these subjects.
	FilterSubjects []string
	// IdleExit, if positive, ends the stream (io.EOF) once no message has arrived for this long
	// and the consumer has no message pending.
	IdleExit time.Duration
	// Logger receives the source's logs; nil means the run's logger.
	Logger *slog.Logger
}

// ReadLog returns a log-mode source of cfg.Stream: one partition (keyed by the stream's name)
// reading the stream in order with an ordered consumer, without acknowledgements. Its state is
// the stream sequence of the last message read; a resumed run starts at the next one.
func ReadLog(cfg LogConfig) dataflow.Source[Message] {
	return dataflow.FromPartitioned[Message, uint64](NewLogSource(cfg))
}

// LogSource is the dataflow.PartitionedSource behind ReadLog.
type LogSource struct{ cfg LogConfig }

// NewLogSource returns the source of ReadLog.
func NewLogSource(cfg LogConfig) *LogSource { return &LogSource{cfg: cfg} }

func (c *LogConfig) check() error {
	if c.Stream == "" {
		return errors.New("nats log source: LogConfig.Stream is empty")
	}
	if c.IdleExit < 0 {
		return fmt.Errorf("nats log source: stream %q: LogConfig.IdleExit is negative", c.Stream)
	}
	if c.URL == "" {
		c.URL = natsgo.DefaultURL
	}
	return nil
}

// Parts returns the stream's name: the source has one partition.
func (s *LogSource) Parts(context.Context) ([]string, error) {
	cfg := s.cfg
	if err := cfg.check(); err != nil {
		return nil, err
	}
	return []string{cfg.Stream}, nil
}

// Build connects and starts an ordered consumer at the message after resume (at the stream's
// first message when resume is nil).
func (s *LogSource) Build(ctx context.Context, part string, resume *uint64) (dataflow.StatefulSource[Message, uint64], error) {
	cfg := s.cfg
	if err := cfg.check(); err != nil {
		return nil, err
	}
	logger := cfg.Logger
	if logger == nil {
		logger = dataflow.Logger(ctx)
	}
	wrap := func(what string, err error) error {
		return fmt.Errorf("nats log source: stream %q: %s: %w", cfg.Stream, what, err)
	}
	nc, err := natsgo.Connect(cfg.URL, append([]natsgo.Option{natsgo.Name("epochflow log " + cfg.Stream), natsgo.MaxReconnects(-1)}, cfg.Options...)...)
	if err != nil {
		return nil, wrap("connecting to "+redact(cfg.URL), err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, wrap("opening JetStream", err)
	}
	oc := jetstream.OrderedConsumerConfig{FilterSubjects: cfg.FilterSubjects, DeliverPolicy: jetstream.DeliverAllPolicy}
	p := &logPart{cfg: cfg, nc: nc, log: logger.With("stream", cfg.Stream), wake: make(chan struct{}, 1), done: make(chan struct{}), last: time.Now()}
	if resume != nil {
		p.seq = *resume
		oc.DeliverPolicy, oc.OptStartSeq = jetstream.DeliverByStartSequencePolicy, *resume+1
	}
	actx, cancel := context.WithTimeout(ctx, apiTimeout)
	defer cancel()
	cons, err := js.OrderedConsumer(actx, cfg.Stream, oc)
	if err != nil {
		nc.Close()
		return nil, wrap("creating the ordered consumer", err)
	}
	p.cons = cons
	if p.it, err = cons.Messages(); err != nil {
		nc.Close()
		return nil, wrap("starting to read", err)
	}
	p.ctx, p.cancel = context.WithCancel(context.Background())
	stop := context.AfterFunc(ctx, p.cancel)
	p.wg.Add(2)
	go p.pull()
	go p.watch(stop)
	return p, nil
}

type logPart struct {
	cfg  LogConfig
	nc   *natsgo.Conn
	cons jetstream.Consumer
	it   jetstream.MessagesContext
	log  *slog.Logger
	seq  uint64 // owned by the worker: the last sequence returned

	ctx    context.Context
	cancel context.CancelFunc
	wake   chan struct{}
	done   chan struct{}
	once   sync.Once
	wg     sync.WaitGroup

	mu   sync.Mutex
	buf  []jetstream.Msg
	last time.Time
	idle bool
}

func (p *logPart) signal() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

func (p *logPart) pull() {
	defer p.wg.Done()
	for {
		m, err := p.it.Next(jetstream.NextContext(p.ctx))
		if err != nil {
			if errors.Is(err, jetstream.ErrMsgIteratorClosed) || p.ctx.Err() != nil {
				return
			}
			p.log.Warn("nats log source: reading", "error", err)
			continue
		}
		p.mu.Lock()
		p.buf = append(p.buf, m)
		p.last, p.idle = time.Now(), false
		p.mu.Unlock()
		p.signal()
	}
}

// watch checks for the idle end and closes everything at the end of the run.
func (p *logPart) watch(stop func() bool) {
	defer p.wg.Done()
	defer func() {
		stop()
		p.it.Stop()
		p.cancel()
		p.nc.Close()
	}()
	var tc <-chan time.Time
	if p.cfg.IdleExit > 0 {
		t := time.NewTicker(min(p.cfg.IdleExit/2, time.Second))
		defer t.Stop()
		tc = t.C
	}
	for {
		select {
		case <-tc:
			p.mu.Lock()
			quiet := time.Since(p.last) >= p.cfg.IdleExit && len(p.buf) == 0 && !p.idle
			p.mu.Unlock()
			if !quiet {
				continue
			}
			ctx, cancel := context.WithTimeout(p.ctx, apiTimeout)
			info, err := p.cons.Info(ctx)
			cancel()
			if err != nil || info.NumPending > 0 {
				continue
			}
			p.mu.Lock()
			if len(p.buf) == 0 {
				p.idle = true
			}
			p.mu.Unlock()
			p.signal()
		case <-p.done:
			return
		case <-p.ctx.Done():
			return
		}
	}
}

// Wait returns a channel that is ready when messages (or the idle end) arrived.
func (p *logPart) Wait() <-chan struct{} { return p.wake }

// Next returns the messages read since the last call, in stream order.
func (p *logPart) Next(context.Context) ([]Message, error) {
	p.mu.Lock()
	buf := p.buf
	p.buf = nil
	idle := p.idle
	p.mu.Unlock()
	if len(buf) == 0 && idle {
		return nil, io.EOF
	}
	out := make([]Message, 0, len(buf))
	for _, m := range buf {
		md, err := m.Metadata()
		if err != nil {
			return nil, fmt.Errorf("nats log source: stream %q: a message without JetStream metadata: %w", p.cfg.Stream, err)
		}
		if md.Sequence.Stream <= p.seq {
			continue // the ordered consumer was recreated and sent it again
		}
		p.seq = md.Sequence.Stream
		out = append(out, Message{Stream: md.Stream, Subject: m.Subject(), Data: m.Data(), Header: m.Headers(),
			Sequence: md.Sequence.Stream, NumDelivered: md.NumDelivered, Timestamp: md.Timestamp})
	}
	return out, nil
}

// Snapshot returns the stream sequence of the last message Next returned.
func (p *logPart) Snapshot() uint64 { return p.seq }

// Commit has nothing to do: a log-mode source acknowledges nothing.
func (p *logPart) Commit(context.Context, uint64) error { return nil }

// Close stops reading and closes the connection.
func (p *logPart) Close() error {
	p.once.Do(func() {
		close(p.done)
		p.wg.Wait()
	})
	return nil
}
