package operators

import "github.com/epochflow/epochflow/dataflow"

// Input adds a step that reads from src (a connector's source, or flowtest's) and returns its
// stream. It is dataflow.Input.
//
// State: the source partitions' resume positions, snapshotted at the end of every epoch.
// Epochs: every item carries the epoch it was read in; each worker closes its epoch every epoch
// interval, and Commit is called on the partitions once an epoch is committed. EOF: the stream
// ends when every partition has ended.
func Input[T any](f *dataflow.Flow, name string, src dataflow.Source[T]) dataflow.Stream[T] {
	return dataflow.Input(f, name, src)
}

// Output adds a step that writes every item of s to sink. It is dataflow.Output.
//
// State: the sink partitions' pre-commit state, taken (Snapshot) at the end of every epoch.
// Epochs: Commit is called on the partitions once an epoch is committed. EOF: nothing more is
// written.
func Output[T any](name string, s dataflow.Stream[T], sink dataflow.Sink[T]) {
	dataflow.Output(name, s, sink)
}
