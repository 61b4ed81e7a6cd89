package pgrepl

import (
	"context"
	"time"

	"github.com/epochflow/epochflow/dataflow"
)

// lagInterval is how often the source reports its lag.
const lagInterval = time.Second

// watchLag reports the partition's epochflow_source_lag every lagInterval until Close: the
// bytes of WAL between the server's current write position (pg_current_wal_lsn, read on the
// admin connection) and the LSN the source confirms (that of the last committed epoch), which
// is the WAL the slot makes the server keep for this flow. A failed query keeps the last value:
// the lag is a report, and the heartbeat and the stream report their own failures.
func (p *partition) watchLag(hook dataflow.MetricsHook, part string) {
	defer close(p.lagDone)
	t := time.NewTicker(lagInterval)
	defer t.Stop()
	for {
		select {
		case <-p.hbStop:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(p.runCtx, lagInterval)
		var cur string
		p.adminMu.Lock()
		err := p.admin.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&cur)
		p.adminMu.Unlock()
		cancel()
		if err != nil {
			if p.runCtx.Err() == nil {
				p.log.Debug("pgrepl: reading the server's WAL position for the lag failed", "slot", p.cfg.Slot, "error", err)
			}
			continue
		}
		end, err := ParseLSN(cur)
		if err != nil {
			continue
		}
		behind := 0.0
		if flushed := LSN(p.flushed.Load()); end > flushed {
			behind = float64(end - flushed)
		}
		hook.SourceLag(part, behind)
	}
}
