// Package operators is epochflow's user-facing operator set: Map, Filter, FlatMap, KeyOn,
// StatefulMap, Reduce, Count, Collect, Join and the rest, built on the primitives of package
// dataflow (Transform, Split, Merge, Redistribute, Stateful).
//
// Every operator is a generic function whose first argument is the step's name; the step's id
// is the flow's name, a dot and that name. Composite operators (Count, Join) add internal steps
// named under theirs ("join.tag0", "join.merge") and name their last step after the operator.
//
// Stateless operators work batch by batch on the worker that holds the batch; their output
// items keep the epoch of the items they came from. Keyed stateful operators first exchange
// items so that every item of a key reaches the worker that owns the key, then keep one state
// per key; the state of epoch e is complete before any item of epoch e+1 is applied.
//
// With recovery (dataflow.Options.Recovery), a stateful operator stores the state of every key
// that changed at the end of each epoch, with dataflow.DefaultCodec unless it is given a codec:
// StatefulMap, StatefulMapErr, StatefulFlatMap and Stateful (a Logic's snapshot) take one in
// StateOptions; for the others (Fold's A, the values of Reduce, MaxBy, Collect and Join) the
// state must be a plain type that the default codec round-trips (see dataflow.CheckCodec), or
// the step is written with dataflow.Stateful and a StatefulLogic.Codec. A state type that
// cannot be stored refuses to start, with an error naming the step and what takes a codec.
//
// A user function that can fail has an Err variant (MapErr, FilterErr, ...). Its error, or a
// panic in any user function, stops the flow: Run returns a *dataflow.StepError naming the
// step and the worker, which wraps a *dataflow.ItemError naming the item.
//
// An operator given a zero Stream (the result of an earlier build mistake) returns a zero
// Stream and does nothing; a bad configuration (a nil function, Collect without a bound, Join
// with fewer than two sides) is recorded in the flow with (*dataflow.Flow).Fail, and Run
// returns it.
package operators
