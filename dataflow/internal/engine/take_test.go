package engine

import (
	"fmt"
	"slices"
	"testing"

	"github.com/epochflow/epochflow/recovery"
	"pgregory.net/rapid"
)

type Snapshot = recovery.Snapshot

// takeUpTo takes exactly the snapshots of epochs up to the epoch, each once, and leaves the
// others, each once; a pack it takes whole is passed on as it is.
func TestTakeUpTo(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		var packs []*Pack
		var all []string
		for p := range rapid.IntRange(0, 5).Draw(t, "packs") {
			pk := &Pack{}
			for i := range rapid.IntRange(1, 20).Draw(t, "n") {
				s := Snapshot{Step: fmt.Sprint("s", rapid.IntRange(0, 2).Draw(t, "step")), Key: fmt.Sprint("k", p, ".", i),
					Epoch: uint64(rapid.IntRange(1, 6).Draw(t, "epoch")), Deleted: rapid.Bool().Draw(t, "deleted")}
				if !s.Deleted {
					s.State = []byte(fmt.Sprint("state", p, i))
				}
				pk.AddSnapshot(&s)
				all = append(all, show(&s))
			}
			packs = append(packs, pk)
		}
		epoch := uint64(rapid.IntRange(0, 7).Draw(t, "epoch"))
		taken, spent, rest := takeUpTo(slices.Clone(packs), epoch)
		var got []string
		for _, p := range taken {
			for s := range p.All() {
				if s.Epoch > epoch {
					t.Fatalf("taken: %s, after epoch %d", show(s), epoch)
				}
				got = append(got, show(s))
			}
			if slices.Contains(spent, p) {
				t.Fatalf("a pack is both taken and spent")
			}
		}
		for _, p := range rest {
			for s := range p.All() {
				if s.Epoch <= epoch {
					t.Fatalf("left: %s, at or before epoch %d", show(s), epoch)
				}
				got = append(got, show(s))
			}
		}
		slices.Sort(got)
		slices.Sort(all)
		if !slices.Equal(got, all) {
			t.Fatalf("taken and left: %v, want %v", got, all)
		}
	})
}

func show(s *Snapshot) string {
	return fmt.Sprintf("%s/%s@%d:%v:%q", s.Step, s.Key, s.Epoch, s.Deleted, s.State)
}
