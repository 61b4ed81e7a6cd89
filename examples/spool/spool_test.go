package spool

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/epochflow/epochflow/connectors/flowtest"
	"github.com/epochflow/epochflow/dataflow"
	"github.com/epochflow/epochflow/recovery"
)

// produce drops messages first .. first+n-1 into dir as a producer must: written under a
// hidden name, then renamed to a name that sorts in order.
func produce(t *testing.T, dir string, first, n int) {
	t.Helper()
	for i := first; i < first+n; i++ {
		tmp := filepath.Join(dir, fmt.Sprintf(".tmp-%d", i))
		if err := os.WriteFile(tmp, []byte(fmt.Sprintf("message %d", i)), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(dir, fmt.Sprintf("%010d", i))); err != nil {
			t.Fatal(err)
		}
	}
}

// bodies returns the contents of the files of dir, and the names of its hidden files.
func bodies(t *testing.T, dir string) (visible []string, hidden []string) {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".") {
			hidden = append(hidden, e.Name())
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		visible = append(visible, string(b))
	}
	return visible, hidden
}

func copyFlow(in, out string, idle time.Duration) *dataflow.Flow {
	f := dataflow.New("spool-copy")
	msgs := dataflow.Input(f, "read", Read(SourceConfig{Dir: in, Poll: 10 * time.Millisecond, IdleExit: idle, MaxBatch: 7}))
	dataflow.Output("write", msgs, Write(out, func(m Message) []byte { return m.Body }))
	return f
}

// A copy that crashes at each point of the commit protocol in turn, and is resumed from its
// store after each crash, ends with every message in the output exactly once, in order, and
// the input directory empty.
func TestExactlyOnceAcrossCrashes(t *testing.T) {
	for _, point := range []string{"after-snapshot", "before-commit-record", "after-commit-record", "before-commit-calls", "inside-commit"} {
		t.Run(point, func(t *testing.T) {
			defer goleak.VerifyNone(t) // a crashed run leaves no goroutine behind
			dir := t.TempDir()
			in, out := filepath.Join(dir, "in"), filepath.Join(dir, "out")
			os.Mkdir(in, 0o755)
			os.Mkdir(out, 0o755)
			const n = 200
			produce(t, in, 0, n)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			crashes := 0
			for run := 0; ; run++ {
				if run > 20 {
					t.Fatal("no run finished in 20 attempts")
				}
				store, err := recovery.OpenSQLite(ctx, filepath.Join(dir, "store"), recovery.SQLiteOptions{})
				if err != nil {
					t.Fatal(err)
				}
				var hits atomic.Int64
				hook := func(p string) bool { return p == point && hits.Add(1) == 3 && crashes < 4 }
				err = dataflow.Run(ctx, copyFlow(in, out, 200*time.Millisecond),
					dataflow.Options{Recovery: store, EpochInterval: 5 * time.Millisecond, CrashHook: hook})
				store.Close()
				if err == nil {
					break
				}
				if !errors.Is(err, dataflow.ErrCrashed) {
					t.Fatal(err)
				}
				crashes++
			}
			if crashes == 0 {
				t.Fatalf("the hook never crashed the run at %s", point)
			}
			got, hidden := bodies(t, out)
			want := make([]string, n)
			for i := range want {
				want[i] = fmt.Sprintf("message %d", i)
			}
			if !slices.Equal(got, want) {
				t.Fatalf("after %d crashes the output holds %d messages %v, want 0..%d once each in order", crashes, len(got), got, n-1)
			}
			if len(hidden) > 0 {
				t.Errorf("pending files left in the output: %v", hidden)
			}
			if left, _ := bodies(t, in); len(left) > 0 {
				t.Errorf("%d messages left in the input after the run: %v", len(left), left)
			}
		})
	}
}

// The source reports the files in its directory as its lag: it rises while they wait, and
// falls to 0 once they are read and committed (and so deleted).
func TestSourceLag(t *testing.T) {
	defer goleak.VerifyNone(t)
	in := t.TempDir()
	produce(t, in, 0, 50)
	g := flowtest.NewGateSink[Message]()
	mon := dataflow.NewMonitor()
	stop := make(chan struct{})
	f := dataflow.New("spool-lag")
	dataflow.Output("write", dataflow.Input(f, "read", Read(SourceConfig{Dir: in, Poll: 10 * time.Millisecond})), g.Output())
	done := make(chan error, 1)
	go func() {
		done <- dataflow.Run(context.Background(), f, dataflow.Options{EpochInterval: 10 * time.Millisecond, Monitor: mon, Stop: stop})
	}()
	lag := func() float64 { l, _ := mon.SourceLag("spool-lag.read"); return l }
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s (lag %v)", what, lag())
			}
		}
	}
	waitFor("a lag of 50", func() bool { return lag() == 50 })
	produce(t, in, 50, 30)
	waitFor("the lag to rise to 80", func() bool { return lag() == 80 })
	g.Open()
	waitFor("the lag to fall to 0", func() bool { return lag() == 0 })
	close(stop)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
