package dataflow

import (
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/epochflow/epochflow/dataflow/internal/engine"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// Monitor holds the metrics of a run, in a Prometheus registry of its own (never the global
// default), and tells whether the run is ready. Give it to Run in Options.Monitor, and serve
// it with Handler. Main always gives one to Run (its progress and status lines read it) and
// serves it with -metrics-addr. It observes one flow at a time (the attempts of one Run,
// restarts included: their counters add up).
//
// The metrics, all named epochflow_*: items_in_total and items_out_total {step, worker},
// epoch_open, epoch_committed, commit_duration_seconds, snapshot_duration_seconds,
// snapshot_bytes, exchange_queue_depth {edge, worker}, source_lag {step, partition} (what the
// connectors report through Metrics; cleared when a run or a restart begins), late_items_total (the items windowed steps sent to their late streams),
// restarts_total, errors_total; and the Go runtime's and the process's (go_*, process_*).
type Monitor struct {
	reg *prometheus.Registry

	restarts, errs, late prometheus.Counter
	commit, snapDur      prometheus.Histogram
	snapBytes            prometheus.Histogram
	lag                  *prometheus.GaugeVec

	lastCommit atomic.Int64 // nanoseconds from the end of the last committed epoch to its commit

	mu    sync.Mutex
	flow  *Flow
	meter *engine.Meter // of flow, with its workers; nil before the first Run
}

// NewMonitor returns a Monitor with a new registry holding the epochflow metrics and the Go
// runtime and process collectors.
func NewMonitor() *Monitor {
	m := &Monitor{reg: prometheus.NewRegistry()}
	m.restarts = prometheus.NewCounter(prometheus.CounterOpts{Name: "epochflow_restarts_total",
		Help: "Restarts of the flow from its last committed epoch after a failure."})
	m.errs = prometheus.NewCounter(prometheus.CounterOpts{Name: "epochflow_errors_total",
		Help: "Failures of the flow (each failed attempt, restarted or not)."})
	m.late = prometheus.NewCounter(prometheus.CounterOpts{Name: "epochflow_late_items_total",
		Help: "Items that came after their window was gone, sent to a windowed step's late stream."})
	m.commit = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "epochflow_commit_duration_seconds",
		Help:    "Time from the end of an epoch at the sources to its commit (alignment, snapshots, store).",
		Buckets: prometheus.ExponentialBuckets(0.001, 2, 16)})
	m.snapDur = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "epochflow_snapshot_duration_seconds",
		Help:    "Time the recovery store took to record a committed epoch and its snapshots, per commit.",
		Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16)})
	m.snapBytes = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "epochflow_snapshot_bytes",
		Help:    "Bytes of state (keys and values) recorded in the recovery store, per commit.",
		Buckets: prometheus.ExponentialBuckets(64, 4, 12)})
	m.lag = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "epochflow_source_lag",
		Help: "How far behind its input a source partition is, as its connector reports it " +
			"(messages waiting or in flight for a queue, bytes of WAL for Postgres)."}, []string{"step", "partition"})
	m.reg.MustRegister(m.restarts, m.errs, m.late, m.commit, m.snapDur, m.snapBytes, m.lag,
		runCollector{m},
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// Registerer is where the program and its connectors register metrics of their own; they are
// served with the epochflow ones.
func (m *Monitor) Registerer() prometheus.Registerer { return m.reg }

// Gatherer is the registry the metrics are gathered from (for a handler of your own).
func (m *Monitor) Gatherer() prometheus.Gatherer { return m.reg }

// Ready tells whether the flow is running and has committed an epoch since it (re)started:
// false before its sources are built and its first epoch is committed, while it resumes or
// restarts after a failure, and once it has ended.
func (m *Monitor) Ready() bool {
	m.mu.Lock()
	meter := m.meter
	m.mu.Unlock()
	return meter != nil && meter.Ready()
}

// attach returns the meter for a run of f on workers workers, the one of the previous run
// when it was of the same flow and workers (a restart), so counters go on growing.
func (m *Monitor) attach(f *Flow, workers int) *engine.Meter {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.meter == nil || m.flow != f || m.meter.Workers() != workers {
		m.flow, m.meter = f, engine.NewMeter(len(f.graph.Steps), workers)
		m.meter.ObserveCommit = func(d time.Duration) {
			m.commit.Observe(d.Seconds())
			m.lastCommit.Store(int64(d))
		}
		m.meter.ObserveSnapshot = func(d time.Duration, bytes int) {
			m.snapDur.Observe(d.Seconds())
			m.snapBytes.Observe(float64(bytes))
		}
	}
	return m.meter
}

func (m *Monitor) current() (*Flow, *engine.Meter) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.flow, m.meter
}

// runCollector reads the engine's counters when Prometheus scrapes.
type runCollector struct{ m *Monitor }

var (
	descIn = prometheus.NewDesc("epochflow_items_in_total",
		"Items a step took in: read from outside by a source, received on its inputs by any other step.",
		[]string{"step", "worker"}, nil)
	descOut = prometheus.NewDesc("epochflow_items_out_total",
		"Items a step put out: handed to the outside by a sink, emitted on its outputs by any other step.",
		[]string{"step", "worker"}, nil)
	descOpen = prometheus.NewDesc("epochflow_epoch_open",
		"The newest epoch open at the sources (items read now belong to it).", nil, nil)
	descCommitted = prometheus.NewDesc("epochflow_epoch_committed",
		"The last committed epoch: everything read up to its end is processed, written and final.", nil, nil)
	descQueue = prometheus.NewDesc("epochflow_exchange_queue_depth",
		"Messages (batches and epoch markers) waiting on a channel between steps, per receiving worker; "+
			"a sender stops reading its sources while one of its channels holds more than 64.",
		[]string{"edge", "worker"}, nil)
)

func (c runCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descIn, descOut, descOpen, descCommitted, descQueue} {
		ch <- d
	}
}

func (c runCollector) Collect(ch chan<- prometheus.Metric) {
	f, meter := c.m.current()
	if meter == nil {
		ch <- prometheus.MustNewConstMetric(descOpen, prometheus.GaugeValue, 0)
		ch <- prometheus.MustNewConstMetric(descCommitted, prometheus.GaugeValue, 0)
		return
	}
	for w := range meter.Workers() {
		wl := strconv.Itoa(w)
		for i, s := range f.graph.Steps {
			in, out := meter.Items(i, w)
			ch <- prometheus.MustNewConstMetric(descIn, prometheus.CounterValue, float64(in), s.ID, wl)
			ch <- prometheus.MustNewConstMetric(descOut, prometheus.CounterValue, float64(out), s.ID, wl)
		}
	}
	ch <- prometheus.MustNewConstMetric(descOpen, prometheus.GaugeValue, float64(meter.OpenEpoch()))
	ch <- prometheus.MustNewConstMetric(descCommitted, prometheus.GaugeValue, float64(meter.Committed()))
	meter.QueueDepths(func(from, to string, worker, depth int) {
		ch <- prometheus.MustNewConstMetric(descQueue, prometheus.GaugeValue, float64(depth),
			from+" -> "+to, strconv.Itoa(worker))
	})
}

// SourceLag returns the sum over the partitions of step (its id, "flow.name", as
// Flow.StepIDs lists it) of the lag its connector last reported (see MetricsHook.SourceLag), and whether it reported any.
func (m *Monitor) SourceLag(step string) (lag float64, reported bool) {
	fams, err := m.reg.Gather()
	if err != nil {
		return 0, false
	}
	for _, fam := range fams {
		if fam.GetName() != "epochflow_source_lag" {
			continue
		}
		for _, g := range fam.GetMetric() {
			for _, l := range g.GetLabel() {
				if l.GetName() == "step" && l.GetValue() == step {
					lag += g.GetGauge().GetValue()
					reported = true
				}
			}
		}
	}
	return lag, reported
}
