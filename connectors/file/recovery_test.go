package file_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/epochflow/epochflow/connectors/file"
	"github.com/epochflow/epochflow/dataflow"
	"github.com/epochflow/epochflow/recovery"
)

// crashAt returns a crash hook that fires the nth time point is reached.
func crashAt(point string, n int) func(string) bool {
	var left atomic.Int64
	left.Store(int64(n))
	return func(p string) bool { return p == point && left.Add(-1) == 0 }
}

// TestCopyExactlyOnceAcrossCrashes copies files into one file through runs that crash at every
// point of the commit protocol and resume from a recovery store, with various numbers of
// workers: in the end the output holds every input line exactly once.
func TestCopyExactlyOnceAcrossCrashes(t *testing.T) {
	dir := t.TempDir()
	var paths, want []string
	for f := range 3 {
		var b strings.Builder
		for i := range 20000 {
			l := fmt.Sprintf("file %d line %d", f, i)
			want = append(want, l)
			b.WriteString(l + "\n")
		}
		paths = append(paths, write(t, filepath.Join(dir, fmt.Sprintf("in-%d.txt", f)), b.String()))
	}
	slices.Sort(want)
	out := filepath.Join(dir, "out.txt")
	storeDir := filepath.Join(dir, "store")

	build := func() *dataflow.Flow {
		f := dataflow.New("copy")
		lines := dataflow.Input(f, "read", file.Lines(paths...))
		slow := dataflow.Transform("slow", lines, func(b []string) ([]string, error) {
			time.Sleep(2 * time.Millisecond) // spread the input over many epochs
			return slices.Clone(b), nil
		})
		dataflow.Output("write", slow, file.WriteLines(out))
		return f
	}
	run := func(workers int, hook func(string) bool) error {
		store, err := recovery.OpenSQLite(context.Background(), storeDir, recovery.SQLiteOptions{})
		if err != nil {
			t.Fatal(err)
		}
		defer store.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		return dataflow.Run(ctx, build(), dataflow.Options{Workers: workers, EpochInterval: time.Millisecond,
			Recovery: store, CrashHook: hook, Logger: slog.New(slog.DiscardHandler)})
	}

	crashed := 0
	for i, point := range []string{"after-snapshot", "before-commit-record", "after-commit-record", "before-commit-calls", "after-snapshot"} {
		err := run(1+i%4, crashAt(point, 3+i))
		if err == nil {
			break
		}
		if !errors.Is(err, dataflow.ErrCrashed) {
			t.Fatalf("run %d: %v, want a crash", i, err)
		}
		crashed++
	}
	if crashed < 3 {
		t.Fatalf("only %d runs crashed; the test needs several", crashed)
	}
	t.Logf("%d runs crashed", crashed)
	if err := run(2, nil); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	got := strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
	slices.Sort(got)
	if !slices.Equal(got, want) {
		dups, missing := 0, 0
		seen := map[string]int{}
		for _, l := range got {
			seen[l]++
		}
		for _, l := range want {
			switch seen[l] {
			case 0:
				missing++
			case 1:
			default:
				dups++
			}
		}
		t.Fatalf("after %d crashes the output has %d lines, want %d: %d missing, %d repeated", crashed, len(got), len(want), missing, dups)
	}
}
