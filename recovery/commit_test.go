package recovery

import (
	"cmp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"pgregory.net/rapid"
)

// sortSnapshots orders each step's snapshots as a plain sort by (key, epoch) does, whatever
// the keys (long shared prefixes, keys that are prefixes of others, zero bytes), and refuses
// a (step, key, epoch) twice.
func TestSortSnapshots(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		prefix := rapid.SampledFrom([]string{"", "k", "a-much-longer-shared-prefix/"}).Draw(t, "prefix")
		key := rapid.Custom(func(t *rapid.T) string {
			return prefix + string(rapid.SliceOfN(rapid.SampledFrom([]byte{0, 1, 'a', 'b', 0xff}), 0, 12).Draw(t, "suffix"))
		})
		n := rapid.IntRange(1, 200).Draw(t, "n")
		var snaps []Snapshot
		seen := map[string]bool{}
		for range n {
			sn := Snapshot{Step: rapid.SampledFrom([]string{"a", "b"}).Draw(t, "step"), Key: key.Draw(t, "key"),
				Epoch: rapid.Uint64Range(1, 4).Draw(t, "epoch"), Deleted: rapid.Bool().Draw(t, "dead")}
			id := sn.Step + "\xff" + sn.Key + "\xff" + string(rune(sn.Epoch))
			if seen[id] {
				continue
			}
			seen[id] = true
			snaps = append(snaps, sn)
		}
		got, err := sortSnapshots(slices.Clone(snaps))
		if err != nil {
			t.Fatal(err)
		}
		want := slices.Clone(snaps)
		slices.SortStableFunc(want, func(a, b Snapshot) int {
			return cmp.Or(strings.Compare(a.Step, b.Step), strings.Compare(a.Key, b.Key), cmp.Compare(a.Epoch, b.Epoch))
		})
		i := 0
		for _, se := range got {
			for j := range se.entries.len() {
				e := se.entries.item(j)
				w := want[i]
				if se.step != w.Step || e.Key != w.Key || e.Epoch != w.Epoch || e.Dead != w.Deleted {
					t.Fatalf("entry %d: %q %q %d, want %q %q %d", i, se.step, e.Key, e.Epoch, w.Step, w.Key, w.Epoch)
				}
				i++
			}
		}
		if i != len(want) {
			t.Fatalf("%d entries, want %d", i, len(want))
		}
		dup := append(slices.Clone(snaps), snaps[rapid.IntRange(0, len(snaps)-1).Draw(t, "dup")])
		if _, err := sortSnapshots(dup); err == nil || !strings.Contains(err.Error(), "appears twice") {
			t.Fatalf("a snapshot twice: %v", err)
		}
	})
}

// BenchmarkSortSnapshots measures the sort of a commit of 1,000,000 snapshots of one step,
// handed over in no order.
func BenchmarkSortSnapshots(b *testing.B) {
	_, fill := commitKeys(1_000_000)
	snaps := make([]Snapshot, 1_000_000)
	fill(snaps, 1)
	cpu0 := cpuTime()
	for b.Loop() {
		if _, err := sortSnapshots(snaps); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64((cpuTime()-cpu0).Milliseconds())/float64(b.N), "cpu-ms/op")
}

// cpuTime returns the CPU time this process has used (user and system), for benchmarks on a
// busy machine, where it varies less than the time.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
