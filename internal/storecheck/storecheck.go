// Package storecheck holds the switch of the recovery store's verification, so that
// benchmarks can measure what the verification costs a resume: recovery's
// BenchmarkVerification and dataflow's BenchmarkResume1MKeysVerification run the same resume
// with it on and off. Nothing else turns it off: a store opened and loaded without
// verification resumes from damage that it would have refused. Being internal, it cannot be
// turned off from outside this module.
package storecheck

import "sync/atomic"

// off is true while verification is turned off.
var off atomic.Bool

// On reports whether the recovery store verifies what it opens and loads: SQLite's quick
// check of the file at a read-write open (of every table but chunks at a read-only one),
// and Load's checks of every chunk and of each step's totals. It is true unless Set(false)
// turned it off. Commit keeps the checksums and totals either way.
func On() bool { return !off.Load() }

// Set turns verification on or off and returns a function that restores the setting it
// replaced.
func Set(on bool) (restore func()) {
	was := off.Swap(!on)
	return func() { off.Store(was) }
}
