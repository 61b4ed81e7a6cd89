package sqs

import (
	"strconv"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/epochflow/epochflow/dataflow"
)

// lagInterval is how often a partition reports its lag.
const lagInterval = time.Second

// watchLag reports the partition's epochflow_source_lag every lagInterval until the partition
// closes: the messages it holds in flight (received and not yet deleted), plus, for the first
// partition (first), the queue's ApproximateNumberOfMessages (the messages waiting, counted
// once for the whole queue). A failed GetQueueAttributes keeps the last count: the lag is a
// report, and receiving reports its own failures.
func (p *partition[T]) watchLag(hook dataflow.MetricsHook, first bool) {
	defer p.wg.Done()
	t := time.NewTicker(lagInterval)
	defer t.Stop()
	waiting := 0
	for {
		select {
		case <-p.stop:
			return
		case <-p.bg.Done():
			return
		case <-t.C:
		}
		if first {
			out, err := p.src.client.GetQueueAttributes(p.bg, &awssqs.GetQueueAttributesInput{QueueUrl: aws.String(p.src.queue),
				AttributeNames: []types.QueueAttributeName{types.QueueAttributeNameApproximateNumberOfMessages}})
			if err == nil {
				waiting, _ = strconv.Atoi(out.Attributes[string(types.QueueAttributeNameApproximateNumberOfMessages)])
			} else if p.bg.Err() == nil {
				p.log.Debug("reading the queue's message count for the lag failed", "error", err)
			}
		}
		p.mu.Lock()
		held := p.led.inFlight()
		p.mu.Unlock()
		hook.SourceLag(p.key, float64(waiting+held))
	}
}
