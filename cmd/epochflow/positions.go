package main

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"

	"github.com/epochflow/epochflow/recovery"
)

// maxPositionKeys is the most keys a step may have for inspect to look for partition
// positions among them: a source or sink has a handful of partitions, a keyed step's state
// may have millions of keys.
const maxPositionKeys = 64

// position is one source or sink partition's resume position, in words.
type position struct {
	step, key string
	epoch     uint64
	words     string
}

// positions reads the states of the steps with at most maxPositionKeys keys and returns those
// that are the resume positions of the project's connectors, in words (see describePosition).
func positions(ctx context.Context, s recovery.Store, steps []recovery.StepInfo) ([]position, error) {
	var out []position
	for _, st := range steps {
		if st.Keys == 0 || st.Keys > maxPositionKeys {
			continue
		}
		err := s.Load(ctx, st.Step, func(key string, epoch uint64, state []byte) error {
			if w := describePosition(key, state); w != "" {
				out = append(out, position{step: st.Step, key: key, epoch: epoch, words: w})
			}
			return nil
		})
		if err != nil {
			return out, fmt.Errorf("step %q: %w", st.Step, err)
		}
	}
	return out, nil
}

var (
	kafkaKey    = regexp.MustCompile(`^[^/]+/\d+$`)          // TOPIC/PARTITION
	consumerKey = regexp.MustCompile(`^consumer-\d+$`)       // amqp source
	publisherKy = regexp.MustCompile(`^publisher-\d+$`)      // amqp sink
	queueKey    = regexp.MustCompile(`^https?://[^#]+#\d+$`) // sqs source and sink
	slotKey     = regexp.MustCompile(`^slot/[a-z0-9_]+$`)    // pgrepl
	fileKey     = regexp.MustCompile(`^/[^\x00]*[^/]$`)      // file source and sink: an absolute path
	scriptKey   = regexp.MustCompile(`^part-\d+$`)           // flowtest scripts
)

// describePosition says in words what the state of a partition of one of the project's
// connectors means, recognised by the shape of its key and the encoding of its state (the
// store does not record the state's type): a file offset or output length, an LSN, a Kafka
// offset, a snapshot sequence number of a queue consumer. It returns "" for a state it does
// not recognise (a keyed step's own state, a connector it does not know).
func describePosition(key string, state []byte) string {
	if len(state) > 0 && state[0] == '{' && json.Valid(state) {
		return describeJSON(key, state)
	}
	u, un := binary.Uvarint(state)
	uok := un == len(state) && un > 0
	i, in := binary.Varint(state)
	iok := in == len(state) && in > 0
	switch {
	case slotKey.MatchString(key):
		return ""
	case fileKey.MatchString(key) && iok:
		return fmt.Sprintf("byte offset %d: where a file source reads on, or the committed length of a file sink's output", i)
	case kafkaKey.MatchString(key) && iok && !strings.HasPrefix(key, "http"):
		return fmt.Sprintf("offset %d: the next record to read from this Kafka partition", i)
	case consumerKey.MatchString(key) && uok:
		return fmt.Sprintf("snapshot %d: a queue consumer acknowledges what it read up to this snapshot once its epoch is committed; the broker redelivers what came after", u)
	case publisherKy.MatchString(key) && uok:
		return fmt.Sprintf("%d messages published and confirmed by the broker", u)
	case queueKey.MatchString(key) && uok:
		return fmt.Sprintf("snapshot %d: the SQS consumer deletes what it read up to this snapshot once its epoch is committed; later messages come back after their visibility timeout", u)
	}
	return ""
}

// describeJSON says in words what a JSON partition state means, by its fields.
func describeJSON(key string, state []byte) string {
	var m map[string]json.RawMessage
	if json.Unmarshal(state, &m) != nil {
		return ""
	}
	str := func(f string) string {
		var s string
		json.Unmarshal(m[f], &s)
		return s
	}
	num := func(f string) uint64 {
		var n uint64
		json.Unmarshal(m[f], &n)
		return n
	}
	has := func(fs ...string) bool {
		for _, f := range fs {
			if _, ok := m[f]; !ok {
				return false
			}
		}
		return true
	}
	switch {
	case has("LSN"): // pgrepl.State
		w := fmt.Sprintf("LSN %s: replication resumes after the transaction that ends there", str("LSN"))
		if has("TxCommit") {
			w += fmt.Sprintf(", skipping the first %d events of the transaction that commits at %s (the epoch ended inside it)", num("TxEvents"), str("TxCommit"))
		}
		var copying bool
		json.Unmarshal(m["Copying"], &copying)
		if copying {
			w += "; the initial copy is not finished and starts again"
		}
		return w
	case has("snapshot", "done"): // nats.QueueState
		return fmt.Sprintf("stream sequence %d done: the consumer acks up to it once its epoch is committed (snapshot %d)", num("done"), num("snapshot"))
	case has("epoch", "items") && len(m) == 2: // nats.SinkState
		return fmt.Sprintf("epoch %d, %d messages: what the sink published up to them is final; a replay is deduplicated by message id (the next is number %d)", num("epoch"), num("items"), num("items")+1)
	case has("epoch") && len(m) == 1: // nats.SinkState of a run before message ids counted items
		return fmt.Sprintf("epoch %d: what the sink published up to it is final; a replay is deduplicated by message id", num("epoch"))
	case has("Seq", "Txns"): // kafka.SinkState
		var txns []json.RawMessage
		json.Unmarshal(m["Txns"], &txns)
		return fmt.Sprintf("snapshot %d, %d transactions flushed and waiting for their epoch's commit", num("Seq"), len(txns))
	case has("Seq", "Run"): // sqs.SinkState
		return fmt.Sprintf("snapshot %d of run %s: message ids are derived from both, so a replay sends the same ids", num("Seq"), str("Run"))
	case has("Event", "Item") && scriptKey.MatchString(key): // flowtest.Position
		return fmt.Sprintf("event %d, item %d of the test script", num("Event"), num("Item"))
	}
	return ""
}

// positionsHelp explains the positions table.
const positionsHelp = "POSITION: where each source or sink partition resumes, as of the committed epoch, for the " +
	"connectors this tool knows (file, pgrepl, kafka, amqp, sqs, nats); other states are not listed."

// frontiersHelp explains the FRONTIERS column of the executions table.
const frontiersHelp = "FRONTIERS: for each worker of the execution, in worker order, where it stood at the last commit " +
	"it took part in: the last epoch that all its steps had closed (written, snapshotted; the worker's frontier, the " +
	"oldest epoch it had not finished, is the next one), or \"end\" for a worker that had read all its input. The epoch " +
	"committed then is the smallest of them; \"-\": the execution committed nothing."
