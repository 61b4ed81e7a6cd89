package operators_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/epochflow/epochflow/connectors/flowtest"
	"github.com/epochflow/epochflow/dataflow"
	"github.com/epochflow/epochflow/operators"
)

func TestDeduplicate(t *testing.T) {
	id := func(s string) string { k, _, _ := strings.Cut(s, ":"); return k }
	for _, c := range []struct {
		name   string
		window time.Duration
		script []flowtest.Event[string]
		want   []string
	}{
		{"forever", 0,
			[]flowtest.Event[string]{flowtest.Items("a:1", "b:1", "a:2", ":x", ":x", "b:2", "c:1")},
			[]string{":x", ":x", "a:1", "b:1", "c:1"}},
		// The window ends during the pause: "a" is forgotten, and its next item passes.
		{"window", 20 * time.Millisecond,
			[]flowtest.Event[string]{flowtest.Items("a:1", "a:2"), flowtest.Pause[string](200 * time.Millisecond), flowtest.Items("a:3", "a:4")},
			[]string{"a:1", "a:3"}},
	} {
		for _, workers := range []int{1, 3} {
			t.Run(fmt.Sprint(c.name, "/workers=", workers), func(t *testing.T) {
				f := dataflow.New("t")
				in := operators.Input(f, "in", flowtest.NewSource(1, c.script).Input())
				sink := flowtest.NewSink[string]()
				operators.Output("out", operators.Deduplicate("dedup", in, id, c.window), sink.Output())
				if err := dataflow.Run(context.Background(), f, dataflow.Options{Workers: workers, EpochInterval: time.Millisecond}); err != nil {
					t.Fatal(err)
				}
				got := sink.Items()
				slices.Sort(got)
				if !slices.Equal(got, c.want) {
					t.Errorf("got %v, want %v", got, c.want)
				}
			})
		}
	}
	f := dataflow.New("t")
	operators.Deduplicate("dedup", operators.Input(f, "in", flowtest.List("a")), id, -time.Second)
	if f.Err() == nil {
		t.Error("a negative window was accepted")
	}
}

func ExampleDeduplicate() {
	f := dataflow.New("example")
	in := operators.Input(f, "in", flowtest.List("m1", "m2", "m1", "m3", "m2"))
	sink := flowtest.NewSink[string]()
	operators.Output("out", operators.Deduplicate("dedup", in, func(s string) string { return s }, 0), sink.Output())
	if err := dataflow.Run(context.Background(), f, dataflow.Options{}); err != nil {
		fmt.Println(err)
	}
	got := sink.Items()
	slices.Sort(got)
	fmt.Println(got)
	// Output: [m1 m2 m3]
}
