package sqs

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"strconv"
	"sync"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/epochflow/epochflow/dataflow"
)

// DefaultSendConcurrency is how many SendMessageBatch calls a sink partition of a standard queue
// keeps in flight (a FIFO queue gets one, to keep the order of its groups).
const DefaultSendConcurrency = 8

// SinkOption configures a Sink.
type SinkOption func(*sinkConfig)

type sinkConfig struct {
	partitions  int
	concurrency int
	scope       string
	logger      *slog.Logger
	err         error
}

// SinkPartitions sets the number of sink partitions; by default one per worker of the run. As
// for the source, a resumed run must list every partition its recovery store knows.
func SinkPartitions(n int) SinkOption {
	return func(c *sinkConfig) {
		if n < 1 {
			c.err = fmt.Errorf("SinkPartitions: want at least 1, got %d", n)
		}
		c.partitions = n
	}
}

// SendConcurrency sets how many SendMessageBatch calls a partition of a standard queue keeps in
// flight (default DefaultSendConcurrency). FIFO queues always use one.
func SendConcurrency(n int) SinkOption {
	return func(c *sinkConfig) {
		if n < 1 {
			c.err = fmt.Errorf("SendConcurrency: want at least 1, got %d", n)
		}
		c.concurrency = n
	}
}

// DedupScope names the flow incarnation in the deduplication ids the sink makes up for a FIFO
// queue, in place of the random id a fresh start draws. With a random id, an epoch that is
// replayed after a crash before the partition's first commit gets new ids (a fresh start cannot
// know that it replays), so its messages may be sent twice; with a scope, that replay is
// deduplicated too, but two runs with the same scope (a flow started again on an empty recovery
// store within SQS's 5-minute deduplication window) make equal ids, and SQS would drop the
// second run's messages. Use a value unique to the flow, its step and its recovery store, such
// as "orders/send/" plus the store's creation time.
func DedupScope(scope string) SinkOption {
	return func(c *sinkConfig) { c.scope = scope }
}

// SinkLogger sets the logger of the sink's retry warnings; default the run's logger
// (dataflow.Logger).
func SinkLogger(l *slog.Logger) SinkOption {
	return func(c *sinkConfig) { c.logger = l }
}

// SinkState is a sink partition's snapshot: the number of epochs it has ended, and the id of the
// run that started it fresh (DedupScope, or random; kept across resumes). Both go into the
// deduplication ids of a FIFO queue, so that a replayed epoch gets the ids of its first try.
type SinkState struct {
	Seq uint64
	Run string
}

// Sink sends messages to an SQS queue with SendMessageBatch (see the package doc). It is a
// dataflow.PartitionedSink; Output turns it into a dataflow.Sink.
type Sink struct {
	client API
	queue  string
	fifo   bool
	cfg    sinkConfig
}

// Send returns a sink that sends every Outgoing to the queue at queueURL.
func Send(client API, queueURL string, opts ...SinkOption) dataflow.Sink[Outgoing] {
	return NewSink(client, queueURL, opts...).Output()
}

// NewSink returns the sink of Send.
func NewSink(client API, queueURL string, opts ...SinkOption) *Sink {
	s := &Sink{client: client, queue: queueURL, fifo: isFIFO(queueURL), cfg: sinkConfig{concurrency: DefaultSendConcurrency}}
	for _, o := range opts {
		o(&s.cfg)
	}
	if s.fifo {
		s.cfg.concurrency = 1
	}
	return s
}

// ConsumerPartitions tells the engine that the sink's partitions are senders to one queue (their
// state only numbers epochs): a flow may resume with fewer of them.
func (s *Sink) ConsumerPartitions() {}

// Output returns the sink for operators.Output / dataflow.Output.
func (s *Sink) Output() dataflow.Sink[Outgoing] {
	return dataflow.ToPartitioned[Outgoing, SinkState](s)
}

// Parts checks the configuration and the queue, and returns SinkPartitions partitions (or one
// per worker), keyed by the queue URL plus "#i".
func (s *Sink) Parts(ctx context.Context) ([]string, error) {
	if s.client == nil {
		return nil, fmt.Errorf("sqs sink %s: nil client", s.queue)
	}
	if s.queue == "" {
		return nil, errors.New("sqs sink: empty queue URL")
	}
	if s.cfg.err != nil {
		return nil, fmt.Errorf("sqs sink %s: %w", s.queue, s.cfg.err)
	}
	if _, err := s.client.GetQueueAttributes(ctx, &awssqs.GetQueueAttributesInput{QueueUrl: aws.String(s.queue),
		AttributeNames: []types.QueueAttributeName{types.QueueAttributeNameVisibilityTimeout}}); err != nil {
		return nil, fmt.Errorf("sqs sink: queue %s: %w", s.queue, err)
	}
	n := s.cfg.partitions
	if n == 0 {
		n = max(dataflow.WorkerCount(ctx), 1)
	}
	parts := make([]string, n)
	for i := range parts {
		parts[i] = fmt.Sprintf("%s#%d", s.queue, i)
	}
	return parts, nil
}

// PartFor sends all messages of a FIFO group to one partition (which sends them in order), and
// spreads the messages of a standard queue by a hash of their body.
func (s *Sink) PartFor(m Outgoing, parts int) int {
	h := fnv.New32a()
	if s.fifo {
		h.Write([]byte(m.GroupID))
	} else {
		h.Write([]byte(m.Body))
	}
	return int(h.Sum32() % uint32(parts))
}

// Build opens a partition, resuming the epoch count (and the run id) of resume.
func (s *Sink) Build(ctx context.Context, part string, resume *SinkState) (dataflow.StatefulSink[Outgoing, SinkState], error) {
	p := &sinkPart{s: s, key: part, ctx: ctx, sem: make(chan struct{}, s.cfg.concurrency),
		log: loggerOr(s.cfg.logger, ctx).With("queue", s.queue, "partition", part)}
	switch {
	case resume != nil:
		p.state = *resume
	case s.cfg.scope != "":
		p.state.Run = s.cfg.scope
	default:
		var b [12]byte
		if _, err := rand.Read(b[:]); err != nil {
			return nil, fmt.Errorf("sqs sink %s: %w", s.queue, err)
		}
		p.state.Run = hex.EncodeToString(b[:])
	}
	return p, nil
}

type sinkPart struct {
	s     *Sink
	key   string
	ctx   context.Context // the run's: sends end with it
	log   *slog.Logger
	state SinkState
	index int // messages written in the open epoch
	batch []types.SendMessageBatchRequestEntry
	sem   chan struct{}
	wg    sync.WaitGroup

	mu   sync.Mutex
	err  error
	told bool
}

// dedupID is the deduplication id of the index-th message of the open epoch.
func (p *sinkPart) dedupID(index int) string {
	h := sha256.New()
	fmt.Fprintf(h, "%s\x00%s\x00%d\x00%d", p.state.Run, p.key, p.state.Seq+1, index)
	return hex.EncodeToString(h.Sum(nil)) // 64 characters; SQS allows 128
}

func (p *sinkPart) failed() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.err != nil {
		p.told = true
	}
	return p.err
}

// Write queues the messages and sends them, ten per SendMessageBatch call, in the background.
// A message the queue cannot take (no group on a FIFO queue, an empty body) is an error naming it.
func (p *sinkPart) Write(_ context.Context, items []Outgoing) error {
	if err := p.failed(); err != nil {
		return err
	}
	for _, m := range items {
		if m.Body == "" {
			return fmt.Errorf("sqs sink %s: message %d of the epoch has an empty body, which SQS refuses", p.s.queue, p.index)
		}
		e := types.SendMessageBatchRequestEntry{Id: aws.String(strconv.Itoa(len(p.batch))), MessageBody: aws.String(m.Body),
			MessageAttributes: m.Attributes, DelaySeconds: m.DelaySeconds}
		if p.s.fifo {
			if m.GroupID == "" {
				return fmt.Errorf("sqs sink %s: message %d of the epoch (body %.40q) has no GroupID, which a FIFO queue requires", p.s.queue, p.index, m.Body)
			}
			e.MessageGroupId = aws.String(m.GroupID)
			id := m.DeduplicationID
			if id == "" {
				id = p.dedupID(p.index)
			}
			e.MessageDeduplicationId = aws.String(id)
		} else if m.GroupID != "" {
			e.MessageGroupId = aws.String(m.GroupID) // fair queues use it on standard queues
		}
		p.index++
		p.batch = append(p.batch, e)
		if len(p.batch) == 10 {
			p.dispatch()
		}
	}
	return nil
}

// dispatch sends the filled batch on a goroutine of its own (at most SendConcurrency at once).
func (p *sinkPart) dispatch() {
	if len(p.batch) == 0 {
		return
	}
	batch := p.batch
	p.batch = nil
	p.sem <- struct{}{}
	p.wg.Add(1)
	go func() {
		defer func() { <-p.sem; p.wg.Done() }()
		if err := p.send(batch); err != nil {
			p.mu.Lock()
			if p.err == nil {
				p.err = err
			}
			p.mu.Unlock()
		}
	}()
}

// send sends one batch until every entry is accepted: failed entries and failed calls are
// retried (maxFailures times in a row at most); an entry SQS refuses as the sender's fault is
// an error naming it.
func (p *sinkPart) send(entries []types.SendMessageBatchRequestEntry) error {
	ctx := p.ctx
	fails := 0
	for len(entries) > 0 {
		out, err := p.s.client.SendMessageBatch(ctx, &awssqs.SendMessageBatchInput{QueueUrl: aws.String(p.s.queue), Entries: entries})
		if err != nil {
			fails++
			if ctx.Err() != nil || permanent(err) || fails >= maxFailures {
				return fmt.Errorf("sqs sink %s: SendMessageBatch failed %d times: %w", p.s.queue, fails, err)
			}
			p.log.Warn("SendMessageBatch failed; retrying", "error", err)
			sleep(ctx, backoff(fails))
			continue
		}
		if len(out.Failed) == 0 {
			return nil
		}
		byID := make(map[string]types.SendMessageBatchRequestEntry, len(entries))
		for _, e := range entries {
			byID[aws.ToString(e.Id)] = e
		}
		var retry []types.SendMessageBatchRequestEntry
		for _, f := range out.Failed {
			e, ok := byID[aws.ToString(f.Id)]
			if !ok {
				continue
			}
			if f.SenderFault {
				return fmt.Errorf("sqs sink %s: message (body %.40q) refused: %s: %s", p.s.queue, aws.ToString(e.MessageBody), aws.ToString(f.Code), aws.ToString(f.Message))
			}
			retry = append(retry, e)
		}
		fails++
		if fails >= maxFailures {
			return fmt.Errorf("sqs sink %s: %d messages still failing after %d tries: %s", p.s.queue, len(retry), fails, aws.ToString(out.Failed[0].Message))
		}
		p.log.Warn("some messages of a SendMessageBatch failed; retrying them", "failed", len(retry))
		sleep(ctx, backoff(fails))
		entries = retry
	}
	return nil
}

// Snapshot sends what is queued and waits until SQS has accepted every message written so far;
// an error (a message that could not be sent) stops the flow before the epoch commits.
func (p *sinkPart) Snapshot() (SinkState, error) {
	p.dispatch()
	p.wg.Wait()
	if err := p.failed(); err != nil {
		return p.state, err
	}
	p.state.Seq++
	p.index = 0
	return p.state, nil
}

// Commit has nothing to do: the messages were sent and confirmed before the snapshot.
func (p *sinkPart) Commit(context.Context, SinkState) error { return p.failed() }

// Close waits for the sends in flight and returns a failure the engine has not seen.
func (p *sinkPart) Close() error {
	p.wg.Wait()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.err != nil && !p.told {
		return p.err
	}
	return nil
}
