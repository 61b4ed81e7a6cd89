// Command kafka-copy copies the records of one Kafka topic to another, exactly once for
// read_committed readers of the target:
//
//	go run ./examples/kafka-copy -brokers B -from TOPIC -to TOPIC -recovery DIR [-idle-exit D] [-epoch-interval D]
//
// B is a comma-separated list of seed brokers, HOST:PORT (default 127.0.0.1:9092, or the
// KAFKA_BROKERS environment variable). Both topics must exist. Each record keeps its key,
// value, headers and timestamp; the producer picks the target partition by key. With
// -idle-exit the program exits 0 once no record has arrived for that long; without it, it runs
// until SIGINT or SIGTERM (which finish and commit the current epoch first).
//
// Exactly once: the source's offsets are in the flow's snapshots, and each epoch's records are
// written in a Kafka transaction that commits only when the epoch commits. After a crash (even
// SIGKILL) the next run on the same -recovery directory commits the flushed transactions of
// the last committed epoch, aborts every other transaction the crashed run left open, and
// reads on from the committed offsets.
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/epochflow/epochflow/connectors/kafka"
	"github.com/epochflow/epochflow/dataflow"
	"github.com/epochflow/epochflow/operators"
)

func main() {
	defBrokers := "127.0.0.1:9092"
	if b := os.Getenv("KAFKA_BROKERS"); b != "" {
		defBrokers = b
	}
	brokers := flag.String("brokers", defBrokers, "seed brokers, HOST:PORT,... (env KAFKA_BROKERS)")
	from := flag.String("from", "", "the topic to read (required)")
	to := flag.String("to", "", "the topic to write (required)")
	idle := flag.Duration("idle-exit", 0, "exit 0 once no record has arrived for this long (0: run until stopped)")
	timeout := flag.Duration("transaction-timeout", kafka.DefaultTransactionTimeout,
		"the target's transaction timeout: at least 5 epoch intervals plus 30s, at most the brokers' transaction.max.timeout.ms")
	producers := flag.Int("producers", 1, "producers (sink partitions), each with its own transactions; keep it the same across runs on one -recovery directory")
	name := flag.String("name", "", "the prefix of the transactional ids (default kafka-copy.FROM.TO); one per running copy")
	dataflow.Usage("kafka-copy copies the records of one Kafka topic to another, exactly once for read_committed readers of the target.",
		"kafka-copy -brokers 127.0.0.1:9092 -from orders -to orders-copy -recovery state")
	dataflow.MainFunc(func() (*dataflow.Flow, error) {
		graph := dataflow.GraphOnly() // -graph: no flag is required
		switch {
		case *from == "" && !graph:
			return nil, errors.New("flag -from is required")
		case *to == "" && !graph:
			return nil, errors.New("flag -to is required")
		case *idle < 0:
			return nil, fmt.Errorf("invalid value %v for flag -idle-exit: want 0 or a positive duration", *idle)
		case *producers < 1:
			return nil, fmt.Errorf("invalid value %d for flag -producers: want 1 or more", *producers)
		}
		if f := flag.Lookup("epoch-interval"); f != nil {
			if iv, ok := f.Value.(flag.Getter).Get().(time.Duration); ok && *timeout < kafka.MinTransactionTimeout(iv) {
				return nil, fmt.Errorf("invalid value %v for flag -transaction-timeout: with -epoch-interval %v it must be at least %v (5 epochs plus 30s for a restart), or a crashed run's transactions could time out before the restart commits them",
					*timeout, iv, kafka.MinTransactionTimeout(iv))
			}
		}
		var list []string
		for _, b := range strings.Split(*brokers, ",") {
			if b = strings.TrimSpace(b); b != "" {
				list = append(list, b)
			}
		}
		if len(list) == 0 {
			return nil, errors.New("flag -brokers is empty")
		}
		if *name == "" {
			*name = "kafka-copy." + *from + "." + *to
		}
		src := kafka.SourceConfig{Brokers: list, Topics: []string{*from}, IdleEOF: *idle}
		sink := kafka.SinkConfig{Brokers: list, Topic: *to, Name: *name, Partitions: *producers, TransactionTimeout: *timeout}
		return build(src, sink), nil
	})
}

// build returns the flow: read the source topic, write every record to the target topic.
func build(src kafka.SourceConfig, sink kafka.SinkConfig) *dataflow.Flow {
	flow := dataflow.New("kafka-copy")
	recs := operators.Input(flow, "read", kafka.Consume(src))
	operators.Output("write", recs, kafka.Produce(sink))
	return flow
}
