package engine

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"
)

// PanicError is a panic recovered in a step, turned into an error. Frame is "file:line" of the
// code that panicked: the first frame of the panicking goroutine outside the Go runtime, the
// standard library and epochflow's own packages (dataflow, operators, connectors), which is
// the user's function; when every frame is one of those, the first outside the runtime. Stack
// is the goroutine's stack at the panic, for a debug log.
type PanicError struct {
	Value any
	Frame string
	Stack []byte
}

// Error returns "panic: VALUE (at FILE:LINE)".
func (e *PanicError) Error() string {
	if e.Frame == "" {
		return fmt.Sprintf("panic: %v", e.Value)
	}
	return fmt.Sprintf("panic: %v (at %s)", e.Value, e.Frame)
}

// Unwrap returns the panic's value when it is an error.
func (e *PanicError) Unwrap() error {
	err, _ := e.Value.(error)
	return err
}

// NewPanicError records a recovered panic p. It must be called from the deferred function
// that recovered p (directly or through helpers), while the panicking frames are still on the
// stack.
func NewPanicError(p any) *PanicError {
	if pe, ok := p.(*PanicError); ok {
		return pe
	}
	pcs := make([]uintptr, 64)
	n := runtime.Callers(2, pcs)
	frames := runtime.CallersFrames(pcs[:n])
	var user, first string
	for {
		f, more := frames.Next()
		if !strings.HasPrefix(f.Function, "runtime.") && f.Function != "" {
			at := fmt.Sprintf("%s:%d", f.File, f.Line)
			if first == "" && !ownFrame(f) {
				first = at
			}
			if user == "" && !ownFrame(f) && !stdlibFrame(f.Function) {
				user = at
				break
			}
		}
		if !more {
			break
		}
	}
	if user == "" {
		user = first
	}
	return &PanicError{Value: p, Frame: user, Stack: debug.Stack()}
}

// ownPackages are the import paths of epochflow's library code: a frame in them (outside a
// test file) is not the user's.
var ownPackages = []string{
	"github.com/epochflow/epochflow/dataflow",
	"github.com/epochflow/epochflow/operators",
	"github.com/epochflow/epochflow/connectors/",
	"github.com/epochflow/epochflow/recovery",
}

func ownFrame(f runtime.Frame) bool {
	if strings.HasSuffix(f.File, "_test.go") {
		return false
	}
	for _, p := range ownPackages {
		if strings.HasPrefix(f.Function, p) {
			rest := f.Function[len(p):]
			// The package itself or one below it ("dataflow.", "dataflow/internal/..."),
			// not "dataflow_test." or "dataflowx.".
			if strings.HasSuffix(p, "/") || strings.HasPrefix(rest, ".") || strings.HasPrefix(rest, "/") {
				return true
			}
		}
	}
	return false
}

// stdlibFrame tells whether fn belongs to the standard library: its import path's first
// element has no dot (and it is not package main).
func stdlibFrame(fn string) bool {
	path := fn
	if i := strings.LastIndex(path, "/"); i >= 0 {
		if j := strings.Index(path[:i], "/"); j >= 0 {
			return !strings.Contains(path[:j], ".")
		}
		return !strings.Contains(path[:i], ".")
	}
	return !strings.HasPrefix(path, "main.")
}
