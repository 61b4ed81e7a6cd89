package dataflow

import (
	"context"
	"strings"
	"time"

	"github.com/epochflow/epochflow/recovery"
	"github.com/epochflow/epochflow/recovery/pgstore"
)

// isPostgresURL reports whether the value of -recovery is a PostgreSQL URL rather than a
// directory.
func isPostgresURL(where string) bool {
	return strings.HasPrefix(where, "postgres://") || strings.HasPrefix(where, "postgresql://")
}

// openStore opens the recovery store that -recovery names: for a postgres:// or
// postgresql:// URL, the PostgreSQL store (recovery/pgstore) in the database it names (in its
// schema parameter's schema, or pgstore.DefaultSchema); otherwise the SQLite store in the
// directory.
func openStore(ctx context.Context, where string, backup time.Duration) (recovery.Store, error) {
	if isPostgresURL(where) {
		return pgstore.Open(ctx, where, pgstore.Options{BackupInterval: backup})
	}
	return recovery.OpenSQLite(ctx, where, recovery.SQLiteOptions{BackupInterval: backup})
}

// storeName is how the program's logs and errors name the store that -recovery names: a URL
// without its password, a directory as it is.
func storeName(where string) string {
	if isPostgresURL(where) {
		return pgstore.RedactDSN(where)
	}
	return where
}
