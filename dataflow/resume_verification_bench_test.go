package dataflow_test

import (
	"context"
	"testing"
	"time"

	"github.com/epochflow/epochflow/dataflow"
	"github.com/epochflow/epochflow/internal/storecheck"
	"github.com/epochflow/epochflow/recovery"
)

// BenchmarkResume1MKeysVerification measures what the recovery store's verification costs the
// resume of BenchmarkResume1MKeys: the same flow resumed from a store of the same shape
// (1,000,000 keys of one stateful step, or EPOCHFLOW_BENCH_KEYS), with verification on
// (SQLite's quick check of the whole file at open, Load's checks of every chunk and of the
// step's totals) and off (internal/storecheck). Each iteration runs both, in alternating order,
// so that a change of the machine's load affects both alike. It reports seconds and, where
// /proc/self/stat tells them, CPU seconds per resume with and without, and the verification's
// share of the unverified resume in percent (%verification, by time; %cpu-verification, by
// CPU time): issue 9 bounds it at 10 %.
func BenchmarkResume1MKeysVerification(b *testing.B) {
	keys := benchSize(b, "EPOCHFLOW_BENCH_KEYS", 1_000_000)
	dir := b.TempDir()
	ctx := context.Background()
	buildResumeStore(b, dir, keys, 1)

	// resume runs the flow once on the store, verified or not, and returns its time and CPU
	// time (0 where the CPU time is unknown).
	resume := func(verify bool) (time.Duration, time.Duration) {
		defer storecheck.Set(verify)()
		cpu0, _ := processCPU()
		start := time.Now()
		store, err := recovery.OpenSQLite(ctx, dir, recovery.SQLiteOptions{})
		if err != nil {
			b.Fatal(err)
		}
		err = dataflow.Run(ctx, resumeFlow(), dataflow.Options{Workers: 2, Recovery: store})
		store.Close()
		if err != nil {
			b.Fatal(err)
		}
		took := time.Since(start)
		cpu1, _ := processCPU()
		return took, cpu1 - cpu0
	}
	var on, off, cpuOn, cpuOff time.Duration
	for i := 0; b.Loop(); i++ {
		for _, verify := range []bool{i%2 == 0, i%2 != 0} {
			took, cpu := resume(verify)
			if verify {
				on, cpuOn = on+took, cpuOn+cpu
			} else {
				off, cpuOff = off+took, cpuOff+cpu
			}
		}
	}
	n := float64(b.N)
	b.ReportMetric(on.Seconds()/n, "s/verified")
	b.ReportMetric(off.Seconds()/n, "s/unverified")
	b.ReportMetric(100*(on-off).Seconds()/off.Seconds(), "%verification")
	if _, ok := processCPU(); ok && cpuOff > 0 {
		b.ReportMetric(cpuOn.Seconds()/n, "cpu-s/verified")
		b.ReportMetric(cpuOff.Seconds()/n, "cpu-s/unverified")
		b.ReportMetric(100*(cpuOn-cpuOff).Seconds()/cpuOff.Seconds(), "%cpu-verification")
	}
}
