package dataflow

import (
	"context"

	"github.com/prometheus/client_golang/prometheus"
)

// MetricsHook is how a connector reports what only it knows, from the context the engine
// passes it. Its methods are safe to call from any goroutine, at any time. The source_lag
// series are cleared when a run and each of its restarts begin, so the connectors of every
// attempt report afresh and a partition that is gone leaves no stale series; what is reported
// after the run ended stays until the next run begins.
type MetricsHook interface {
	// SourceLag records how far behind its input a partition of the step is, as
	// epochflow_source_lag{step, partition}: the messages waiting or in flight for a queue,
	// the bytes of WAL the server holds beyond the confirmed position for Postgres. Report 0
	// once drained. The step is the one whose context this hook came from (none: the call
	// does nothing).
	SourceLag(partition string, lag float64)
	// Registerer is where the connector registers metrics of its own (name them
	// epochflow_<connector>_*). Build is called again on every worker and at every restart,
	// so register once: on a prometheus.AlreadyRegisteredError, use its ExistingCollector.
	Registerer() prometheus.Registerer
}

type metricsKey struct{}

type stepKey struct{}

// Metrics returns the metrics hook of the run, from the context the engine passes to a
// connector (Parts, Build, Next, Write, Commit, and what derives from them, such as the
// context of a goroutine Build starts). From any other context, or when the run has no
// Options.Monitor, it returns a hook that records nothing. Programs built on Main always have
// a Monitor, with or without -metrics-addr (which only serves it).
//
// A queue source, for example, reports its backlog after each read:
//
//	hook := dataflow.Metrics(ctx) // in Build
//	...
//	hook.SourceLag(part, float64(inFlight+waiting))
func Metrics(ctx context.Context) MetricsHook {
	m, _ := ctx.Value(metricsKey{}).(*Monitor)
	if m == nil {
		return noMetrics{}
	}
	step, _ := ctx.Value(stepKey{}).(string)
	return stepMetrics{m: m, step: step}
}

// stepMetrics is the hook of one step of a monitored run.
type stepMetrics struct {
	m    *Monitor
	step string
}

func (h stepMetrics) SourceLag(partition string, lag float64) {
	if h.step != "" {
		h.m.lag.WithLabelValues(h.step, partition).Set(lag)
	}
}

func (h stepMetrics) Registerer() prometheus.Registerer { return h.m.reg }

// noMetrics is the hook of a run without metrics.
type noMetrics struct{}

func (noMetrics) SourceLag(string, float64) {}

func (noMetrics) Registerer() prometheus.Registerer { return discardRegisterer{} }

// discardRegisterer accepts every collector and serves none.
type discardRegisterer struct{}

func (discardRegisterer) Register(prometheus.Collector) error  { return nil }
func (discardRegisterer) MustRegister(...prometheus.Collector) {}
func (discardRegisterer) Unregister(prometheus.Collector) bool { return true }
