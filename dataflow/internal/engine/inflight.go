package engine

import "sync/atomic"

// snapshotOverhead is what a snapshot costs the store's writer besides its bytes in a pack:
// the recovery store's sort of a commit holds two 24-byte references per snapshot.
const snapshotOverhead = 48

// snapshotBytes is the memory the engine and the store's writer hold for p until it is
// durable: approximately, its bytes and the sort's references to its snapshots.
func snapshotBytes(p *Pack) int64 {
	return int64(p.Size()) + int64(p.Len())*snapshotOverhead
}

// inFlight is the coordinator's account of the snapshots handed over by workers and not yet
// durable (waiting for the writer, or being written). Its fields are guarded by
// coordinator.mu, except over, which workers read without the lock.
type inFlight struct {
	bytes  int64  // snapshot bytes reported and not yet durable
	newest uint64 // the newest epoch of a snapshot reported
	budget int64  // Config.MaxSnapshotBytesInFlight; 0 for none
	over   atomic.Bool
	hook   func(epochs uint64, bytes int64) // Config.OnInFlight
}

// add counts a pack reported; committed is the committed epoch.
func (f *inFlight) add(p *Pack, committed uint64) {
	if p == nil || p.Len() == 0 {
		return
	}
	f.bytes += snapshotBytes(p)
	_, hi := p.Epochs()
	f.newest = max(f.newest, hi)
	f.changed(committed)
}

// done counts bytes that became durable with the commit of committed.
func (f *inFlight) done(bytes int64, committed uint64) {
	f.bytes -= bytes
	f.changed(committed)
}

// changed tells the hook, then the workers: a test that sees the hook's account before any
// worker acts on it can check that no source reads while the bound is exceeded.
func (f *inFlight) changed(committed uint64) {
	if f.hook != nil {
		var epochs uint64
		if f.newest > committed {
			epochs = f.newest - committed
		}
		f.hook(epochs, f.bytes)
	}
	f.over.Store(f.budget > 0 && f.bytes > f.budget)
}
