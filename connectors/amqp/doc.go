// Package amqp reads from and writes to RabbitMQ (AMQP 0-9-1, with
// github.com/rabbitmq/amqp091-go), acknowledging messages only once the epoch that read them is
// committed.
//
// # Source
//
// Consume and ConsumeDecoded read one queue.
//
// Partitions are consumers, "consumer-0" ... "consumer-(n-1)": by default one per worker of the
// run (dataflow.WorkerCount), or SourceConfig.Consumers. A queue has no partitions of its own:
// RabbitMQ hands its messages out to competing consumers, so one consumer per worker spreads the
// reading, decoding and the work after it over every worker without an exchange between them.
// Each consumer has its own connection and channel, so a failure hits one consumer only. Each
// consumer sees its messages in queue order, but with several consumers there is no order across
// them. The source declares dataflow.ConsumerPartitions, so a flow may resume with another
// number of workers: the state of consumers no longer listed is dropped.
//
// State: a partition's snapshot is a sequence number (a uint64), never a delivery tag: tags
// belong to the channel that delivered them and die with it. In memory, per snapshot sequence
// number, the consumer keeps for each channel generation (a counter of the channels it opened)
// the highest delivery tag it accepted and the tags it rejected (see Poison messages). These are
// dropped on Commit, and dropped unacknowledged when their channel dies.
//
// Epochs and Commit: messages are consumed with manual acknowledgement. Nothing is acknowledged
// before its epoch commits. Commit(seq) hands the consumer's goroutine, for every channel, the
// nacks of the rejected messages of the snapshots up to seq and then one
// Ack(lastTag, multiple=true), and returns at once; the goroutine sends them on that channel if
// it is still the live one, and drops them otherwise (a tag of a dead channel is unknown to the
// new one, and acking it would close the channel with 406 PRECONDITION_FAILED). After a resume,
// Commit of the resumed state has nothing to do.
//
// Prefetch: a consumer holds every message of its open epoch and of the epochs not yet
// committed, so its prefetch count (SourceConfig.Prefetch, DefaultPrefetch by default) must let
// a whole epoch or two be in flight. When a consumer reaches it, the broker sends nothing until
// the next commit, throughput is bounded by the prefetch per commit interval, and the source
// logs a warning (at most once a minute). RabbitMQ's consumer_timeout (30 minutes by default)
// closes a channel whose oldest unacknowledged message is older than that: epochs must commit
// well within it (if one does not, the consumer reconnects and the broker redelivers).
//
// Throughput: the broker spends more CPU per message on a consumer that acknowledges than on
// one with autoAck, and more the more messages it holds unacknowledged. A flow holds those of
// its open epoch and of the epoch being committed, so short epochs (tens of milliseconds)
// read faster than long ones. BenchmarkConsume, on a 2-core machine that also runs the broker
// (RabbitMQ 3.10), reads 200,000 persistent messages of a durable queue through a flow with
// 20 ms epochs at 0.91-0.99 times the rate of a bare amqp091-go consumer that acknowledges
// every 20 ms, 1.53-1.66 times that of one acknowledging every message, and 0.86-0.90 times
// that of one with autoAck. With transient messages the broker has so little to do for an
// autoAck consumer that any consumer that acknowledges, the bare one included, reads at
// 0.6-0.8 times its rate.
//
// Lost connections: when the connection or the channel is lost, the consumer reconnects with
// back-off (SourceConfig.ReconnectMin to ReconnectMax) and carries on; the broker requeues what
// the dead channel had not acknowledged and delivers it again with Message.Redelivered set. A
// missing queue, refused credentials or a refused acknowledgement stop the flow with an error
// instead. The first connection is made when the run starts, and failing it fails the run.
//
// Delivery guarantee: at least once. A message can be delivered again, with Redelivered set,
// after a lost connection (if its epoch had been read but not acknowledged) and after a crash
// between an epoch's commit and the broker's receipt of its acks; a flow that must not see a
// message twice deduplicates by Message.MessageId, as examples/amqp-to-file does.
//
// Poison messages: ConsumeDecoded takes a decode function. A message it rejects is never
// silently dropped: with SourceConfig.DeadLetter (the queue has a dead-letter exchange) it is
// nacked with requeue=false when its epoch commits, so the broker moves it to the dead-letter
// exchange, and the acknowledgement of that epoch skips its tag; without DeadLetter the flow
// stops with an error naming the queue and the message id. Nacking at commit, not at once,
// keeps the rule that nothing is acknowledged (nor dead-lettered) before its epoch commits.
//
// Lag: each consumer reports epochflow_source_lag (dataflow.Metrics) about once a second: the
// messages it holds unacknowledged (read, their epoch not yet committed), and for
// "consumer-0" also the messages ready in the queue (a passive declaration on a channel of its
// own), so that the sum over the consumers is the backlog: it rises while messages wait and is
// 0 once the queue is drained and every epoch committed. Messages the broker has sent but the
// consumer not yet read (at most the prefetch) are not counted.
//
// End: the source never ends unless SourceConfig.IdleExit is set: then each consumer ends
// (io.EOF) once no message has arrived for that long and the broker reports no ready message
// in the queue, for drains and backfills.
//
// # Sink
//
// Publish and PublishEncoded publish with publisher confirms. Partitions are publishers,
// "publisher-0" ... (one per worker by default, SinkConfig.Publishers), each with its own
// connection and channel; a message goes to the publisher picked by a hash of its exchange and
// routing key. Snapshot, the pre-commit, returns only once the broker has confirmed every
// message published so far; a nack or a message returned as unroutable (messages are mandatory
// unless SinkConfig.AllowUnroutable) fails it, naming the exchange and the
// routing key, and the flow stops: the epoch never commits, and a run that resumes from the
// recovery store publishes it again. A lost connection or channel (a dropped socket, a broker
// restart) is not a failure: the publisher reconnects with back-off (SinkConfig.ReconnectMin
// to ReconnectMax, for up to ConfirmTimeout) and publishes every message not yet confirmed
// again, in order, on the new channel; a channel the broker closed for a refused operation (a
// missing exchange, access refused) fails the flow instead. The state is the count of
// confirmed messages; Commit has nothing to do. Delivery guarantee: at least once (a replayed
// epoch, or messages published again after a lost connection, arrive twice).
//
// # Running against a broker
//
// SourceConfig.URL and SinkConfig.URL take an AMQP URI with the credentials and the virtual
// host, amqp://USER:PASSWORD@HOST:PORT/VHOST (amqps:// for TLS; percent-encode reserved
// characters in the user or password; a path of "/" or none means the default virtual host "/").
// The default, DefaultURL, is RabbitMQ's guest account on 127.0.0.1:5672 (guest may only log in
// from localhost). Passwords never appear in errors or logs. The user needs the configure
// permission on the queue only if SourceConfig.Declare is set, read permission to consume and
// write permission on the exchanges to publish.
//
// The tests need a broker: scripts/services/rabbitmq starts one on 127.0.0.1:5672 (installing
// rabbitmq-server with apt where it is missing), or set EPOCHFLOW_AMQP_URL to another. They read
// unacknowledged counts with rabbitmqctl, on the same machine. Without a broker they fail.
package amqp
