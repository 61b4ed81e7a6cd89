package dataflow

import (
	"fmt"
	"unicode/utf8"

	"github.com/epochflow/epochflow/dataflow/internal/engine"
)

// StepError is the error Run returns when a step fails: it names the step and the worker. Its
// Err is often an *ItemError naming the item.
type StepError = engine.StepError

// PanicError is a panic of a user function (or of a connector), recovered and turned into an
// error: Error is "panic: VALUE (at FILE:LINE)", where FILE:LINE is the user code that
// panicked (the first frame outside the Go runtime, the standard library and epochflow's own
// packages). Its Stack, the whole stack at the panic, is logged at debug level when the run
// fails. Unwrap returns the panic's value when it is an error.
type PanicError = engine.PanicError

// PanicErr turns the value p recovered from a panic into a *PanicError. Call it from the
// deferred function that called recover (directly or in a function that one calls), so that
// the frames of the panic are still on the stack.
func PanicErr(p any) error { return engine.NewPanicError(p) }

// userError marks the error of a user function that is not an *ItemError (a Transform's
// error, a stateful step's error on a key): Run does not restart a flow for it (see
// RestartPolicy). It is invisible in messages and to errors.Is and errors.As.
type userError struct{ err error }

func (e *userError) Error() string { return e.err.Error() }
func (e *userError) Unwrap() error { return e.err }

// userErr marks err as a user function's error; nil stays nil.
func userErr(err error) error {
	if err == nil {
		return nil
	}
	return &userError{err}
}

// ItemError is the error of a user function on one item.
type ItemError struct {
	Item string // the item, printed with %v and cut to a readable length
	Err  error
}

// Error returns "item ITEM: ERR".
func (e *ItemError) Error() string { return fmt.Sprintf("item %s: %v", e.Item, e.Err) }

// Unwrap returns the user function's error.
func (e *ItemError) Unwrap() error { return e.Err }

// maxItemLen is how much of an item an error shows.
const maxItemLen = 200

// FormatItem prints an item for an error message: %v, quoted when it is a string, cut to 200
// bytes.
func FormatItem(item any) string {
	var s string
	switch v := item.(type) {
	case string:
		s = fmt.Sprintf("%q", v)
	case []byte:
		s = fmt.Sprintf("%q", v)
	default:
		s = fmt.Sprintf("%+v", v)
	}
	if len(s) > maxItemLen {
		cut := maxItemLen
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut--
		}
		s = s[:cut] + fmt.Sprintf("...(%d bytes)", len(s))
	}
	return s
}

// ItemErr wraps err as the failure of a user function on item.
func ItemErr(item any, err error) error {
	return &ItemError{Item: FormatItem(item), Err: err}
}

// ForEach calls fn on every item of batch in order. It stops at the first error or panic and
// returns it as an *ItemError naming the item; a panic becomes an error, not a crash.
func ForEach[T any](batch []T, fn func(T) error) (err error) {
	i := 0
	defer func() {
		if p := recover(); p != nil {
			err = ItemErr(batch[i], PanicErr(p))
		}
	}()
	for ; i < len(batch); i++ {
		if err := fn(batch[i]); err != nil {
			return ItemErr(batch[i], err)
		}
	}
	return nil
}
