package pgstore

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/epochflow/epochflow/recovery"
)

// restartKeys is how many keys each commit of the restart tests rewrites: enough for a commit
// to take a while (several COPYs and a merge).
const restartKeys = 50_000

// epochSnaps returns a snapshot of every key with the epoch as its state.
func epochSnaps(e uint64) []recovery.Snapshot {
	snaps := make([]recovery.Snapshot, restartKeys)
	for k := range snaps {
		snaps[k] = recovery.Snapshot{Step: "s", Key: fmt.Sprintf("k%06d", k), Epoch: e, State: []byte(strconv.FormatUint(e, 10))}
	}
	return snaps
}

// checkAllOrNothing checks that the store's committed epoch is before or e, and every key's
// state is the committed epoch's: the commit of e is there entirely or not at all.
func checkAllOrNothing(t *testing.T, s *Store, before, e uint64) uint64 {
	t.Helper()
	ctx := context.Background()
	c, err := s.Committed(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if c.Epoch != before && c.Epoch != e {
		t.Fatalf("committed epoch %d, want %d or %d", c.Epoch, before, e)
	}
	n := 0
	want := strconv.FormatUint(c.Epoch, 10)
	if err := s.Load(ctx, "s", func(key string, epoch uint64, state []byte) error {
		n++
		if epoch != c.Epoch || string(state) != want {
			return fmt.Errorf("key %s: epoch %d state %q, want the committed epoch %d's", key, epoch, state, c.Epoch)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if n != restartKeys {
		t.Fatalf("Load returned %d keys, want %d", n, restartKeys)
	}
	return c.Epoch
}

// A commit whose connection breaks (the server ends its backend, or the server restarts,
// fast or immediately) at some point is committed entirely or not at all; the error says that
// the connection was lost; the store connects again and takes its lock again at the next
// Commit, and resumes at the next Begin.
func TestConnectionLostDuringCommit(t *testing.T) {
	ctx := context.Background()
	breakers := []struct {
		name    string
		breakIt func(t *testing.T, pid uint32)
	}{
		{"backend terminated", func(t *testing.T, pid uint32) {
			exec(t, fmt.Sprintf(`SELECT pg_terminate_backend(%d)`, pid))
		}},
		{"server restarted immediately", func(t *testing.T, _ uint32) {
			if err := pg.Restart("immediate"); err != nil {
				t.Fatal(err)
			}
		}},
		{"server restarted fast", func(t *testing.T, _ uint32) {
			if err := pg.Restart("fast"); err != nil {
				t.Fatal(err)
			}
		}},
	}
	for _, b := range breakers {
		t.Run(b.name, func(t *testing.T) {
			s := open(t, newSchema(), Options{})
			if _, err := s.Begin(ctx, recovery.Execution{Flow: "restart", Steps: []string{"s"}, Workers: 1}); err != nil {
				t.Fatal(err)
			}
			if err := s.Commit(ctx, recovery.Epoch{Epoch: 1, Frontiers: []uint64{1}, Snapshots: epochSnaps(1)}); err != nil {
				t.Fatal(err)
			}
			committed := uint64(1)
			outcomes := map[string]int{}
			for i, delay := range []time.Duration{0, 50 * time.Millisecond, 200 * time.Millisecond, 500 * time.Millisecond, 1500 * time.Millisecond} {
				e := committed + 1
				pid := s.writer.PgConn().PID()
				snaps := epochSnaps(e)
				done := make(chan error, 1)
				go func() {
					done <- s.Commit(ctx, recovery.Epoch{Epoch: e, Frontiers: []uint64{e}, Snapshots: snaps})
				}()
				time.Sleep(delay)
				b.breakIt(t, pid)
				err := <-done
				switch {
				case err == nil:
					outcomes["committed"]++
				case strings.Contains(err.Error(), "nothing of the epoch was committed"),
					strings.Contains(err.Error(), "connecting: "): // the server was not back yet
					outcomes["not committed"]++
				case strings.Contains(err.Error(), "the epoch is committed entirely or not at all"):
					outcomes["unknown"]++
				default:
					t.Fatalf("attempt %d: Commit of epoch %d: %v; want nil or an error saying that the connection was lost", i, e, err)
				}
				if err != nil && !strings.Contains(err.Error(), s.Name()) {
					t.Errorf("error does not name the store: %v", err)
				}
				got := checkAllOrNothing(t, s, committed, e)
				if err != nil && !strings.Contains(err.Error(), "entirely or not at all") && got != committed {
					t.Fatalf("Commit said nothing was committed, but epoch %d is", got)
				}
				if err == nil && got != e {
					t.Fatalf("Commit of %d returned nil, but the committed epoch is %d", e, got)
				}
				committed = got
				// The next Commit connects again and takes the lock again.
				if err := s.Commit(ctx, recovery.Epoch{Epoch: committed + 1, Frontiers: []uint64{committed + 1}, Snapshots: epochSnaps(committed + 1)}); err != nil {
					t.Fatalf("Commit after the connection was lost: %v", err)
				}
				committed++
				checkAllOrNothing(t, s, committed, committed)
			}
			t.Logf("outcomes: %v", outcomes)
			// A second writer is still refused: the store holds the lock again.
			if w, err := Open(ctx, testDSN(t), Options{Schema: s.Schema()}); err == nil {
				w.Close()
				t.Error("a second writer could open the store after the first took its lock again")
			}
			r, err := s.Begin(ctx, recovery.Execution{Flow: "restart", Steps: []string{"s"}, Workers: 1})
			if err != nil || r.Committed != committed {
				t.Errorf("Begin = %+v, %v; want committed epoch %d", r, err, committed)
			}
		})
	}
}

// A store whose connection was lost does not commit over another writer that has taken the
// lock meanwhile: its Commit is refused with ErrInUse.
func TestLostLockIsNotTakenBack(t *testing.T) {
	ctx := context.Background()
	defer func(d time.Duration) { relockWait = d }(relockWait)
	relockWait = 300 * time.Millisecond
	schema := newSchema()
	a := open(t, schema, Options{})
	if _, err := a.Begin(ctx, recovery.Execution{Flow: "f", Workers: 1}); err != nil {
		t.Fatal(err)
	}
	exec(t, fmt.Sprintf(`SELECT pg_terminate_backend(%d)`, a.writer.PgConn().PID()))
	// Until a notices, b can take the lock, and begins an execution.
	var b *Store
	deadline := time.Now().Add(10 * time.Second)
	for {
		var err error
		if b, err = Open(ctx, testDSN(t), Options{Schema: schema}); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the lock of a terminated backend was not released: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	defer b.Close()
	if _, err := b.Begin(ctx, recovery.Execution{Flow: "f", Workers: 1}); err != nil {
		t.Fatal(err)
	}
	err := a.Commit(ctx, recovery.Epoch{Epoch: 1, Frontiers: []uint64{1}})
	if err == nil {
		t.Fatal("the store whose lock was taken committed")
	}
	// Its first attempt fails on the lost connection; the next cannot take the lock.
	err = a.Commit(ctx, recovery.Epoch{Epoch: 1, Frontiers: []uint64{1}})
	if err == nil || !strings.Contains(err.Error(), "in use") {
		t.Errorf("Commit while another writer holds the lock: %v, want ErrInUse", err)
	}
	if err := b.Commit(ctx, recovery.Epoch{Epoch: 1, Frontiers: []uint64{1}}); err != nil {
		t.Errorf("the writer holding the lock: %v", err)
	}
	b.Close()
	// Once b is gone, a takes the lock back, but its execution was superseded: Begin again.
	if err := a.Commit(ctx, recovery.Epoch{Epoch: 2, Frontiers: []uint64{2}}); err == nil || !strings.Contains(err.Error(), "has begun since") {
		t.Errorf("Commit of a superseded execution: %v", err)
	}
	if r, err := a.Begin(ctx, recovery.Execution{Flow: "f", Workers: 1}); err != nil || r.Execution != 3 || r.Committed != 1 {
		t.Errorf("Begin = %+v, %v", r, err)
	}
}
