package operators

import (
	"fmt"

	"github.com/epochflow/epochflow/dataflow"
)

// stepID returns the id a step named name gets in f, for error messages.
func stepID(f *dataflow.Flow, name string) string { return f.Name() + "." + name }

// usable tells whether a step named name can be built on in. It records a build error on the
// flow when isNil reports a missing function (what names it).
func usable[T any](name string, in dataflow.Stream[T], what string, isNil bool) bool {
	f := in.Flow()
	if f == nil || f.Err() != nil {
		return false
	}
	if isNil {
		f.Fail(fmt.Errorf("step %q: %s is nil", stepID(f, name), what))
		return false
	}
	return true
}

// recoverItem, deferred directly, turns a panic while handling batch[*i] into *err: an
// *dataflow.ItemError wrapping a *dataflow.PanicError, which names the user code's frame.
func recoverItem[T any](batch []T, i *int, err *error) {
	if p := recover(); p != nil {
		*err = dataflow.ItemErr(batch[*i], dataflow.PanicErr(p))
	}
}
