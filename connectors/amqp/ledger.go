package amqp

import "fmt"

// ackOp is one acknowledgement the consumer goroutine sends to the broker: Ack(tag,
// multiple=true), or Nack(tag, multiple=false, requeue=false) when nack is set. It is sent only
// on the channel of generation gen, and dropped when that channel is gone.
type ackOp struct {
	gen  uint64
	tag  uint64
	nack bool
}

// span is what one epoch received on one channel generation: the highest delivery tag it
// accepted (0 if none), the tags it rejected (to be nacked, in increasing order) and how many
// deliveries it holds in all.
type span struct {
	gen   uint64
	last  uint64
	nacks []uint64
	n     int
}

// epochSpans is the in-flight record of one snapshot sequence number.
type epochSpans struct {
	seq   uint64
	spans []span
}

// ledger is the in-memory bookkeeping of a consumer's unacknowledged deliveries, owned by the
// partition's worker (Next, Snapshot and Commit): which delivery tags of which channel
// generation each snapshot covers. Snapshots are sequence numbers; tags are never persisted.
//
// Invariants it keeps, which the broker requires (an unknown tag closes the channel with 406
// PRECONDITION_FAILED):
//   - an op is only ever issued for a tag of a generation the ledger has not seen die;
//   - every committed tag is acknowledged once: rejected tags by a single nack, the others by
//     one multiple ack whose tag is the highest accepted tag of the committed range of that
//     generation, sent after the nacks of that range, so no tag is acked after it was nacked
//     nor nacked after it was acked;
//   - per generation, ack tags increase strictly from one commit to the next.
type ledger struct {
	seq     uint64 // snapshots taken (or the resume state)
	open    []span // the open epoch, one span per generation seen in it (usually one)
	pending []epochSpans
	live    uint64 // generations below live are dead: their tags are forgotten
	held    int    // deliveries recorded and not yet committed or forgotten
	lastGen uint64 // the generation and tag of the last delivery recorded
	lastTag uint64
}

// deliver records a delivery of the open epoch. Tags of one generation must arrive in
// increasing order (the broker numbers a channel's deliveries 1, 2, 3 ...); one that does not is
// refused with an error and not recorded, since a multiple ack past it could cover a message of
// a later epoch.
func (l *ledger) deliver(gen, tag uint64, reject bool) error {
	if gen < l.live {
		return nil
	}
	if gen == l.lastGen && tag <= l.lastTag {
		return fmt.Errorf("delivery tag %d of channel generation %d arrived after tag %d (out of order: a bug)", tag, gen, l.lastTag)
	}
	l.lastGen, l.lastTag = gen, tag
	var s *span
	if n := len(l.open); n > 0 && l.open[n-1].gen == gen {
		s = &l.open[n-1]
	} else {
		l.open = append(l.open, span{gen: gen})
		s = &l.open[len(l.open)-1]
	}
	if reject {
		s.nacks = append(s.nacks, tag)
	} else {
		s.last = tag
	}
	s.n++
	l.held++
	return nil
}

// snapshot closes the open epoch and returns its sequence number.
func (l *ledger) snapshot() uint64 {
	l.seq++
	if len(l.open) > 0 {
		l.pending = append(l.pending, epochSpans{seq: l.seq, spans: l.open})
		l.open = nil
	}
	return l.seq
}

// resume sets the sequence number a resumed partition continues from.
func (l *ledger) resume(seq uint64) { l.seq = seq }

// commit returns the ops that acknowledge every delivery of the snapshots up to seq, and
// forgets them. The ops come grouped by generation in increasing order; within a generation
// the nacks (increasing) come before the one multiple ack.
func (l *ledger) commit(seq uint64) ([]ackOp, error) {
	if seq > l.seq {
		return nil, fmt.Errorf("commit of snapshot %d, but only %d were taken", seq, l.seq)
	}
	i := 0
	for i < len(l.pending) && l.pending[i].seq <= seq {
		i++
	}
	if i == 0 {
		return nil, nil
	}
	var ops []ackOp
	var cur *span // the merged span of the generation being collected
	var merged []span
	for _, e := range l.pending[:i] {
		for _, s := range e.spans {
			l.held -= s.n
			if s.gen < l.live {
				continue
			}
			if cur == nil || cur.gen != s.gen {
				merged = append(merged, span{gen: s.gen})
				cur = &merged[len(merged)-1]
			}
			if s.last > cur.last {
				cur.last = s.last
			}
			cur.nacks = append(cur.nacks, s.nacks...)
		}
	}
	for _, s := range merged {
		for _, t := range s.nacks {
			ops = append(ops, ackOp{gen: s.gen, tag: t, nack: true})
		}
		if s.last > 0 {
			ops = append(ops, ackOp{gen: s.gen, tag: s.last})
		}
	}
	clear(l.pending[:i])
	l.pending = l.pending[i:]
	return ops, nil
}

// setLive tells the ledger that every generation below gen is dead: its deliveries are
// forgotten (the broker requeued them when their channel closed) and never acknowledged.
func (l *ledger) setLive(gen uint64) {
	if gen <= l.live {
		return
	}
	l.live = gen
	l.open = l.dropDead(l.open)
	kept := l.pending[:0]
	for _, e := range l.pending {
		e.spans = l.dropDead(e.spans)
		if len(e.spans) > 0 {
			kept = append(kept, e)
		}
	}
	clear(l.pending[len(kept):])
	l.pending = kept
}

func (l *ledger) dropDead(spans []span) []span {
	kept := spans[:0]
	for _, s := range spans {
		if s.gen < l.live {
			l.held -= s.n
			continue
		}
		kept = append(kept, s)
	}
	if len(kept) == 0 {
		return nil
	}
	return kept
}

// outstanding returns how many deliveries are recorded and not yet committed: while it is at
// the prefetch limit, the broker sends nothing more.
func (l *ledger) outstanding() int { return l.held }
