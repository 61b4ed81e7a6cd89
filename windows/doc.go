// Package windows cuts keyed streams into event-time (or system-time) windows and aggregates
// each window of each key: Tumbling, Sliding and Session windowers; Apply for any logic (open,
// add, merge, close, and a codec for its state), and Fold, Reduce, Count, Collect, Max and Min
// on top of it; window joins of keyed streams (Join of two or more of one type, Join2 of two
// types; complete, final or running) and IntervalJoin.
//
// A windowed step keeps time with a dataflow.Clock: an event-time clock reads each item's time
// and carries a watermark from every upstream worker through the step's keyed exchange, the
// minimum over the source partitions that worker reads; the step's watermark is the minimum
// over upstream workers, leaving out idle partitions and workers (see dataflow.Clock).
// A window emits its result once the watermark reaches its end. Every windowed step has three
// outputs: the results (key, window, value, whether it is an update), the late items (never
// dropped silently: an item whose window is gone goes there with that window), and each
// window's metadata once it is gone (how many items and results it had).
//
// Time in a windowed step, for a Bytewax or Flink user, is described in docs/time.md of the
// repository.
package windows
