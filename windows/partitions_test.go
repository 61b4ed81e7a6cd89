package windows_test

import (
	"fmt"
	"testing"
	"time"

	"pgregory.net/rapid"
)

// TestPartitionsDriftingApartMatchOfflineModel: up to four partitions, each with disorder within
// the wait but far apart from each other in event time (up to 500 ms), read by as few as one
// worker, with crashes and resumes: the watermark is tracked per partition, so no item is late
// however the partitions share the workers, and every window's result is the offline
// computation over all events, exactly once.
func TestPartitionsDriftingApartMatchOfflineModel(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		s := drawSpec(t, false)
		nparts := rapid.IntRange(2, 4).Draw(t, "parts")
		keys := rapid.IntRange(1, 4).Draw(t, "keys")
		var parts [][]ev
		var cuts, aborts [][]int
		var all []ev
		for p := range nparts {
			events := drawEvents(t, fmt.Sprint("p", p), keys, 1000*p, s.wait+1)
			shift := rapid.Int64Range(0, 500).Draw(t, fmt.Sprint("p", p, "-shift"))
			for i := range events {
				events[i].T += shift
			}
			c, a := drawCuts(t, fmt.Sprint("p", p), len(events))
			parts, cuts, aborts = append(parts, events), append(cuts, c), append(aborts, a)
			all = append(all, events...)
		}
		got := runWindowed(t, s, parts, cuts, aborts, 1, rapid.IntRange(1, 10).Draw(t, "batch"),
			time.Duration(rapid.IntRange(1, 5).Draw(t, "interval_ms"))*time.Millisecond, nil)
		want := modelOffline(s, all)
		if d := diff(got, want); d != "" {
			t.Fatalf("output differs from the offline model (%+v):\n%s", s, d)
		}
	})
}
