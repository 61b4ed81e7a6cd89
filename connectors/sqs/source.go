package sqs

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/aws/smithy-go"

	"github.com/epochflow/epochflow/dataflow"
)

// Defaults of the source options.
const (
	DefaultMaxInFlight = 10_000
	DefaultWaitTime    = 20 * time.Second
	// fallbackVisibility is used when the queue's own visibility timeout is 0.
	fallbackVisibility = 30 * time.Second
	// maxFailures is how many times in a row a call (receive, delete, dead-letter send) may
	// fail before the partition reports the error and stops.
	maxFailures = 8
	// closeTimeout bounds the deletes and releases Close still does.
	closeTimeout = 20 * time.Second
	// deleteCallsPerRound bounds the delete calls between two looks at the visibility deadlines.
	deleteCallsPerRound = 20
	// deleteConcurrency is how many DeleteMessageBatch calls a partition has out at once (the
	// AWS SQS buffered client sends 5 outbound batches at a time by default). One at a time, a
	// partition deletes 10 messages per round trip, less than it can receive.
	deleteConcurrency = 5
	// extendConcurrency is how many visibility extension calls a partition has out at once.
	extendConcurrency = 5
	// initialInFlightLimit is where the adaptive cap on the messages in flight starts (see
	// MaxInFlight), and minInFlightLimit the lowest it goes.
	initialInFlightLimit = 200
	minInFlightLimit     = 10
	// maxStretch bounds how many times the visibility timeout an extension asks for while
	// extensions are behind (see partition.stretch).
	maxStretch = 4
	// ErrorAttribute is the message attribute that carries the decode error of a message sent
	// to the dead-letter queue.
	ErrorAttribute = "epochflow.error"
)

// SourceOption configures a Source.
type SourceOption func(*sourceConfig)

type sourceConfig struct {
	dlq         string
	idleExit    time.Duration
	maxInFlight int
	visibility  time.Duration
	waitTime    time.Duration
	consumers   int
	logger      *slog.Logger
	err         error
}

// DeadLetter sends the messages the decode function rejects to the queue at url (with their
// attributes, plus ErrorAttribute holding the error), and deletes them from the source queue
// once that send is confirmed and their epoch is committed. Without it a rejected message stops
// the flow. On a FIFO dead-letter queue the message keeps its group (or gets the group
// "epochflow-dead-letter") and its message id as deduplication id.
func DeadLetter(url string) SourceOption {
	return func(c *sourceConfig) {
		if url == "" {
			c.err = errors.New("DeadLetter: empty queue URL")
		}
		c.dlq = url
	}
}

// IdleExit ends the stream (io.EOF) once receives have returned nothing for d: the queue has
// been empty (or all of its messages invisible) that long. 0, the default, never ends it.
func IdleExit(d time.Duration) SourceOption {
	return func(c *sourceConfig) {
		if d < 0 {
			c.err = fmt.Errorf("IdleExit: negative duration %v", d)
		}
		c.idleExit = d
	}
}

// MaxInFlight caps the messages received and not yet deleted, per partition: receiving pauses at
// the cap and resumes when commits delete messages. Default DefaultMaxInFlight. SQS allows about
// 120,000 in flight per standard queue and 20,000 per FIFO queue, over all consumers.
//
// Below it the partition keeps a cap of its own that follows what its visibility extensions
// can keep up with (see the package doc): it starts at 200 (or MaxInFlight if lower), grows
// while deletes and extensions arrive in time, and halves when an extension or a delete goes out
// late.
func MaxInFlight(n int) SourceOption {
	return func(c *sourceConfig) {
		if n < 1 {
			c.err = fmt.Errorf("MaxInFlight: want at least 1, got %d", n)
		}
		c.maxInFlight = n
	}
}

// Visibility is the visibility timeout the source asks for on every receive and extension
// (whole seconds, 1 s to 12 h). By default it is the queue's own VisibilityTimeout attribute.
// Messages stay invisible beyond it while their epoch is not committed: the source extends it
// when half of it is left (by up to 4 times it while extensions cannot keep up, see the package
// doc).
func Visibility(d time.Duration) SourceOption {
	return func(c *sourceConfig) {
		if d < time.Second || d > MaxVisibility || d%time.Second != 0 {
			c.err = fmt.Errorf("Visibility: want whole seconds from 1s to 12h, got %v", d)
		}
		c.visibility = d
	}
}

// WaitTime is the long-poll wait of every receive (whole seconds, 1 to 20 s; default 20 s).
func WaitTime(d time.Duration) SourceOption {
	return func(c *sourceConfig) {
		if d < time.Second || d > 20*time.Second || d%time.Second != 0 {
			c.err = fmt.Errorf("WaitTime: want whole seconds from 1s to 20s, got %v", d)
		}
		c.waitTime = d
	}
}

// Consumers sets the number of partitions (consumers of the queue). By default there is one per
// worker of the run. The partition keys are the queue URL plus "#i", and a run that resumes from
// a recovery store must list every partition the store knows: fix Consumers when the number of
// workers may shrink between runs.
func Consumers(n int) SourceOption {
	return func(c *sourceConfig) {
		if n < 1 {
			c.err = fmt.Errorf("Consumers: want at least 1, got %d", n)
		}
		c.consumers = n
	}
}

// Logger sets the logger of the source's warnings (stale receipt handles, retries); default
// the run's logger (dataflow.Logger).
func Logger(l *slog.Logger) SourceOption {
	return func(c *sourceConfig) { c.logger = l }
}

// Stats are counters of a Source over all its partitions since it was made.
type Stats struct {
	Received       int64 // messages received
	Emitted        int64 // messages handed to the flow
	Rejected       int64 // messages the decode function rejected
	DeadLettered   int64 // rejected messages sent to the dead-letter queue
	Deleted        int64 // messages deleted after their epoch committed
	StaleDeletes   int64 // deletes SQS refused for the receipt handle (expired or redelivered): the message comes again
	DeleteRetries  int64 // failed delete calls or entries that were retried
	Extended       int64 // visibility extensions that succeeded
	ExtendRetries  int64 // visibility extensions that failed and were retried
	VisibilityLost int64 // messages whose visibility could not be extended (stale, or 12 h reached): they come again
	Released       int64 // uncommitted messages made visible again at Close
	ReceiveErrors  int64 // failed receive calls
	DeletePauses   int64 // times receiving paused because the deletes of committed messages were behind (see the package doc)
	// ExtensionPauses counts the times receiving paused because visibility extensions were
	// behind (one went out with less than a quarter of the visibility timeout left).
	ExtensionPauses int64
	// LimitCuts counts the times a partition halved its in-flight cap because extensions fell
	// behind (see MaxInFlight).
	LimitCuts int64
	// SingleVisibilityCalls is true once the endpoint refused ChangeMessageVisibilityBatch
	// (goaws does) and extensions went to single ChangeMessageVisibility calls.
	SingleVisibilityCalls bool
}

type counters struct {
	received, emitted, rejected, deadLettered, deleted, staleDeletes, deleteRetries,
	extended, extendRetries, visibilityLost, released, receiveErrors, deletePauses,
	extensionPauses, limitCuts atomic.Int64
}

// Source reads an SQS queue (see the package doc for partitions, state, commits and delivery).
// It is a dataflow.PartitionedSource; Input turns it into a dataflow.Source. One Source may
// serve one run at a time.
type Source[T any] struct {
	client API
	queue  string
	decode func(Message) (T, error)
	cfg    sourceConfig
	stats  counters

	vis       time.Duration // resolved by Parts
	dlqFIFO   bool
	singleVis atomic.Bool // the endpoint does not support ChangeMessageVisibilityBatch
}

// Receive returns a source of the queue at queueURL that hands every message to the flow as a
// Message. See NewSource for the options.
func Receive(client API, queueURL string, opts ...SourceOption) dataflow.Source[Message] {
	return NewSource(client, queueURL, func(m Message) (Message, error) { return m, nil }, opts...).Input()
}

// NewSource returns a source of the queue at queueURL whose items are what decode makes of each
// message. A message decode rejects (an error) goes to the dead-letter queue (DeadLetter) or,
// without one, stops the flow with an error naming the queue and the message id; it is never
// dropped silently.
func NewSource[T any](client API, queueURL string, decode func(Message) (T, error), opts ...SourceOption) *Source[T] {
	s := &Source[T]{client: client, queue: queueURL, decode: decode,
		cfg: sourceConfig{maxInFlight: DefaultMaxInFlight, waitTime: DefaultWaitTime}}
	for _, o := range opts {
		o(&s.cfg)
	}
	return s
}

// ConsumerPartitions tells the engine that the source's partitions are consumers of one queue
// (their state is a counter): a flow may resume with fewer of them.
func (s *Source[T]) ConsumerPartitions() {}

// Input returns the source for operators.Input / dataflow.Input.
func (s *Source[T]) Input() dataflow.Source[T] {
	return dataflow.FromPartitioned[T, uint64](s)
}

// Stats returns the source's counters.
func (s *Source[T]) Stats() Stats {
	c := &s.stats
	return Stats{
		Received: c.received.Load(), Emitted: c.emitted.Load(), Rejected: c.rejected.Load(),
		DeadLettered: c.deadLettered.Load(), Deleted: c.deleted.Load(), StaleDeletes: c.staleDeletes.Load(),
		DeleteRetries: c.deleteRetries.Load(), Extended: c.extended.Load(), ExtendRetries: c.extendRetries.Load(),
		VisibilityLost: c.visibilityLost.Load(), Released: c.released.Load(), ReceiveErrors: c.receiveErrors.Load(),
		DeletePauses: c.deletePauses.Load(), ExtensionPauses: c.extensionPauses.Load(), LimitCuts: c.limitCuts.Load(),
		SingleVisibilityCalls: s.singleVis.Load(),
	}
}

func isFIFO(url string) bool { return strings.HasSuffix(url, ".fifo") }

// Parts checks the configuration and the queue (and the dead-letter queue), learns the queue's
// visibility timeout, and returns one partition per consumer: Consumers, or else the run's
// number of workers.
func (s *Source[T]) Parts(ctx context.Context) ([]string, error) {
	if s.client == nil {
		return nil, fmt.Errorf("sqs source %s: nil client", s.queue)
	}
	if s.queue == "" {
		return nil, errors.New("sqs source: empty queue URL")
	}
	if s.decode == nil {
		return nil, fmt.Errorf("sqs source %s: nil decode function", s.queue)
	}
	if s.cfg.err != nil {
		return nil, fmt.Errorf("sqs source %s: %w", s.queue, s.cfg.err)
	}
	attrs, err := s.client.GetQueueAttributes(ctx, &awssqs.GetQueueAttributesInput{QueueUrl: aws.String(s.queue),
		AttributeNames: []types.QueueAttributeName{types.QueueAttributeNameVisibilityTimeout}})
	if err != nil {
		return nil, fmt.Errorf("sqs source: queue %s: %w", s.queue, err)
	}
	s.vis = s.cfg.visibility
	if s.vis == 0 {
		secs, _ := strconv.Atoi(attrs.Attributes[string(types.QueueAttributeNameVisibilityTimeout)])
		s.vis = time.Duration(secs) * time.Second
		if s.vis == 0 {
			s.vis = fallbackVisibility
		}
	}
	if s.cfg.dlq != "" {
		if _, err := s.client.GetQueueAttributes(ctx, &awssqs.GetQueueAttributesInput{QueueUrl: aws.String(s.cfg.dlq),
			AttributeNames: []types.QueueAttributeName{types.QueueAttributeNameVisibilityTimeout}}); err != nil {
			return nil, fmt.Errorf("sqs source %s: dead-letter queue %s: %w", s.queue, s.cfg.dlq, err)
		}
		s.dlqFIFO = isFIFO(s.cfg.dlq)
	}
	n := s.cfg.consumers
	if n == 0 {
		n = max(dataflow.WorkerCount(ctx), 1)
	}
	parts := make([]string, n)
	for i := range parts {
		parts[i] = fmt.Sprintf("%s#%d", s.queue, i)
	}
	return parts, nil
}

// Build opens a partition: it starts its receiving goroutine and its manager goroutine (deletes,
// visibility extensions, dead-letter sends). resume is the snapshot sequence number to count on
// from; the messages of the epochs a crashed run never committed come back from SQS by
// themselves, once their visibility timeout runs out.
func (s *Source[T]) Build(ctx context.Context, part string, resume *uint64) (dataflow.StatefulSource[T, uint64], error) {
	if s.vis == 0 {
		return nil, fmt.Errorf("sqs source %s: Build before Parts", s.queue)
	}
	var seq uint64
	if resume != nil {
		seq = *resume
	}
	p := &partition[T]{src: s, key: part, led: newLedger(seq),
		wake: make(chan struct{}, 1), kick: make(chan struct{}, 1), room: make(chan struct{}, 1),
		log:   loggerOr(s.cfg.logger, ctx).With("queue", s.queue, "partition", part),
		limit: float64(min(s.cfg.maxInFlight, initialInFlightLimit)), slowStart: true, stretch: 1}
	p.bg, p.cancel = context.WithCancel(ctx)
	p.recv, p.stopRecv = context.WithCancel(p.bg)
	p.stop = make(chan struct{})
	p.wg.Add(3)
	go p.receive()
	go p.manage()
	go p.watchLag(dataflow.Metrics(ctx), part == s.queue+"#0")
	return p, nil
}

// received is a message received and not yet handed to the flow.
type received struct {
	id  uint64
	msg types.Message
}

// dlqItem is a rejected message waiting for its dead-letter send.
type dlqItem struct {
	id        uint64
	msg       Message
	cause     error
	fails     int
	notBefore time.Time
}

// partition is one consumer of the queue.
type partition[T any] struct {
	src *Source[T]
	key string
	log *slog.Logger

	bg       context.Context // the manager's calls: ends at Close, or when the run ends without Close (a crash)
	cancel   context.CancelFunc
	recv     context.Context // the receiver's calls: ends first at Close
	stopRecv context.CancelFunc
	stop     chan struct{} // closed by Close: the manager finishes its round and returns
	wg       sync.WaitGroup

	wake chan struct{} // Waiter: messages arrived, the stream ended, or an error
	kick chan struct{} // wakes the manager
	room chan struct{} // wakes the receiver paused at MaxInFlight

	mu       sync.Mutex
	led      *ledger
	ready    []received
	deletes  []*entry
	dlq      []dlqItem
	armed    bool // the manager has a visibility deadline to watch
	idle     bool // the receiver stopped: IdleExit reached
	err      error
	told     bool
	eof      bool
	closed   bool
	delFails int
	delRetry time.Time
	deleting int // messages the manager took from deletes and has not finished deleting

	// The adaptive cap on the messages in flight (see MaxInFlight): limit grows by one per
	// message deleted or extended in time (doubling per round trip while slowStart), by an
	// eighth of that afterwards, and halves (at most once a quarter visibility
	// timeout, lastCut) when an extension goes out late or fails; extBehind is set from such a
	// late extension to the end of the manager's round, and receiving waits meanwhile.
	limit     float64
	slowStart bool
	lastCut   time.Time
	extBehind bool
	// stretch multiplies the visibility that extensions ask for: it doubles (up to maxStretch)
	// after a round of extensions with one late, and halves after one in time. The messages in
	// flight cannot become fewer before their epoch commits; asking for longer extensions while
	// the calls cannot keep up is what keeps them from losing their visibility meanwhile.
	stretch int
	// delLatency is a moving average of how long a DeleteMessageBatch call takes (0 before the
	// first). The messages in flight become deletes when their epoch commits, and deletes go
	// out 10 per call, deleteConcurrency calls at once: holding more than those calls can
	// delete within half a visibility timeout would see the last of them come again before their
	// delete (Little's law), so the cap never exceeds that (deleteBound).
	delLatency time.Duration
}

// deleteBound is the most messages the partition's delete calls can delete within half a
// visibility timeout at their measured latency (no bound before the first call answered). The
// caller holds p.mu.
func (p *partition[T]) deleteBound() int {
	if p.delLatency <= 0 {
		return math.MaxInt
	}
	calls := float64(p.src.vis/2) / float64(p.delLatency)
	return max(int(calls*10*deleteConcurrency), minInFlightLimit)
}

func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// fail records the partition's first fatal error; the next Next or Commit returns it.
func (p *partition[T]) fail(err error) {
	p.mu.Lock()
	if p.err == nil {
		p.err = err
	}
	p.mu.Unlock()
	signal(p.wake)
}

func (p *partition[T]) errorf(format string, args ...any) error {
	return fmt.Errorf("sqs source %s: "+format, append([]any{p.src.queue}, args...)...)
}

// Wait returns the channel that is ready when Next has something to say.
func (p *partition[T]) Wait() <-chan struct{} { return p.wake }

// Next returns the messages received so far (decoded), io.EOF once IdleExit is reached and
// everything is handed out, or the error that stopped the partition.
func (p *partition[T]) Next(context.Context) ([]T, error) {
	p.mu.Lock()
	if p.err != nil {
		p.told = true
		err := p.err
		p.mu.Unlock()
		return nil, err
	}
	batch := p.ready
	p.ready = nil
	idle := p.idle
	p.mu.Unlock()

	var out []T
	var rejected []dlqItem
	var fatal error
	ok := make([]bool, len(batch))
	for i, r := range batch {
		m := newMessage(p.src.queue, r.msg)
		v, err := p.src.decode(m)
		if err == nil {
			out = append(out, v)
			ok[i] = true
			continue
		}
		p.src.stats.rejected.Add(1)
		if p.src.cfg.dlq == "" {
			fatal = dataflow.Permanent(p.errorf("message %s rejected by the decode function (no dead-letter queue is configured; the message stays in the queue): %w", m.ID, err))
			break
		}
		p.log.Warn("message rejected by the decode function; sending it to the dead-letter queue",
			"message_id", m.ID, "dead_letter_queue", p.src.cfg.dlq, "error", err)
		rejected = append(rejected, dlqItem{id: r.id, msg: m, cause: err})
	}

	p.mu.Lock()
	defer p.mu.Unlock()
	if fatal != nil {
		// Nothing of this batch is emitted: its messages stay buffered and are released at Close.
		p.err, p.told = fatal, true
		return nil, fatal
	}
	for i, r := range batch {
		p.led.emit(r.id, !ok[i])
	}
	p.src.stats.emitted.Add(int64(len(out)))
	if len(rejected) > 0 {
		p.dlq = append(p.dlq, rejected...)
		signal(p.kick)
	}
	if idle && len(p.ready) == 0 {
		p.eof = true
		return out, io.EOF
	}
	return out, nil
}

// Snapshot closes the open epoch: its messages are now those of the returned sequence number.
func (p *partition[T]) Snapshot() uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.led.snapshot()
}

// Commit hands the messages of every epoch up to seq to the manager for deletion and returns
// at once. It returns the error that stopped the partition, if any.
func (p *partition[T]) Commit(_ context.Context, seq uint64) error {
	p.mu.Lock()
	es, err := p.led.commit(seq)
	p.deletes = append(p.deletes, es...)
	if err == nil && p.err != nil {
		err, p.told = p.err, true
	} else if err != nil {
		err = p.errorf("partition %s: %w", p.key, err)
	}
	p.mu.Unlock()
	if len(es) > 0 {
		signal(p.kick)
	}
	return err
}

// receive long-polls the queue until the partition closes, IdleExit is reached, or receiving
// fails for good.
func (p *partition[T]) receive() {
	defer p.wg.Done()
	s := p.src
	lastMsg := time.Now()
	fails := 0
	waitingForDeletes, waitingForExtensions := false, false
	for p.recv.Err() == nil {
		p.mu.Lock()
		room := min(s.cfg.maxInFlight, int(p.limit), p.deleteBound()) - p.led.inFlight()
		behind := p.deletesBehind(time.Now())
		extBehind := p.extBehind
		p.mu.Unlock()
		if room <= 0 || behind || extBehind {
			if behind {
				if !waitingForDeletes {
					s.stats.deletePauses.Add(1)
				}
				signal(p.kick) // the manager may be asleep with deletes waiting
			}
			if extBehind && !waitingForExtensions {
				s.stats.extensionPauses.Add(1)
			}
			waitingForDeletes, waitingForExtensions = behind, extBehind
			if !p.pause() {
				return
			}
			lastMsg = time.Now() // a pause is no idleness of the queue: it was not asked
			continue
		}
		waitingForDeletes, waitingForExtensions = false, false
		wait := s.cfg.waitTime
		if s.cfg.idleExit > 0 {
			left := s.cfg.idleExit - time.Since(lastMsg)
			if left <= 0 {
				p.mu.Lock()
				p.idle = true
				p.mu.Unlock()
				signal(p.wake)
				return
			}
			wait = min(wait, max((left+time.Second-1)/time.Second*time.Second, time.Second))
		}
		sentAt := time.Now()
		out, err := s.client.ReceiveMessage(p.recv, &awssqs.ReceiveMessageInput{
			QueueUrl:                    aws.String(s.queue),
			MaxNumberOfMessages:         int32(min(10, room)),
			WaitTimeSeconds:             int32(wait / time.Second),
			VisibilityTimeout:           int32(s.vis / time.Second),
			MessageAttributeNames:       []string{"All"},
			MessageSystemAttributeNames: []types.MessageSystemAttributeName{types.MessageSystemAttributeNameAll},
		})
		if err != nil {
			if p.recv.Err() != nil {
				return
			}
			fails++
			s.stats.receiveErrors.Add(1)
			if permanent(err) || fails >= maxFailures {
				p.fail(p.errorf("partition %s: receiving failed %d times in a row: %w", p.key, fails, err))
				return
			}
			p.log.Warn("receive failed; retrying", "error", err, "failures", fails)
			if !sleep(p.recv, backoff(fails)) {
				return
			}
			continue
		}
		fails = 0
		if len(out.Messages) == 0 {
			continue
		}
		lastMsg = time.Now()
		s.stats.received.Add(int64(len(out.Messages)))
		p.mu.Lock()
		for _, m := range out.Messages {
			id := p.led.add(aws.ToString(m.ReceiptHandle), aws.ToString(m.MessageId), sentAt, s.vis)
			p.ready = append(p.ready, received{id: id, msg: m})
		}
		kick := !p.armed
		p.armed = true
		p.mu.Unlock()
		signal(p.wake)
		if kick {
			signal(p.kick)
		}
	}
}

// deletesBehind says whether the deletes of committed messages are behind: more are waiting
// or out than two rounds of concurrent delete calls, or one waiting is within half a visibility
// timeout of its deadline. Receiving more then would only add deletes behind them: past its
// deadline a message comes again, its delete is refused as stale, and a partition that receives
// faster than it deletes ends up redelivering everything. So the receiver waits for the deletes
// to catch up. The caller holds p.mu.
func (p *partition[T]) deletesBehind(now time.Time) bool {
	if len(p.deletes)+p.deleting >= 2*10*deleteConcurrency {
		return true
	}
	for _, e := range p.deletes { // fewer than 100
		if e.deadline.Sub(now) < p.src.vis/2 {
			return true
		}
	}
	return false
}

// pause waits until the manager frees room (a delete, or a message given up), 100 ms at most,
// and reports whether the receiver should go on. The receiver pauses at MaxInFlight and while
// the deletes are behind.
func (p *partition[T]) pause() bool {
	t := time.NewTimer(100 * time.Millisecond)
	defer t.Stop()
	select {
	case <-p.room:
	case <-t.C:
	case <-p.recv.Done():
		return false
	}
	return true
}

// backoff is the pause after the nth failure in a row: 100 ms doubling up to 5 s.
func backoff(n int) time.Duration {
	d := 100 * time.Millisecond
	for i := 1; i < n && d < 5*time.Second; i++ {
		d *= 2
	}
	return min(d, 5*time.Second)
}

// sleep waits d or until ctx ends; it reports whether ctx is still alive.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// apiCode returns the error code of an SQS error ("" if err is not one).
func apiCode(err error) string {
	var ae smithy.APIError
	if errors.As(err, &ae) {
		return ae.ErrorCode()
	}
	return ""
}

// httpStatus returns the HTTP status of a failed call (0 if there was no response).
func httpStatus(err error) int {
	var re *awshttp.ResponseError
	if errors.As(err, &re) {
		return re.HTTPStatusCode()
	}
	return 0
}

// permanent says whether retrying err is pointless: a client error (4xx) that is not a
// throttle or the in-flight limit.
func permanent(err error) bool {
	st := httpStatus(err)
	if st < 400 || st >= 500 || st == 429 {
		return false
	}
	code := apiCode(err)
	return !strings.Contains(code, "Throttl") && !strings.Contains(code, "OverLimit") && !strings.Contains(code, "RequestThrottled")
}

// batchUnsupported says whether a failed ChangeMessageVisibilityBatch call means the endpoint
// does not know the call (goaws answers a plain-text 400 that is no SQS error).
func batchUnsupported(err error) bool {
	switch httpStatus(err) {
	case 400, 404, 405, 501:
	default:
		return false
	}
	switch apiCode(err) {
	case "", "UnknownOperationException", "InvalidAction", "UnsupportedOperation", "AWS.SimpleQueueService.UnsupportedOperation":
		return true
	}
	return false
}

// goneCode says whether an error code means the receipt handle is no longer valid.
func goneCode(code string) bool {
	return strings.Contains(code, "MessageNotInFlight") || strings.Contains(code, "ReceiptHandleIsInvalid") ||
		strings.Contains(code, "InvalidReceiptHandle")
}

// manage runs the partition's calls other than receiving: visibility extensions first (they are
// due at a time), then deletes of committed messages, then dead-letter sends.
func (p *partition[T]) manage() {
	defer p.wg.Done()
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	margin := p.src.vis / 2
	for {
		more := p.round(margin)
		select {
		case <-p.stop:
			return
		case <-p.bg.Done():
			return
		default:
		}
		if more {
			continue
		}
		p.mu.Lock()
		at := p.led.nextWake(margin)
		p.armed = !at.IsZero()
		if !p.delRetry.IsZero() && len(p.deletes) > 0 && (at.IsZero() || p.delRetry.Before(at)) {
			at = p.delRetry
		}
		for _, d := range p.dlq {
			if at.IsZero() || d.notBefore.Before(at) {
				at = d.notBefore
			}
		}
		p.mu.Unlock()
		if !at.IsZero() {
			timer.Reset(max(time.Until(at), 0))
		}
		select {
		case <-p.stop:
			return
		case <-p.bg.Done():
			return
		case <-p.kick:
		case <-timer.C:
		}
		timer.Stop()
	}
}

// round does one round of the manager's work and reports whether work is left that can be done
// at once.
func (p *partition[T]) round(margin time.Duration) (more bool) {
	now := time.Now()
	p.mu.Lock()
	reqs, capped := p.led.due(now, margin, p.src.vis*time.Duration(p.stretch))
	var dels []*entry
	if now.After(p.delRetry) || p.delRetry.IsZero() {
		n := min(len(p.deletes), 10*deleteCallsPerRound)
		dels = append(dels, p.deletes[:n]...)
		p.deletes = p.deletes[n:]
		p.deleting = n
		more = len(p.deletes) > 0
	}
	var sends []dlqItem
	keep := p.dlq[:0]
	for _, d := range p.dlq {
		if now.Before(d.notBefore) {
			keep = append(keep, d)
		} else {
			sends = append(sends, d)
		}
	}
	p.dlq = keep
	p.mu.Unlock()

	for _, e := range capped {
		p.src.stats.visibilityLost.Add(1)
		p.log.Warn("message reached the 12 h visibility limit of SQS before its epoch committed; it will be delivered again",
			"message_id", e.msgID)
	}
	late := false
	if len(reqs) > 0 {
		late = p.extend(p.bg, reqs, margin)
	}
	p.mu.Lock()
	caughtUp := p.extBehind && !late
	p.extBehind = late
	if late {
		p.stretch = min(2*p.stretch, maxStretch)
	} else if len(reqs) > 0 && p.stretch > 1 {
		p.stretch /= 2
	}
	p.mu.Unlock()
	if caughtUp {
		signal(p.room)
	}
	defer func() {
		p.mu.Lock()
		p.deleting = 0
		if len(dels) > 0 { // the partition is closing: Close deletes them
			p.deletes = append(dels, p.deletes...)
		}
		p.mu.Unlock()
	}()
	for len(dels) > 0 && p.bg.Err() == nil {
		n := min(10*deleteConcurrency, len(dels))
		retry, progress, err := p.deleteBatches(p.bg, dels[:n])
		dels = dels[n:]
		if p.bg.Err() != nil {
			dels = append(retry, dels...)
			return false
		}
		p.mu.Lock()
		p.deleting = len(dels)
		if len(retry) == 0 {
			p.delFails, p.delRetry = 0, time.Time{}
			p.mu.Unlock()
			continue
		}
		// Some deletes failed: they go back to the front, to be tried again after a back-off
		// that grows while no delete at all gets through.
		p.deletes = append(append(retry, dels...), p.deletes...)
		dels = nil
		p.deleting = 0
		if progress {
			p.delFails = 0
		}
		p.delFails++
		p.delRetry = time.Now().Add(backoff(p.delFails))
		if (p.delFails >= maxFailures || permanent(err)) && p.err == nil {
			p.err = p.errorf("partition %s: deleting messages of committed epochs failed (%d in a row; they will be delivered again): %w", p.key, p.delFails, err)
			signal(p.wake)
		}
		p.mu.Unlock()
		more = false
		break // the dead-letter sends taken this round still go out
	}
	for _, d := range sends {
		p.sendDead(d)
	}
	return more
}

// deleteBatches deletes es with up to deleteConcurrency DeleteMessageBatch calls at once, and
// returns once every call has answered: the entries to try again, in their order, whether any
// entry was settled (deleted, or given up as stale), and the first error.
func (p *partition[T]) deleteBatches(ctx context.Context, es []*entry) (retry []*entry, progress bool, err error) {
	if len(es) <= 10 {
		retry, err = p.deleteBatch(ctx, es)
		return retry, len(retry) < len(es), err
	}
	type result struct {
		retry []*entry
		err   error
	}
	results := make([]result, (len(es)+9)/10)
	var wg sync.WaitGroup
	for i := range results {
		batch := es[i*10 : min(i*10+10, len(es))]
		wg.Go(func() {
			results[i].retry, results[i].err = p.deleteBatch(ctx, batch)
		})
	}
	wg.Wait()
	for _, r := range results {
		retry = append(retry, r.retry...)
		if err == nil {
			err = r.err
		}
	}
	return retry, len(retry) < len(es), err
}

// deleteBatch deletes up to 10 messages with DeleteMessageBatch. It returns the entries to try
// again, with the call's error if the whole call failed, or else that of the first failed entry.
func (p *partition[T]) deleteBatch(ctx context.Context, es []*entry) ([]*entry, error) {
	in := &awssqs.DeleteMessageBatchInput{QueueUrl: aws.String(p.src.queue)}
	for i, e := range es {
		in.Entries = append(in.Entries, types.DeleteMessageBatchRequestEntry{Id: aws.String(strconv.Itoa(i)), ReceiptHandle: aws.String(e.handle)})
	}
	sentAt := time.Now()
	out, err := p.src.client.DeleteMessageBatch(ctx, in)
	if err != nil {
		if ctx.Err() == nil {
			p.src.stats.deleteRetries.Add(1)
			p.log.Warn("DeleteMessageBatch failed; retrying", "error", err)
		}
		return es, err
	}
	done := make([]bool, len(es))
	var retry []*entry
	stale := false
	for _, f := range out.Failed {
		i, aerr := strconv.Atoi(aws.ToString(f.Id))
		if aerr != nil || i < 0 || i >= len(es) || done[i] {
			continue
		}
		done[i] = true
		e := es[i]
		if f.SenderFault {
			stale = true
			p.src.stats.staleDeletes.Add(1)
			p.log.Warn("delete refused: the receipt handle is stale (the visibility ran out, so the message will be delivered again: at-least-once)",
				"message_id", e.msgID, "code", aws.ToString(f.Code), "reason", aws.ToString(f.Message))
			p.forget(e)
			continue
		}
		p.src.stats.deleteRetries.Add(1)
		p.log.Warn("delete failed; retrying", "message_id", e.msgID, "code", aws.ToString(f.Code), "reason", aws.ToString(f.Message))
		if err == nil {
			err = fmt.Errorf("message %s: %s: %s", e.msgID, aws.ToString(f.Code), aws.ToString(f.Message))
		}
		retry = append(retry, e)
	}
	inTime, late := 0, false
	for i, e := range es {
		if !done[i] {
			p.src.stats.deleted.Add(1)
			if e.deadline.Sub(sentAt) < p.src.vis/4 {
				late = true
			} else {
				inTime++
			}
			p.forget(e)
		}
	}
	p.mu.Lock()
	if took := time.Since(sentAt); p.delLatency == 0 {
		p.delLatency = took
	} else {
		p.delLatency = (7*p.delLatency + took) / 8
	}
	p.grow(inTime)
	if stale || late {
		// The deletes of committed messages do not keep up with what the partition holds: a
		// delete went out with less than a quarter of the visibility timeout left, or too late.
		// The messages in flight become deletes in bulk when their epoch commits, so the cap on
		// them is what keeps the next commit's deletes in time: it halves, as for a late
		// extension. Receiving goes on (the deletes pause it while they are behind).
		p.cut(time.Now())
	}
	p.mu.Unlock()
	return retry, err
}

// forget drops a deleted (or given up) message from the ledger and wakes a paused receiver.
func (p *partition[T]) forget(e *entry) {
	p.mu.Lock()
	p.led.done(e.id)
	p.mu.Unlock()
	signal(p.room)
}

// extend sends the extension requests (nearest deadline first) with up to extendConcurrency
// calls out at once: ChangeMessageVisibilityBatch, or single ChangeMessageVisibility calls once
// the endpoint turned out not to support the batch call. It reports whether a request went out
// late, with less than half of margin left before its deadline: the extensions do not keep up
// with the messages in flight, and the partition then halves its in-flight cap and receiving
// waits (see congested).
func (p *partition[T]) extend(ctx context.Context, reqs []extension, margin time.Duration) (late bool) {
	batches := make([][]extension, 0, (len(reqs)+9)/10)
	for len(reqs) > 0 {
		n := min(10, len(reqs))
		batches = append(batches, reqs[:n])
		reqs = reqs[n:]
	}
	var mu sync.Mutex
	next := 0
	take := func() []extension {
		mu.Lock()
		defer mu.Unlock()
		if next == len(batches) || ctx.Err() != nil {
			return nil
		}
		next++
		return batches[next-1]
	}
	var lateSeen atomic.Bool
	lateAt := func(x extension) bool {
		now := time.Now()
		if x.deadline.Sub(now) >= margin/2 {
			return false
		}
		if !lateSeen.Swap(true) {
			p.log.Warn("visibility extensions are behind; receiving waits and the cap on messages in flight is halved",
				"time_left", x.deadline.Sub(now).Round(time.Millisecond))
		}
		p.mu.Lock()
		p.congested(now)
		p.mu.Unlock()
		return true
	}
	var wg sync.WaitGroup
	for range min(extendConcurrency, len(batches)) {
		wg.Go(func() {
			for batch := take(); batch != nil; batch = take() {
				if !p.src.singleVis.Load() {
					if p.extendBatch(ctx, batch, lateAt(batch[0])) {
						continue
					}
				}
				for _, x := range batch {
					if ctx.Err() != nil {
						return
					}
					late := lateAt(x)
					sentAt := time.Now()
					_, err := p.src.client.ChangeMessageVisibility(ctx, &awssqs.ChangeMessageVisibilityInput{
						QueueUrl: aws.String(p.src.queue), ReceiptHandle: aws.String(x.handle), VisibilityTimeout: int32(x.timeout / time.Second)})
					p.extended(x, sentAt, err == nil, err != nil && goneCode(apiCode(err)), late, err)
				}
			}
		})
	}
	wg.Wait()
	// Requests a cancelled run never sent are no longer out.
	mu.Lock()
	rest := batches[next:]
	next = len(batches)
	mu.Unlock()
	if len(rest) > 0 {
		p.mu.Lock()
		for _, b := range rest {
			for _, x := range b {
				if e := p.led.entries[x.id]; e != nil {
					e.extending = false
				}
			}
		}
		p.mu.Unlock()
	}
	return lateSeen.Load()
}

// grow raises the in-flight cap for n messages deleted or extended in time: by n while in slow
// start (so that it doubles per round trip), else by n/8 (an eighth per round trip). The caller
// holds p.mu.
func (p *partition[T]) grow(n int) {
	top := float64(p.src.cfg.maxInFlight)
	if n <= 0 || p.limit >= top {
		return
	}
	if p.slowStart {
		p.limit += float64(n)
	} else {
		p.limit += float64(n) / 8
	}
	p.limit = min(p.limit, top)
}

// congested records that extensions are behind (one went out late, or failed): receiving waits
// until a round of extensions goes out in time, and the in-flight cap halves, from what is in
// flight if that is less, at most once per quarter visibility timeout (the time the messages
// received since need before they show whether the cut was enough), and not while more are in
// flight than the cap already allows. Slow start ends. The caller holds p.mu.
func (p *partition[T]) congested(now time.Time) {
	p.extBehind = true
	p.cut(now)
}

// cut halves the in-flight cap, from what is in flight if that is less, at most once per quarter
// visibility timeout and not while more are in flight than the cap already allows (see
// congested). Slow start ends. The caller holds p.mu.
func (p *partition[T]) cut(now time.Time) {
	if !p.lastCut.IsZero() && now.Sub(p.lastCut) < p.src.vis/4 {
		return
	}
	if float64(p.led.inFlight()) > p.limit {
		// Still above a cap already cut: receiving waits until commits bring the messages in
		// flight below it, and those messages, not the cap, are what is behind.
		return
	}
	p.lastCut = now
	p.slowStart = false
	p.limit = max(min(p.limit, float64(p.led.inFlight()))/2, minInFlightLimit)
	p.src.stats.limitCuts.Add(1)
}

// extendBatch sends one ChangeMessageVisibilityBatch call. It returns false when the endpoint
// does not support the call (and remembers that for the whole source).
func (p *partition[T]) extendBatch(ctx context.Context, batch []extension, late bool) bool {
	in := &awssqs.ChangeMessageVisibilityBatchInput{QueueUrl: aws.String(p.src.queue)}
	for i, x := range batch {
		in.Entries = append(in.Entries, types.ChangeMessageVisibilityBatchRequestEntry{
			Id: aws.String(strconv.Itoa(i)), ReceiptHandle: aws.String(x.handle), VisibilityTimeout: int32(x.timeout / time.Second)})
	}
	sentAt := time.Now()
	out, err := p.src.client.ChangeMessageVisibilityBatch(ctx, in)
	if err != nil {
		if batchUnsupported(err) {
			if !p.src.singleVis.Swap(true) {
				p.log.Info("the endpoint does not support ChangeMessageVisibilityBatch; extending visibility with single calls", "error", err)
			}
			return false
		}
		for _, x := range batch {
			p.extended(x, sentAt, false, false, late, err)
		}
		return true
	}
	failed := make(map[int]types.BatchResultErrorEntry, len(out.Failed))
	for _, f := range out.Failed {
		if i, err := strconv.Atoi(aws.ToString(f.Id)); err == nil {
			failed[i] = f
		}
	}
	for i, x := range batch {
		f, bad := failed[i]
		if !bad {
			p.extended(x, sentAt, true, false, late, nil)
			continue
		}
		err := fmt.Errorf("%s: %s", aws.ToString(f.Code), aws.ToString(f.Message))
		p.extended(x, sentAt, false, f.SenderFault || goneCode(aws.ToString(f.Code)), late, err)
	}
	return true
}

// extended records an extension's outcome in the ledger, counts it and logs a lost message. An
// extension in time raises the in-flight cap; one that failed to be retried (a throttle, an
// error of SQS's) counts as congestion.
func (p *partition[T]) extended(x extension, sentAt time.Time, ok, gone, late bool, err error) {
	p.mu.Lock()
	p.led.extended(x, sentAt, ok, gone)
	switch {
	case ok && !late:
		p.grow(1)
	case !ok && !gone && p.bg.Err() == nil:
		p.congested(time.Now())
	}
	msgID := ""
	if e := p.led.entries[x.id]; e != nil {
		msgID = e.msgID
	}
	p.mu.Unlock()
	switch {
	case ok:
		p.src.stats.extended.Add(1)
	case gone:
		p.src.stats.visibilityLost.Add(1)
		p.log.Warn("could not extend the visibility of a message: its receipt handle is no longer valid, so it will be delivered again (at-least-once)",
			"message_id", msgID, "error", err)
	default:
		p.src.stats.extendRetries.Add(1)
		p.log.Warn("extending visibility failed; retrying", "message_id", msgID, "error", err)
	}
}

// sendDead sends a rejected message to the dead-letter queue; once confirmed, the message is
// deleted from the source queue as soon as its epoch is committed.
func (p *partition[T]) sendDead(d dlqItem) {
	s := p.src
	attrs := make(map[string]types.MessageAttributeValue, len(d.msg.Attributes)+1)
	for k, v := range d.msg.Attributes {
		attrs[k] = v
	}
	cause := fmt.Sprintf("message %s of queue %s rejected: %v", d.msg.ID, s.queue, d.cause)
	attrs[ErrorAttribute] = types.MessageAttributeValue{DataType: aws.String("String"), StringValue: aws.String(cause)}
	if len(attrs) > 10 {
		p.fail(p.errorf("message %s was rejected (%v) but cannot go to the dead-letter queue %s: it has %d attributes, which leaves no room for %s (SQS allows 10)",
			d.msg.ID, d.cause, s.cfg.dlq, len(d.msg.Attributes), ErrorAttribute))
		return
	}
	in := &awssqs.SendMessageInput{QueueUrl: aws.String(s.cfg.dlq), MessageBody: aws.String(d.msg.Body), MessageAttributes: attrs}
	if s.dlqFIFO {
		g := d.msg.GroupID
		if g == "" {
			g = "epochflow-dead-letter"
		}
		in.MessageGroupId = aws.String(g)
		in.MessageDeduplicationId = aws.String(d.msg.ID)
	}
	_, err := s.client.SendMessage(p.bg, in)
	if err != nil {
		if p.bg.Err() != nil {
			return
		}
		d.fails++
		if permanent(err) || d.fails >= maxFailures {
			p.fail(p.errorf("sending rejected message %s to the dead-letter queue %s failed %d times (the message stays in the queue): %w", d.msg.ID, s.cfg.dlq, d.fails, err))
			return
		}
		p.log.Warn("sending a rejected message to the dead-letter queue failed; retrying", "message_id", d.msg.ID, "error", err)
		d.notBefore = time.Now().Add(backoff(d.fails))
		p.mu.Lock()
		p.dlq = append(p.dlq, d)
		p.mu.Unlock()
		return
	}
	s.stats.deadLettered.Add(1)
	p.mu.Lock()
	e := p.led.dlqSent(d.id)
	if e != nil {
		p.deletes = append(p.deletes, e)
	}
	p.mu.Unlock()
	if e != nil {
		signal(p.kick) // its epoch committed before the send was confirmed: delete it now
	}
}

// Close stops the goroutines, deletes the messages of committed epochs still waiting (for up to
// 20 s), and makes the uncommitted ones visible again at once (no further Commit can come).
// It returns the error that stopped the partition if the engine has not seen it yet, and an
// error if committed messages could not be deleted (they will be delivered again).
func (p *partition[T]) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	p.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
	defer cancel()
	defer context.AfterFunc(ctx, p.cancel)() // the manager's unfinished round shares the budget
	p.stopRecv()
	close(p.stop)
	p.wg.Wait()
	defer p.cancel()

	p.mu.Lock()
	dels := p.deletes
	p.deletes = nil
	rel := p.led.release()
	p.ready = nil
	var errs []error
	if p.err != nil && !p.told {
		errs = append(errs, p.err)
	}
	fails := p.delFails // the count goes on: deletes that failed 8 times get one more try
	p.mu.Unlock()

	var lastErr error
	for len(dels) > 0 && ctx.Err() == nil {
		n := min(10*deleteConcurrency, len(dels))
		retry, progress, err := p.deleteBatches(ctx, dels[:n])
		dels = append(retry, dels[n:]...)
		if len(retry) == 0 {
			fails = 0
			continue
		}
		lastErr = err
		if progress {
			fails = 0
		}
		fails++
		if fails >= maxFailures || permanent(err) || !sleep(ctx, backoff(fails)) {
			break
		}
	}
	if len(dels) > 0 {
		if lastErr == nil {
			lastErr = ctx.Err()
		}
		errs = append(errs, p.errorf("partition %s: %d messages of committed epochs could not be deleted before Close (they will be delivered again): %v", p.key, len(dels), lastErr))
	}
	if len(rel) > 0 {
		reqs := make([]extension, len(rel))
		for i, e := range rel {
			reqs[i] = extension{id: e.id, handle: e.handle}
		}
		p.release(ctx, reqs)
	}
	return errors.Join(errs...)
}

// release makes messages visible again (visibility timeout 0), best effort: those it misses
// come back when their timeout runs out.
func (p *partition[T]) release(ctx context.Context, reqs []extension) {
	for len(reqs) > 0 && ctx.Err() == nil {
		n := min(10, len(reqs))
		batch := reqs[:n]
		reqs = reqs[n:]
		if !p.src.singleVis.Load() {
			in := &awssqs.ChangeMessageVisibilityBatchInput{QueueUrl: aws.String(p.src.queue)}
			for i, x := range batch {
				in.Entries = append(in.Entries, types.ChangeMessageVisibilityBatchRequestEntry{Id: aws.String(strconv.Itoa(i)), ReceiptHandle: aws.String(x.handle)})
			}
			out, err := p.src.client.ChangeMessageVisibilityBatch(ctx, in)
			if err == nil {
				p.src.stats.released.Add(int64(len(batch) - len(out.Failed)))
				continue
			}
			if !batchUnsupported(err) {
				continue
			}
			p.src.singleVis.Store(true)
		}
		for _, x := range batch {
			if _, err := p.src.client.ChangeMessageVisibility(ctx, &awssqs.ChangeMessageVisibilityInput{
				QueueUrl: aws.String(p.src.queue), ReceiptHandle: aws.String(x.handle)}); err == nil {
				p.src.stats.released.Add(1)
			}
		}
	}
}

// loggerOr returns l, or the run's logger when l is nil.
func loggerOr(l *slog.Logger, ctx context.Context) *slog.Logger {
	if l != nil {
		return l
	}
	return dataflow.Logger(ctx)
}
