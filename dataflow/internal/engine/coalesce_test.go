package engine

import (
	"fmt"
	"slices"
	"testing"

	"pgregory.net/rapid"
)

// newestOnly keeps exactly the newest snapshot of every (step, key), states and tombstones
// alike, and leaves a commit of one epoch as it is.
func TestNewestOnly(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(0, 200).Draw(t, "n")
		epochs := rapid.IntRange(1, 4).Draw(t, "epochs")
		var snaps []Snapshot
		used := map[[2]string]map[uint64]bool{}
		for range n {
			s := Snapshot{
				Step:    fmt.Sprint("s", rapid.IntRange(0, 2).Draw(t, "step")),
				Key:     fmt.Sprint("k", rapid.IntRange(0, 30).Draw(t, "key")),
				Epoch:   uint64(rapid.IntRange(1, epochs).Draw(t, "epoch")),
				Deleted: rapid.Bool().Draw(t, "deleted"),
			}
			k := [2]string{s.Step, s.Key}
			if used[k] == nil {
				used[k] = map[uint64]bool{}
			}
			if used[k][s.Epoch] {
				continue // a (step, key, epoch) is reported once
			}
			used[k][s.Epoch] = true
			s.State = []byte(fmt.Sprint(s.Step, s.Key, s.Epoch))
			snaps = append(snaps, s)
		}
		want := map[[2]string]Snapshot{}
		distinct := map[uint64]bool{}
		for _, s := range snaps {
			k := [2]string{s.Step, s.Key}
			if w, ok := want[k]; !ok || s.Epoch > w.Epoch {
				want[k] = s
			}
			distinct[s.Epoch] = true
		}
		in := slices.Clone(snaps)
		got := newestOnly(in)
		if len(distinct) <= 1 {
			if !slices.EqualFunc(got, snaps, func(a, b Snapshot) bool { return a.Key == b.Key && a.Step == b.Step && a.Epoch == b.Epoch }) {
				t.Fatalf("one epoch: got %v, want the snapshots as they were", got)
			}
			return
		}
		if len(got) != len(want) {
			t.Fatalf("%d snapshots kept, want %d", len(got), len(want))
		}
		for _, s := range got {
			w := want[[2]string{s.Step, s.Key}]
			if s.Epoch != w.Epoch || s.Deleted != w.Deleted || string(s.State) != string(w.State) {
				t.Fatalf("kept %+v, want %+v", s, w)
			}
		}
	})
}
