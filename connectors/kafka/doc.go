// Package kafka reads from and writes to Apache Kafka (with github.com/twmb/franz-go): a
// source whose offsets live in the flow's snapshots, and an exactly-once sink that writes each
// epoch in a Kafka transaction committed when the epoch commits.
//
// # Source
//
// Consume reads SourceConfig.Topics. Partitions are the topics' partitions, "TOPIC/PARTITION",
// listed when the run starts; each is consumed by a client of its own that is assigned that
// one partition (no consumer group, no rebalances), so a partition lives on one worker and its
// records come in offset order. A fetch goroutine per partition polls the client and keeps at
// most SourceConfig.MaxBuffered records for Next; the worker parks (Waiter) while none come.
//
// State: a partition's snapshot is the offset of the next record to read (an int64; -1 before
// the first record of a fresh start). A resumed partition starts at that offset, so every
// record of a committed epoch is read exactly once by the flow, and the records of an epoch
// that never committed are read again. A fresh partition starts at its beginning, or at its
// end with SourceConfig.Latest.
//
// Commit: correctness needs none (the offsets are in the snapshot). With SourceConfig.Group,
// Commit hands the committed offset to a goroutine of the partition, which writes it to that
// consumer group (an OffsetCommit without group membership) so that lag tools see the flow's
// progress; it returns at once, and a failed write is logged and retried at the next commit.
//
// Isolation: records of transactions are read once committed (read_committed), unless
// SourceConfig.ReadUncommitted.
//
// Lag: each partition reports epochflow_source_lag (dataflow.Metrics) after every fetch and
// every Commit: the records between the offset of the last committed epoch and the partition's
// end as the last fetch saw it (the last stable offset for read_committed): it rises while
// records wait and is 0 once everything is read and committed. On a topic written in
// transactions the end lies past the last transaction's commit marker, which is no record, so
// an idle partition shows a lag of 1 there.
//
// End: the partitions never end unless SourceConfig.IdleEOF is set: then a partition ends
// (io.EOF) once no record has arrived for that long after it caught up (it had nothing to read
// at its start, or a record came), for tests, drains and backfills.
//
// # Sink
//
// Produce writes records, exactly once for read_committed readers. Partitions are producers,
// "p0" ... (SinkConfig.Partitions, one by default); a record goes to one by a hash of its key,
// and to a Kafka partition by the client's partitioner (by key).
//
// Transactions: each sink partition owns a pool of SinkConfig.Transactions transactional ids,
// "NAME-PART-SLOT" (SinkConfig.Name identifies the flow and step). The first record of an
// epoch begins a transaction on a free id; Snapshot, the pre-commit, flushes it (every record
// acknowledged by the brokers, inside the transaction, which stays open) and returns the
// state: the snapshot's number and, for every flushed transaction not yet known to be
// committed, its transactional id, producer id and producer epoch. Commit hands the snapshot's
// number to the partition's committer goroutine, which ends the transactions up to it with
// EndTransaction(commit), oldest first, and returns at once; the id is then free for a later
// epoch. With several ids, the next epoch's transaction runs while the last one's commit is
// pending. Every transaction of an id gets its own producer epoch (brokers with KIP-890 bump it
// at each commit; otherwise the sink initialises the id again), so a stale commit request can
// never end a later transaction.
//
// Recovery: Build with a resume state first commits the state's transactions (their epochs are
// committed) with a raw EndTxn request carrying their producer id and epoch, without
// initialising their transactional ids, which would abort them; a broker that says the epoch is
// stale (ProducerFenced, InvalidProducerEpoch) is taken to mean that the transaction was ended
// before, by the commit of an earlier run. A broker without KIP-890 says the same of a
// transaction it aborted when its timeout ran out (the abort bumps the epoch), and neither
// that answer nor DescribeTransactions (the id's current state only) can tell the two apart,
// so the sink logs a warning naming the transactional id, producer id and epoch, the snapshot
// and the id's current state. (A broker that recognises a repeated EndTxn, as KIP-890 has
// it, may answer InvalidTxnState instead while the id has not moved on since the abort: then
// Build fails, naming the transaction as lost.) Then it
// initialises every id of the pool, which fences earlier producers and aborts any transaction
// left open: those belong to epochs that never committed, which the flow replays. Close
// aborts the open epoch's transaction and leaves flushed ones for the next run.
//
// Timeouts: a transaction is open from the first write of its epoch until its commit, and
// after a crash until the restart commits it. A transaction the broker aborts on timeout loses
// its records, so Build refuses a SinkConfig.TransactionTimeout shorter than 5 epoch intervals
// plus 30 s (the default, DefaultTransactionTimeout, is 5 minutes; the brokers'
// transaction.max.timeout.ms caps it, 15 minutes by default). The pool must hold more ids than
// epochs in flight (dataflow.Options.MaxEpochsInFlight); when every id holds an uncommitted
// epoch, the sink fails with an error saying so.
//
// Delivery guarantee: exactly once for readers with isolation level read_committed. Readers
// with read_uncommitted also see the records of aborted transactions (replayed epochs).
//
// # Testing
//
// The tests run against github.com/twmb/franz-go/pkg/kfake, an in-process Kafka cluster
// started by each test (no broker needed). Its version is pinned in go.mod: older ones did not
// abort an open transaction when its transactional id was initialised again, which the
// recovery relies on.
package kafka
