package file

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestSnapshotFailure checks that a flush or fsync failure in Snapshot, which cannot return an
// error, fails the next Write, Commit and Close, and that Close does not repeat an error the
// engine has already seen.
func TestSnapshotFailure(t *testing.T) {
	path := filepath.Join(t.TempDir(), "out.txt")
	ctx := context.Background()
	for _, next := range []string{"write", "commit", "close"} {
		s, err := NewLineSink[string](path, nil).Build(ctx, path, nil)
		if err != nil {
			t.Fatal(err)
		}
		p := s.(*lineSinkPart[string])
		if err := p.Write(ctx, []string{"a"}); err != nil {
			t.Fatal(err)
		}
		p.f.Close() // the flush and fsync of the snapshot fail
		if _, err := p.Snapshot(); err == nil || !strings.Contains(err.Error(), path) {
			t.Fatalf("snapshot of a closed file: %v, want an error naming the path", err)
		}
		check := func(what string, err error) {
			t.Helper()
			if err == nil || !strings.Contains(err.Error(), path) || !errors.Is(err, os.ErrClosed) {
				t.Fatalf("%s after a failed snapshot: %v, want an error naming the path", what, err)
			}
		}
		switch next {
		case "write":
			check("Write", p.Write(ctx, []string{"b"}))
			check("Commit", p.Commit(ctx, 2))
		case "commit":
			check("Commit", p.Commit(ctx, 2))
		case "close":
			check("Close", p.Close())
			continue
		}
		if err := p.Close(); err != nil && strings.Contains(err.Error(), "snapshot") {
			t.Fatalf("Close repeated the error the engine saw: %v", err)
		}
	}
}
