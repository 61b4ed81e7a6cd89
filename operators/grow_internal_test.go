package operators

import "testing"

func TestGrow(t *testing.T) {
	cases := []struct {
		name                   string
		len, cap, more         int
		done, total            int
		wantMinCap, wantMaxCap int
	}{
		// Few items seen: double (or what is needed).
		{"early", 10, 10, 1, 3, 1024, 20, 20},
		{"early outlier", 0, 1024, 100000, 1, 1024, 100000, 100000},
		// Enough items: project 10 per item over 1024 items, plus an eighth.
		{"projected", 3000, 3000, 10, 300, 1024, 10240, 11600},
		// ... but at most 4 times what is needed now.
		{"projected capped", 1020, 1024, 10, 103, 1024, 4120, 4120},
		// An outlier after the first items: at most 4 times what is needed now.
		{"capped", 200, 1024, 100000, 20, 1024, 100200, 400800},
		// A projection below the current size still grows by a quarter.
		{"slow", 1024, 1024, 1, 1000, 1024, 1280, 1280},
	}
	for _, c := range cases {
		out := make([]int, c.len, c.cap)
		for i := range out {
			out[i] = i
		}
		g := grow(out, c.more, c.done, c.total)
		if len(g) != c.len || cap(g) < c.len+c.more || cap(g) < c.wantMinCap || cap(g) > c.wantMaxCap {
			t.Errorf("%s: len %d cap %d, want len %d and cap in [%d, %d]", c.name, len(g), cap(g), c.len, c.wantMinCap, c.wantMaxCap)
		}
		for i := range g {
			if g[i] != i {
				t.Fatalf("%s: item %d is %d", c.name, i, g[i])
			}
		}
	}
}
