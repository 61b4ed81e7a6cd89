package pgrepl

import (
	"context"
	"errors"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
)

// The slot's confirmed_flush_lsn stays where it was while the epoch that read two
// transactions is uncommitted (also across several status intervals, and while the server
// asks for replies), the WAL stays retained, and after Commit it moves to exactly the end LSN
// of the committed epoch's last transaction, never to the server's WAL end.
func TestFlushOnlyOnCommit(t *testing.T) {
	dsn, conn := newDB(t)
	name := slotName(t, conn)
	exec(t, conn, "CREATE TABLE t (id int PRIMARY KEY, v text)")

	var mu sync.Mutex
	var answered []LSN // flushed LSNs sent in answer to keepalives that asked
	var walEnds []LSN
	statusHook = func(flushed LSN, ka *pglogrepl.PrimaryKeepaliveMessage) {
		if ka != nil {
			mu.Lock()
			answered = append(answered, flushed)
			walEnds = append(walEnds, LSN(ka.ServerWALEnd))
			mu.Unlock()
		}
	}
	defer func() { statusHook = nil }()

	// wal_sender_timeout=2s: the server asks for a reply after 1 s without one; with a
	// status interval of 10 s, only the answers to those keep the connection alive.
	cfg := Config{DSN: dsn + "&wal_sender_timeout=2s", Slot: name, Publication: "pub", Tables: []string{"t"},
		CreateSlot: true, CreatePublication: true, StatusInterval: 10 * time.Second}
	p := build(t, cfg, nil)
	defer p.Close()
	start := slot(t, conn, name)
	if err := p.Commit(context.Background(), p.Snapshot()); err != nil { // as the engine does on start
		t.Fatal(err)
	}

	exec(t, conn, "INSERT INTO t SELECT g, 'a' FROM generate_series(1, 100) g")
	exec(t, conn, "UPDATE t SET v = 'b' WHERE id <= 50")
	got := read(t, p, commits(2))
	state := p.Snapshot()
	if state.LSN != got[len(got)-1].LSN || state.TxCommit != 0 {
		t.Fatalf("snapshot %+v after a commit event at %s", state, got[len(got)-1].LSN)
	}
	firstCommit := got[0].CommitLSN
	// More WAL that the epoch has not read: the server's WAL end moves past the snapshot.
	exec(t, conn, "INSERT INTO t VALUES (1000, 'later')")

	time.Sleep(5 * time.Second) // several keepalive rounds, an epoch that takes long
	s := slot(t, conn, name)
	if s.confirmed != start.confirmed {
		t.Fatalf("confirmed_flush_lsn moved from %s to %s before any commit", start.confirmed, s.confirmed)
	}
	if s.restart > firstCommit {
		t.Fatalf("restart_lsn %s passed the uncommitted transaction at %s: its WAL is not retained", s.restart, firstCommit)
	}
	if !s.active {
		t.Fatal("the slot is no longer active: the server dropped the connection (keepalives unanswered?)")
	}
	mu.Lock()
	if len(answered) == 0 {
		t.Error("no keepalive asked for a reply within 5 s with wal_sender_timeout=2s")
	}
	for i, a := range answered {
		if a != start.confirmed {
			t.Errorf("keepalive (server WAL end %s) answered with %s, want the committed %s", walEnds[i], a, start.confirmed)
		}
	}
	mu.Unlock()

	if err := p.Commit(context.Background(), state); err != nil {
		t.Fatal(err)
	}
	eventually(t, "confirmed_flush_lsn to move", func() bool { return slot(t, conn, name).confirmed != start.confirmed })
	s = slot(t, conn, name)
	if s.confirmed != state.LSN {
		t.Fatalf("confirmed_flush_lsn is %s after Commit, want the committed transaction's end %s", s.confirmed, state.LSN)
	}
	// An older Commit (subsuming, or repeated) never moves it back.
	if err := p.Commit(context.Background(), State{LSN: start.confirmed}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	if s2 := slot(t, conn, name); s2.confirmed != state.LSN {
		t.Fatalf("confirmed_flush_lsn moved to %s after an older Commit", s2.confirmed)
	}
	mu.Lock()
	for _, a := range answered {
		if a != start.confirmed && a != state.LSN {
			t.Errorf("keepalive answered with %s, which is no committed LSN", a)
		}
	}
	mu.Unlock()
}

// A run that resumes from a snapshot taken in the middle of a large transaction, and from one
// taken after a complete one, emits every event exactly once across the runs.
func TestResumeExactlyOnce(t *testing.T) {
	dsn, conn := newDB(t)
	name := slotName(t, conn)
	exec(t, conn, "CREATE TABLE t (id int PRIMARY KEY)")
	cfg := Config{DSN: dsn, Slot: name, Publication: "pub", Tables: []string{"t"}, CreateSlot: true, CreatePublication: true}
	p := build(t, cfg, nil)
	if err := p.Commit(context.Background(), p.Snapshot()); err != nil { // an epoch committed: the slot stays
		t.Fatal(err)
	}
	exec(t, conn, "INSERT INTO t SELECT g FROM generate_series(1, 10) g")
	exec(t, conn, "INSERT INTO t SELECT g FROM generate_series(11, 5010) g") // 5000 rows: more than one Next
	exec(t, conn, "INSERT INTO t SELECT g FROM generate_series(5011, 5020) g")
	seen := map[int32]int{}
	count := func(cs []Change) {
		for _, c := range cs {
			if c.Kind == Insert {
				seen[c.New[0].(int32)]++
			}
		}
	}
	// First run: the first transaction and part of the second.
	first := read(t, p, func(cs []Change) bool {
		return len(cs) >= 100 && cs[len(cs)-1].Kind == Insert && cs[len(cs)-1].New[0].(int32) > 10
	})
	count(first)
	mid := p.Snapshot()
	if mid.TxCommit == 0 || mid.TxEvents == 0 {
		t.Fatalf("snapshot %+v taken inside a transaction has no partial part", mid)
	}
	p.Close()

	// Second run, resumed from the middle: the rest of the second transaction and the third.
	p = build(t, cfg, &mid)
	if err := p.Commit(context.Background(), mid); err != nil {
		t.Fatal(err)
	}
	rest := read(t, p, commits(2))
	count(rest)
	if rest[0].Kind == Begin {
		t.Errorf("the resumed run started with a Begin of the transaction it had begun")
	}
	end := p.Snapshot()
	p.Close()
	for id := int32(1); id <= 5020; id++ {
		if seen[id] != 1 {
			t.Fatalf("row %d seen %d times", id, seen[id])
		}
	}
	if len(seen) != 5020 {
		t.Fatalf("%d rows seen, want 5020", len(seen))
	}

	// Third run, resumed after everything, without a Commit reaching the server first: the
	// server sends the transactions again from the slot's position, and the source skips them.
	p = build(t, cfg, &end)
	exec(t, conn, "INSERT INTO t VALUES (9999)")
	again := read(t, p, commits(1))
	p.Close()
	for _, c := range again {
		if c.Kind == Insert && c.New[0].(int32) != 9999 {
			t.Fatalf("row %v emitted again after a resume past it", c.New[0])
		}
	}
}

// Heartbeats let the position of an idle source advance (and so the slot, once committed),
// without emitting events.
func TestHeartbeat(t *testing.T) {
	dsn, conn := newDB(t)
	name := slotName(t, conn)
	exec(t, conn, "CREATE TABLE t (id int PRIMARY KEY)")
	p := build(t, Config{DSN: dsn, Slot: name, Publication: "pub", Tables: []string{"t"}, CreateSlot: true, CreatePublication: true,
		Heartbeat: 50 * time.Millisecond}, nil)
	defer p.Close()
	start := p.Snapshot()
	deadline := time.Now().Add(20 * time.Second)
	for p.Snapshot().LSN == start.LSN {
		cs, err := p.Next(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if len(cs) > 0 {
			t.Fatalf("heartbeats emitted events: %v", cs)
		}
		if time.Now().After(deadline) {
			t.Fatal("the position did not advance with heartbeats")
		}
		select {
		case <-p.Wait():
		case <-time.After(100 * time.Millisecond):
		}
	}
	s := p.Snapshot()
	if err := p.Commit(context.Background(), s); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the slot to advance", func() bool { return slot(t, conn, name).confirmed == s.LSN })
}

// A transaction whose commit reaches Next apart from its first events still starts the
// IdleEOF clock: the source wakes its waiter for the end, though the last Next returned data
// (CI once hung here, the transaction split across two Next calls on a loaded machine).
func TestIdleEOFAfterASplitTransaction(t *testing.T) {
	dsn, conn := newDB(t)
	exec(t, conn, "CREATE TABLE t (id int PRIMARY KEY)")
	p := build(t, Config{DSN: dsn, Slot: slotName(t, conn), Publication: "pub", Tables: []string{"t"}, CreateSlot: true,
		CreatePublication: true, IdleEOF: time.Second}, nil)
	defer p.Close()
	// Nothing is written to the database: the test feeds the partition's queue as the
	// replication goroutine would, one transaction in two parts.
	drain := func() []Change { // as a worker does: Wait, then Next
		t.Helper()
		select {
		case <-p.Wait():
		default:
		}
		out, err := p.Next(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	for len(drain()) > 0 {
	}
	// As if no empty Next had come before: no idle clock running, no wake-up pending.
	if p.idleTimer != nil {
		p.idleTimer.Stop()
	}
	select {
	case <-p.ready:
	default:
	}
	const commit = LSN(0x1_0000_0000)
	p.enqueue(Change{Kind: Begin, CommitLSN: commit}, true)
	p.enqueue(Change{Kind: Insert, CommitLSN: commit}, true)
	if got := drain(); len(got) != 2 {
		t.Fatalf("first part: %d events, want 2", len(got))
	}
	p.enqueue(Change{Kind: Commit, CommitLSN: commit, LSN: commit}, true)
	if got := drain(); len(got) != 1 {
		t.Fatalf("second part: %d events, want the commit", len(got))
	}
	select {
	case <-p.Wait():
	case <-time.After(5 * time.Second):
		t.Fatal("Wait was not ready within 5 s of the last change: the IdleEOF end was not signalled")
	}
	for end := time.Now().Add(5 * time.Second); ; {
		_, err := p.Next(context.Background())
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil || time.Now().After(end) {
			t.Fatalf("Next after the idle time: %v, want io.EOF", err)
		}
		select {
		case <-p.Wait():
		case <-time.After(5 * time.Second):
		}
	}
}

// With IdleEOF the source ends once no change arrived for that long, and DropSlotAtEnd drops
// the slot after the last commit; without it the slot stays.
func TestIdleEOFAndDropSlot(t *testing.T) {
	dsn, conn := newDB(t)
	exec(t, conn, "CREATE TABLE t (id int PRIMARY KEY)")
	for _, drop := range []bool{false, true} {
		name := slotName(t, conn)
		p := build(t, Config{DSN: dsn, Slot: name, Publication: "pub", Tables: []string{"t"}, CreateSlot: true, CreatePublication: true,
			IdleEOF: 300 * time.Millisecond, DropSlotAtEnd: drop}, nil)
		exec(t, conn, "INSERT INTO t VALUES (1) ON CONFLICT DO NOTHING")
		deadline := time.Now().Add(30 * time.Second)
		for {
			_, err := p.Next(context.Background())
			if err != nil {
				if !strings.Contains(err.Error(), "EOF") {
					t.Fatal(err)
				}
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("no EOF")
			}
			// The source must wake its waiter for the end as for data: a worker parked on
			// Wait has nothing else to go on.
			select {
			case <-p.Wait():
			case <-time.After(5 * time.Second):
				t.Fatal("Wait was not ready within 5 s of the last change: the IdleEOF end was not signalled")
			}
		}
		if err := p.Commit(context.Background(), p.Snapshot()); err != nil {
			t.Fatal(err)
		}
		if err := p.Close(); err != nil {
			t.Fatal(err)
		}
		var n int
		if err := conn.QueryRow(context.Background(), "SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1", name).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if (n == 0) != drop {
			t.Errorf("DropSlotAtEnd=%v: %d slots named %s left", drop, n, name)
		}
	}
}
