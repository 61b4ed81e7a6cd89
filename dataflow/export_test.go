package dataflow

// SetInFlightHook makes runs with o call fn whenever the snapshots waiting for the recovery
// store change, with how many epochs past the committed one they span and their bytes (see
// engine.Config.OnInFlight). fn is called under the engine's lock: it must be quick.
func SetInFlightHook(o *Options, fn func(epochs uint64, bytes int64)) { o.onInFlight = fn }
