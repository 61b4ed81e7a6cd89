package windows_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/epochflow/epochflow/connectors/flowtest"
	"github.com/epochflow/epochflow/dataflow"
	"github.com/epochflow/epochflow/operators"
	"github.com/epochflow/epochflow/windows"
)

type view struct {
	User string
	T    int64
	Page string
}

type buy struct {
	User  string
	T     int64
	Price int
}

func showPairs(r windows.Result[[]windows.Pair[view, buy]]) string {
	var rows []string
	for _, p := range r.Value {
		l, rr := "-", "-"
		if p.Left != nil {
			l = p.Left.Page
		}
		if p.Right != nil {
			rr = fmt.Sprint(p.Right.Price)
		}
		rows = append(rows, l+"/"+rr)
	}
	slices.Sort(rows)
	return fmt.Sprintf("%s [%d,%d) %v", r.Key, r.Window.Start.UnixMilli(), r.Window.End.UnixMilli(), rows)
}

// TestJoin2 joins page views and purchases (two types) per user and 10 ms tumbling window: the
// complete join gives the windows where both sides have items, the final one every window with
// nil for a missing side, the running one a window's rows so far at every item, and an item
// after its window closed goes to the late stream.
func TestJoin2(t *testing.T) {
	views := []view{{"ann", 1, "home"}, {"ann", 4, "shoe"}, {"bob", 3, "home"}, {"ann", 15, "hat"}, {"cat", 22, "home"}}
	buys := []buy{{"ann", 6, 30}, {"bob", 12, 5}, {"ann", 19, 8}}
	for _, tc := range []struct {
		mode windows.JoinMode
		want []string
	}{
		{windows.JoinComplete, []string{"ann [0,10) [home/30 shoe/30]", "ann [10,20) [hat/8]"}},
		{windows.JoinFinal, []string{"ann [0,10) [home/30 shoe/30]", "ann [10,20) [hat/8]", "bob [0,10) [home/-]", "bob [10,20) [-/5]", "cat [20,30) [home/-]"}},
		// The rows so far at every item: both inputs are read by worker 0 (one partition
		// each), the views first.
		{windows.JoinRunning, []string{"ann [0,10) [home/-]", "ann [0,10) [home/- shoe/-]", "ann [0,10) [home/30 shoe/30]",
			"ann [10,20) [hat/-]", "ann [10,20) [hat/8]", "bob [0,10) [home/-]", "bob [10,20) [-/5]", "cat [20,30) [home/-]"}},
	} {
		for _, workers := range []int{1, 2} {
			f := dataflow.New("j")
			vs := operators.KeyOn("vkey", operators.Input(f, "views", flowtest.List(views...)), func(v view) string { return v.User })
			bs := operators.KeyOn("bkey", operators.Input(f, "buys", flowtest.List(buys...)), func(b buy) string { return b.User })
			out := windows.Join2("join", vs, bs, func(v view) time.Time { return ms(v.T) }, func(b buy) time.Time { return ms(b.T) },
				time.Hour, windows.Tumbling(10*time.Millisecond, ms(0)), tc.mode)
			sink := flowtest.NewSink[string]()
			operators.Output("out", operators.Map("show", out.Results, showPairs), sink.Output())
			if err := dataflow.Run(context.Background(), f, dataflow.Options{Workers: workers, Logger: quiet}); err != nil {
				t.Fatal(err)
			}
			same(t, fmt.Sprintf("mode %d, workers=%d", tc.mode, workers), sorted(sink.Items()), tc.want)
		}
	}

	// One worker reads both inputs, a partition each: the views at 100 do not make the
	// purchase at 5 late, as the watermark follows the purchases' partition too; the purchase
	// at 6 after one at 100 of the same partition is late (and its window's rows stay as they
	// were).
	f := dataflow.New("j")
	vs := operators.KeyOn("vkey", operators.Input(f, "views", flowtest.List(view{"ann", 1, "home"}, view{"ann", 100, "shoe"})), func(v view) string { return v.User })
	bs := operators.KeyOn("bkey", operators.Input(f, "buys", flowtest.List(buy{"ann", 5, 30}, buy{"ann", 100, 7}, buy{"ann", 6, 9})), func(b buy) string { return b.User })
	out := windows.Join2("join", vs, bs, func(v view) time.Time { return ms(v.T) }, func(b buy) time.Time { return ms(b.T) },
		0, windows.Tumbling(10*time.Millisecond, ms(0)), windows.JoinFinal)
	rs, ls := flowtest.NewSink[string](), flowtest.NewSink[string]()
	operators.Output("out", operators.Map("show", out.Results, showPairs), rs.Output())
	operators.Output("late", operators.Map("show-late", out.Late, func(l windows.Late[windows.Either[view, buy]]) string {
		return fmt.Sprintf("%s [%d,%d) right=%v %d", l.Key, l.Window.Start.UnixMilli(), l.Window.End.UnixMilli(), l.Item.IsRight, l.Item.Right.Price)
	}), ls.Output())
	if err := dataflow.Run(context.Background(), f, dataflow.Options{Workers: 1, Logger: quiet}); err != nil {
		t.Fatal(err)
	}
	same(t, "late run results", sorted(rs.Items()), []string{"ann [0,10) [home/30]", "ann [100,110) [shoe/7]"})
	same(t, "late run late items", sorted(ls.Items()), []string{"ann [0,10) right=true 9"})
}
