package nats

import (
	"testing"
	"time"
)

func acceptAll(t *testing.T, l *ledger, want bool, seqs ...uint64) {
	t.Helper()
	for _, s := range seqs {
		if got := l.accept(s, "r", time.Time{}); got != want {
			t.Fatalf("accept(%d) = %v, want %v", s, got, want)
		}
	}
}

func wantTarget(t *testing.T, l *ledger, st QueueState, want uint64) {
	t.Helper()
	tg, ok := l.commit(st)
	if want == 0 {
		if ok {
			t.Fatalf("commit(%+v) acks all up to %d, want no ack-all", st, tg.seq)
		}
		return
	}
	if !ok || tg.seq != want {
		t.Fatalf("commit(%+v) = %d %v, want an ack-all on %d", st, tg.seq, ok, want)
	}
}

// A redelivery of a message held by an uncommitted epoch is dropped; the held copy is the one
// processed, and the ack-all of its epoch covers it.
func TestLedgerDropsRedeliveryOfHeld(t *testing.T) {
	l := newLedger(nil)
	l.start(0, 0, 0)
	acceptAll(t, l, true, 1, 2, 3, 4, 5)
	s1 := l.snapshot()
	acceptAll(t, l, true, 6, 7)
	acceptAll(t, l, false, 5) // epoch 1's message 5, redelivered in epoch 2
	s2 := l.snapshot()
	wantTarget(t, l, s1, 5)
	acceptAll(t, l, false, 3) // below the last ack-all
	wantTarget(t, l, s2, 7)
	wantTarget(t, l, s2, 0) // idempotent
}

// A message never seen before that arrives in an open epoch below the sequences of committed
// ones (a redelivery of an earlier run's) caps the ack-all below it until its epoch commits.
func TestLedgerCapsBelowAnUncommittedRedelivery(t *testing.T) {
	l := newLedger(nil)
	l.start(0, 10, 10) // an earlier run left 1..10 pending
	acceptAll(t, l, true, 11, 12, 13)
	s1 := l.snapshot()
	if s1.Done != 0 {
		t.Fatalf("snapshot Done = %d with unseen pending messages below, want 0", s1.Done)
	}
	wantTarget(t, l, s1, 0) // 1..10 unseen: nothing may be acked
	acceptAll(t, l, true, 1, 2, 3, 4, 5, 6, 7, 8, 9)
	s2 := l.snapshot()
	wantTarget(t, l, s2, 0) // 10 still unseen, and 1..9 only now committed: cap at the floor 0
	acceptAll(t, l, true, 10)
	// Epoch 3 (open) holds 10: an ack-all on 13 would cover it.
	wantTarget(t, l, s2, 9)
	s3 := l.snapshot()
	if s3.Done != 13 {
		t.Fatalf("snapshot Done = %d, want 13", s3.Done)
	}
	wantTarget(t, l, s3, 13)
}

// After a resume, a redelivery at or below the committed Done is dropped, and acked with the
// next ack-all.
func TestLedgerDropsRedeliveryAtOrBelowDone(t *testing.T) {
	l := newLedger(&QueueState{Snapshot: 4, Done: 8})
	l.start(0, 12, 12)
	wantTarget(t, l, QueueState{Snapshot: 4, Done: 8}, 0)
	acceptAll(t, l, false, 1, 2, 3, 4, 5, 6, 7, 8)
	acceptAll(t, l, true, 9, 10, 11, 12)
	s := l.snapshot()
	// Every pending message below 8 is processed: the resumed state's ack-all may go out
	// before the new epoch commits.
	wantTarget(t, l, QueueState{Snapshot: 4, Done: 8}, 8)
	wantTarget(t, l, s, 12)
}

// Pending messages of an earlier run that the server no longer counts are gone, but those
// pulled and not yet accepted are not: they keep capping the ack-all until accepted, so that
// no ack-all covers them before their epoch commits.
func TestLedgerSettlesOldButKeepsThePulledOnes(t *testing.T) {
	l := newLedger(nil)
	l.start(0, 10, 10) // an earlier run left 1..10 pending
	acceptAll(t, l, true, 11, 12)
	s1 := l.snapshot()
	pulled := []uint64{3, 4, 4, 12} // 3 and 4 redelivered (4 twice), 12 again: not accepted yet
	if n := l.known(pulled); n != 4 {
		t.Fatalf("known = %d, want 4 (11, 12, 3, 4)", n)
	}
	// The server counts 4 pending: 1, 2 and 5..10 are gone; 3 and 4 are on their way.
	if gone := l.settleOld(pulled); gone != 8 {
		t.Fatalf("settleOld = %d gone, want 8", gone)
	}
	wantTarget(t, l, s1, 0) // 3 and 4 unseen by the ledger: no ack-all may pass them
	acceptAll(t, l, true, 3, 4)
	wantTarget(t, l, s1, 0) // 3 and 4 in the open epoch cap it below 3
	s2 := l.snapshot()
	wantTarget(t, l, s2, 12)
}
