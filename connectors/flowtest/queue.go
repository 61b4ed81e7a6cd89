package flowtest

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/epochflow/epochflow/dataflow"
)

// Message is a message of a Queue.
type Message struct {
	ID         int
	Body       string
	Deliveries int // how many times it was received, this delivery included
}

// Queue is an in-memory message queue with a visibility timeout and explicit acks, as SQS
// works: a received message is invisible until its timeout runs out, and comes back unless it
// is acked first. Its source (Input) acks only in Commit, so it tests the at-least-once path
// of a connector that acknowledges late. A Queue outlives runs of a flow, so a test can crash a
// run and start another on the same queue.
type Queue struct {
	mu         sync.Mutex
	msgs       []*queued
	visibility time.Duration
	acked      int
	// OnAck, if set, is called (under no lock) with every message just acked: a test checks
	// there that the message's output is committed.
	OnAck func(Message)
}

type queued struct {
	Message
	invisibleUntil time.Time
	acked          bool
}

// NewQueue returns a queue with the given visibility timeout.
func NewQueue(visibility time.Duration) *Queue { return &Queue{visibility: visibility} }

// Send adds messages with these bodies; their ids are their positions in the queue.
func (q *Queue) Send(bodies ...string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, b := range bodies {
		q.msgs = append(q.msgs, &queued{Message: Message{ID: len(q.msgs), Body: b}})
	}
}

// ExpireAll makes every unacked message visible again at once, as if the visibility timeout
// of a crashed consumer had run out.
func (q *Queue) ExpireAll() {
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, m := range q.msgs {
		m.invisibleUntil = time.Time{}
	}
}

// Unacked returns how many messages are not acked.
func (q *Queue) Unacked() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.msgs) - q.acked
}

// receive returns up to n visible messages and makes them invisible.
func (q *Queue) receive(n int) []Message {
	q.mu.Lock()
	defer q.mu.Unlock()
	now := time.Now()
	var out []Message
	for _, m := range q.msgs {
		if len(out) == n {
			break
		}
		if m.acked || now.Before(m.invisibleUntil) {
			continue
		}
		m.invisibleUntil = now.Add(q.visibility)
		m.Deliveries++
		out = append(out, m.Message)
	}
	return out
}

func (q *Queue) ack(ids []int) {
	var done []Message
	q.mu.Lock()
	for _, id := range ids {
		m := q.msgs[id]
		if !m.acked {
			m.acked = true
			q.acked++
			done = append(done, m.Message)
		}
	}
	onAck := q.OnAck
	q.mu.Unlock()
	if onAck != nil {
		for _, m := range done {
			onAck(m)
		}
	}
}

// Input returns a source of the queue with one partition, reading at most batch messages per
// Next. It keeps the messages of each epoch in memory and acks them in Commit once their epoch
// is committed; its snapshot is only a counter of epochs, never the messages. After a crash the
// unacked messages come back when their visibility runs out (see ExpireAll).
func (q *Queue) Input(batch int) dataflow.Source[Message] {
	return dataflow.FromPartitioned[Message, uint64](queueSource{q: q, batch: max(batch, 1)})
}

type queueSource struct {
	q     *Queue
	batch int
}

func (s queueSource) Parts(context.Context) ([]string, error) { return []string{"queue"}, nil }

func (s queueSource) Build(_ context.Context, _ string, resume *uint64) (dataflow.StatefulSource[Message, uint64], error) {
	p := &queuePart{q: s.q, batch: s.batch, inflight: map[uint64][]int{}}
	if resume != nil {
		p.seq = *resume
	}
	return p, nil
}

type queuePart struct {
	q        *Queue
	batch    int
	seq      uint64 // epochs snapshotted so far
	open     []int  // ids received in the open epoch
	inflight map[uint64][]int
}

func (p *queuePart) Next(context.Context) ([]Message, error) {
	msgs := p.q.receive(p.batch)
	for _, m := range msgs {
		p.open = append(p.open, m.ID)
	}
	return msgs, nil
}

// NextAwake polls the queue every millisecond when it is empty.
func (p *queuePart) NextAwake() time.Time { return time.Now().Add(time.Millisecond) }

func (p *queuePart) Snapshot() uint64 {
	p.seq++
	if len(p.open) > 0 {
		p.inflight[p.seq] = p.open
		p.open = nil
	}
	return p.seq
}

func (p *queuePart) Commit(_ context.Context, seq uint64) error {
	if seq > p.seq {
		return fmt.Errorf("flowtest queue: commit of snapshot %d, but only %d were taken", seq, p.seq)
	}
	var ids []int
	for s, batch := range p.inflight {
		if s <= seq {
			ids = append(ids, batch...)
			delete(p.inflight, s)
		}
	}
	p.q.ack(ids)
	return nil
}

func (p *queuePart) Close() error { return nil }
