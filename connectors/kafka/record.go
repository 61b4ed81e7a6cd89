package kafka

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// Record is a Kafka record: what the source emits and what the sink writes.
type Record struct {
	// Topic and Partition say where the record was read (source). The sink writes to
	// SinkConfig.Topic when it is set, else to Topic; it ignores Partition (the producer's
	// partitioner picks one by Key).
	Topic     string
	Partition int32
	// Offset is the record's offset in its partition (source only).
	Offset    int64
	Key       []byte
	Value     []byte
	Headers   []Header
	Timestamp time.Time
}

// Header is a record header.
type Header struct {
	Key   string
	Value []byte
}

// String names the record by topic, partition and offset.
func (r Record) String() string {
	return fmt.Sprintf("record %s/%d@%d", r.Topic, r.Partition, r.Offset)
}

func fromKgo(r *kgo.Record) Record {
	out := Record{Topic: r.Topic, Partition: r.Partition, Offset: r.Offset, Key: r.Key, Value: r.Value, Timestamp: r.Timestamp}
	if len(r.Headers) > 0 {
		out.Headers = make([]Header, len(r.Headers))
		for i, h := range r.Headers {
			out.Headers[i] = Header{Key: h.Key, Value: h.Value}
		}
	}
	return out
}

// partKey is the name of the source partition of a topic partition: "TOPIC/PARTITION".
func partKey(topic string, p int32) string { return topic + "/" + strconv.Itoa(int(p)) }

func parsePartKey(key string) (string, int32, error) {
	i := strings.LastIndexByte(key, '/')
	if i <= 0 {
		return "", 0, fmt.Errorf("kafka source: partition %q is not TOPIC/PARTITION", key)
	}
	n, err := strconv.ParseInt(key[i+1:], 10, 32)
	if err != nil || n < 0 {
		return "", 0, fmt.Errorf("kafka source: partition %q is not TOPIC/PARTITION", key)
	}
	return key[:i], int32(n), nil
}

// newClient returns a client of brokers with the connector's options, then the caller's.
func newClient(brokers []string, extra []kgo.Opt, opts ...kgo.Opt) (*kgo.Client, error) {
	all := append([]kgo.Opt{kgo.SeedBrokers(brokers...)}, opts...)
	all = append(all, extra...)
	return kgo.NewClient(all...)
}

func checkBrokers(who string, brokers []string) error {
	if len(brokers) == 0 {
		return fmt.Errorf("kafka %s: the broker list (Brokers) is empty", who)
	}
	for _, b := range brokers {
		if b == "" {
			return fmt.Errorf("kafka %s: the broker list (Brokers) holds an empty address", who)
		}
	}
	return nil
}

// partitionsOf returns the partition numbers of topic, in order.
func partitionsOf(ctx context.Context, cl *kgo.Client, topic string) ([]int32, error) {
	req := kmsg.NewPtrMetadataRequest()
	t := kmsg.NewMetadataRequestTopic()
	t.Topic = kmsg.StringPtr(topic)
	req.Topics = append(req.Topics, t)
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return nil, fmt.Errorf("reading the metadata of topic %q: %w", topic, err)
	}
	if len(resp.Topics) != 1 {
		return nil, fmt.Errorf("reading the metadata of topic %q: the broker answered with %d topics", topic, len(resp.Topics))
	}
	if err := kerr.ErrorForCode(resp.Topics[0].ErrorCode); err != nil {
		if errors.Is(err, kerr.UnknownTopicOrPartition) {
			return nil, fmt.Errorf("topic %q does not exist: %w", topic, err)
		}
		return nil, fmt.Errorf("reading the metadata of topic %q: %w", topic, err)
	}
	var ps []int32
	for _, p := range resp.Topics[0].Partitions {
		ps = append(ps, p.Partition)
	}
	slices.Sort(ps)
	if len(ps) == 0 {
		return nil, fmt.Errorf("topic %q has no partitions", topic)
	}
	return ps, nil
}
