package recovery

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"
)

// fill creates a store in dir holding n keys of step "s" with 16-byte states, committed in
// commits of perCommit snapshots.
func fill(b testing.TB, dir string, n, perCommit int) {
	b.Helper()
	ctx := context.Background()
	s, err := OpenSQLite(ctx, dir, SQLiteOptions{})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	if _, err := s.Begin(ctx, Execution{Flow: "bench", Steps: []string{"s"}, Workers: 1}); err != nil {
		b.Fatal(err)
	}
	epoch := uint64(0)
	for i := 0; i < n; i += perCommit {
		epoch++
		snaps := make([]Snapshot, 0, perCommit)
		for k := i; k < min(n, i+perCommit); k++ {
			snaps = append(snaps, Snapshot{Step: "s", Key: fmt.Sprintf("key-%08d", k), Epoch: epoch, State: []byte("0123456789abcdef")})
		}
		if err := s.Commit(ctx, Epoch{Epoch: epoch, Frontiers: []uint64{epoch}, Snapshots: snaps}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkLoad1M measures what a resume of 1,000,000 keys with 16-byte states costs:
// OpenSQLite, Begin, StepIDs and Load (the store is filled once, outside the timing). It also
// logs how long Steps, which inspection uses, takes on that store.
func BenchmarkLoad1M(b *testing.B) {
	const n = 1_000_000
	dir := b.TempDir()
	start := time.Now()
	fill(b, dir, n, 50_000)
	b.Logf("filled %d keys in %v", n, time.Since(start))
	ctx := context.Background()
	b.ResetTimer()
	for b.Loop() {
		s, err := OpenSQLite(ctx, dir, SQLiteOptions{})
		if err != nil {
			b.Fatal(err)
		}
		if _, err := s.Begin(ctx, Execution{Flow: "bench", Steps: []string{"s"}, Workers: 1}); err != nil {
			b.Fatal(err)
		}
		ids, err := s.StepIDs(ctx)
		if err != nil || len(ids) != 1 {
			b.Fatalf("StepIDs() = %q, %v", ids, err)
		}
		count := 0
		if err := s.Load(ctx, ids[0], func(key string, epoch uint64, state []byte) error {
			count++
			return nil
		}); err != nil {
			b.Fatal(err)
		}
		if count != n {
			b.Fatalf("loaded %d keys, want %d", count, n)
		}
		s.Close()
	}
	b.StopTimer()
	s := open(b, dir, SQLiteOptions{ReadOnly: true})
	start = time.Now()
	if _, err := s.Steps(ctx); err != nil {
		b.Fatal(err)
	}
	b.Logf("Steps: %v", time.Since(start))
}

// BenchmarkCommit measures Commit of n snapshots of keys among `keys` existing ones (each
// Commit replaces older snapshots, so garbage collection has work) and reports the p50 and
// p99 latency per commit, with synchronous=FULL (the store's setting) and, to show what
// durability costs, NORMAL; and with a backup window of an hour (which the benchmark never
// reaches: every snapshot is kept).
func BenchmarkCommit(b *testing.B) {
	for _, sync := range []string{"FULL", "NORMAL"} {
		for _, n := range []int{1, 100, 10_000} {
			for _, existing := range []int{0, 100_000} {
				b.Run(fmt.Sprintf("sync=%s/snapshots=%d/keys=%d", sync, n, existing), func(b *testing.B) {
					benchmarkCommit(b, sync, n, existing, 0)
				})
				if sync == "FULL" {
					// With a backup window, garbage collection queues the keys instead.
					b.Run(fmt.Sprintf("sync=%s/snapshots=%d/keys=%d/backup=1h", sync, n, existing), func(b *testing.B) {
						benchmarkCommit(b, sync, n, existing, time.Hour)
					})
				}
			}
		}
	}
}

func benchmarkCommit(b *testing.B, sync string, n, existing int, backup time.Duration) {
	defer func(s string) { synchronous = s }(synchronous)
	synchronous = sync
	dir := b.TempDir()
	ctx := context.Background()
	if existing > 0 {
		fill(b, dir, existing, 10_000)
	}
	s, err := OpenSQLite(ctx, dir, SQLiteOptions{BackupInterval: backup})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	r, err := s.Begin(ctx, Execution{Flow: "bench", Steps: []string{"s"}, Workers: 2})
	if err != nil {
		b.Fatal(err)
	}
	epoch := r.Committed
	var lat []time.Duration
	b.ResetTimer()
	for b.Loop() {
		epoch++
		snaps := make([]Snapshot, n)
		for i := range snaps {
			k := (int(epoch)*n + i) * 7919 % max(existing, n)
			snaps[i] = Snapshot{Step: "s", Key: fmt.Sprintf("key-%08d", k), Epoch: epoch, State: []byte("0123456789abcdef")}
		}
		t0 := time.Now()
		if err := s.Commit(ctx, Epoch{Epoch: epoch, Frontiers: []uint64{epoch, epoch}, Snapshots: snaps}); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(t0))
	}
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
}
