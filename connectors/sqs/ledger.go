package sqs

import (
	"fmt"
	"slices"
	"time"
)

// MaxVisibility is the longest SQS keeps a received message invisible, counted from the
// receive: 12 hours. Extensions never ask for more.
const MaxVisibility = 12 * time.Hour

// visibilitySlack is kept between the 12 h limit and the latest deadline an extension asks
// for, since the request reaches SQS a little after it is computed.
const visibilitySlack = 30 * time.Second

// entryState is where a received message is in its life.
type entryState uint8

const (
	stBuffered  entryState = iota // received, not yet returned by Next
	stEmitted                     // returned by Next (or rejected) in the open epoch
	stSealed                      // its epoch was snapshotted, not yet committed
	stCommitted                   // its epoch is committed; waiting for the dead-letter send
	stDeleting                    // handed to the deleter
)

// entry is one in-flight message of a partition.
type entry struct {
	id        uint64
	handle    string // receipt handle
	msgID     string
	received  time.Time // when the receive request was sent: the start of the 12 h clock (conservative)
	deadline  time.Time // when the message becomes visible again unless extended (conservative)
	notBefore time.Time // no extension request before this (back-off after a failed one)
	state     entryState
	seq       uint64 // the snapshot its epoch ends with (emitted: the next one)
	extending bool   // an extension request for it is out
	lost      bool   // its visibility can no longer be extended (expired, stale, or 12 h reached)
	dlq       bool   // rejected: must be sent to the dead-letter queue before it is deleted
	dlqDone   bool   // the dead-letter send is confirmed
}

// extension is a request to keep a message invisible for timeout more.
type extension struct {
	id       uint64
	handle   string
	timeout  time.Duration // a whole number of seconds, at least 1
	deadline time.Time     // the message's deadline when the request was made
}

// ledger is the in-memory bookkeeping of a source partition: the messages in flight, the epoch
// each belongs to (by snapshot sequence number), and their visibility deadlines. It does no I/O
// and takes the time as an argument, so that it can be tested on its own. It is not safe for
// concurrent use.
type ledger struct {
	seq     uint64 // snapshots taken (resumed runs start at the resumed one)
	nextID  uint64
	entries map[uint64]*entry
	open    []uint64            // emitted since the last snapshot
	sealed  map[uint64][]uint64 // snapshot seq -> ids
}

func newLedger(seq uint64) *ledger {
	return &ledger{seq: seq, entries: map[uint64]*entry{}, sealed: map[uint64][]uint64{}}
}

// inFlight is the number of messages received and not yet deleted (or given up on).
func (l *ledger) inFlight() int { return len(l.entries) }

// add records a message received by a request sent at sentAt with the visibility vis, and
// returns its id.
func (l *ledger) add(handle, msgID string, sentAt time.Time, vis time.Duration) uint64 {
	l.nextID++
	l.entries[l.nextID] = &entry{id: l.nextID, handle: handle, msgID: msgID, received: sentAt, deadline: sentAt.Add(vis)}
	return l.nextID
}

// emit puts a buffered message into the open epoch; dlq says it was rejected and goes to the
// dead-letter queue.
func (l *ledger) emit(id uint64, dlq bool) {
	e := l.entries[id]
	if e == nil || e.state != stBuffered {
		return
	}
	e.state, e.seq, e.dlq = stEmitted, l.seq+1, dlq
	l.open = append(l.open, id)
}

// snapshot closes the open epoch and returns its sequence number.
func (l *ledger) snapshot() uint64 {
	l.seq++
	if len(l.open) > 0 {
		for _, id := range l.open {
			if e := l.entries[id]; e != nil && e.state == stEmitted {
				e.state = stSealed
			}
		}
		l.sealed[l.seq] = l.open
		l.open = nil
	}
	return l.seq
}

// commit marks the messages of every epoch up to seq committed and returns those that may be
// deleted now (the rest wait for their dead-letter send, see dlqSent). It is idempotent and
// subsuming: a repeated or older seq returns nothing new. A seq beyond the last snapshot is an
// error.
func (l *ledger) commit(seq uint64) ([]*entry, error) {
	if seq > l.seq {
		return nil, fmt.Errorf("commit of snapshot %d, but only %d were taken", seq, l.seq)
	}
	var out []*entry
	for s, ids := range l.sealed {
		if s > seq {
			continue
		}
		for _, id := range ids {
			e := l.entries[id]
			if e == nil || e.state != stSealed {
				continue
			}
			if e.dlq && !e.dlqDone {
				e.state = stCommitted
				continue
			}
			e.state = stDeleting
			out = append(out, e)
		}
		delete(l.sealed, s)
	}
	return out, nil
}

// dlqSent records that the dead-letter send of id is confirmed, and returns the entry if it
// may be deleted now (its epoch is committed).
func (l *ledger) dlqSent(id uint64) *entry {
	e := l.entries[id]
	if e == nil {
		return nil
	}
	e.dlqDone = true
	if e.state == stCommitted {
		e.state = stDeleting
		return e
	}
	return nil
}

// release removes the messages that were never committed and returns them (at Close, to make
// them visible again).
func (l *ledger) release() []*entry {
	var out []*entry
	for id, e := range l.entries {
		if e.state == stBuffered || e.state == stEmitted || e.state == stSealed {
			out = append(out, e)
			delete(l.entries, id)
		}
	}
	l.open = nil
	clear(l.sealed)
	return out
}

// done forgets a message: deleted, or given up on.
func (l *ledger) done(id uint64) { delete(l.entries, id) }

// extendable says whether a message's visibility is ours to keep: it is not yet handed to the
// deleter, not lost, and no request for it is out.
func (e *entry) extendable() bool {
	return e.state != stDeleting && !e.lost && !e.extending
}

// due returns the extension requests to send at now: for every extendable message whose
// deadline is within margin (or within margin*3/2, to batch requests), a timeout of vis
// (rounded up to whole seconds), cut so that the message stays invisible at most MaxVisibility
// (less a slack) after its receive. The requests come nearest deadline first. A message that
// cannot be extended any more is marked lost and returned in capped.
func (l *ledger) due(now time.Time, margin, vis time.Duration) (reqs []extension, capped []*entry) {
	horizon := now.Add(margin + margin/2)
	want := (vis + time.Second - 1) / time.Second * time.Second
	for _, e := range l.entries {
		if !e.extendable() || e.deadline.After(horizon) || now.Before(e.notBefore) {
			continue
		}
		left := e.received.Add(MaxVisibility - visibilitySlack).Sub(now)
		t := min(want, left/time.Second*time.Second)
		if t < time.Second || !now.Add(t).After(e.deadline) {
			e.lost = true
			capped = append(capped, e)
			continue
		}
		e.extending = true
		reqs = append(reqs, extension{id: e.id, handle: e.handle, timeout: t, deadline: e.deadline})
	}
	slices.SortFunc(reqs, func(a, b extension) int { return a.deadline.Compare(b.deadline) })
	return reqs, capped
}

// extended records the outcome of an extension request sent at sentAt: ok moves the deadline,
// gone marks the message lost (its receipt handle is no longer valid), and neither (a failure
// worth retrying) backs off for a second, or half the time left before the deadline if less.
func (l *ledger) extended(x extension, sentAt time.Time, ok, gone bool) {
	e := l.entries[x.id]
	if e == nil {
		return
	}
	e.extending = false
	switch {
	case ok:
		if d := sentAt.Add(x.timeout); d.After(e.deadline) {
			e.deadline = d
		}
	case gone:
		e.lost = true
	default:
		e.notBefore = sentAt.Add(max(min(time.Second, e.deadline.Sub(sentAt)/2), 10*time.Millisecond))
	}
}

// nextWake returns when due should next be called (the zero time if no message needs it).
func (l *ledger) nextWake(margin time.Duration) time.Time {
	var at time.Time
	for _, e := range l.entries {
		if !e.extendable() {
			continue
		}
		t := e.deadline.Add(-margin)
		if t.Before(e.notBefore) {
			t = e.notBefore
		}
		if at.IsZero() || t.Before(at) {
			at = t
		}
	}
	return at
}
