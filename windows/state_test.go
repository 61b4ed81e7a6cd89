package windows

import (
	"encoding/json"
	"slices"
	"testing"

	"pgregory.net/rapid"
)

// The windows of a key are stored as before the first window was held inline (a struct with
// the slice Wins, as JSON), and every form of the state restores from what it stored, and from
// what the old form stored.
func TestKeyStateStoredForm(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(0, 4).Draw(t, "n")
		var ws []winState[int]
		for i := range n {
			ws = append(ws, winState[int]{ID: int64(i), Start: int64(10 * i), End: int64(10*i + 10),
				Acc: rapid.Int().Draw(t, "acc"), N: i + 1, Fired: rapid.Bool().Draw(t, "fired")})
		}
		// The old form: type keyState[A any] struct{ Wins []winState[A] }, with the default codec.
		old, err := json.Marshal(struct{ Wins []winState[int] }{ws})
		if err != nil {
			t.Fatal(err)
		}
		// Build the state by inserts, as the kernel does (out of order).
		var st keyState[int]
		for _, i := range rapid.Permutation(seq(n)).Draw(t, "order") {
			at, _ := slices.BinarySearchFunc(st.wins(), ws[i].Start, func(w winState[int], s int64) int { return cmpInt(w.Start, s) })
			st.insert(at, ws[i])
		}
		if !slices.Equal(st.wins(), ws) {
			t.Fatalf("inserted %v, got %v", ws, st.wins())
		}
		for _, codec := range []struct {
			name string
			c    interface {
				Encode(keyState[int]) ([]byte, error)
				Decode(string, []byte) (keyState[int], error)
			}
		}{{"default", codecFor(Logic[int, int, int]{})}, {"logic codec", codecFor(Logic[int, int, int]{Codec: intCodec{}})}} {
			b, err := codec.c.Encode(st)
			if err != nil {
				t.Fatal(err)
			}
			if codec.name == "default" && string(b) != string(old) {
				t.Fatalf("stored %s, the old form stored %s", b, old)
			}
			for _, data := range [][]byte{b, old} {
				if codec.name != "default" && string(data) == string(old) {
					continue
				}
				back, err := codec.c.Decode("k", data)
				if err != nil {
					t.Fatal(err)
				}
				if !slices.Equal(back.wins(), ws) {
					t.Fatalf("%s: restored %v from %s, want %v", codec.name, back.wins(), data, ws)
				}
			}
		}
		// Dropping windows from the front and the back keeps the others in order.
		keep := rapid.IntRange(0, n).Draw(t, "keep")
		w := st.wins()
		copy(w, w[n-keep:])
		st.shrink(keep)
		if !slices.Equal(st.wins(), ws[n-keep:]) {
			t.Fatalf("kept %v, want %v", st.wins(), ws[n-keep:])
		}
	})
}

func seq(n int) []int {
	s := make([]int, n)
	for i := range s {
		s[i] = i
	}
	return s
}

type intCodec struct{}

func (intCodec) Encode(v int) ([]byte, error) { return json.Marshal(v) }
func (intCodec) Decode(_ string, b []byte) (int, error) {
	var v int
	err := json.Unmarshal(b, &v)
	return v, err
}
