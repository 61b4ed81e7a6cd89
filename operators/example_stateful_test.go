package operators_test

import (
	"context"
	"fmt"
	"time"

	"github.com/epochflow/epochflow/connectors/flowtest"
	"github.com/epochflow/epochflow/dataflow"
	"github.com/epochflow/epochflow/operators"
)

// session is the Logic of one user's session: it gathers the user's clicks and emits the
// session (its click count) after 50ms without a click, or at EOF.
// (A Logic that needs no timers can embed operators.BaseLogic instead of writing NotifyAt,
// OnNotify and OnEOF.)
type session struct {
	clicks int
	last   time.Time
}

func (s *session) OnItem(string) ([]int, bool, error) {
	s.clicks++
	s.last = time.Now()
	return nil, false, nil
}

// NotifyAt asks for OnNotify 50ms after the last click.
func (s *session) NotifyAt() time.Time { return s.last.Add(50 * time.Millisecond) }

// OnNotify closes the session: emit it and discard this Logic.
func (s *session) OnNotify(time.Time) ([]int, bool, error) { return []int{s.clicks}, true, nil }

func (s *session) OnEOF() ([]int, bool, error) { return []int{s.clicks}, true, nil }

// Snapshot is what recovery stores for the key; build gets it back as resume.
func (s *session) Snapshot() int { return s.clicks }

func ExampleStateful() {
	f := dataflow.New("example")
	click := func(user string) dataflow.KV[string] { return dataflow.KV[string]{Key: user, Value: "click"} }
	src := flowtest.NewSource(10, []flowtest.Event[dataflow.KV[string]]{
		flowtest.Items(click("ann"), click("ann")),
		flowtest.Pause[dataflow.KV[string]](200 * time.Millisecond), // ann's session times out
		flowtest.Items(click("ann")),
	})
	clicks := operators.Input(f, "read", src.Input())
	sessions := operators.Stateful("sessions", clicks, func(user string, resume *int) (operators.Logic[string, int, int], error) {
		s := &session{}
		if resume != nil {
			s.clicks = *resume
		}
		return s, nil
	})
	sink := flowtest.NewSink[dataflow.KV[int]]()
	operators.Output("write", sessions, sink.Output())
	if err := dataflow.Run(context.Background(), f, dataflow.Options{}); err != nil {
		fmt.Println(err)
	}
	fmt.Println(sink.Items())
	// Output: [{ann 2} {ann 1}]
}
