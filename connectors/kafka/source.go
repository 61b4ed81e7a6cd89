package kafka

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/epochflow/epochflow/dataflow"
)

// Defaults of SourceConfig.
const (
	// DefaultMaxBuffered is how many records a partition's consumer buffers, read but not yet
	// returned by Next, before it stops fetching.
	DefaultMaxBuffered = 16384
	// pollMax bounds the records one poll takes from the client.
	pollMax = 4096
	// closeGrace bounds Close's wait for the consumer's goroutines.
	closeGrace = 10 * time.Second
)

// SourceConfig says which topics a source reads and how.
type SourceConfig struct {
	// Brokers are the seed brokers, HOST:PORT. Required.
	Brokers []string
	// Topics are the topics to read, every partition of each (one source partition per topic
	// partition). Required. The partitions are listed when the run starts.
	Topics []string
	// Group, if set, is a consumer group to which each partition's committed offset is written
	// when its epoch commits (an OffsetCommit without group membership), so that lag tools see
	// the flow's progress. Correctness does not depend on it: the offsets that count are in the
	// flow's snapshots. A failed offset commit is logged and retried at the next commit.
	Group string
	// ReadUncommitted reads records of open and aborted transactions too. By default the
	// source reads committed records only (isolation level read_committed).
	ReadUncommitted bool
	// Latest starts a partition that has no resume state at its end (only records produced
	// after the start are read); by default it starts at its beginning.
	Latest bool
	// IdleEOF, if positive, ends each partition (io.EOF) once no record has arrived for this
	// long: for tests, drains and backfills. Zero means the partitions never end.
	IdleEOF time.Duration
	// MaxBuffered is how many records a partition buffers before it stops fetching until Next
	// takes them; 0 means DefaultMaxBuffered.
	MaxBuffered int
	// Options are extra franz-go client options (TLS, SASL, timeouts), applied after the
	// connector's own.
	Options []kgo.Opt
	// Logger receives the source's logs; nil means the run's logger (dataflow.Logger).
	Logger *slog.Logger
}

func (c *SourceConfig) check() error {
	if err := checkBrokers("source", c.Brokers); err != nil {
		return err
	}
	if len(c.Topics) == 0 {
		return errors.New("kafka source: SourceConfig.Topics is empty")
	}
	for _, t := range c.Topics {
		if t == "" {
			return errors.New("kafka source: SourceConfig.Topics holds an empty topic name")
		}
	}
	if c.IdleEOF < 0 {
		return fmt.Errorf("kafka source: SourceConfig.IdleEOF is %v, want 0 (never) or more", c.IdleEOF)
	}
	if c.MaxBuffered < 0 {
		return fmt.Errorf("kafka source: SourceConfig.MaxBuffered is %d, want 0 (the default %d) or more", c.MaxBuffered, DefaultMaxBuffered)
	}
	if c.MaxBuffered == 0 {
		c.MaxBuffered = DefaultMaxBuffered
	}
	return nil
}

// Consume returns a source of the records of cfg.Topics. See the package documentation for its
// partitions, state and delivery guarantee.
func Consume(cfg SourceConfig) dataflow.Source[Record] {
	return dataflow.FromPartitioned[Record, int64](NewSource(cfg))
}

// Source is the dataflow.PartitionedSource behind Consume. Its partitions are the topics'
// partitions, "TOPIC/PARTITION"; their state is the offset of the next record to read (an
// int64).
type Source struct {
	cfg SourceConfig
}

// NewSource returns the source of Consume, for tests and for composing it.
func NewSource(cfg SourceConfig) *Source { return &Source{cfg: cfg} }

// Parts lists the partitions of every topic, "TOPIC/PARTITION", topic by topic in the order
// of SourceConfig.Topics and by partition number. A missing topic fails it.
func (s *Source) Parts(ctx context.Context) ([]string, error) {
	cfg := s.cfg
	if err := cfg.check(); err != nil {
		return nil, err
	}
	cl, err := newClient(cfg.Brokers, cfg.Options)
	if err != nil {
		return nil, fmt.Errorf("kafka source: %w", err)
	}
	defer cl.Close()
	var parts []string
	for _, t := range cfg.Topics {
		ps, err := partitionsOf(ctx, cl, t)
		if err != nil {
			return nil, fmt.Errorf("kafka source: %w", err)
		}
		for _, p := range ps {
			parts = append(parts, partKey(t, p))
		}
	}
	return parts, nil
}

// Build opens one partition: a client that consumes that topic partition alone (no group
// membership), from the offset resume holds, or from the beginning (the end with
// SourceConfig.Latest) without one.
func (s *Source) Build(ctx context.Context, part string, resume *int64) (dataflow.StatefulSource[Record, int64], error) {
	cfg := s.cfg
	if err := cfg.check(); err != nil {
		return nil, err
	}
	topic, num, err := parsePartKey(part)
	if err != nil {
		return nil, err
	}
	start := kgo.NewOffset().AtStart()
	if cfg.Latest {
		start = kgo.NewOffset().AtEnd()
	}
	if resume != nil && *resume >= 0 {
		start = kgo.NewOffset().At(*resume)
	}
	iso := kgo.ReadCommitted()
	if cfg.ReadUncommitted {
		iso = kgo.ReadUncommitted()
	}
	cl, err := newClient(cfg.Brokers, cfg.Options,
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: {num: start}}),
		kgo.FetchIsolationLevel(iso),
		kgo.FetchMaxWait(500*time.Millisecond))
	if err != nil {
		return nil, fmt.Errorf("kafka source: partition %s: %w", part, err)
	}
	log := cfg.Logger
	if log == nil {
		log = dataflow.Logger(ctx)
	}
	c := &consumer{cfg: cfg, part: part, topic: topic, num: num, cl: cl, log: log,
		next: -1, wake: make(chan struct{}, 1), room: make(chan struct{}, 1),
		kick: make(chan struct{}, 1), exited: make(chan struct{})}
	if resume != nil {
		c.next = *resume
	}
	c.from = c.next
	c.metrics = dataflow.Metrics(ctx)
	c.end.Store(-1)
	c.done.Store(c.next)
	c.ctx, c.cancel = context.WithCancel(context.Background())
	n := 1
	if cfg.Group != "" {
		n = 2
		c.adm = kadm.NewClient(cl)
	}
	c.wg.Add(n)
	go c.fetch()
	if cfg.Group != "" {
		go c.commitOffsets()
	}
	go func() { c.wg.Wait(); close(c.exited) }()
	return c, nil
}

// consumer is one open partition. The worker calls Next, Snapshot, Commit and Close; the fetch
// goroutine polls the client into buf; the commit goroutine (with a Group) writes offsets.
type consumer struct {
	cfg   SourceConfig
	part  string
	topic string
	num   int32
	cl    *kgo.Client
	adm   *kadm.Client
	log   *slog.Logger

	from  int64 // the resume offset, -1 for none (read by the fetch goroutine)
	next  int64 // owned by the worker: the offset after the last record Next returned, -1 before any
	spare []Record
	told  bool

	ctx    context.Context
	cancel context.CancelFunc
	wake   chan struct{} // Wait: records, a failure or the idle end arrived
	room   chan struct{} // Next took the buffer
	kick   chan struct{} // a commit target was set
	wg     sync.WaitGroup
	exited chan struct{}
	once   sync.Once

	// The lag (reportLag): the partition's end as the last fetch saw it, and the offset of the
	// last committed epoch's snapshot (before any: of the first record fetched; -1 before that).
	metrics   dataflow.MetricsHook
	end, done atomic.Int64

	mu        sync.Mutex // guards the fields below
	buf       []Record
	err       error
	idle      bool
	target    int64 // the offset to commit to the group; 0 none
	committed int64 // the offset the group last accepted
}

func (c *consumer) signal() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

func (c *consumer) fail(err error) {
	c.mu.Lock()
	if c.err == nil {
		c.err = fmt.Errorf("kafka source: partition %s: %w", c.part, err)
	}
	c.mu.Unlock()
	c.signal()
}

// fetch is the fetch goroutine: it polls the client until Close, keeping at most MaxBuffered
// records in buf, and marks the partition idle after IdleEOF without a record.
func (c *consumer) fetch() {
	defer c.wg.Done()
	// The idle clock runs once the partition has shown it is caught up: it had nothing to
	// read at the start, or a record came. A slow first fetch is not idleness.
	caughtUp := c.cfg.IdleEOF <= 0 || c.emptyAtStart()
	last := time.Now()
	for c.ctx.Err() == nil {
		c.mu.Lock()
		full := len(c.buf) >= c.cfg.MaxBuffered
		c.mu.Unlock()
		if full {
			select {
			case <-c.room:
				continue
			case <-c.ctx.Done():
				return
			}
		}
		pctx, cancel := c.ctx, context.CancelFunc(func() {})
		if c.cfg.IdleEOF > 0 && caughtUp {
			pctx, cancel = context.WithDeadline(c.ctx, last.Add(c.cfg.IdleEOF))
		}
		fs := c.cl.PollRecords(pctx, pollMax)
		timedOut := pctx.Err() != nil
		cancel()
		if c.ctx.Err() != nil {
			return
		}
		var ferr error
		fs.EachError(func(t string, p int32, err error) {
			var loss *kgo.ErrDataLoss
			switch {
			case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
			case errors.As(err, &loss):
				c.log.Warn("kafka source: records were lost (the offset to resume at no longer exists; retention deleted them?); reading on from the next offset the broker has",
					"partition", c.part, "error", err)
			default:
				if ferr == nil {
					ferr = fmt.Errorf("fetching: %w", err)
				}
			}
		})
		if ferr != nil {
			c.fail(ferr)
			return
		}
		n := fs.NumRecords()
		if n == 0 {
			if timedOut && c.cfg.IdleEOF > 0 && time.Since(last) >= c.cfg.IdleEOF {
				c.mu.Lock()
				c.idle = true
				c.mu.Unlock()
				c.signal()
				<-c.ctx.Done() // the partition has ended: wait for Close
				return
			}
			continue
		}
		last, caughtUp = time.Now(), true
		c.mu.Lock()
		fs.EachRecord(func(r *kgo.Record) { c.buf = append(c.buf, fromKgo(r)) })
		c.mu.Unlock()
		c.signal()
		fs.EachPartition(func(p kgo.FetchTopicPartition) {
			end := p.HighWatermark
			if !c.cfg.ReadUncommitted && p.LastStableOffset >= 0 {
				end = p.LastStableOffset // read_committed reads up to the last stable offset
			}
			c.end.Store(end)
			if len(p.Records) > 0 {
				c.done.CompareAndSwap(-1, p.Records[0].Offset) // a fresh start counts from its first record
			}
		})
		c.reportLag()
	}
}

// emptyAtStart tells whether the partition has nothing to read from where it starts: its
// resume offset (or its beginning) is at its end (the last stable offset when reading
// committed records). An error counts as "not known to be empty".
func (c *consumer) emptyAtStart() bool {
	if c.cfg.Latest && c.from < 0 {
		return true
	}
	ctx, cancel := context.WithTimeout(c.ctx, 30*time.Second)
	defer cancel()
	adm := kadm.NewClient(c.cl)
	var ends kadm.ListedOffsets
	var err error
	if c.cfg.ReadUncommitted {
		ends, err = adm.ListEndOffsets(ctx, c.topic)
	} else {
		ends, err = adm.ListCommittedOffsets(ctx, c.topic)
	}
	if err != nil {
		return false
	}
	end, ok := ends.Lookup(c.topic, c.num)
	if !ok || end.Err != nil {
		return false
	}
	from := c.from
	if from < 0 {
		starts, err := adm.ListStartOffsets(ctx, c.topic)
		if err != nil {
			return false
		}
		st, ok := starts.Lookup(c.topic, c.num)
		if !ok || st.Err != nil {
			return false
		}
		from = st.Offset
	}
	return from >= end.Offset
}

// Wait returns a channel that is ready when records (or a failure, or the idle end) arrived.
func (c *consumer) Wait() <-chan struct{} { return c.wake }

// Next returns the records fetched since the last call, in offset order. It never blocks.
func (c *consumer) Next(context.Context) ([]Record, error) {
	c.mu.Lock()
	buf, err, idle := c.buf, c.err, c.idle
	c.buf = c.spare[:0]
	c.mu.Unlock()
	select {
	case c.room <- struct{}{}:
	default:
	}
	if err != nil {
		c.told = true
		return nil, err
	}
	if len(buf) == 0 {
		c.spare = buf[:0]
		if idle {
			return nil, io.EOF
		}
		return nil, nil
	}
	out := buf // the engine keeps it: the fetch goroutine starts a new buffer
	c.spare = nil
	if first := out[0].Offset; c.next >= 0 && first < c.next {
		// The client never goes back, but a resumed partition must not re-emit what an
		// earlier run committed: drop records below the resume offset.
		i := 0
		for i < len(out) && out[i].Offset < c.next {
			i++
		}
		out = out[i:]
	}
	if len(out) > 0 {
		c.next = out[len(out)-1].Offset + 1
	}
	return out, nil
}

// reportLag reports the records between the last committed epoch's offset (or, before the
// first commit of a fresh start, the first record fetched) and the partition's end as the last fetch saw it, as epochflow_source_lag: read or not, they
// are not committed yet. It is called by the fetch goroutine after each fetch and by Commit.
func (c *consumer) reportLag() {
	end := c.end.Load()
	if end < 0 {
		return // no fetch yet
	}
	if from := c.done.Load(); from >= 0 {
		c.metrics.SourceLag(c.part, float64(max(end-from, 0)))
	}
}

// Snapshot returns the offset of the next record to read: everything Next returned is below
// it. Before the first record it is the resume offset, or -1 (none) on a fresh start.
func (c *consumer) Snapshot() int64 { return c.next }

// Commit hands the offset to the commit goroutine when SourceConfig.Group is set (it returns
// at once), and otherwise does nothing: the offset is in the flow's snapshot already.
func (c *consumer) Commit(_ context.Context, next int64) error {
	if next > c.done.Load() {
		c.done.Store(next)
		c.reportLag()
	}
	c.mu.Lock()
	err := c.err
	if c.adm != nil && next > c.target {
		c.target = next
		select {
		case c.kick <- struct{}{}:
		default:
		}
	}
	c.mu.Unlock()
	if err != nil {
		c.told = true
	}
	return err
}

// commitOffsets is the commit goroutine: it writes the newest committed offset to the group.
func (c *consumer) commitOffsets() {
	defer c.wg.Done()
	for {
		select {
		case <-c.kick:
		case <-c.ctx.Done():
			return
		}
		if err := c.commitGroup(c.ctx); err != nil && c.ctx.Err() == nil {
			c.log.Warn("kafka source: committing the offset to the consumer group failed; retrying at the next commit (the flow's own offsets are unaffected)",
				"partition", c.part, "group", c.cfg.Group, "error", err)
		}
	}
}

// commitGroup writes the newest commit target to the consumer group, unless the group holds
// it already.
func (c *consumer) commitGroup(parent context.Context) error {
	c.mu.Lock()
	target, done := c.target, c.committed
	c.mu.Unlock()
	if target <= done {
		return nil
	}
	var os kadm.Offsets
	os.Add(kadm.Offset{Topic: c.topic, Partition: c.num, At: target, LeaderEpoch: -1})
	ctx, cancel := context.WithTimeout(parent, 30*time.Second)
	resp, err := c.adm.CommitOffsets(ctx, c.cfg.Group, os)
	cancel()
	if err == nil {
		err = resp.Error()
	}
	if err != nil {
		return fmt.Errorf("offset %d: %w", target, err)
	}
	c.mu.Lock()
	c.committed = max(c.committed, target)
	c.mu.Unlock()
	return nil
}

// Close stops the goroutines, writes the last committed offset to the consumer group if the
// commit goroutine had not yet (so that the group shows the flow's progress after a clean
// end), and closes the client. It returns the failure that stopped the partition, unless Next
// or Commit already returned it.
func (c *consumer) Close() error { return c.close(true) }

func (c *consumer) close(flush bool) error {
	c.once.Do(func() {
		c.cancel()
		t := time.NewTimer(closeGrace)
		stopped := false
		select {
		case <-c.exited:
			stopped = true
		case <-t.C:
			c.log.Warn("kafka source: the consumer's goroutines did not stop in time; closing the client", "partition", c.part)
		}
		t.Stop()
		// Only once the commit goroutine has stopped is this write the newest: an older one
		// cannot land after it.
		if flush && stopped && c.adm != nil {
			ctx, cancel := context.WithTimeout(context.Background(), closeGrace)
			if err := c.commitGroup(ctx); err != nil {
				c.log.Warn("kafka source: writing the last committed offset to the consumer group failed at close (the flow's own offsets are unaffected)",
					"partition", c.part, "group", c.cfg.Group, "error", err)
			}
			cancel()
		}
		c.cl.Close()
		<-c.exited
	})
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.told {
		return nil
	}
	return c.err
}

// kill drops the partition as a crashed process would (for tests): nothing more is committed.
func (c *consumer) kill() { _ = c.close(false) }
