package dataflow

import (
	"log/slog"
	"time"
)

// progress is what a run has done so far, as the summary line tells it.
type progress struct {
	read, written   uint64 // items read by the sources, handed to the sinks
	open, committed uint64 // epochs
	lastCommit      time.Duration
	lag             float64 // the sum of the sources' lag, as their connectors report it
	lagKnown        bool    // some connector reports its lag
}

// progress reads the monitor's counters.
func (m *Monitor) progress() progress {
	var p progress
	f, meter := m.current()
	if meter == nil {
		return p
	}
	for i, s := range f.graph.Steps {
		for w := range meter.Workers() {
			in, out := meter.Items(i, w)
			if s.Source {
				p.read += in
			}
			if s.Outputs == 0 {
				p.written += out
			}
		}
	}
	p.open, p.committed = meter.OpenEpoch(), meter.Committed()
	p.lastCommit = time.Duration(m.lastCommit.Load())
	fams, err := m.reg.Gather()
	if err != nil {
		return p
	}
	for _, fam := range fams {
		if fam.GetName() == "epochflow_source_lag" {
			for _, g := range fam.GetMetric() {
				p.lag += g.GetGauge().GetValue()
				p.lagKnown = true
			}
		}
	}
	return p
}

// everyTick calls report every interval with the run's progress, the progress of the tick
// before and the seconds between them, until stop is called; stop returns once its goroutine
// has. It is the loop of the summary lines and of the live status line.
func everyTick(m *Monitor, interval time.Duration, report func(p, last progress, secs float64)) (stop func()) {
	done, exited := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(exited)
		t := time.NewTicker(interval)
		defer t.Stop()
		last, lastAt := m.progress(), time.Now()
		for {
			select {
			case <-done:
				return
			case now := <-t.C:
				p := m.progress()
				report(p, last, now.Sub(lastAt).Seconds())
				last, lastAt = p, now
			}
		}
	}()
	return func() {
		close(done)
		<-exited
	}
}

// summarize logs a line of the run's progress every interval (items read and written, their
// rates over the interval, the open and committed epochs, the last commit's latency, the
// sources' lag), until stop is called; stop returns once its goroutine has.
func summarize(logger *slog.Logger, flow string, m *Monitor, interval time.Duration) (stop func()) {
	return everyTick(m, interval, func(p, last progress, secs float64) {
		attrs := []any{"flow", flow, "items_read", p.read, "items_written", p.written,
			"read_per_s", int64(float64(p.read-last.read) / secs),
			"written_per_s", int64(float64(p.written-last.written) / secs),
			"epoch_open", p.open, "epoch_committed", p.committed,
			"commit_latency", p.lastCommit.Round(time.Millisecond)}
		if p.lagKnown {
			attrs = append(attrs, "source_lag", p.lag)
		}
		logger.Info("progress", attrs...)
	})
}
