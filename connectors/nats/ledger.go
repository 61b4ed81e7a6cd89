package nats

import (
	"math"
	"time"
)

// QueueState is the resume state of a queue-mode partition (one durable consumer).
type QueueState struct {
	// Snapshot counts the snapshots the partition has taken.
	Snapshot uint64 `json:"snapshot"`
	// Done is a stream sequence at or below which every message still pending on the consumer
	// has been processed by an epoch up to this one: once this epoch is committed, acking all
	// up to Done is safe, and a redelivery at or below it is dropped.
	Done uint64 `json:"done"`
}

// entry is a message delivered to the consumer and not yet covered by an ack-all.
type entry struct {
	reply string    // the ack subject of its latest delivery
	epoch uint64    // the snapshot number that covers it; 0: already processed (committed)
	due   time.Time // when the server's AckWait for its latest delivery or in-progress runs out
}

// ackTarget is one ack-all to send: "+ACK" as a request on the reply subject of the message of
// stream sequence seq.
type ackTarget struct {
	seq   uint64
	reply string
}

// ledger is the bookkeeping of a queue-mode consumer, shared by the worker (accept, snapshot,
// commit) and the consumer's goroutine (keep-alive), under the consumer's mutex.
//
// The ack-all rule. An ack-all on stream sequence S acknowledges every message of the
// consumer still pending at or below S. So the ledger sends one only on a message S such that
// every pending message at or below S has been processed by a committed epoch:
//   - S is the highest held message of a committed epoch below limit, where limit is the
//     lowest sequence held by an epoch not yet committed (the open one included). A
//     redelivery that arrives in an open epoch for a message never seen before (one of an
//     earlier run's) is such a message: until its epoch commits, no ack-all reaches it;
//   - pending messages an earlier run received and never acknowledged (ConsumerInfo's
//     NumAckPending when the partition starts, all between its AckFloor and its Delivered
//     sequence) are unknown until the server redelivers them; until all of them have come
//     back, limit is also capped at that AckFloor (or Done, if higher);
//   - a redelivery of a message already held is dropped (the held copy is the one processed;
//     its ack subject and deadline are refreshed), and so is one at or below Done or below the
//     last ack-all, which a committed epoch already processed: such a message is kept as a
//     committed entry, so that the next ack-all covers it.
//
// Committed messages above limit stay held (and kept alive) until limit passes them.
type ledger struct {
	snap      uint64 // snapshots taken (or the resumed one)
	committed uint64 // the last committed snapshot number
	floor     uint64 // every pending message at or below it was processed by a committed epoch
	acked     uint64 // the sequence of the last ack-all decided
	held      map[uint64]*entry

	// Pending messages of an earlier run not yet seen again: oldLeft of them, in (oldLo, oldHi].
	oldLo, oldHi uint64
	oldLeft      int
}

func newLedger(resume *QueueState) *ledger {
	l := &ledger{held: make(map[uint64]*entry)}
	if resume != nil {
		l.snap, l.committed, l.floor = resume.Snapshot, resume.Snapshot, resume.Done
	}
	return l
}

// start records what the server said when the consumer was opened: its ack floor, its
// delivered stream sequence and how many messages are pending (delivered to an earlier run and
// not acknowledged).
func (l *ledger) start(ackFloor, delivered uint64, pending int) {
	l.acked = ackFloor
	if pending > 0 {
		l.oldLo, l.oldHi, l.oldLeft = ackFloor, delivered, pending
	}
}

// accept records a delivery of stream sequence seq with ack subject reply, received at now
// (the server's AckWait for it runs out at due), and says whether it must be emitted in the
// open epoch.
func (l *ledger) accept(seq uint64, reply string, due time.Time) bool {
	if e, ok := l.held[seq]; ok {
		e.reply, e.due = reply, due // a redelivery of a message held: drop it
		return false
	}
	if seq <= l.acked {
		return false // acked already (the redelivery crossed the ack)
	}
	if l.oldLeft > 0 && seq > l.oldLo && seq <= l.oldHi {
		l.oldLeft--
	}
	if seq <= l.floor {
		l.held[seq] = &entry{reply: reply, due: due} // processed by a committed epoch
		return false
	}
	l.held[seq] = &entry{reply: reply, epoch: l.snap + 1, due: due}
	return true
}

// snapshot closes the open epoch and returns its state.
func (l *ledger) snapshot() QueueState {
	l.snap++
	var top uint64
	for seq, e := range l.held {
		if seq > top && e.epoch <= l.snap {
			top = seq
		}
	}
	done := min(top, l.oldCap())
	return QueueState{Snapshot: l.snap, Done: max(done, l.floor)}
}

// oldCap is the highest sequence an ack-all may reach while pending messages of an earlier
// run are unseen (math.MaxUint64 when there are none).
func (l *ledger) oldCap() uint64 {
	if l.oldLeft > 0 {
		return max(l.oldLo, l.floor)
	}
	return math.MaxUint64
}

// commit marks the snapshots up to st.Snapshot committed and returns the ack-all to send, if
// any (ok false: nothing new to acknowledge).
func (l *ledger) commit(st QueueState) (ackTarget, bool) {
	if st.Snapshot > l.committed {
		l.committed = st.Snapshot
	}
	l.floor = max(l.floor, st.Done)
	return l.target()
}

// target returns the ack-all the ledger allows now (see the ack-all rule) and forgets the
// entries it covers.
func (l *ledger) target() (ackTarget, bool) {
	limit := l.oldCap()
	if limit != math.MaxUint64 {
		limit++ // the cap itself may be acked
	}
	for seq, e := range l.held {
		if e.epoch > l.committed && seq < limit {
			limit = seq
		}
	}
	var t ackTarget
	for seq, e := range l.held {
		if e.epoch <= l.committed && seq < limit && seq > t.seq {
			t = ackTarget{seq: seq, reply: e.reply}
		}
	}
	if t.seq == 0 || t.seq <= l.acked {
		return ackTarget{}, false
	}
	for seq := range l.held {
		if seq <= t.seq {
			delete(l.held, seq)
		}
	}
	l.acked = t.seq
	l.floor = max(l.floor, t.seq)
	return t, true
}

// known returns how many distinct pending messages the partition knows of: those held and
// those pulled (their stream sequences) and not yet accepted, less those an ack-all covered.
func (l *ledger) known(pulled []uint64) int {
	n := len(l.held)
	seen := make(map[uint64]bool, len(pulled))
	for _, seq := range pulled {
		if _, held := l.held[seq]; !held && !seen[seq] && seq > l.acked {
			seen[seq] = true
			n++
		}
	}
	return n
}

// settleOld is called when the server counts no more pending messages than the partition
// knows of (known): the pending messages of an earlier run not among them are gone from the
// stream (deleted, or dropped by a limit) and never come back, so they no longer cap the
// ack-all. Those among the messages pulled and not yet accepted (pulled) are not gone: they
// keep capping it until accept sees them, or an ack-all could cover one before its epoch
// commits. It returns how many were found gone.
func (l *ledger) settleOld(pulled []uint64) int {
	coming := make(map[uint64]bool)
	for _, seq := range pulled {
		if _, held := l.held[seq]; !held && seq > l.acked && seq > l.oldLo && seq <= l.oldHi {
			coming[seq] = true
		}
	}
	gone := max(l.oldLeft-len(coming), 0)
	l.oldLeft -= gone
	return gone
}

// due returns the ack subjects of the held messages whose AckWait runs out before soon, and
// moves their deadline to next.
func (l *ledger) due(soon, next time.Time, out []string) []string {
	for _, e := range l.held {
		if e.due.Before(soon) {
			out = append(out, e.reply)
			e.due = next
		}
	}
	return out
}
