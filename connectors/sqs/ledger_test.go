package sqs

import (
	"fmt"
	"testing"
	"time"

	"pgregory.net/rapid"
)

// The in-flight bookkeeping under random receives, emits, snapshots, commits (in order, repeated
// and skipped), dead-letter confirmations, time steps and extension outcomes: the messages handed
// to the deleter are exactly those of committed epochs, each once (a rejected one only after its
// dead-letter send); extension requests are only for in-flight messages not handed to the
// deleter, are made before their deadline when the manager wakes when asked, and never keep a
// message invisible beyond 12 h after its receive.
func TestLedgerProperties(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		start := time.Unix(1_700_000_000, 0)
		now := start
		resume := rapid.Uint64Range(0, 5).Draw(t, "resume")
		l := newLedger(resume)
		vis := time.Duration(rapid.IntRange(1, 60).Draw(t, "visSeconds")) * time.Second
		margin := vis / 2
		type msg struct {
			emittedSeq uint64 // 0: not emitted
			dlq        bool
			dlqDone    bool
			deleted    int
			received   time.Time
			deadline   time.Time // the true latest deadline granted
			released   bool
		}
		msgs := map[uint64]*msg{}
		committed := resume
		var outstanding []extension
		deleting := map[uint64]bool{}

		checkDeletes := func(es []*entry, why string) {
			for _, e := range es {
				m := msgs[e.id]
				if m == nil {
					t.Fatalf("%s: deleted unknown message %d", why, e.id)
				}
				m.deleted++
				if m.deleted > 1 {
					t.Fatalf("%s: message %d deleted twice", why, e.id)
				}
				if m.emittedSeq == 0 || m.emittedSeq > committed {
					t.Fatalf("%s: message %d of epoch %d deleted, committed is %d", why, e.id, m.emittedSeq, committed)
				}
				if m.dlq && !m.dlqDone {
					t.Fatalf("%s: rejected message %d deleted before its dead-letter send", why, e.id)
				}
				deleting[e.id] = true
			}
		}

		steps := rapid.IntRange(1, 200).Draw(t, "steps")
		for i := 0; i < steps; i++ {
			switch rapid.IntRange(0, 8).Draw(t, fmt.Sprintf("op%d", i)) {
			case 0: // receive
				n := rapid.IntRange(1, 10).Draw(t, "n")
				for range n {
					id := l.add("h", "m", now, vis)
					msgs[id] = &msg{received: now, deadline: now.Add(vis)}
				}
			case 1: // emit buffered
				for id, m := range msgs {
					if m.emittedSeq == 0 && !m.released && l.entries[id] != nil && l.entries[id].state == stBuffered {
						dlq := rapid.IntRange(0, 9).Draw(t, "reject") == 0
						l.emit(id, dlq)
						m.emittedSeq, m.dlq = l.seq+1, dlq
					}
				}
			case 2: // snapshot
				l.snapshot()
			case 3: // commit some snapshot taken so far
				s := rapid.Uint64Range(0, l.seq).Draw(t, "commit")
				if s > committed {
					committed = s
				}
				es, err := l.commit(s)
				if err != nil {
					t.Fatal(err)
				}
				checkDeletes(es, "commit")
			case 4: // dead-letter send confirmed
				for id, m := range msgs {
					if m.dlq && !m.dlqDone && l.entries[id] != nil {
						m.dlqDone = true
						if e := l.dlqSent(id); e != nil {
							checkDeletes([]*entry{e}, "dlqSent")
						}
						break
					}
				}
			case 5: // the deleter finishes
				for id := range deleting {
					l.done(id)
					delete(deleting, id)
				}
			case 6: // time passes, never beyond the next wake-up the ledger asked for, and not
				// while extension requests are out (they are answered at once)
				if len(outstanding) > 0 {
					continue
				}
				step := time.Duration(rapid.Int64Range(1, int64(2*time.Hour)).Draw(t, "step"))
				if w := l.nextWake(margin); !w.IsZero() && w.Before(now.Add(step)) {
					step = max(w.Sub(now), 0)
				}
				now = now.Add(step)
			case 7: // the manager wakes: request extensions
				reqs, capped := l.due(now, margin, vis)
				for _, x := range reqs {
					m := msgs[x.id]
					if m == nil || l.entries[x.id] == nil {
						t.Fatalf("extension of a message not in flight: %d", x.id)
					}
					if m.deleted > 0 || deleting[x.id] {
						t.Fatalf("extension of message %d handed to the deleter", x.id)
					}
					if m.emittedSeq != 0 && m.emittedSeq <= committed && !(m.dlq && !m.dlqDone) {
						t.Fatalf("extension of committed message %d (epoch %d, committed %d)", x.id, m.emittedSeq, committed)
					}
					if now.After(m.deadline) {
						t.Fatalf("extension of message %d at %v, after its deadline %v", x.id, now.Sub(start), m.deadline.Sub(start))
					}
					if now.Add(x.timeout).After(m.received.Add(MaxVisibility)) {
						t.Fatalf("extension of message %d to %v after its receive, beyond 12 h", x.id, now.Add(x.timeout).Sub(m.received))
					}
					if x.timeout < time.Second || x.timeout%time.Second != 0 {
						t.Fatalf("extension timeout %v is not a whole number of seconds", x.timeout)
					}
				}
				outstanding = append(outstanding, reqs...)
				for _, e := range capped {
					if now.Sub(msgs[e.id].received) < MaxVisibility-visibilitySlack-vis-time.Second {
						t.Fatalf("message %d given up %v after its receive, long before 12 h", e.id, now.Sub(msgs[e.id].received))
					}
				}
			case 8: // extension outcomes
				for _, x := range outstanding {
					switch rapid.IntRange(0, 5).Draw(t, "outcome") {
					case 0:
						l.extended(x, now, false, false)
					case 1:
						l.extended(x, now, false, true)
					default:
						if m := msgs[x.id]; m != nil {
							if d := now.Add(x.timeout); d.After(m.deadline) {
								m.deadline = d
							}
						}
						l.extended(x, now, true, false)
					}
				}
				outstanding = nil
			}
		}
		// Commit everything: every emitted message is deleted exactly once (after its
		// dead-letter send), none that was not emitted.
		l.snapshot()
		committed = l.seq
		es, err := l.commit(l.seq)
		if err != nil {
			t.Fatal(err)
		}
		checkDeletes(es, "final commit")
		for id, m := range msgs {
			if m.dlq && !m.dlqDone {
				m.dlqDone = true
				if e := l.dlqSent(id); e != nil {
					checkDeletes([]*entry{e}, "final dlqSent")
				}
			}
		}
		for id, m := range msgs {
			if m.emittedSeq != 0 && m.deleted != 1 {
				t.Fatalf("emitted message %d (epoch %d) deleted %d times", id, m.emittedSeq, m.deleted)
			}
			if m.emittedSeq == 0 && m.deleted != 0 {
				t.Fatalf("message %d never emitted but deleted", id)
			}
		}
		// A commit beyond the last snapshot is refused.
		if _, err := l.commit(l.seq + 1); err == nil {
			t.Fatal("commit beyond the last snapshot accepted")
		}
	})
}
