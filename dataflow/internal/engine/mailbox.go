package engine

import (
	"math"
	"sync"
	"sync/atomic"
)

type msgKind uint8

const (
	msgData msgKind = iota
	msgBarrier
	msgEOF
	msgStop // the sender stopped early (a graceful stop): like EOF, but OnEOF is not called
)

// message is what crosses a channel: a batch of one epoch, the end of an epoch, or the end of
// the stream.
type message struct {
	kind  msgKind
	epoch uint64
	batch any
}

// mailbox is one channel of one exchange edge, from one sending worker to one receiving worker.
// Sends never block: the sender stops reading its sources when a mailbox holds more than
// highWater messages, and the receiver wakes it when the mailbox drains to lowWater. A worker
// that both sends and receives therefore never waits on another, and alignment (holding a
// channel until the others catch up) cannot deadlock.
type mailbox struct {
	mu     sync.Mutex
	q      []message
	head   int
	n      atomic.Int32
	sender *worker // nil when the sender is in another process (in is set)
	recv   *worker // nil when the receiver is in another process (out is set)
	out    *remoteOut
	in     *remoteIn
	// receiver-side state, touched only by the receiving worker
	reached uint64 // every message of epochs <= reached has been taken
	eof     bool   // the end (or a stop) was taken
	stopped bool   // the end was a stop
}

const (
	highWater = 64
	lowWater  = 16
)

func (m *mailbox) send(msg message) {
	if m.out != nil {
		m.out.send(m, msg)
		return
	}
	m.mu.Lock()
	m.q = append(m.q, msg)
	m.mu.Unlock()
	m.n.Add(1)
	m.recv.wakeUp()
}

// peek returns the first message without taking it.
func (m *mailbox) peek() (message, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.head == len(m.q) {
		return message{}, false
	}
	return m.q[m.head], true
}

// pop removes the first message.
func (m *mailbox) pop() {
	m.mu.Lock()
	m.q[m.head] = message{}
	m.head++
	if m.head == len(m.q) {
		m.q = m.q[:0]
		m.head = 0
	} else if m.head > 256 && m.head*2 > len(m.q) {
		n := copy(m.q, m.q[m.head:])
		clear(m.q[n:])
		m.q = m.q[:n]
		m.head = 0
	}
	m.mu.Unlock()
	n := m.n.Add(-1)
	if m.in != nil {
		m.in.took(n)
	} else if n == lowWater {
		m.sender.wakeUp()
	}
}

// full tells the sender to stop reading its sources.
func (m *mailbox) full() bool { return m.n.Load() > highWater }

const eofEpoch = math.MaxUint64
