package kafka

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/epochflow/epochflow/dataflow"
	"github.com/epochflow/epochflow/internal/commitloop"
)

// Defaults of SinkConfig.
const (
	// DefaultTransactions is the number of transactional ids per sink partition.
	DefaultTransactions = 8
	// DefaultTransactionTimeout is the transaction timeout the sink asks for. It must cover an
	// epoch, its commit and a restart after a crash; it may not exceed the brokers'
	// transaction.max.timeout.ms (15 minutes by default).
	DefaultTransactionTimeout = 5 * time.Minute
	// minRestart is the time a transaction timeout must leave, beyond the epochs, for a crashed
	// flow to restart and commit its prepared transactions.
	minRestart = 30 * time.Second
	// epochsPerTimeout is how many epoch intervals a transaction may have to live: the epochs
	// in flight (dataflow.DefaultMaxEpochsInFlight) and the open one.
	epochsPerTimeout = dataflow.DefaultMaxEpochsInFlight + 1
	// recoverTimeout bounds the recovery of one prepared transaction at Build.
	recoverTimeout = time.Minute
)

// SinkConfig says where a sink writes.
type SinkConfig struct {
	// Brokers are the seed brokers, HOST:PORT. Required.
	Brokers []string
	// Topic is the topic every record goes to; empty means each record's Topic.
	Topic string
	// Name identifies the flow and the step in the sink's transactional ids,
	// "NAME-PART-SLOT": use one name per sink (such as "kafka-copy.write"), the same across
	// runs of the flow, and never two running flows with the same name on one cluster (the
	// second would fence the first). Required.
	Name string
	// Partitions is the number of sink partitions ("p0", "p1", ...), each with its own
	// transactions; a record goes to one by a hash of its key. 0 means 1. It must stay the
	// same across runs on one recovery store.
	Partitions int
	// Transactions is the number of transactional ids (producers) per partition, so that an
	// epoch's transaction can begin while earlier ones wait for their commit. It must exceed
	// the run's epochs in flight (dataflow.Options.MaxEpochsInFlight); 0 means
	// DefaultTransactions. It may grow from one run to the
	// next, never shrink.
	Transactions int
	// TransactionTimeout is the transaction timeout (0 means DefaultTransactionTimeout). A
	// transaction is open from the first write of its epoch until its commit, and after a
	// crash until the restart commits it: the timeout must be at least 5 epoch intervals plus
	// 30 s, or Build refuses to start. A transaction the broker aborts on timeout loses its
	// records.
	TransactionTimeout time.Duration
	// Options are extra franz-go client options (TLS, SASL, linger, compression), applied
	// after the connector's own.
	Options []kgo.Opt
	// Logger receives the sink's logs; nil means the run's logger (dataflow.Logger).
	Logger *slog.Logger
}

func (c *SinkConfig) check() error {
	if err := checkBrokers("sink", c.Brokers); err != nil {
		return err
	}
	switch {
	case c.Name == "":
		return errors.New("kafka sink: SinkConfig.Name is empty: give the sink a name that identifies the flow and step (its transactional ids start with it)")
	case c.Partitions < 0:
		return fmt.Errorf("kafka sink %q: SinkConfig.Partitions is %d, want 0 (one) or more", c.Name, c.Partitions)
	case c.Transactions < 0 || c.Transactions == 1:
		return fmt.Errorf("kafka sink %q: SinkConfig.Transactions is %d, want 0 (the default %d) or 2 or more", c.Name, c.Transactions, DefaultTransactions)
	case c.TransactionTimeout < 0:
		return fmt.Errorf("kafka sink %q: SinkConfig.TransactionTimeout is %v, want 0 (the default %v) or more", c.Name, c.TransactionTimeout, DefaultTransactionTimeout)
	}
	if c.Transactions == 0 {
		c.Transactions = DefaultTransactions
	}
	if c.TransactionTimeout == 0 {
		c.TransactionTimeout = DefaultTransactionTimeout
	}
	return nil
}

// MinTransactionTimeout returns the shortest SinkConfig.TransactionTimeout that Build accepts
// with this epoch interval: 5 epoch intervals (the epochs in flight and the open one) plus 30 s
// for a restart after a crash.
func MinTransactionTimeout(epochInterval time.Duration) time.Duration {
	return epochsPerTimeout*epochInterval + minRestart
}

// checkTimeout refuses a transaction timeout too short for the run's epoch interval.
func (c *SinkConfig) checkTimeout(interval time.Duration) error {
	if interval <= 0 {
		return nil
	}
	if need := MinTransactionTimeout(interval); c.TransactionTimeout < need {
		return fmt.Errorf("kafka sink %q: the transaction timeout (SinkConfig.TransactionTimeout) is %v, too short for the epoch interval %v (flag -epoch-interval): a transaction lives for up to %d epochs plus a restart after a crash, so it must be at least %v; raise the timeout (at most the brokers' transaction.max.timeout.ms) or shorten the epoch interval",
			c.Name, c.TransactionTimeout, interval, epochsPerTimeout, need)
	}
	return nil
}

// SinkState is a sink partition's snapshot: how many snapshots it took and the transactions
// that were flushed (prepared) but not yet known to be committed when it was taken, oldest
// first. After a crash, Build commits those of the resume state (their epochs are committed)
// and aborts every other transaction of the partition's ids.
type SinkState struct {
	Seq  uint64
	Txns []Txn
}

// Txn identifies one flushed transaction: the snapshot it belongs to, its transactional id and
// the producer id and epoch that wrote it.
type Txn struct {
	Seq           uint64
	ID            string
	ProducerID    int64
	ProducerEpoch int16
}

// Produce returns an exactly-once sink of records: one Kafka transaction per epoch and sink
// partition, committed when the epoch commits. See the package documentation.
func Produce(cfg SinkConfig) dataflow.Sink[Record] {
	return dataflow.ToPartitioned[Record, SinkState](NewSink(cfg))
}

// Sink is the dataflow.PartitionedSink behind Produce.
type Sink struct {
	cfg SinkConfig
	// afterEnd, if set, is called by the committer after each EndTransaction (tests).
	afterEnd func(Txn, error)
}

// NewSink returns the sink of Produce, for tests and for composing it.
func NewSink(cfg SinkConfig) *Sink { return &Sink{cfg: cfg} }

// Parts returns "p0", "p1", ... (SinkConfig.Partitions of them).
func (s *Sink) Parts(context.Context) ([]string, error) {
	cfg := s.cfg
	if err := cfg.check(); err != nil {
		return nil, err
	}
	parts := make([]string, max(cfg.Partitions, 1))
	for i := range parts {
		parts[i] = "p" + strconv.Itoa(i)
	}
	return parts, nil
}

// PartFor picks the partition by a hash of the record's key (records without a key go to the
// first).
func (s *Sink) PartFor(r Record, parts int) int {
	if len(r.Key) == 0 || parts <= 1 {
		return 0
	}
	h := fnv.New32a()
	h.Write(r.Key)
	return int(h.Sum32() % uint32(parts))
}

// txnID is the transactional id of a slot of a partition.
func (c *SinkConfig) txnID(part string, slot int) string {
	return c.Name + "-" + part + "-" + strconv.Itoa(slot)
}

// Build opens a partition and finishes what an earlier run left: the prepared transactions of
// resume (of committed epochs) are committed with EndTxn requests from their ids, producer
// ids and epochs, without initialising their transactional ids (which would abort them); then
// every transactional id of the partition is initialised, which aborts any transaction still
// open on it (of an epoch that never committed).
func (s *Sink) Build(ctx context.Context, part string, resume *SinkState) (dataflow.StatefulSink[Record, SinkState], error) {
	cfg := s.cfg
	if err := cfg.check(); err != nil {
		return nil, err
	}
	if err := cfg.checkTimeout(dataflow.EpochInterval(ctx)); err != nil {
		return nil, err
	}
	log := cfg.Logger
	if log == nil {
		log = dataflow.Logger(ctx)
	}
	p := &producer{cfg: cfg, part: part, log: log, afterEnd: s.afterEnd}
	fail := func(err error) (dataflow.StatefulSink[Record, SinkState], error) {
		p.closeClients()
		return nil, fmt.Errorf("kafka sink %q: partition %s: %w", cfg.Name, part, err)
	}
	if resume != nil {
		p.seq = resume.Seq
		if len(resume.Txns) > 0 {
			cl, err := newClient(cfg.Brokers, cfg.Options)
			if err != nil {
				return fail(err)
			}
			for _, t := range resume.Txns {
				committed, err := commitPrepared(ctx, cl, t, log.With("partition", part))
				if err != nil {
					cl.Close()
					return fail(err)
				}
				if committed {
					log.Info("kafka sink: committed the prepared transaction of a committed epoch", "partition", part, "transactional_id", t.ID, "snapshot", t.Seq)
				}
			}
			cl.Close()
		}
	}
	p.slots = make([]*slot, cfg.Transactions)
	var wg sync.WaitGroup
	errs := make([]error, len(p.slots))
	for i := range p.slots {
		p.slots[i] = &slot{index: i, id: cfg.txnID(part, i)}
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = p.initSlot(ctx, p.slots[i])
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return fail(err)
	}
	p.free = append(p.free, p.slots...)
	p.commits = commitloop.Start(p.commitUpTo, func(err error) error {
		return fmt.Errorf("kafka sink %q: partition %s: %w", p.cfg.Name, p.part, err)
	})
	return p, nil
}

// commitPrepared ends a flushed transaction of a committed epoch with EndTxn(commit), sent
// with its own producer id and epoch, and reports whether this call committed it. A broker
// that answers that the epoch is stale (ProducerFenced or InvalidProducerEpoch: the id moved
// on) is taken as done, since that is what a transaction the sink committed before the crash
// gives; but a broker without KIP-890 gives the same answer for a transaction it aborted on
// its timeout (the abort bumps the epoch), and the answer cannot tell the two apart, so it is
// logged as a warning (see staleCommit).
func commitPrepared(ctx context.Context, cl *kgo.Client, t Txn, log *slog.Logger) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, recoverTimeout)
	defer cancel()
	backoff := 50 * time.Millisecond
	for {
		req := kmsg.NewPtrEndTxnRequest()
		req.TransactionalID = t.ID
		req.ProducerID = t.ProducerID
		req.ProducerEpoch = t.ProducerEpoch
		req.Commit = true
		resp, err := req.RequestWith(ctx, cl)
		if err == nil {
			err = kerr.ErrorForCode(resp.ErrorCode)
		}
		switch {
		case err == nil:
			return true, nil
		case errors.Is(err, kerr.ProducerFenced), errors.Is(err, kerr.InvalidProducerEpoch):
			staleCommit(ctx, cl, t, err, log)
			return false, nil
		case errors.Is(err, kerr.InvalidTxnState):
			return false, fmt.Errorf("committing the prepared transaction %s (producer id %d, epoch %d) of snapshot %d: the broker says it is not open, it was aborted (its transaction timeout ran out?), and its records are lost: %w",
				t.ID, t.ProducerID, t.ProducerEpoch, t.Seq, err)
		case errors.Is(err, kerr.InvalidProducerIDMapping):
			return false, fmt.Errorf("committing the prepared transaction %s (producer id %d, epoch %d) of snapshot %d: the broker does not know the producer id (the transactional id expired?): %w",
				t.ID, t.ProducerID, t.ProducerEpoch, t.Seq, err)
		case kerr.IsRetriable(err) || errors.Is(err, kerr.ConcurrentTransactions):
		default:
			return false, fmt.Errorf("committing the prepared transaction %s (producer id %d, epoch %d) of snapshot %d: %w", t.ID, t.ProducerID, t.ProducerEpoch, t.Seq, err)
		}
		select {
		case <-ctx.Done():
			return false, fmt.Errorf("committing the prepared transaction %s of snapshot %d: %w (last: %w)", t.ID, t.Seq, ctx.Err(), err)
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, time.Second)
	}
}

// staleCommit logs, as a warning, that the recovery's commit of t was refused as stale and
// taken as done, with what DescribeTransactions tells of the id now (its state and producer
// epoch; a failed lookup is logged instead). It cannot confirm the outcome: the coordinator
// keeps the id's current state, not the end of an earlier transaction, and a commit and a
// timeout abort both leave the epoch past t's.
func staleCommit(ctx context.Context, cl *kgo.Client, t Txn, refusal error, log *slog.Logger) {
	attrs := []any{"transactional_id", t.ID, "producer_id", t.ProducerID, "producer_epoch", t.ProducerEpoch, "snapshot", t.Seq, "refusal", refusal}
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	described, err := kadm.NewClient(cl).DescribeTransactions(dctx, t.ID)
	cancel()
	d, ok := described[t.ID]
	switch {
	case err == nil && !ok:
		err = errors.New("the broker did not describe it")
	case err == nil:
		err = d.Err
	}
	if err == nil {
		attrs = append(attrs, "id_state", d.State, "id_producer_id", d.ProducerID, "id_producer_epoch", d.ProducerEpoch)
	} else {
		attrs = append(attrs, "describe_error", err)
	}
	log.Warn(fmt.Sprintf("kafka sink: the broker refused the recovery's commit of the prepared transaction %s (producer id %d, epoch %d) of snapshot %d as stale: taken as committed before the crash, which is what a restart after the commit gives; but a broker without KIP-890 gives the same answer for a transaction it aborted when its timeout ran out, whose records are then lost: if the flow was down longer than the transaction timeout (SinkConfig.TransactionTimeout), check the target for the records of that snapshot",
		t.ID, t.ProducerID, t.ProducerEpoch, t.Seq), attrs...)
}

// slot is one transactional id of a partition and its client.
type slot struct {
	index int
	id    string
	cl    *kgo.Client
}

// initSlot (re)creates the slot's client and initialises its producer id, which fences the
// id's earlier producers and aborts a transaction left open on it.
func (p *producer) initSlot(ctx context.Context, sl *slot) error {
	if sl.cl != nil {
		sl.cl.Close()
		sl.cl = nil
	}
	opts := []kgo.Opt{kgo.TransactionalID(sl.id), kgo.TransactionTimeout(p.cfg.TransactionTimeout),
		kgo.ProducerLinger(0)}
	if p.cfg.Topic != "" {
		opts = append(opts, kgo.DefaultProduceTopic(p.cfg.Topic))
	}
	cl, err := newClient(p.cfg.Brokers, p.cfg.Options, opts...)
	if err != nil {
		return fmt.Errorf("transactional id %s: %w", sl.id, err)
	}
	ictx, cancel := context.WithTimeout(ctx, recoverTimeout)
	defer cancel()
	if _, _, err := cl.ProducerID(ictx); err != nil {
		cl.Close()
		return fmt.Errorf("initialising the transactional id %s: %w", sl.id, err)
	}
	sl.cl = cl
	return nil
}

// producer is one open sink partition. The worker calls Write, Snapshot, Commit and Close; the
// committer goroutine ends the transactions of committed epochs.
type producer struct {
	cfg      SinkConfig
	part     string
	log      *slog.Logger
	afterEnd func(Txn, error)
	slots    []*slot

	// Owned by the worker.
	seq    uint64
	open   *slot // the slot of the open epoch's transaction, nil before its first record
	err    error
	told   bool
	closed bool

	perr   atomic.Pointer[error] // the first failed produce of the open transaction
	killed atomic.Bool           // tests: the partition was killed

	commits *commitloop.Loop // the committer goroutine

	mu      sync.Mutex // guards the fields below, shared with the committer
	free    []*slot
	pending []pendingTxn // flushed, not yet committed, oldest first
}

type pendingTxn struct {
	Txn
	slot *slot
}

func (p *producer) failed() error {
	if p.err == nil {
		p.err = p.commits.Err()
	}
	if p.err != nil {
		p.told = true
	}
	return p.err
}

func (p *producer) setErr(err error) error {
	if p.err == nil {
		p.err = fmt.Errorf("kafka sink %q: partition %s: %w", p.cfg.Name, p.part, err)
	}
	return p.failed()
}

// begin takes a free slot for the open epoch and begins its transaction. With no slot free it
// waits for the committer, but only while a commit it was asked for is still running (only
// the worker, this goroutine, could end any other wait).
func (p *producer) begin() error {
	for {
		if p.commits.Err() != nil {
			return p.failed()
		}
		p.mu.Lock()
		if n := len(p.free); n > 0 {
			p.open = p.free[n-1]
			p.free = p.free[:n-1]
			p.mu.Unlock()
			break
		}
		waitable := len(p.pending) > 0 && p.pending[0].Seq <= p.commits.Target()
		p.mu.Unlock()
		if !waitable {
			return p.setErr(fmt.Errorf("all %d transactional ids hold transactions of epochs not yet committed: raise SinkConfig.Transactions above the run's epochs in flight (dataflow.Options.MaxEpochsInFlight)", len(p.slots)))
		}
		p.commits.Wait()
	}
	p.perr.Store(nil)
	if err := p.open.cl.BeginTransaction(); err != nil {
		return p.setErr(fmt.Errorf("transactional id %s: beginning a transaction: %w", p.open.id, err))
	}
	return nil
}

// Write produces the records into the open epoch's transaction (beginning it with the
// epoch's first record). It returns before the broker acknowledges them; Snapshot waits.
func (p *producer) Write(ctx context.Context, batch []Record) error {
	if err := p.failed(); err != nil {
		return err
	}
	if len(batch) == 0 {
		return nil
	}
	if p.open == nil {
		if err := p.begin(); err != nil {
			return err
		}
	}
	if e := p.perr.Load(); e != nil {
		return p.setErr(fmt.Errorf("transactional id %s: producing: %w", p.open.id, *e))
	}
	promise := func(_ *kgo.Record, err error) {
		if err != nil {
			p.perr.CompareAndSwap(nil, &err)
		}
	}
	for i := range batch {
		r := &batch[i]
		kr := &kgo.Record{Topic: p.cfg.Topic, Key: r.Key, Value: r.Value, Timestamp: r.Timestamp}
		if kr.Topic == "" {
			if r.Topic == "" {
				return p.setErr(fmt.Errorf("%s has no topic and SinkConfig.Topic is empty", r))
			}
			kr.Topic = r.Topic
		}
		if len(r.Headers) > 0 {
			kr.Headers = make([]kgo.RecordHeader, len(r.Headers))
			for j, h := range r.Headers {
				kr.Headers[j] = kgo.RecordHeader{Key: h.Key, Value: h.Value}
			}
		}
		p.open.cl.Produce(ctx, kr, promise)
	}
	return nil
}

// Snapshot is the pre-commit: it flushes the open epoch's transaction (every record
// acknowledged by the brokers, inside the still open transaction) and returns the state with
// it and the other flushed transactions not yet committed. A failed produce fails it, and the
// epoch never commits.
func (p *producer) Snapshot() (SinkState, error) {
	if err := p.failed(); err != nil {
		return SinkState{Seq: p.seq}, err
	}
	p.seq++
	if sl := p.open; sl != nil {
		p.open = nil
		if err := sl.cl.Flush(context.Background()); err != nil {
			return SinkState{Seq: p.seq}, p.setErr(fmt.Errorf("transactional id %s: flushing: %w", sl.id, err))
		}
		if e := p.perr.Load(); e != nil {
			return SinkState{Seq: p.seq}, p.setErr(fmt.Errorf("transactional id %s: producing: %w", sl.id, *e))
		}
		pid, epoch, err := sl.cl.ProducerID(context.Background())
		if err != nil {
			return SinkState{Seq: p.seq}, p.setErr(fmt.Errorf("transactional id %s: reading the producer id: %w", sl.id, err))
		}
		p.mu.Lock()
		p.pending = append(p.pending, pendingTxn{Txn: Txn{Seq: p.seq, ID: sl.id, ProducerID: pid, ProducerEpoch: epoch}, slot: sl})
		p.mu.Unlock()
	}
	p.mu.Lock()
	st := SinkState{Seq: p.seq, Txns: make([]Txn, len(p.pending))}
	for i, t := range p.pending {
		st.Txns[i] = t.Txn
	}
	p.mu.Unlock()
	if len(st.Txns) == 0 {
		st.Txns = nil
	}
	return st, nil
}

// Commit hands the snapshot's sequence number to the committer goroutine, which ends the
// transactions up to it with EndTransaction(commit). It returns at once, or with an earlier
// failure.
func (p *producer) Commit(_ context.Context, st SinkState) error {
	if st.Seq > p.seq {
		return fmt.Errorf("kafka sink %q: partition %s: commit of snapshot %d, but only %d were taken", p.cfg.Name, p.part, st.Seq, p.seq)
	}
	p.commits.Request(st.Seq)
	return p.failed()
}

// commitUpTo commits the pending transactions up to target, oldest first, and frees their
// slots. A slot whose producer epoch the broker did not bump at the commit (brokers without
// KIP-890) is initialised again, so that every transaction of an id has its own producer
// epoch: a stale EndTxn of a recovery can then never commit a later transaction.
func (p *producer) commitUpTo(target uint64) error {
	for {
		p.mu.Lock()
		if len(p.pending) == 0 || p.pending[0].Seq > target || p.killed.Load() {
			p.mu.Unlock()
			return nil
		}
		t := p.pending[0]
		p.mu.Unlock()
		ctx := context.Background()
		err := t.slot.cl.EndTransaction(ctx, kgo.TryCommit)
		if p.afterEnd != nil {
			p.afterEnd(t.Txn, err)
		}
		if err != nil {
			return fmt.Errorf("committing the transaction %s of snapshot %d: %w", t.ID, t.Seq, err)
		}
		if _, epoch, err := t.slot.cl.ProducerID(ctx); err != nil || epoch == t.ProducerEpoch {
			if err := p.initSlot(ctx, t.slot); err != nil {
				return err
			}
		}
		p.mu.Lock()
		p.pending = p.pending[1:]
		p.free = append(p.free, t.slot)
		p.mu.Unlock()
	}
}

// Close lets the committer finish the commits it was given, aborts the open epoch's
// transaction (its epoch was never snapshotted, so it can never commit) and closes the
// clients. Flushed transactions of epochs whose commit did not come stay open: the next run
// (Build with its resume state) commits those of committed epochs and aborts the rest.
func (p *producer) Close() error {
	if p.closed {
		return nil
	}
	p.closed = true
	p.commits.Stop()
	var errs []error
	if !p.told {
		errs = append(errs, p.failed())
	}
	if sl := p.open; sl != nil {
		p.open = nil
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if err := sl.cl.AbortBufferedRecords(ctx); err == nil {
			if err := sl.cl.EndTransaction(ctx, kgo.TryAbort); err != nil {
				p.log.Warn("kafka sink: aborting the open transaction failed; the next run aborts it", "partition", p.part, "transactional_id", sl.id, "error", err)
			}
		}
		cancel()
	}
	p.closeClients()
	return errors.Join(errs...)
}

func (p *producer) closeClients() {
	for _, sl := range p.slots {
		if sl != nil && sl.cl != nil {
			sl.cl.Close()
		}
	}
}

// kill drops the partition as a crashed process would: the committer ends no further
// transaction (one it is ending completes), nothing is aborted, the clients are closed. For
// tests.
func (p *producer) kill() {
	if p.closed {
		return
	}
	p.closed = true
	p.killed.Store(true)
	p.commits.Stop()
	p.closeClients()
}
