// Package exampletest holds what the tests of the example binaries share: building the
// example under test once per test binary.
package exampletest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
)

// Binary is the example binary of the package whose tests run (the Go package in the test's
// working directory), built with go build the first time Path is called: a build per test took
// seconds on a loaded machine. A test binary declares one, and its TestMain calls Remove after
// the tests.
type Binary struct {
	name string
	once sync.Once
	dir  string
	path string
	err  error
}

// New returns the binary of the example named name (the file name it is built to).
func New(name string) *Binary { return &Binary{name: name} }

// Path builds the binary if it is not built yet and returns its path; a failed build fails
// t, for this test and every later one.
func (b *Binary) Path(t testing.TB) string {
	t.Helper()
	b.once.Do(func() {
		if b.dir, b.err = os.MkdirTemp("", "epochflow-"+b.name+"-bin-"); b.err != nil {
			return
		}
		b.path = filepath.Join(b.dir, b.name)
		if out, err := exec.Command("go", "build", "-o", b.path, ".").CombinedOutput(); err != nil {
			b.err = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if b.err != nil {
		t.Fatal(b.err)
	}
	return b.path
}

// Remove deletes what Path built. It is safe to call when nothing was built.
func (b *Binary) Remove() {
	if b.dir != "" {
		os.RemoveAll(b.dir)
	}
}
