// Package sqs reads and writes Amazon SQS queues (aws-sdk-go-v2) with at-least-once delivery:
// a message is deleted from its queue only after the epoch that read it is committed.
//
// # Source
//
// Receive (messages as Message) and NewSource (messages decoded into the flow's type) read one
// queue. The source has one partition per consumer: by default one per worker of the run
// (dataflow.WorkerCount), each with its own long-polling receiver, so that receiving scales
// with the workers and each worker processes the messages it received without an exchange.
// One partition per queue would funnel every message through one worker; since the only thing
// a partition owns is its place in the stream of receives (SQS hands any message to any
// consumer), nothing is lost by splitting a queue this way. Partitions are keyed by the queue URL
// plus "#i". A run that resumes from a recovery store must list every partition the store
// knows, so a flow restarted with fewer workers fails to start: fix the count with Consumers if
// the number of workers may shrink.
//
// State and epochs: a partition's snapshot is only a sequence number (the number of epochs it
// has ended). In memory it keeps the receipt handles of the messages in flight per sequence
// number: Commit(seq) hands every message of the epochs up to seq to the partition's manager
// goroutine, which deletes them with DeleteMessageBatch (ten per call, five calls out at once, as
// the AWS buffered SQS client does) and returns at once. Receiving waits while the deletes are
// behind (a hundred messages waiting or out, or the oldest within half a visibility timeout of
// its deadline; counted in Stats.DeletePauses): a partition that received faster than it deletes
// would see its committed messages come again before their deletes reached SQS.
// Failed delete calls and failed entries are logged and retried with back-off (and counted in
// Stats); after 8 tries in a row in which no delete got through, or at once for a refusal (a
// 4xx that is no throttle, such as AccessDenied), the partition reports the error through Next
// or Commit, which stops the flow (the messages are not lost: SQS delivers them again). A delete SQS refuses
// for its receipt handle (the visibility ran out and the message was, or will be, delivered
// again) is logged and counted as StaleDeletes, not fatal: the message comes again, which is
// at-least-once. Close waits up to 20 s for the deletes of committed epochs, and makes the
// messages of uncommitted epochs visible again at once.
//
// Visibility: messages in flight (received, not yet deleted) stay invisible while their epoch is
// not committed: the manager extends their visibility timeout when half of it is left (the
// queue's VisibilityTimeout, or the Visibility option), with ChangeMessageVisibilityBatch, or with
// single ChangeMessageVisibility calls once the endpoint turns out not to support the batch call
// (goaws answers it with a plain-text 400), nearest deadline first, five calls out at once. No
// message is kept invisible beyond the 12 hours SQS allows after a receive; one that reaches that
// limit is logged and counted and comes again. A cap on the messages in flight (MaxInFlight, per
// partition) pauses receiving until commits delete messages.
//
// Extensions that cannot keep up: every message in flight needs an extension about every half
// visibility timeout, so the messages a partition can hold are bounded by the rate of its
// extension calls (on SQS ten messages per call; on goaws one, and each call scans the queue).
// A partition that received more than that would see them lose their visibility, come again
// and have their deletes refused as stale, epoch after epoch (a redelivery storm). So below
// MaxInFlight each partition keeps a cap of its own, as TCP does its window: it starts at 200,
// doubles per round trip while every delete and extension arrives in time (slow start), and
// once an extension goes out with less than a quarter of the visibility timeout left, receiving
// waits until a round of extensions is in time again (Stats.ExtensionPauses), the cap halves
// (Stats.LimitCuts; at most once per quarter visibility timeout, and not while more messages
// are in flight than the cap already allows) and grows by an eighth per round trip afterwards.
// The deletes bound the cap too: the messages in flight become deletes in bulk when their
// epoch commits, so the cap never exceeds what the delete calls, at their measured latency,
// delete within half a visibility timeout, and it halves when a delete goes out with less than
// a quarter of the visibility timeout left or is refused as stale.
// The messages already in flight cannot be fewer before their epoch commits: while extensions
// are behind they ask for up to 4 times the visibility timeout, so that fewer calls keep them
// invisible; a crash then leaves them invisible that much longer.
//
// Receiving uses long polls (WaitTime, 20 s by default) on a goroutine of its own that wakes the
// worker (dataflow.Waiter) when messages arrive: an idle flow sends one request per WaitTime and
// uses no CPU. IdleExit ends the stream (io.EOF) after the queue has been empty for a while.
//
// FIFO queues: a partition hands a group's messages to the flow in the order it received them.
// SQS does not give a group's later messages to any consumer while earlier ones are in flight,
// and the source keeps them in flight until their epoch commits, so a group's messages are read
// in order also across partitions, but a group moves on only once per epoch commit.
//
// Poison messages: the decode function of NewSource may reject a message (return an error). With
// DeadLetter the message is sent to that queue with its attributes plus ErrorAttribute (the
// error) and deleted from the source queue only when both that send is confirmed and its epoch
// is committed; without it the flow stops with an error naming the queue and the message id, and
// the message stays in the queue. A message is never dropped silently.
//
// Lag: each partition reports epochflow_source_lag (dataflow.Metrics) once a second: the
// messages it holds in flight (received, not yet deleted), and the first partition ("URL#0")
// also the queue's ApproximateNumberOfMessages (one GetQueueAttributes call a second), so that
// the sum over the partitions is the backlog: it rises while messages wait and is 0 once the
// queue is drained and every epoch committed and deleted. (goaws counts the messages in flight
// in ApproximateNumberOfMessages too, so against it the in-flight ones count twice.)
//
// Delivery: at-least-once. A message may reach the flow again after a crash (its epoch never
// committed, or it did but the deletes were cut off), after a visibility timeout that ran out
// (12 h, or a stalled process), or when a ReceiveMessage answer is lost on the way (SQS keeps
// the messages of a lost answer invisible until their timeout). Message.ID stays the same across
// deliveries: Deduplicate drops the repeats within a window, which together with an
// exactly-once sink (file.WriteLines, a two-phase sink) and a recovery store gives exactly-once
// output.
//
// # Sink
//
// Send writes Outgoing messages with SendMessageBatch, ten per call, up to SendConcurrency calls
// in flight per partition (one on a FIFO queue, to keep each group's order). Snapshot, the
// epoch's pre-commit, returns only once SQS accepted every message written so far: entries that
// fail for a reason of SQS's are retried, and an entry refused as the sender's fault (or a call
// failing 8 times in a row) makes Snapshot return an error, which stops the flow before the
// epoch commits. Delivery is at-least-once: an epoch replayed after a crash sends its messages
// again. On a FIFO queue every message without a DeduplicationID gets a deterministic one, a hash
// of the partition, its run id (random, or DedupScope; kept in the snapshot), the epoch's
// sequence number and the message's index in the epoch, so SQS drops a replayed message, with
// these limits: only within SQS's 5-minute deduplication window; only if the replay produces the
// same messages in the same order on the same partition (true for a deterministic source such
// as a file, not for a source like SQS itself, whose redeliveries come in another order); and,
// without DedupScope, not for epochs replayed after a crash before the partition's first commit
// (see DedupScope). Partitions: one per worker (SinkPartitions to fix the count); a FIFO
// message goes to the partition of its group, a standard one to that of a hash of its body.
//
// # Running against AWS
//
// NewClient builds a client the standard AWS way: credentials from AWS_ACCESS_KEY_ID and
// AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN), a profile (AWS_PROFILE, ~/.aws/config and
// ~/.aws/credentials, SSO), web identity on EKS, or the ECS task or EC2 instance role; the region
// from AWS_REGION or the profile. Queue URLs look like
// https://sqs.us-east-1.amazonaws.com/123456789012/orders. The source needs the IAM actions
// sqs:ReceiveMessage, sqs:DeleteMessage, sqs:ChangeMessageVisibility and sqs:GetQueueAttributes
// on its queue (and sqs:SendMessage on the dead-letter queue); the sink sqs:SendMessage and
// sqs:GetQueueAttributes. Set the queue's VisibilityTimeout to a few epoch intervals (the
// source extends it anyway, but a shorter one costs more calls), and keep the epoch interval
// well below 12 hours. For an emulator (goaws, LocalStack) pass its URL as NewClient's endpoint
// and any credentials, for example AWS_ACCESS_KEY_ID=x AWS_SECRET_ACCESS_KEY=x.
package sqs
