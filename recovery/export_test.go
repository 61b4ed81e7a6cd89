package recovery

import "fmt"

// What the contract test (storetest_test.go, package recovery_test, which cannot be in
// package recovery: storetest imports it) needs of the SQLite store's insides.

// Row is a snapshot entry as the store keeps it (convertible to storetest.Entry).
type Row = row

// errFatal is the failure that panicFataler raises.
type errFatal struct{ msg string }

// panicFataler turns rows's and compactAll's test failures into a panic that catch recovers.
type panicFataler struct{}

func (panicFataler) Helper()           {}
func (panicFataler) Fatal(args ...any) { panic(errFatal{fmt.Sprint(args...)}) }

// catch recovers a panicFataler's failure into *err.
func catch(err *error) {
	if r := recover(); r != nil {
		f, ok := r.(errFatal)
		if !ok {
			panic(r)
		}
		*err = fmt.Errorf("%s", f.msg)
	}
}

// StoreRows returns every snapshot entry s keeps, in (step, key, epoch) order.
func StoreRows(s Store) (out []Row, err error) {
	defer catch(&err)
	return rows(panicFataler{}, s.(*SQLiteStore)), nil
}

// CompactAll merges every step's runs of s into one, collecting up to the horizon.
func CompactAll(s Store) (err error) {
	defer catch(&err)
	compactAll(panicFataler{}, s.(*SQLiteStore))
	return nil
}

// SetChunkTarget sets the size at which the run writer closes a chunk (runs of one chunk, or of
// a chunk per entry or two), and returns the one it replaced.
func SetChunkTarget(n int) int {
	old := chunkTarget
	chunkTarget = n
	return old
}
