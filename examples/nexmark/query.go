package main

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/epochflow/epochflow/dataflow"
	"github.com/epochflow/epochflow/operators"
)

// Query is one Nexmark query: its epochflow flow and its plain Go baseline.
type Query struct {
	// Name is the query's name: q0, q1, ...
	Name string
	// About says in a few words what the query computes.
	About string
	// flow adds the query's steps after the events and returns its rows.
	flow func(in dataflow.Stream[Event], c Config) rows
	// plain runs the baseline over c's stream and counts its rows; with collect it also
	// returns them, formatted.
	plain func(c Config, collect bool) (count int64, formatted []string)
	// deterministic turns formatted rows into the part of them that does not depend on how
	// the run went (all of them but for q12, whose windows are of processing time).
	deterministic func([]string) []string
}

// rows is a query's output stream, whatever its row type.
type rows interface {
	// count writes the rows to a sink that only counts them, in m.
	count(m *Meter)
	// collect writes the rows, formatted, to sink, in a step named name.
	collect(name string, sink dataflow.Sink[string])
}

// typedRows is the output stream of a query with rows of type R.
type typedRows[R any] struct {
	s      dataflow.Stream[R]
	format func(R) string
}

func (r typedRows[R]) count(m *Meter) {
	operators.Output("write", r.s, dataflow.ToDynamic[R](countSink[R]{m}))
}

func (r typedRows[R]) collect(name string, sink dataflow.Sink[string]) {
	operators.Output(name, operators.Map(name+".format", r.s, r.format), sink)
}

// Meter counts what a run of a query did: the events its source generated and the rows its
// sink got, from the first partition opened to the last sink closed.
type Meter struct {
	// Events is how many events the source generated.
	Events atomic.Int64
	// Rows is how many rows the query wrote.
	Rows atomic.Int64
	// Done, if set, is called when the last worker's sink closes, at the end of the run.
	Done func(m *Meter, elapsed time.Duration)

	once  sync.Once
	start time.Time
	open  atomic.Int32
}

// begin marks the start of the run, the first time it is called.
func (m *Meter) begin() {
	if m != nil {
		m.once.Do(func() { m.start = time.Now() })
	}
}

// countSink counts the rows written to it, on every worker.
type countSink[R any] struct{ m *Meter }

// Build opens the sink on a worker.
func (s countSink[R]) Build(context.Context, dataflow.Worker) (dataflow.WorkerSink[R], error) {
	s.m.begin()
	s.m.open.Add(1)
	return s, nil
}

// Write counts the batch.
func (s countSink[R]) Write(_ context.Context, batch []R) error {
	s.m.Rows.Add(int64(len(batch)))
	return nil
}

// Close calls the meter's Done if it is the last worker's sink to close.
func (s countSink[R]) Close() error {
	if s.m.open.Add(-1) == 0 && s.m.Done != nil {
		s.m.Done(s.m, time.Since(s.m.start))
	}
	return nil
}

// baseline is a query's plain Go implementation: add is given every event of the stream in
// order, one goroutine, then end once; both emit the rows they make.
type baseline[R any] interface {
	add(e Event, emit func(R))
	end(emit func(R))
}

// define makes a Query of a flow, a baseline and the formatting of their rows.
func define[R any](name, about string, flow func(dataflow.Stream[Event], Config) dataflow.Stream[R],
	newBaseline func(Config) baseline[R], format func(R) string) Query {
	return Query{
		Name:  name,
		About: about,
		flow: func(in dataflow.Stream[Event], c Config) rows {
			return typedRows[R]{s: flow(in, c), format: format}
		},
		plain: func(c Config, collect bool) (int64, []string) {
			c = c.withDefaults()
			g := NewGenerator(c)
			b := newBaseline(c)
			var n int64
			var out []string
			emit := func(R) { n++ }
			if collect {
				emit = func(r R) { n++; out = append(out, format(r)) }
			}
			for i := range c.Events {
				b.add(g.Event(i), emit)
			}
			b.end(emit)
			return n, out
		},
		deterministic: func(s []string) []string { return s },
	}
}

// withDeterministic returns q with the function that picks the deterministic part of its rows.
func (q Query) withDeterministic(fn func([]string) []string) Query {
	q.deterministic = fn
	return q
}

// rowString formats any row with its field names.
func rowString[R any](r R) string { return fmt.Sprintf("%+v", r) }

// Build returns the flow of q over c's stream: "nexmark.read" generates the events, the
// query's steps follow, "nexmark.write" counts its rows (in m, which also counts the events;
// nil counts nowhere) and, when sink is not nil, "nexmark.rows" writes them to sink, formatted.
func (q Query) Build(c Config, m *Meter, sink *dataflow.Sink[string]) *dataflow.Flow {
	c = c.withDefaults()
	f := dataflow.New("nexmark")
	if err := c.check(); err != nil {
		f.Fail(err)
		return f
	}
	if m == nil {
		m = &Meter{}
	}
	c.meter = m
	out := q.flow(operators.Input(f, "read", Source(c)), c)
	out.count(m)
	if sink != nil {
		out.collect("rows", *sink)
	}
	return f
}

// Baseline runs q's plain Go implementation over c's stream and returns how many rows it
// made and, with collect, the rows formatted as the flow's sink gets them.
func (q Query) Baseline(c Config, collect bool) (int64, []string) { return q.plain(c, collect) }

// Queries are the queries this example implements, in order.
var Queries = []Query{q0, q1, q2, q3, q4, q5, q7, q8, q11, q12}

// queryNamed returns the query of that name.
func queryNamed(name string) (Query, bool) {
	i := slices.IndexFunc(Queries, func(q Query) bool { return q.Name == name })
	if i < 0 {
		return Query{}, false
	}
	return Queries[i], true
}
