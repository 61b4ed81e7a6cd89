package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/epochflow/epochflow/recovery"
	"github.com/epochflow/epochflow/recovery/pgstore"
)

// inspected is what inspect needs of a store: the contract, and Verify.
type inspected interface {
	recovery.Store
	Verify(ctx context.Context) error
}

// openInspected opens the store at path read-only: a PostgreSQL store for a postgres:// or
// postgresql:// URL (as -recovery takes it), else the SQLite store of a directory or of the
// store file in one. It returns the store, the name that the report gives it (a URL without
// its password) and its layout's schema version.
func openInspected(ctx context.Context, path string) (inspected, string, int, error) {
	if strings.HasPrefix(path, "postgres://") || strings.HasPrefix(path, "postgresql://") {
		s, err := pgstore.Open(ctx, path, pgstore.Options{ReadOnly: true})
		if err != nil {
			return nil, "", 0, err
		}
		return s, s.Name(), pgstore.SchemaVersion, nil
	}
	dir := path
	fi, err := os.Stat(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil, "", 0, fmt.Errorf("%s does not exist", path)
	case err != nil:
		return nil, "", 0, err
	case !fi.IsDir():
		if filepath.Base(path) != recovery.FileName {
			return nil, "", 0, fmt.Errorf("%s is a file, not a recovery directory or a %s file", path, recovery.FileName)
		}
		dir = filepath.Dir(path)
	}
	s, err := recovery.OpenSQLite(ctx, dir, recovery.SQLiteOptions{ReadOnly: true})
	if err != nil {
		return nil, "", 0, err
	}
	return s, s.Path(), recovery.SchemaVersion, nil
}
