package dataflow

import (
	"log/slog"
	"time"

	"github.com/epochflow/epochflow/dataflow/internal/engine"
)

// aligner is watermark alignment (Clock.MaxDrift) for one event-time step on one worker: it
// holds back the sources that feed the step on the worker (an engine.Gate) while the worker's
// own watermark, the one its clock node stamps on what it sends, is more than the drift ahead
// of the slowest other upstream worker of the step, as the step's node on this worker last
// heard from each (see timedNode.alignRef): upstream workers that are idle, have ended or have
// sent nothing yet hold nobody back. The others' watermarks rise only with the marks they send, and each of
// them wakes this worker, which then asks the gate again.
//
// No set of workers can hold each other back for ever, as the engine lets a gate hold only
// the sources that feed its step straight (through local steps), and a source have one gate:
// the watermark each worker waits for comes from sources no gate of its step holds on the
// slowest worker, and a held worker still flushes what it has buffered for the others (its
// marks included) and takes what they sent; once every mark is through, the slowest worker
// sees nobody behind it and reads. A partition that stops sending without ending holds every
// worker back, unless the clock has an IdleTimeout (as in Flink).
type aligner struct {
	own   *int64                    // the clock node's watermark (clockNode.sent), nil until built
	ref   func() (int64, int, bool) // the slowest other worker's watermark and number, nil until built
	drift int64

	step   string
	worker int
	logger *slog.Logger
	since  time.Time // when the gate closed, zero while open
	warned bool      // the long wait of this closing was logged
}

// alignWarnAfter is how long a worker waits for another before it says so (once per wait).
var alignWarnAfter = 10 * time.Second

// alignKey names a step's aligner among the values of a worker (engine.Env.Local).
type alignKey struct{ step string }

// alignerOf returns the aligner of the event-time step called step on env's worker.
func alignerOf(env *engine.Env, step string, drift int64) *aligner {
	return env.Local(alignKey{step}, func() any {
		return &aligner{drift: drift, step: step, worker: env.Worker, logger: env.Logger}
	}).(*aligner)
}

// Closed tells whether the worker's sources must wait for the slower workers. A wait of more
// than alignWarnAfter is logged once, naming the worker waited for: a partition that stopped
// sending without ending (and without an idle timeout) holds every worker back so.
func (a *aligner) Closed() bool {
	if a.own == nil || a.ref == nil || *a.own == maxTime {
		return false
	}
	ref, slow, ok := a.ref()
	if !ok || subSat(*a.own, a.drift) <= ref {
		a.since, a.warned = time.Time{}, false
		return false
	}
	switch now := time.Now(); {
	case a.since.IsZero():
		a.since = now
	case !a.warned && now.Sub(a.since) >= alignWarnAfter && a.logger != nil:
		a.warned = true
		a.logger.Warn("watermark alignment: this worker has read nothing for a while, waiting for a slower worker of the step to catch up; a partition of that worker may have stopped sending without ending (give the clock an idle timeout)",
			"step", a.step, "worker", a.worker, "waiting_for_worker", slow,
			"watermark", fromNanos(*a.own), "slower_watermark", fromNanos(ref), "max_drift", time.Duration(a.drift), "waited", now.Sub(a.since).Round(time.Second))
	}
	return true
}
