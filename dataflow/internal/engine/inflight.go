package engine

import (
	"sync/atomic"
	"unsafe"
)

// snapshotOverhead is what a Snapshot holds in memory besides its key's and state's bytes.
const snapshotOverhead = int64(unsafe.Sizeof(Snapshot{}))

// snapshotBytes is the memory the engine holds for snaps until they are durable:
// approximately, each snapshot's struct, key and state.
func snapshotBytes(snaps []Snapshot) int64 {
	n := int64(len(snaps)) * snapshotOverhead
	for i := range snaps {
		n += int64(len(snaps[i].Key) + len(snaps[i].State))
	}
	return n
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

// add counts snapshots reported; committed is the committed epoch.
func (f *inFlight) add(snaps []Snapshot, committed uint64) {
	if len(snaps) == 0 {
		return
	}
	f.bytes += snapshotBytes(snaps)
	for i := range snaps {
		f.newest = max(f.newest, snaps[i].Epoch)
	}
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
