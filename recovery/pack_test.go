package recovery

import (
	"bytes"
	"testing"

	"pgregory.net/rapid"
)

// A pack gives back every snapshot added to it, in order and as added (a nil state as an
// empty one, a tombstone without its state), and its epoch range; after Reset it is empty and
// takes new snapshots.
func TestPackRoundTrip(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		var p Pack
		for round := range 2 {
			want := rapid.SliceOfN(rapid.Custom(func(t *rapid.T) Snapshot {
				s := Snapshot{Step: rapid.SampledFrom([]string{"a", "b", "a-step"}).Draw(t, "step"),
					Key:     rapid.String().Draw(t, "key"),
					Epoch:   rapid.Uint64().Draw(t, "epoch"),
					Deleted: rapid.Bool().Draw(t, "deleted")}
				if !s.Deleted {
					s.State = rapid.SliceOfN(rapid.Byte(), 0, 300).Draw(t, "state")
				}
				return s
			}), 0, 50).Draw(t, "snapshots")
			var lo, hi uint64
			for i := range want {
				p.AddSnapshot(&want[i])
				if i == 0 {
					lo, hi = want[i].Epoch, want[i].Epoch
				}
				lo, hi = min(lo, want[i].Epoch), max(hi, want[i].Epoch)
			}
			if p.Len() != len(want) {
				t.Fatalf("round %d: Len %d, want %d", round, p.Len(), len(want))
			}
			if l, h := p.Epochs(); l != lo || h != hi {
				t.Fatalf("round %d: Epochs %d, %d, want %d, %d", round, l, h, lo, hi)
			}
			i := 0
			for s := range p.All() {
				w := want[i]
				if s.Step != w.Step || s.Key != w.Key || s.Epoch != w.Epoch || s.Deleted != w.Deleted ||
					!bytes.Equal(s.State, w.State) || (!w.Deleted && s.State == nil) || (w.Deleted && s.State != nil) {
					t.Fatalf("round %d: snapshot %d: %+v, want %+v", round, i, *s, w)
				}
				i++
			}
			if i != len(want) {
				t.Fatalf("round %d: All gave %d snapshots, want %d", round, i, len(want))
			}
			p.Reset()
		}
	})
}
