package windows_test

import (
	"context"
	"testing"
	"time"

	"github.com/epochflow/epochflow/connectors/flowtest"
	"github.com/epochflow/epochflow/dataflow"
	"github.com/epochflow/epochflow/operators"
	"github.com/epochflow/epochflow/windows"
)

// TestSystemClock: with a system-time clock each item is stamped when the windowed step sees
// it, so nothing is late, every item is counted once, and each result's window holds the time
// the run took place in.
func TestSystemClock(t *testing.T) {
	for _, workers := range []int{1, 3} {
		var items []ev
		for i := range 200 {
			items = append(items, e(string(rune('a'+i%5)), 0, i))
		}
		f := dataflow.New("t")
		in := operators.Input(f, "in", flowtest.NewSource(7, []flowtest.Event[ev]{
			flowtest.Items(items[:100]...), flowtest.Pause[ev](5 * time.Millisecond), flowtest.Items(items[100:]...)}).Input())
		keyed := operators.KeyOn("key", in, func(x ev) string { return x.Key })
		out := windows.Count("count", keyed, dataflow.SystemClock[ev](), windows.Tumbling(time.Millisecond, time.Time{}))
		rs, ls := flowtest.NewSink[windows.Result[int]](), flowtest.NewSink[windows.Late[ev]]()
		operators.Output("results", out.Results, rs.Output())
		operators.Output("late", out.Late, ls.Output())
		start := time.Now()
		if err := dataflow.Run(context.Background(), f, dataflow.Options{Workers: workers, EpochInterval: time.Millisecond, Logger: quiet}); err != nil {
			t.Fatal(err)
		}
		end := time.Now()
		total := 0
		for _, r := range rs.Items() {
			total += r.Value
			if r.Update || r.Window.End.Before(start) || r.Window.Start.After(end) {
				t.Errorf("result %+v: an update, or a window outside the run [%v, %v]", r, start, end)
			}
		}
		if total != len(items) || len(ls.Items()) != 0 {
			t.Errorf("workers=%d: counted %d of %d items, %d late", workers, total, len(items), len(ls.Items()))
		}
	}
}
