package conformance

// reporter is the part of *testing.T the checks use, so that the kit's own tests can run a
// check against a broken connector and see it fail.
type reporter interface {
	Helper()
	Errorf(format string, args ...any)
	Fatalf(format string, args ...any)
	Logf(format string, args ...any)
	TempDir() string
	Name() string
}
