package dataflow

import (
	"time"

	"github.com/epochflow/epochflow/dataflow/internal/cluster"
)

// ExchangeSent returns what this process has sent to other processes of clusters since it
// started: the items encoded for them, and the frames and bytes their transports sent.
func ExchangeSent() (items, frames, bytes uint64) {
	f, b := cluster.Sent()
	return encodedItems.Load(), f, b
}

// SetInFlightHook makes runs with o call fn whenever the snapshots waiting for the recovery
// store change, with how many epochs past the committed one they span and their bytes (see
// engine.Config.OnInFlight). fn is called under the engine's lock: it must be quick.
func SetInFlightHook(o *Options, fn func(epochs uint64, bytes int64)) { o.onInFlight = fn }

// SetAlignWarnAfter sets how long watermark alignment holds a worker back before it logs the
// wait, and returns a func that restores it.
func SetAlignWarnAfter(d time.Duration) (restore func()) {
	prev := alignWarnAfter
	alignWarnAfter = d
	return func() { alignWarnAfter = prev }
}
