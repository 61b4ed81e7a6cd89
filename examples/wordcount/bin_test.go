package main

import (
	"os"
	"testing"

	"github.com/epochflow/epochflow/internal/exampletest"
)

// example is this package's binary, built once per test binary.
var example = exampletest.New("wordcount")

func buildBinary(t *testing.T) string { return example.Path(t) }

func TestMain(m *testing.M) {
	code := m.Run()
	example.Remove()
	os.Exit(code)
}
