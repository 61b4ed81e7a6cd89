package recovery

import (
	"context"
	"fmt"
	"testing"
	"time"
)

func TestPlan(t *testing.T) {
	many := make([]int64, maxRuns+2)
	many[0] = 1 << 40
	for i := 1; i < len(many); i++ {
		many[i] = 1 << (2 * (len(many) - i)) // each run 4 times its newer neighbour: no merge by size
	}
	cases := []struct {
		sizes []int64
		want  int
	}{
		{nil, 0},
		{[]int64{10}, 1},
		{[]int64{10, 10}, 0},        // the others weigh as much as the base: merge all
		{[]int64{10, 3, 7}, 0},      // together too
		{[]int64{100, 40, 10}, 3},   // a newer run a quarter of the one before: keep both
		{[]int64{100, 39, 20}, 1},   // more than half of it: merge them
		{[]int64{100, 30, 8, 5}, 2}, // 8 < 2*5: merge; 30 >= 2*13: stop
		{[]int64{100, 20, 8, 5}, 1}, // 20 < 2*13: merge on
		{[]int64{100, 90, 1}, 3},    // 91 < 100: no full merge
		{many, 1},                   // too many runs: all but the base
		{many[:maxRuns], len(many[:maxRuns])},
	}
	for _, c := range cases {
		if got := plan(c.sizes); got != c.want {
			t.Errorf("plan(%v) = %d, want %d", c.sizes, got, c.want)
		}
	}
}

// Commits keep the store proportional to what garbage collection must keep: commits of every
// key, of a small part of them, and with a backup window, never leave a step more than about
// twice the entries it must keep (plus one commit's), nor more than maxRuns runs.
func TestCompactionBoundsStore(t *testing.T) {
	const keys = 1000
	defer func(n int) { chunkTarget = n }(chunkTarget)
	chunkTarget = 4 << 10 // runs of several chunks
	cases := []struct {
		name    string
		changed int // keys per commit
		window  int // in commits (one a second)
	}{
		{"every key", keys, 0},
		{"a hundredth", keys / 100, 0},
		{"a tenth, tombstones", keys / 10, 0},
		{"every key, window", keys, 3},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ctx := context.Background()
			clk := newClock()
			s := open(t, t.TempDir(), SQLiteOptions{BackupInterval: time.Duration(c.window) * time.Second, Now: clk.Now})
			begin(t, s, "f", 1)
			var all []Snapshot
			for k := range keys {
				all = append(all, snap("s", fmt.Sprintf("k%05d", k), 1, "first"))
			}
			commit(t, s, 1, 1, all...)
			for e := uint64(2); e <= 40; e++ {
				clk.Advance(time.Second)
				var snaps []Snapshot
				for i := range c.changed {
					k := (int(e)*c.changed + i) % keys
					if c.name == "a tenth, tombstones" && i%2 == 0 {
						snaps = append(snaps, tomb("s", fmt.Sprintf("k%05d", k), e))
					} else {
						snaps = append(snaps, snap("s", fmt.Sprintf("k%05d", k), e, fmt.Sprint("state ", e)))
					}
				}
				commit(t, s, 1, e, snaps...)
				entries := len(rows(t, s))
				// Must keep: a snapshot per key (at most), and the window's backups.
				kept := keys * (1 + min(c.window, int(e)-1))
				if c.window > 0 {
					kept = keys * min(c.window+1, int(e))
				}
				if bound := 2*kept + c.changed; entries > bound {
					t.Fatalf("after commit %d: %d entries, more than %d (twice the %d to keep, and a commit's)", e, entries, bound, kept)
				}
				runs, err := readRuns(ctx, s.db, "s")
				if err != nil {
					t.Fatal(err)
				}
				if len(runs) > maxRuns {
					t.Fatalf("after commit %d: %d runs", e, len(runs))
				}
			}
			if err := s.Verify(ctx); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// The store (its file, after a checkpoint of the -wal file) stays within three times the
// live state plus the backups the window keeps, over commits of every key
// (BenchmarkStoreSize measures the million keys and a hundred epochs, counting the
// -wal file as it is, which SQLite lets grow to 4 MiB, or to a commit's size, before a
// checkpoint).
func TestStoreSize(t *testing.T) {
	for _, window := range []int{0, 3} {
		r := storeSize(t, 5_000, 20, window, true)
		t.Logf("window %d: file %d, wal %d, live %d, window %d bytes", window, r.file, r.wal, r.live, r.window)
		if r.file > 3*(r.live+r.window) {
			t.Errorf("window %d: the file has %d bytes, more than 3 times the live state (%d) plus the window's backups (%d)", window, r.file, r.live, r.window)
		}
	}
}
