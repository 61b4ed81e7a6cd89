// Package nats reads from and writes to NATS JetStream (github.com/nats-io/nats.go and its
// jetstream package), acknowledging messages only once the epoch that read them is committed.
//
// # Which source
//
// Consume (queue mode) reads durable pull consumers and acknowledges what a flow has
// processed, so the server removes it (interest streams) and another run, or another
// instance, never gets it again: pick it when the stream is a queue of work. ReadLog (log
// mode) reads a limits-retention stream in order with an ordered consumer, acknowledging
// nothing, and keeps its position in the flow's recovery store: pick it when the stream is a
// log that others read too, or to replay history.
//
// # Queue mode
//
// Partitions are the durable pull consumers of SourceConfig.Consumers (SourceConfig.Create
// creates missing ones), each with its own connection and two goroutines: one pulls, one sends
// acknowledgements and in-progress signals. A consumer must use AckPolicy "all" and be read by
// this flow only. Work-queue streams are refused at start: the server does not allow
// AckPolicy "all" on them (JetStream error 10098, "workqueue stream requires explicit ack"),
// and per-message acks would cost one request per message per commit. An interest stream with
// one consumer behaves like a work queue: a message is removed once acknowledged.
//
// Epochs and Commit: every message is tagged in memory with the epoch that read it. On Commit,
// the partition's goroutine sends ONE acknowledgement, "+ACK" on the last message of the
// committed epochs (which, with AckPolicy all, acknowledges every pending message at or below
// its stream sequence), as a request, and retries it until the server confirms it; Commit
// itself returns at once. A newer commit replaces an ack-all not yet confirmed.
//
// The ack-all rule. An ack-all on sequence S acknowledges everything still pending at or
// below S, so S is never above a pending message whose output is not written:
//   - a redelivery of a message the partition holds (its AckWait ran out) is dropped: the copy
//     held, tagged with its first epoch, is the one processed;
//   - a redelivery at or below the committed sequence (QueueState.Done, or the last ack-all)
//     is dropped, and covered by the next ack-all;
//   - a message seen for the first time in an open epoch but below the sequences of committed
//     epochs (one an earlier run received and never acknowledged, redelivered after its
//     AckWait, after newer messages) caps the ack-all below it until its own epoch commits;
//   - while messages that an earlier run left pending (ConsumerInfo.NumAckPending at start)
//     have not all come back, no ack-all goes above the consumer's ack floor (or the resumed
//     QueueState.Done): their sequences are not known until they arrive. The partition reads
//     the consumer's counts meanwhile (once a second): when the server counts no pending
//     message it does not hold or has not pulled, the missing ones were deleted from the
//     stream, and the cap goes, except for those pulled and not yet read by the flow, which
//     keep it until they are.
//
// Committed messages an ack-all cannot reach yet stay held and kept alive. After a crash
// the messages an earlier run held come back only after their AckWait, so a consumer's
// AckWait bounds how long a restarted flow acknowledges nothing.
//
// AckWait and MaxAckPending: a partition holds every message of the open epoch and of the
// epochs not yet committed. Consumers that Create makes get AckWait = the larger of 30 s and four
// epoch intervals (SourceConfig.AckWait; the epoch interval is SourceConfig.EpochInterval, or
// the run's when that is 0) and MaxAckPending = SourceConfig.MaxInFlight (20,000 by default).
// An existing consumer whose AckWait is shorter than two epoch intervals cannot hold an epoch
// without keep-alive traffic, and is warned about at start. An existing consumer whose
// MaxAckPending is below MaxInFlight is warned about
// at start: when a consumer reaches MaxAckPending the server stops delivering without an error
// (its default of 1,000 bounds a flow to 1,000 messages per commit interval), and the source
// logs a warning when it happens (at most once a minute). A consumer with another AckPolicy,
// or a push consumer, is refused.
//
// Keep-alive: the server keeps a timer per pending message, and an in-progress signal ("+WPI")
// refreshes only the message it names; there is no batched form. Every quarter of AckWait (at
// least 20 ms, at most 5 s), the partition's goroutine sends "+WPI" for each message it holds
// (pulled, in an open epoch, or committed and not yet acknowledged) whose AckWait runs out
// within half of it, and flushes once: one round, one flush, whatever the number of messages.
// With an AckWait well above an epoch, no signal is ever sent. The margin is half of AckWait,
// so an AckWait below a second is at the mercy of scheduling delays on a loaded machine.
//
// Throughput: BenchmarkConsume, on a 2-core machine shared with other work and running the
// server in the same process, read 200,000 messages of an interest stream through a flow with
// 50 ms epochs at 0.98 times the rate of a bare nats.go pull consumer acking all every 100 ms
// (24,400 against 24,900 messages a second) and 1.37 times that of one acking every message
// (17,800): acking each message costs the server less here than the broker of the amqp
// package.
//
// State: QueueState, the snapshot count and Done, the sequence at or below which every pending
// message is processed once the epoch commits. After a resume, Commit of the resumed state
// acknowledges nothing new until a redelivery at or below Done arrives (it is dropped and
// acknowledged).
//
// Delivery guarantee: at least once. A message is read again after a crash between its
// epoch's commit and the server's receipt of the ack-all (unless Done already covered it), and
// after a lost connection if the server redelivered it to a run that did not hold it. A flow
// that must not see a message twice deduplicates on Message.Sequence (the stream sequence), as
// examples/nats-to-file does.
//
// Poison messages: a message that decode (ConsumeDecoded) rejects stops the flow with an error
// naming the stream, the consumer and the sequence; the source has no dead-letter stream of its
// own (examples/nats-to-file branches messages it cannot write to a -dead-letter subject
// before its sink). Do not delete such a message from the stream to get past it: the server
// takes the deletion of a delivered, unacknowledged message as its acknowledgement, and with
// ack policy "all" that acknowledges every message before it too, including those of epochs
// not yet committed, which are then never written.
//
// Lag: each partition reports epochflow_source_lag (dataflow.Metrics) once a second from the
// consumer's info: the messages not yet delivered to it (NumPending) plus those delivered and
// not yet acknowledged (NumAckPending, held by the epochs not committed). It rises while
// messages wait and is 0 once the stream is drained and every epoch committed and acked.
//
// End: a partition never ends unless SourceConfig.IdleExit is set: then it ends (io.EOF) once
// no message arrived for that long, the consumer has nothing pending delivery and every
// message it has delivered is held by the partition.
//
// # Log mode
//
// ReadLog has one partition, keyed by the stream's name, reading with an ordered consumer (the
// library recreates it at the next sequence after a gap or a lost connection). Its state is the
// stream sequence of the last message read; a resumed run starts at the next one. Commit has
// nothing to do. Delivery guarantee: exactly once into a flow's state, as far as the stream
// keeps the messages (a limits stream may drop old ones before a stopped flow resumes).
//
// # Sink
//
// Publish publishes with a deterministic Nats-Msg-Id, "FLOW/PARTITION/N" (the flow's name
// given in SinkConfig.Flow, the sink partition, and the message's position among everything
// the partition has written, counted from the flow's first run on its recovery store), so that
// when a resumed flow replays what followed its last committed epoch in the same order, the
// stream's duplicate window drops the copies, however the replay's epochs are cut. Every
// publish is acknowledged by the stream (PubAck) before Snapshot returns; a refused or
// unanswered publish fails the epoch and stops the flow. The state is the epoch count and the
// position; Commit has nothing to do. Readers of the stream see a message as soon as it is
// published, before its epoch commits. Delivery guarantee: exactly once for a replay that
// repeats the same items in the same order per partition (a flow over one ordered source, such
// as a log-mode stream or a file, or any flow with one worker) within the stream's duplicate
// window; at least once otherwise (a queue source's redelivery may reorder a replay).
//
// Duplicate window: a replay repeats what was published in the epochs a crash left
// uncommitted (those in flight and the open one) after a restart, so the stream's Duplicates
// (2 minutes by default) must cover a few epoch intervals plus the restart:
// MinDuplicateWindow of the run's epoch interval (5 intervals plus 30 s). The sink checks
// SinkConfig.Stream at Build, and every stream its publishes land in at the first Snapshot
// that sees it, and logs a warning naming the stream, its window and the window to set when
// it is shorter.
//
// # Tests
//
// The tests start an embedded github.com/nats-io/nats-server/v2 server with JetStream (no
// daemon needed).
package nats
