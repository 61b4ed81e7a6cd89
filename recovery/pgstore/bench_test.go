package pgstore

import (
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/epochflow/epochflow/internal/pgtest"
	"github.com/epochflow/epochflow/recovery"
)

// The benchmarks run each case against this store and the SQLite store, in the same run, so
// that their numbers compare (the ratio is the point: the machine's speed is not). PostgreSQL
// runs in a cluster of its own with fsync on (the tests' cluster has it off), as the SQLite
// store syncs its WAL at every commit: both measure durable commits.

// syncedPG is the benchmarks' cluster, started at the first benchmark that needs it.
var syncedPG struct {
	once sync.Once
	c    *pgtest.Cluster
	dsn  string
	err  error
	n    int
}

// benchStores are the stores the benchmarks compare: each opens a new, empty store (for a
// given backup window) and returns the function that reopens it.
var benchStores = []struct {
	name string
	new  func(b *testing.B) func(backup time.Duration) (recovery.Store, error)
}{
	{"sqlite", func(b *testing.B) func(time.Duration) (recovery.Store, error) {
		dir := b.TempDir()
		return func(backup time.Duration) (recovery.Store, error) {
			return recovery.OpenSQLite(context.Background(), dir, recovery.SQLiteOptions{BackupInterval: backup})
		}
	}},
	{"postgres", func(b *testing.B) func(time.Duration) (recovery.Store, error) {
		syncedPG.once.Do(func() {
			syncedPG.c, syncedPG.err = pgtest.StartWith("fsync=on\nfull_page_writes=on\nsynchronous_commit=on")
			if syncedPG.err == nil {
				syncedPG.dsn, syncedPG.err = syncedPG.c.CreateDB(context.Background(), "bench")
			}
		})
		if syncedPG.err != nil {
			b.Fatal(syncedPG.err)
		}
		syncedPG.n++
		schema := fmt.Sprintf("bench_%d", syncedPG.n)
		return func(backup time.Duration) (recovery.Store, error) {
			return Open(context.Background(), syncedPG.dsn, Options{Schema: schema, BackupInterval: backup})
		}
	}},
}

// stopBenchCluster stops the benchmarks' cluster, if one was started (TestMain's cleanup).
func stopBenchCluster() {
	if syncedPG.c != nil {
		syncedPG.c.Stop()
	}
}

// cpuTime returns the CPU time this process has used (user and system): the store's share of
// the work, without the server's.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// fill commits n keys of step "s" with 16-byte states into s, perCommit at a time.
func fill(b *testing.B, s recovery.Store, n, perCommit int) {
	b.Helper()
	ctx := context.Background()
	r, err := s.Begin(ctx, recovery.Execution{Flow: "bench", Steps: []string{"s"}, Workers: 1})
	if err != nil {
		b.Fatal(err)
	}
	epoch := r.Committed
	for i := 0; i < n; i += perCommit {
		epoch++
		snaps := make([]recovery.Snapshot, 0, perCommit)
		for k := i; k < min(n, i+perCommit); k++ {
			snaps = append(snaps, recovery.Snapshot{Step: "s", Key: fmt.Sprintf("key-%08d", k), Epoch: epoch, State: []byte("0123456789abcdef")})
		}
		if err := s.Commit(ctx, recovery.Epoch{Epoch: epoch, Frontiers: []uint64{epoch}, Snapshots: snaps}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkLoad measures a resume of 1,000,000 keys with 16-byte states (committed 50,000 at
// a time, outside the timing): Open, Begin, StepIDs and a verified Load of every key, as
// recovery's BenchmarkLoad1M does for the SQLite store.
func BenchmarkLoad(b *testing.B) {
	const n = 1_000_000
	for _, st := range benchStores {
		b.Run("store="+st.name, func(b *testing.B) {
			ctx := context.Background()
			open := st.new(b)
			s, err := open(0)
			if err != nil {
				b.Fatal(err)
			}
			start := time.Now()
			fill(b, s, n, 50_000)
			s.Close()
			b.Logf("filled %d keys in %v", n, time.Since(start))
			b.ResetTimer()
			cpu0 := cpuTime()
			for b.Loop() {
				s, err := open(0)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := s.Begin(ctx, recovery.Execution{Flow: "bench", Steps: []string{"s"}, Workers: 1}); err != nil {
					b.Fatal(err)
				}
				ids, err := s.StepIDs(ctx)
				if err != nil || len(ids) != 1 {
					b.Fatalf("StepIDs() = %q, %v", ids, err)
				}
				count := 0
				if err := s.Load(ctx, ids[0], func(string, uint64, []byte) error { count++; return nil }); err != nil {
					b.Fatal(err)
				}
				if count != n {
					b.Fatalf("loaded %d keys, want %d", count, n)
				}
				s.Close()
			}
			b.StopTimer()
			b.ReportMetric((cpuTime()-cpu0).Seconds()/float64(b.N), "cpu-s/op")
		})
	}
}

// BenchmarkCommit measures commits into a step of 1,000,000 keys (8-byte states): of every
// key each epoch (changed=1000000), of a tenth of them, or of 1,000 (keys given in no order,
// as the engine hands them), as recovery's BenchmarkCommit1M does for the SQLite store. It
// reports the p50 and p99 latency per commit (the snapshots are built outside the measured
// time), the snapshots written per second, and this process's CPU time per commit (the
// store's encoding and sorting; PostgreSQL's work is the server's).
func BenchmarkCommit(b *testing.B) {
	const n = 1_000_000
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("key-%07d", i)
	}
	rand.New(rand.NewPCG(1, 2)).Shuffle(n, func(i, j int) { keys[i], keys[j] = keys[j], keys[i] })
	snapsOf := func(epoch uint64, from, count int) []recovery.Snapshot {
		snaps := make([]recovery.Snapshot, count)
		for i := range snaps {
			k := (from + i) % n
			snaps[i] = recovery.Snapshot{Step: "count", Key: keys[k], Epoch: epoch,
				State: binary.LittleEndian.AppendUint64(make([]byte, 0, 8), epoch*uint64(n)+uint64(k))}
		}
		return snaps
	}
	for _, changed := range []int{1_000_000, 100_000, 1_000} {
		for _, st := range benchStores {
			b.Run(fmt.Sprintf("changed=%d/store=%s", changed, st.name), func(b *testing.B) {
				ctx := context.Background()
				s, err := st.new(b)(0)
				if err != nil {
					b.Fatal(err)
				}
				defer s.Close()
				if _, err := s.Begin(ctx, recovery.Execution{Flow: "bench", Steps: []string{"count"}, Workers: 1}); err != nil {
					b.Fatal(err)
				}
				if err := s.Commit(ctx, recovery.Epoch{Epoch: 1, Frontiers: []uint64{1}, Snapshots: snapsOf(1, 0, n)}); err != nil {
					b.Fatal(err)
				}
				epoch := uint64(1)
				var lat []time.Duration
				var total, cpu time.Duration
				for b.Loop() {
					b.StopTimer()
					epoch++
					snaps := snapsOf(epoch, int(epoch)*changed%n, changed)
					b.StartTimer()
					t0, c0 := time.Now(), cpuTime()
					if err := s.Commit(ctx, recovery.Epoch{Epoch: epoch, Frontiers: []uint64{epoch}, Snapshots: snaps}); err != nil {
						b.Fatal(err)
					}
					d := time.Since(t0)
					cpu += cpuTime() - c0
					lat = append(lat, d)
					total += d
				}
				slices.Sort(lat)
				b.ReportMetric(float64(changed)*float64(len(lat))/total.Seconds(), "snapshots/s")
				b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
				b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
				b.ReportMetric(cpu.Seconds()*1000/float64(len(lat)), "cpu-ms/commit")
			})
		}
	}
}
