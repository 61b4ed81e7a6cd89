package recovery_test

import (
	"context"
	"path/filepath"
	"testing"

	"pgregory.net/rapid"

	"github.com/epochflow/epochflow/recovery"
	"github.com/epochflow/epochflow/recovery/storetest"
)

// The SQLite store keeps the contract every store does (recovery/storetest), with the random
// model over runs of every chunk size. Its own tests (sqlite_test.go) check what is SQLite's
// only: files, the directory lock, migrations, damage to the file.
func TestStoreContract(t *testing.T) {
	defer recovery.SetChunkTarget(recovery.SetChunkTarget(256 << 10))
	storetest.Run(t, storetest.Harness{
		New: func(t *testing.T) storetest.Opener {
			dir := t.TempDir()
			return func(c storetest.Config) (recovery.Store, error) {
				return recovery.OpenSQLite(context.Background(), dir, recovery.SQLiteOptions{
					BackupInterval: c.BackupInterval, Now: c.Now, ReadOnly: c.ReadOnly})
			}
		},
		// The errors name the store's file, or its directory (ErrInUse).
		Name: func(s recovery.Store) string { return filepath.Dir(s.(*recovery.SQLiteStore).Path()) },
		Entries: func(s recovery.Store) ([]storetest.Entry, error) {
			rows, err := recovery.StoreRows(s)
			out := make([]storetest.Entry, len(rows))
			for i, r := range rows {
				out[i] = storetest.Entry(r)
			}
			return out, err
		},
		Collect:   recovery.CompactAll,
		Verify:    func(ctx context.Context, s recovery.Store) error { return s.(*recovery.SQLiteStore).Verify(ctx) },
		ReadOnly:  true,
		Exclusive: true,
		// Runs of one chunk, or of a chunk per entry or two.
		Vary: func(t *rapid.T) {
			recovery.SetChunkTarget(rapid.SampledFrom([]int{1, 8, 256 << 10}).Draw(t, "chunk size"))
		},
	})
}
