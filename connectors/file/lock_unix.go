//go:build unix

package file

import (
	"errors"
	"os"
	"syscall"
)

// flock takes an exclusive, non-blocking flock on f, as the recovery store does on its
// directory: the kernel releases it when f is closed or the process ends, however it ends.
// It returns errWouldBlock when another open file description holds the lock.
func flock(f *os.File) error {
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		switch {
		case err == nil:
			return nil
		case errors.Is(err, syscall.EINTR):
			continue
		case errors.Is(err, syscall.EWOULDBLOCK):
			return errWouldBlock
		default:
			return err
		}
	}
}

// funlock releases the flock of f (f stays open).
func funlock(f *os.File) error { return syscall.Flock(int(f.Fd()), syscall.LOCK_UN) }
