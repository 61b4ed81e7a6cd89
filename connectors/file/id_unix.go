//go:build unix

package file

import (
	"fmt"
	"os"
	"syscall"
)

// fileID names the file behind fi, at path (device, inode and, on Linux where the file system
// records it, birth time), so that a start marker written for one file is not taken for
// another file at the same path: a file created after the first one was removed often gets
// its inode number again.
func fileID(path string, fi os.FileInfo) string {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return ""
	}
	id := fmt.Sprintf("%d:%d", st.Dev, st.Ino)
	if b, ok := birthTime(path); ok {
		id += ":" + b
	}
	return id
}
