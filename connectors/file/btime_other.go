//go:build unix && !linux

package file

// birthTime is not known here: a start marker names its file by device and inode.
func birthTime(string) (string, bool) { return "", false }
