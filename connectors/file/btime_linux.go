//go:build linux

package file

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// birthTime returns the creation time of the file at path, where the file system records it.
func birthTime(path string) (string, bool) {
	var sx unix.Statx_t
	if err := unix.Statx(unix.AT_FDCWD, path, 0, unix.STATX_BTIME, &sx); err != nil || sx.Mask&unix.STATX_BTIME == 0 {
		return "", false
	}
	return fmt.Sprintf("%d.%09d", sx.Btime.Sec, sx.Btime.Nsec), true
}
