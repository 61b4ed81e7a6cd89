package recovery

import (
	"context"
	"encoding/binary"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/epochflow/epochflow/internal/storecheck"
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
// OpenSQLite, Begin, StepIDs and Load, which verifies what it reads (the store is filled
// once, outside the timing). It also logs how long Steps, which inspection uses, and SQLite's
// quick check of the whole file take on that store.
func BenchmarkLoad1M(b *testing.B) {
	const n = 1_000_000
	dir := b.TempDir()
	start := time.Now()
	fill(b, dir, n, 50_000)
	b.Logf("filled %d keys in %v", n, time.Since(start))
	ctx := context.Background()
	b.ResetTimer()
	cpu0 := cpuTime()
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
	b.ReportMetric((cpuTime()-cpu0).Seconds()/float64(b.N), "cpu-s/op")
	s := open(b, dir, SQLiteOptions{ReadOnly: true})
	start = time.Now()
	if _, err := s.Steps(ctx); err != nil {
		b.Fatal(err)
	}
	b.Logf("Steps: %v", time.Since(start))
	// What SQLite's quick check of the whole file, which every read-write open runs (and
	// the timed resumes above include), costs on that store.
	start = time.Now()
	if err := quickCheck(ctx, s.db, s.path, ""); err != nil {
		b.Fatal(err)
	}
	b.Logf("quick check of the whole file: %v", time.Since(start))
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
					// With a backup window, compaction keeps every snapshot.
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

// BenchmarkVerification measures what the store's verification costs the resume of
// BenchmarkResume1MKeys (dataflow), on a store of the same shape (1,000,000 keys of one step,
// or EPOCHFLOW_BENCH_RESUME_KEYS; varint states, one commit): OpenSQLite, Begin, StepIDs and
// a Load of every key, with verification on (SQLite's quick check of the whole file at open,
// and Load's checks of every chunk's checksum and of the runs' totals against step_sums) and
// off (storecheck). Each iteration runs both, in alternating order, so that a change of the
// machine's load affects both alike. It reports seconds per resume with and without, their
// difference, and the difference in percent of the unverified resume. (dataflow's
// BenchmarkResume1MKeysVerification does the same with the whole resume of a flow.)
func BenchmarkVerification(b *testing.B) {
	n := benchResumeKeys(b)
	dir := b.TempDir()
	ctx := context.Background()
	s, err := OpenSQLite(ctx, dir, SQLiteOptions{})
	if err != nil {
		b.Fatal(err)
	}
	if _, err := s.Begin(ctx, Execution{Flow: "resume", Steps: []string{"resume.state"}, Workers: 1}); err != nil {
		b.Fatal(err)
	}
	snaps := make([]Snapshot, n)
	for i := range snaps {
		snaps[i] = Snapshot{Step: "resume.state", Key: fmt.Sprintf("key-%07d", i), Epoch: 1, State: binary.AppendVarint(nil, int64(i))}
	}
	if err := s.Commit(ctx, Epoch{Epoch: 1, Frontiers: []uint64{1}, Snapshots: snaps}); err != nil {
		b.Fatal(err)
	}
	s.Close()
	resume := func(verify bool) time.Duration {
		defer storecheck.Set(verify)()
		start := time.Now()
		s, err := OpenSQLite(ctx, dir, SQLiteOptions{})
		if err != nil {
			b.Fatal(err)
		}
		defer s.Close()
		if _, err := s.Begin(ctx, Execution{Flow: "resume", Steps: []string{"resume.state"}, Workers: 1}); err != nil {
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
		return time.Since(start)
	}
	var on, off time.Duration
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		if i%2 == 0 {
			on += resume(true)
			off += resume(false)
		} else {
			off += resume(false)
			on += resume(true)
		}
	}
	b.ReportMetric(on.Seconds()/float64(b.N), "s/verified")
	b.ReportMetric(off.Seconds()/float64(b.N), "s/unverified")
	b.ReportMetric((on-off).Seconds()/float64(b.N), "s/verification")
	b.ReportMetric(100*(on-off).Seconds()/off.Seconds(), "%verification")
}

// benchResumeKeys is the number of keys of BenchmarkVerification's store:
// EPOCHFLOW_BENCH_RESUME_KEYS, 1,000,000 by default (a smaller number checks that the
// benchmark runs).
func benchResumeKeys(b *testing.B) int {
	b.Helper()
	v := os.Getenv("EPOCHFLOW_BENCH_RESUME_KEYS")
	if v == "" {
		return 1_000_000
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		b.Fatalf("EPOCHFLOW_BENCH_RESUME_KEYS=%q: want a number of keys, at least 1", v)
	}
	return n
}

// commitKeys returns n keys in a shuffled order (the engine hands its snapshots unsorted)
// and a function that fills snaps with a snapshot of each for epoch, an 8-byte state.
func commitKeys(n int) ([]string, func(snaps []Snapshot, epoch uint64)) {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("key-%07d", i)
	}
	rand.New(rand.NewPCG(1, 2)).Shuffle(n, func(i, j int) { keys[i], keys[j] = keys[j], keys[i] })
	fill := func(snaps []Snapshot, epoch uint64) {
		for i := range snaps {
			st := binary.LittleEndian.AppendUint64(make([]byte, 0, 8), epoch*uint64(n)+uint64(i))
			snaps[i] = Snapshot{Step: "count", Key: keys[i%n], Epoch: epoch, State: st}
		}
	}
	return keys, fill
}

// BenchmarkCommit1M measures commits of many keys into a step of 1,000,000: every key each
// epoch (changed=1000000, the wordcount over a million words), or a tenth of them. It reports
// the snapshots written per second of Commit, the p50 and p99 commit latency (the snapshots
// are built outside the measured time) and the CPU time per commit (of the process, the Go
// garbage collector's included: on a busy machine it varies less than the latency).
func BenchmarkCommit1M(b *testing.B) {
	for _, changed := range []int{1_000_000, 100_000} {
		b.Run(fmt.Sprintf("changed=%d", changed), func(b *testing.B) {
			const n = 1_000_000
			ctx := context.Background()
			s, err := OpenSQLite(ctx, b.TempDir(), SQLiteOptions{})
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			if _, err := s.Begin(ctx, Execution{Flow: "bench", Steps: []string{"count"}, Workers: 1}); err != nil {
				b.Fatal(err)
			}
			_, fill := commitKeys(n)
			all := make([]Snapshot, n)
			fill(all, 1)
			if err := s.Commit(ctx, Epoch{Epoch: 1, Frontiers: []uint64{1}, Snapshots: all}); err != nil {
				b.Fatal(err)
			}
			epoch := uint64(1)
			var lat []time.Duration
			var total, cpu time.Duration
			snaps := make([]Snapshot, changed)
			for b.Loop() {
				epoch++
				fill(all, epoch)
				off := int(epoch) * changed % n
				for i := range snaps {
					snaps[i] = all[(off+i)%n]
				}
				t0, c0 := time.Now(), cpuTime()
				if err := s.Commit(ctx, Epoch{Epoch: epoch, Frontiers: []uint64{epoch}, Snapshots: snaps}); err != nil {
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

// sizeResult is what storeSize measured.
type sizeResult struct {
	file, wal    int64   // bytes of the store's file and its -wal file after the last commit
	live, window int64   // bytes (keys and states) of the live state and of the backups kept
	peak         int64   // the largest file + wal seen after a commit
	ratio        float64 // (file + wal) / (live + window)
}

// storeSize commits epochs epochs, each updating all keys keys of one step with an 8-byte
// state, one second apart, with a backup window of windowEpochs seconds, and measures the
// store's size against the live state plus what the backup window keeps. With checkpoint,
// it first copies the -wal file into the database and truncates it (SQLite does so on its
// own once the -wal file holds 4 MiB): the file then holds the whole store.
func storeSize(tb testing.TB, keys, epochs, windowEpochs int, checkpoint bool) sizeResult {
	tb.Helper()
	ctx := context.Background()
	dir := tb.TempDir()
	clk := newClock()
	s, err := OpenSQLite(ctx, dir, SQLiteOptions{BackupInterval: time.Duration(windowEpochs) * time.Second, Now: clk.Now})
	if err != nil {
		tb.Fatal(err)
	}
	defer s.Close()
	if _, err := s.Begin(ctx, Execution{Flow: "size", Steps: []string{"count"}, Workers: 1}); err != nil {
		tb.Fatal(err)
	}
	names, fill := commitKeys(keys)
	var keyBytes int64
	for _, k := range names {
		keyBytes += int64(len(k))
	}
	perEpoch := keyBytes + 8*int64(keys) // every epoch writes every key with 8 bytes of state
	snaps := make([]Snapshot, keys)
	var r sizeResult
	size := func(name string) int64 {
		fi, err := os.Stat(filepath.Join(dir, name))
		if err != nil {
			return 0
		}
		return fi.Size()
	}
	for e := 1; e <= epochs; e++ {
		clk.Advance(time.Second)
		fill(snaps, uint64(e))
		if err := s.Commit(ctx, Epoch{Epoch: uint64(e), Frontiers: []uint64{uint64(e)}, Snapshots: snaps}); err != nil {
			tb.Fatal(err)
		}
		r.peak = max(r.peak, size(FileName)+size(FileName+"-wal"))
	}
	if checkpoint {
		if _, err := s.db.ExecContext(ctx, `PRAGMA wal_checkpoint(TRUNCATE)`); err != nil {
			tb.Fatal(err)
		}
	}
	r.file, r.wal = size(FileName), size(FileName+"-wal")
	// Epoch e was committed at second e, the last at second epochs: the horizon is the
	// newest epoch committed windowEpochs seconds before or earlier. The backups kept are
	// the epochs after it but the last, and the horizon's own (the newest at or before it).
	horizon := max(epochs-windowEpochs, 0)
	backups := epochs - horizon - 1
	if horizon > 0 && backups < epochs-1 {
		backups++
	}
	backups = min(backups, epochs-1)
	r.live, r.window = perEpoch, int64(backups)*perEpoch
	r.ratio = float64(r.file+r.wal) / float64(r.live+r.window)
	return r
}

// sizeKeys is the number of keys of BenchmarkStoreSize (the criterion: 1,000,000).
var sizeKeys = flag.Int("size-keys", 1_000_000, "keys of BenchmarkStoreSize")

// BenchmarkStoreSize measures the store's size after 100 committed epochs of updates to all
// of -size-keys keys (1,000,000), without a backup window and with one of 5 epochs, against
// the size of the live state plus the backups the window keeps. As TestStoreSize does, it
// measures the file after a checkpoint of the -wal file into it (which SQLite otherwise does
// once the -wal file holds 4 MiB, or a commit's pages): store-ratio is (file + wal) / (live +
// window) then, and the benchmark fails if it is more than 3 (the bound). peak-MiB is
// the largest file + wal seen after a commit, before any checkpoint. One iteration is the
// whole run (use -benchtime 1x; -size-keys 5000 for a quick check).
func BenchmarkStoreSize(b *testing.B) {
	for _, window := range []int{0, 5} {
		b.Run(fmt.Sprintf("keys=%d/epochs=100/window=%d", *sizeKeys, window), func(b *testing.B) {
			var r sizeResult
			for b.Loop() {
				r = storeSize(b, *sizeKeys, 100, window, true)
			}
			mb := func(n int64) float64 { return float64(n) / (1 << 20) }
			b.ReportMetric(r.ratio, "store-ratio")
			b.ReportMetric(mb(r.file), "file-MiB")
			b.ReportMetric(mb(r.wal), "wal-MiB")
			b.ReportMetric(mb(r.peak), "peak-MiB")
			b.ReportMetric(mb(r.live), "live-MiB")
			b.ReportMetric(mb(r.window), "window-MiB")
			if r.ratio > 3 {
				b.Errorf("window %d: the store has %d bytes (file %d, wal %d), %.2f times the live state (%d) plus the window's backups (%d): more than 3",
					window, r.file+r.wal, r.file, r.wal, r.ratio, r.live, r.window)
			}
		})
	}
}
