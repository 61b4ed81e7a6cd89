package nats

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"strings"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/epochflow/epochflow/dataflow"
)

// DefaultAckTimeout bounds the wait for one publish acknowledgement in Snapshot when
// SinkConfig.AckTimeout is 0.
const DefaultAckTimeout = 30 * time.Second

const (
	// windowEpochs is how many epoch intervals of publishes a replay may repeat: the epochs in
	// flight (dataflow.DefaultMaxEpochsInFlight) and the open one.
	windowEpochs = dataflow.DefaultMaxEpochsInFlight + 1
	// windowRestart is what the duplicate window must leave, beyond those epochs, for a
	// crashed flow to restart and replay them.
	windowRestart = 30 * time.Second
)

// MinDuplicateWindow returns the shortest duplicate window (the stream's Duplicates) that
// covers a replay with this epoch interval: the epochs a crash can leave uncommitted (those in
// flight and the open one) plus 30 s for the restart. A stream with a shorter window stores a
// replayed message again when its first copy was published longer ago than the window, and
// the sink warns about it.
func MinDuplicateWindow(epochInterval time.Duration) time.Duration {
	return windowEpochs*epochInterval + windowRestart
}

// OutMessage is one message for Publish to publish.
type OutMessage struct {
	// Subject is the subject to publish on; it must belong to a stream.
	Subject string
	// Data is the payload.
	Data []byte
	// Header holds extra headers (Nats-Msg-Id is set by the sink).
	Header natsgo.Header
}

// SinkConfig says where and how Publish publishes.
type SinkConfig struct {
	// URL is the server's URL; empty means nats.DefaultURL.
	URL string
	// Options are extra connection options.
	Options []natsgo.Option
	// Flow names the flow in the messages' Nats-Msg-Id: it must be unique among the flows
	// publishing to the same stream, and stable from one run of the flow to the next.
	// Required.
	Flow string
	// Publishers is the number of sink partitions ("publisher-0" ...); 0 means one per worker.
	// It must not change from one run to the next on the same recovery store (the message ids
	// of a replayed epoch would differ).
	Publishers int
	// AckTimeout bounds the wait for each publish acknowledgement; 0 means DefaultAckTimeout.
	AckTimeout time.Duration
	// Stream, if set, is the stream the subjects belong to: Build looks it up (failing if it
	// does not exist) and warns when its duplicate window is shorter than
	// MinDuplicateWindow of the run's epoch interval. Whether set or not, the sink checks
	// every stream its publishes land in once, at the first Snapshot that sees it.
	Stream string
	// Logger receives the sink's logs; nil means the run's logger (dataflow.Logger).
	Logger *slog.Logger
}

// SinkState is the resume state of a sink partition: the epochs it has snapshotted and the
// items it had written by then (the last message's position, which the next message's id
// follows).
type SinkState struct {
	Epoch uint64 `json:"epoch"`
	Items uint64 `json:"items"`
}

// Publish returns a sink that publishes each item to JetStream with a deterministic
// Nats-Msg-Id, every publish acknowledged before the epoch's Snapshot returns. See the package
// documentation.
func Publish(cfg SinkConfig) dataflow.Sink[OutMessage] {
	return dataflow.ToPartitioned[OutMessage, SinkState](NewSink(cfg))
}

// Sink is the dataflow.PartitionedSink behind Publish.
type Sink struct{ cfg SinkConfig }

// NewSink returns the sink of Publish.
func NewSink(cfg SinkConfig) *Sink { return &Sink{cfg: cfg} }

func (c *SinkConfig) check() error {
	if c.Flow == "" || strings.ContainsAny(c.Flow, "/") {
		return fmt.Errorf("nats sink: SinkConfig.Flow is %q, want a non-empty name without '/'", c.Flow)
	}
	if c.Publishers < 0 || c.AckTimeout < 0 {
		return fmt.Errorf("nats sink: flow %q: SinkConfig.Publishers and AckTimeout must not be negative", c.Flow)
	}
	if c.URL == "" {
		c.URL = natsgo.DefaultURL
	}
	if c.AckTimeout == 0 {
		c.AckTimeout = DefaultAckTimeout
	}
	return nil
}

// Parts returns "publisher-0" ... "publisher-(n-1)".
func (s *Sink) Parts(ctx context.Context) ([]string, error) {
	cfg := s.cfg
	if err := cfg.check(); err != nil {
		return nil, err
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

// PartFor picks the publisher by a hash of the subject, so one subject's messages keep their
// order.
func (s *Sink) PartFor(m OutMessage, parts int) int {
	h := fnv.New32a()
	h.Write([]byte(m.Subject))
	return int(h.Sum32() % uint32(parts))
}

// Build connects the publisher named part, resuming its epoch count from resume. With
// SinkConfig.Stream it checks that stream's duplicate window (see MinDuplicateWindow).
func (s *Sink) Build(ctx context.Context, part string, resume *SinkState) (dataflow.StatefulSink[OutMessage, SinkState], error) {
	cfg := s.cfg
	if err := cfg.check(); err != nil {
		return nil, err
	}
	nc, err := natsgo.Connect(cfg.URL, append([]natsgo.Option{natsgo.Name("epochflow sink " + cfg.Flow + " " + part), natsgo.MaxReconnects(-1)}, cfg.Options...)...)
	if err != nil {
		return nil, fmt.Errorf("nats sink: flow %q, %s: connecting to %s: %w", cfg.Flow, part, redact(cfg.URL), err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("nats sink: flow %q, %s: opening JetStream: %w", cfg.Flow, part, err)
	}
	log := cfg.Logger
	if log == nil {
		log = dataflow.Logger(ctx)
	}
	interval := dataflow.EpochInterval(ctx)
	if interval <= 0 {
		interval = dataflow.DefaultEpochInterval
	}
	p := &publisher{cfg: cfg, part: part, nc: nc, js: js, log: log.With("flow", cfg.Flow, "partition", part), interval: interval, checked: map[string]bool{}}
	if cfg.Stream != "" {
		if err := p.checkWindow(ctx, cfg.Stream); err != nil {
			nc.Close()
			return nil, fmt.Errorf("nats sink: flow %q, %s: looking up the stream %q (SinkConfig.Stream): %w", cfg.Flow, part, cfg.Stream, err)
		}
	}
	if resume != nil {
		p.epoch, p.items = resume.Epoch, resume.Items
	}
	p.stop = context.AfterFunc(ctx, nc.Close) // a run that ends without Close cuts the connection
	return p, nil
}

type publisher struct {
	cfg      SinkConfig
	part     string
	nc       *natsgo.Conn
	js       jetstream.JetStream
	log      *slog.Logger
	interval time.Duration   // the run's epoch interval, for the duplicate window check
	checked  map[string]bool // the streams whose duplicate window was checked
	stop     func() bool
	epoch    uint64 // epochs snapshotted
	items    uint64 // items written, by this run and the runs it resumes
	sent     []sent
}

type sent struct {
	msg *natsgo.Msg
	f   jetstream.PubAckFuture
}

func (p *publisher) id() string {
	return fmt.Sprintf("%s/%s/%d", p.cfg.Flow, p.part, p.items)
}

// Write publishes the batch asynchronously; Snapshot waits for the acknowledgements.
func (p *publisher) Write(_ context.Context, batch []OutMessage) error {
	for _, m := range batch {
		p.items++
		msg := &natsgo.Msg{Subject: m.Subject, Data: m.Data, Header: natsgo.Header{}}
		for k, v := range m.Header {
			msg.Header[k] = append([]string(nil), v...)
		}
		msg.Header.Set(natsgo.MsgIdHdr, p.id())
		f, err := p.js.PublishMsgAsync(msg)
		if errors.Is(err, jetstream.ErrTooManyStalledMsgs) {
			// The server is slower than the flow: wait for what is outstanding, then go on.
			select {
			case <-p.js.PublishAsyncComplete():
			case <-time.After(p.cfg.AckTimeout):
			}
			f, err = p.js.PublishMsgAsync(msg)
		}
		if err != nil {
			return fmt.Errorf("nats sink: flow %q, %s: publishing to %q: %w", p.cfg.Flow, p.part, m.Subject, err)
		}
		p.sent = append(p.sent, sent{msg: msg, f: f})
	}
	return nil
}

// Snapshot waits until the stream has acknowledged every message published in the epoch (one
// that failed is published again, with the same id, once) and returns the epoch count. The
// first acknowledgement from a stream not checked yet has its duplicate window checked.
func (p *publisher) Snapshot() (SinkState, error) {
	for _, s := range p.sent {
		ack, err := p.await(s.f)
		if err != nil {
			ctx, cancel := context.WithTimeout(context.Background(), p.cfg.AckTimeout)
			var err2 error
			ack, err2 = p.js.PublishMsg(ctx, s.msg)
			cancel()
			if err2 != nil {
				return SinkState{}, fmt.Errorf("nats sink: flow %q, %s: message %s to %q was not acknowledged (%v), nor when published again: %w",
					p.cfg.Flow, p.part, s.msg.Header.Get(natsgo.MsgIdHdr), s.msg.Subject, err, err2)
			}
		}
		if ack != nil && ack.Stream != "" && !p.checked[ack.Stream] {
			ctx, cancel := context.WithTimeout(context.Background(), p.cfg.AckTimeout)
			if err := p.checkWindow(ctx, ack.Stream); err != nil {
				p.log.Warn("nats sink: could not look the stream up to check its duplicate window", "stream", ack.Stream, "error", err)
			}
			cancel()
		}
	}
	clear(p.sent)
	p.sent = p.sent[:0]
	p.epoch++
	return SinkState{Epoch: p.epoch, Items: p.items}, nil
}

func (p *publisher) await(f jetstream.PubAckFuture) (*jetstream.PubAck, error) {
	t := time.NewTimer(p.cfg.AckTimeout)
	defer t.Stop()
	select {
	case ack := <-f.Ok():
		return ack, nil
	case err := <-f.Err():
		return nil, err
	case <-t.C:
		return nil, errors.New("no acknowledgement within SinkConfig.AckTimeout")
	}
}

// checkWindow looks the stream up and warns when its duplicate window cannot cover a replay
// (MinDuplicateWindow): the stream would then store a replayed message again. It checks each
// stream once; a failed lookup is checked again next time.
func (p *publisher) checkWindow(ctx context.Context, stream string) error {
	st, err := p.js.Stream(ctx, stream)
	if err != nil {
		return err
	}
	p.checked[stream] = true
	window := st.CachedInfo().Config.Duplicates
	if need := MinDuplicateWindow(p.interval); window < need {
		p.log.Warn(fmt.Sprintf("nats sink: the duplicate window of stream %q is %v, shorter than the %v a replay after a crash can need with %v epochs (%d epoch intervals of publishes plus %v for the restart): a replayed message first published longer ago than the window is stored twice; set the stream's Duplicates (duplicate_window) to at least %v with a stream update, or shorten the epoch interval",
			stream, window, need, p.interval, windowEpochs, windowRestart, need),
			"stream", stream, "duplicates", window, "want_duplicates", need, "epoch_interval", p.interval)
	}
	return nil
}

// Commit has nothing to do: the messages were stored at Snapshot.
func (p *publisher) Commit(context.Context, SinkState) error { return nil }

// Close closes the connection.
func (p *publisher) Close() error {
	p.stop()
	p.nc.Close()
	return nil
}
