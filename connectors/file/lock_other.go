//go:build !unix

package file

import "os"

// flock does nothing where there is no flock: two writers of one file are not detected there.
func flock(*os.File) error { return nil }

func funlock(*os.File) error { return nil }

// fileID is empty where the file's identity is not known: a start marker then names its file
// by path only.
func fileID(string, os.FileInfo) string { return "" }
