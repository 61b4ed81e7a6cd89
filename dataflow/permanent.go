package dataflow

import "errors"

// Permanent marks err as a failure that restarting the flow cannot cure: a message the source
// would read again and reject again (a poison message with no dead-letter queue), a
// configuration the server refuses. Run's restart policy (Options.Restart) returns such a
// failure at once instead of restarting, as it does for a user function's error. nil stays
// nil. The mark is invisible in messages, and errors.Is and errors.As see through it.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &permanentError{err}
}

// IsPermanent tells whether err, or an error it wraps, was marked with Permanent.
func IsPermanent(err error) bool {
	var pe *permanentError
	return errors.As(err, &pe)
}

type permanentError struct{ err error }

func (e *permanentError) Error() string { return e.err.Error() }
func (e *permanentError) Unwrap() error { return e.err }
