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

// A pack encoded with AppendBinary and rebuilt with UnmarshalBinary (into a fresh pack or one
// that held other snapshots) gives back the same snapshots, count and epoch range; a truncated
// or damaged encoding is an error, never a panic.
func TestPackBinaryRoundTrip(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		var p Pack
		n := rapid.IntRange(0, 40).Draw(t, "n")
		for range n {
			s := Snapshot{Step: rapid.SampledFrom([]string{"a", "b", "a-step", ""}).Draw(t, "step"),
				Key: rapid.String().Draw(t, "key"), Epoch: rapid.Uint64().Draw(t, "epoch"),
				Deleted: rapid.Bool().Draw(t, "deleted")}
			if !s.Deleted {
				s.State = rapid.SliceOfN(rapid.Byte(), 0, 200).Draw(t, "state")
			}
			p.AddSnapshot(&s)
		}
		enc, err := p.AppendBinary([]byte("prefix"))
		if err != nil {
			t.Fatal(err)
		}
		enc = enc[len("prefix"):]
		var q Pack
		if rapid.Bool().Draw(t, "dirty") {
			q.Add("other", "k", 9, []byte("v"), false)
		}
		if err := q.UnmarshalBinary(enc); err != nil {
			t.Fatalf("UnmarshalBinary: %v", err)
		}
		if q.Len() != p.Len() || q.Size() != p.Size() {
			t.Fatalf("Len, Size %d, %d, want %d, %d", q.Len(), q.Size(), p.Len(), p.Size())
		}
		l, h := q.Epochs()
		if l2, h2 := p.Epochs(); l != l2 || h != h2 {
			t.Fatalf("Epochs %d, %d, want %d, %d", l, h, l2, h2)
		}
		var want []Snapshot
		for s := range p.All() {
			want = append(want, Snapshot{Step: s.Step, Key: s.Key, Epoch: s.Epoch, State: bytes.Clone(s.State), Deleted: s.Deleted})
		}
		i := 0
		for s := range q.All() {
			w := want[i]
			if s.Step != w.Step || s.Key != w.Key || s.Epoch != w.Epoch || s.Deleted != w.Deleted || !bytes.Equal(s.State, w.State) {
				t.Fatalf("snapshot %d: %+v, want %+v", i, *s, w)
			}
			i++
		}
		// Damage: a cut or a flipped byte is refused or decodes to something well-formed.
		if len(enc) > 0 {
			cut := rapid.IntRange(0, len(enc)-1).Draw(t, "cut")
			var d Pack
			if err := d.UnmarshalBinary(enc[:cut]); err == nil {
				for range d.All() {
				}
			}
			bad := bytes.Clone(enc)
			bad[cut] ^= byte(rapid.IntRange(1, 255).Draw(t, "flip"))
			if err := d.UnmarshalBinary(bad); err == nil {
				for range d.All() {
				}
			}
		}
	})
}
