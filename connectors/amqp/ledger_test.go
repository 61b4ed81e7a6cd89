package amqp

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	amqp091 "github.com/rabbitmq/amqp091-go"
	"pgregory.net/rapid"
)

// fakeBroker models what RabbitMQ does with the acknowledgements of one consumer: each channel
// generation numbers its deliveries 1, 2, 3 ...; an ack or nack of a tag that is not
// outstanding on the live channel is a 406 PRECONDITION_FAILED; a channel that dies requeues
// what was outstanding on it.
type fakeBroker struct {
	gen         uint64
	next        uint64          // the next tag of the live generation
	outstanding map[uint64]bool // tags of the live generation not yet acked or nacked
	acked       map[[2]uint64]bool
	nacked      map[[2]uint64]bool
	lastAck     map[uint64]uint64 // per generation, the tag of the last multiple ack
}

func (b *fakeBroker) kill() {
	b.gen++
	b.next = 1
	b.outstanding = map[uint64]bool{}
}

// apply is what the consumer goroutine does with an op: drop it unless it is for the live
// channel, else send it.
func (b *fakeBroker) apply(t *rapid.T, op ackOp) {
	if op.gen != b.gen {
		return // a dead generation: never sent
	}
	if !b.outstanding[op.tag] {
		t.Fatalf("406 PRECONDITION_FAILED: %+v: tag %d is not outstanding on generation %d", op, op.tag, op.gen)
	}
	if op.nack {
		delete(b.outstanding, op.tag)
		b.nacked[[2]uint64{op.gen, op.tag}] = true
		return
	}
	if op.tag <= b.lastAck[op.gen] {
		t.Fatalf("multiple ack of tag %d on generation %d after one of tag %d", op.tag, op.gen, b.lastAck[op.gen])
	}
	b.lastAck[op.gen] = op.tag
	for tag := range b.outstanding {
		if tag <= op.tag {
			delete(b.outstanding, tag)
			b.acked[[2]uint64{op.gen, tag}] = true
		}
	}
}

type delivered struct {
	gen, tag uint64
	reject   bool
}

// Random deliveries over random channel generations, random snapshots, commits (subsuming,
// repeated, skipped) and channel deaths that the worker learns of late: the ops the ledger
// issues never touch an unknown tag, acknowledge every tag at most once, ack with increasing
// tags per channel, acknowledge exactly the committed deliveries of channels that were alive
// when their commit was applied, and nack exactly the rejected ones among those.
func TestLedgerProperty(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		b := &fakeBroker{gen: 1, next: 1, outstanding: map[uint64]bool{},
			acked: map[[2]uint64]bool{}, nacked: map[[2]uint64]bool{}, lastAck: map[uint64]uint64{}}
		var l ledger
		l.setLive(1)
		var open []delivered
		bySeq := map[uint64][]delivered{}
		var seqs []uint64
		committed := uint64(0)
		// want: the deliveries that must be acknowledged: committed while their generation was
		// the broker's live one.
		wantAck := map[[2]uint64]bool{}
		wantNack := map[[2]uint64]bool{}
		workerLive := uint64(1)

		steps := rapid.IntRange(1, 300).Draw(t, "steps")
		for i := 0; i < steps; i++ {
			switch rapid.IntRange(0, 9).Draw(t, "action") {
			case 0, 1, 2, 3: // a delivery of the live channel
				reject := rapid.IntRange(0, 5).Draw(t, "reject") == 0
				d := delivered{gen: b.gen, tag: b.next, reject: reject}
				b.outstanding[b.next] = true
				b.next++
				if err := l.deliver(d.gen, d.tag, d.reject); err != nil {
					t.Fatal(err)
				}
				open = append(open, d)
			case 4: // the end of an epoch
				seq := l.snapshot()
				bySeq[seq] = open
				open = nil
				seqs = append(seqs, seq)
			case 5: // the channel dies; the worker does not know yet
				b.kill()
			case 6: // the worker learns which generation is live
				workerLive = b.gen
				l.setLive(workerLive)
			case 7, 8: // a commit of some snapshot taken, possibly an old one again
				if len(seqs) == 0 {
					continue
				}
				seq := seqs[rapid.IntRange(0, len(seqs)-1).Draw(t, "commit")]
				ops, err := l.commit(seq)
				if err != nil {
					t.Fatal(err)
				}
				if seq > committed {
					for s := committed + 1; s <= seq; s++ {
						for _, d := range bySeq[s] {
							// A delivery counts when its generation is still the broker's
							// live one as the ops are applied, and the worker had not
							// declared it dead before the commit.
							if d.gen == b.gen && d.gen >= workerLive {
								if d.reject {
									wantNack[[2]uint64{d.gen, d.tag}] = true
								} else {
									wantAck[[2]uint64{d.gen, d.tag}] = true
								}
							}
						}
					}
					committed = seq
				} else if len(ops) > 0 {
					t.Fatalf("commit of %d after %d issued %v", seq, committed, ops)
				}
				checkOrder(t, ops)
				for _, op := range ops {
					b.apply(t, op)
				}
			case 9: // a commit of a sequence number never taken is an error
				if _, err := l.commit(l.seq + 1); err == nil {
					t.Fatal("commit of a future snapshot succeeded")
				}
			}
		}
		// Every acknowledged tag was wanted; nothing wanted was missed.
		for k := range b.acked {
			if !wantAck[k] {
				t.Fatalf("tag %v acknowledged but not a committed accepted delivery of a live channel", k)
			}
		}
		for k := range wantAck {
			if !b.acked[k] {
				t.Fatalf("committed delivery %v never acked", k)
			}
		}
		if fmt.Sprint(b.nacked) != fmt.Sprint(wantNack) {
			t.Fatalf("nacked %v, want %v", b.nacked, wantNack)
		}
		// What is held is exactly the live deliveries not committed.
		held := len(open)
		for _, s := range seqs {
			if s > committed {
				held += len(bySeq[s])
			}
		}
		dead := 0
		for _, d := range open {
			if d.gen < workerLive {
				dead++
			}
		}
		for _, s := range seqs {
			if s > committed {
				for _, d := range bySeq[s] {
					if d.gen < workerLive {
						dead++
					}
				}
			}
		}
		if l.outstanding() != held-dead {
			t.Fatalf("outstanding() = %d, want %d", l.outstanding(), held-dead)
		}
	})
}

// checkOrder: per generation, nacks come before the ack and each tag appears once.
func checkOrder(t *rapid.T, ops []ackOp) {
	seen := map[[2]uint64]bool{}
	acked := map[uint64]bool{}
	for i, op := range ops {
		k := [2]uint64{op.gen, op.tag}
		if seen[k] {
			t.Fatalf("tag %v twice in one commit: %v", k, ops)
		}
		seen[k] = true
		if acked[op.gen] {
			t.Fatalf("op %d (%+v) after the ack of its generation: %v", i, op, ops)
		}
		if !op.nack {
			acked[op.gen] = true
		}
		if i > 0 && ops[i-1].gen > op.gen {
			t.Fatalf("generations out of order: %v", ops)
		}
	}
}

func TestLedgerCommitSkipsAndRepeats(t *testing.T) {
	var l ledger
	l.setLive(1)
	for tag := uint64(1); tag <= 3; tag++ {
		l.deliver(1, tag, false)
	}
	s1 := l.snapshot()
	l.deliver(1, 4, true) // rejected: nacked, never acked
	s2 := l.snapshot()
	l.deliver(1, 5, false)
	s3 := l.snapshot()
	ops, err := l.commit(s2) // covers s1 and s2
	if err != nil {
		t.Fatal(err)
	}
	want := []ackOp{{gen: 1, tag: 4, nack: true}, {gen: 1, tag: 3}}
	if !slices.Equal(ops, want) {
		t.Fatalf("commit(%d) = %v, want %v", s2, ops, want)
	}
	if ops, _ := l.commit(s1); len(ops) != 0 {
		t.Fatalf("a repeated older commit issued %v", ops)
	}
	l.setLive(2) // the channel died: tag 5 is forgotten
	if ops, _ := l.commit(s3); len(ops) != 0 {
		t.Fatalf("commit after the channel died issued %v", ops)
	}
	if l.outstanding() != 0 {
		t.Fatalf("outstanding = %d, want 0", l.outstanding())
	}
}

func TestFatal(t *testing.T) {
	for _, c := range []struct {
		err   error
		fatal bool
	}{
		{&amqp091.Error{Code: amqp091.NotFound, Reason: "NOT_FOUND - no queue 'q'"}, true},
		{&amqp091.Error{Code: amqp091.AccessRefused}, true},
		{&amqp091.Error{Code: amqp091.PreconditionFailed, Reason: "PRECONDITION_FAILED - unknown delivery tag 7"}, true},
		{&amqp091.Error{Code: amqp091.PreconditionFailed, Reason: "PRECONDITION_FAILED - delivery acknowledgement on channel 1 timed out"}, false},
		{&amqp091.Error{Code: amqp091.ConnectionForced, Reason: "CONNECTION_FORCED - Closed via management plugin"}, false},
		{fmt.Errorf("the connection was closed: %w", &amqp091.Error{Code: amqp091.FrameError, Reason: "EOF"}), false},
		{errors.New("dial tcp: connection refused"), false},
	} {
		if got := fatal(c.err); got != c.fatal {
			t.Errorf("fatal(%v) = %v, want %v", c.err, got, c.fatal)
		}
	}
}

// A tag that does not increase within a generation is refused, not recorded: acking past it
// could cover a message of a later epoch.
func TestLedgerRefusesTagsOutOfOrder(t *testing.T) {
	var l ledger
	l.setLive(1)
	for _, tag := range []uint64{1, 2, 5} {
		if err := l.deliver(1, tag, false); err != nil {
			t.Fatal(err)
		}
	}
	for _, tag := range []uint64{5, 3} {
		if err := l.deliver(1, tag, false); err == nil || !strings.Contains(err.Error(), "out of order") {
			t.Fatalf("deliver(tag %d after 5) = %v, want an out-of-order error", tag, err)
		}
	}
	l.setLive(2)
	if err := l.deliver(2, 1, false); err != nil {
		t.Fatalf("a new generation starts again at tag 1: %v", err)
	}
	seq := l.snapshot()
	ops, err := l.commit(seq)
	if err != nil {
		t.Fatal(err)
	}
	if want := []ackOp{{gen: 2, tag: 1}}; !slices.Equal(ops, want) {
		t.Fatalf("commit = %v, want %v (the dead generation's tags dropped)", ops, want)
	}
}
