// Package commitloop runs the commits of an exactly-once sink partition on a goroutine of its
// own, so that the engine's Commit call returns at once: Request hands the loop the newest
// committed snapshot, and the loop commits every pending transaction up to it, oldest first,
// until the first failure, which it keeps for the partition to report.
package commitloop

import (
	"sync"
	"sync/atomic"
)

// Loop is one partition's commit goroutine. The zero Loop is not usable; see Start.
type Loop struct {
	commitUpTo func(target uint64) error
	wrap       func(error) error

	target   atomic.Uint64
	kick     chan struct{}
	progress chan struct{} // a round ended
	stop     chan struct{}
	done     chan struct{}
	stopOnce sync.Once

	mu  sync.Mutex
	err error
}

// Start starts the goroutine. commitUpTo commits what is pending up to target (a snapshot
// sequence) and returns nil when there is nothing (more) to do; it is called once per round,
// with the newest target requested, never concurrently. A failure ends the loop: Err returns
// it, passed through wrap (which names the sink and partition).
func Start(commitUpTo func(target uint64) error, wrap func(error) error) *Loop {
	l := &Loop{commitUpTo: commitUpTo, wrap: wrap,
		kick: make(chan struct{}, 1), progress: make(chan struct{}, 1),
		stop: make(chan struct{}), done: make(chan struct{})}
	go l.run()
	return l
}

func (l *Loop) run() {
	defer close(l.done)
	for {
		stop := false
		select {
		case <-l.kick:
		case <-l.stop:
			stop = true
		}
		err := l.commitUpTo(l.target.Load())
		if err != nil {
			l.mu.Lock()
			l.err = l.wrap(err)
			l.mu.Unlock()
		}
		select {
		case l.progress <- struct{}{}:
		default:
		}
		if err != nil || stop {
			return
		}
	}
}

// Request raises the target to seq (a lower seq than one requested before changes nothing)
// and wakes the loop. It does not wait.
func (l *Loop) Request(seq uint64) {
	if seq > l.target.Load() {
		l.target.Store(seq)
		select {
		case l.kick <- struct{}{}:
		default:
		}
	}
}

// Target returns the newest sequence requested.
func (l *Loop) Target() uint64 { return l.target.Load() }

// Err returns the failure that ended the loop, nil while it runs.
func (l *Loop) Err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}

// Wait blocks until the loop ends a round (true) or has ended (false). A caller that waits
// for a commit it requested checks its condition again after each round.
func (l *Loop) Wait() bool {
	select {
	case <-l.progress:
		return true
	case <-l.done:
		return false
	}
}

// Stop lets the loop run one last round with the newest target, then waits for its
// goroutine to end. It is idempotent.
func (l *Loop) Stop() {
	l.stopOnce.Do(func() { close(l.stop) })
	<-l.done
}
