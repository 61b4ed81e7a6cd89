package commitloop

import (
	"errors"
	"strings"
	"sync"
	"testing"

	"go.uber.org/goleak"
)

// Every requested target is committed up to, in rounds that see the newest target; a lower
// request changes nothing; Stop runs a last round with the newest target.
func TestCommitsUpToTheNewestTarget(t *testing.T) {
	defer goleak.VerifyNone(t)
	var mu sync.Mutex
	var rounds []uint64
	l := Start(func(target uint64) error {
		mu.Lock()
		rounds = append(rounds, target)
		mu.Unlock()
		return nil
	}, func(err error) error { return err })
	for seq := uint64(1); seq <= 50; seq++ {
		l.Request(seq)
	}
	l.Request(3)
	if l.Target() != 50 {
		t.Fatalf("target %d after requesting up to 50", l.Target())
	}
	l.Stop()
	l.Stop() // idempotent
	mu.Lock()
	defer mu.Unlock()
	if len(rounds) == 0 || rounds[len(rounds)-1] != 50 {
		t.Fatalf("rounds %v: want the last one at 50", rounds)
	}
	for i := 1; i < len(rounds); i++ {
		if rounds[i] < rounds[i-1] {
			t.Fatalf("rounds %v: a target went back", rounds)
		}
	}
	if l.Err() != nil {
		t.Fatalf("after Stop: Err %v", l.Err())
	}
	for l.Wait() { // a last round's signal may be buffered; then Wait reports the end
	}
}

// The first failure ends the loop: Err returns it wrapped, Wait reports the end, later
// requests commit nothing.
func TestFailureEndsTheLoop(t *testing.T) {
	defer goleak.VerifyNone(t)
	calls := 0
	boom := errors.New("boom")
	l := Start(func(uint64) error { calls++; return boom }, func(err error) error { return errors.Join(errors.New("sink x: partition p0"), err) })
	l.Request(1)
	for l.Wait() {
	}
	if err := l.Err(); !errors.Is(err, boom) || !strings.Contains(err.Error(), "partition p0") {
		t.Fatalf("Err = %v, want boom wrapped with the partition", err)
	}
	l.Request(2)
	l.Stop()
	if calls != 1 {
		t.Fatalf("commitUpTo called %d times, want once", calls)
	}
}
