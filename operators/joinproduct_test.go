package operators_test

import (
	"fmt"
	"slices"
	"testing"

	"github.com/epochflow/epochflow/operators"
)

// TestJoinProduct: the rows of a product, last side fastest, a side without values giving a
// missing entry, each row with slices of its own.
func TestJoinProduct(t *testing.T) {
	show := func(rows []operators.JoinRow[int]) []string {
		var out []string
		for _, r := range rows {
			out = append(out, fmt.Sprint(r.Values, r.Present))
		}
		return out
	}
	for _, tc := range []struct {
		lists [][]int
		want  []string
	}{
		{[][]int{{1, 2}, {3}, {4, 5}}, []string{
			"[1 3 4] [true true true]", "[1 3 5] [true true true]", "[2 3 4] [true true true]", "[2 3 5] [true true true]"}},
		{[][]int{{1}, nil, {4, 5}}, []string{"[1 0 4] [true false true]", "[1 0 5] [true false true]"}},
		{[][]int{nil, nil}, []string{"[0 0] [false false]"}},
	} {
		rows := operators.JoinProduct(tc.lists)
		if got := show(rows); !slices.Equal(got, tc.want) {
			t.Errorf("JoinProduct(%v) = %q, want %q", tc.lists, got, tc.want)
		}
		for i, r := range rows {
			// A row's slices end where it does: appending to one never writes into another.
			if cap(r.Values) != len(tc.lists) || cap(r.Present) != len(tc.lists) {
				t.Errorf("row %d of %v: capacities %d and %d, want %d", i, tc.lists, cap(r.Values), cap(r.Present), len(tc.lists))
			}
		}
	}
}
