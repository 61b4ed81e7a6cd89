package main

import (
	"context"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/epochflow/epochflow/dataflow"
	"github.com/epochflow/epochflow/recovery"
)

// BenchmarkNexmark is issue 12's acceptance 1 (go test ./examples/nexmark -run '^$' -bench
// Nexmark): every query over the same stream (seed 1, 10,000 events a second of event time,
// 10 s windows), as its plain Go baseline (one goroutine) and as an epochflow flow with 1 and 2
// workers, and with 2 workers and a SQLite recovery store in b.TempDir() (1 s epochs, as all
// the flows). Each reports events/s, the events of the stream over the time of a run.
//
// The events are generated during the run, in both the baseline and the flows, by the same
// generator (Generator.Event): 10,000,000 events held in memory would take gigabytes. So the
// baseline's time includes generating every event on its one goroutine, and the flows' include
// generating them in the source's partitions, one per worker. For the cheap queries (q0-q3)
// generation is most of the work.
//
// Then <query>/ratios reports, from the same run, workers=1/baseline, workers=2/workers=1 and
// recovery/workers=2 (a sub-benchmark of its own because the testing package prints no result
// of a benchmark that has sub-benchmarks). Each flow run checks that it generated every event
// and, but for q12 (processing time), wrote as many rows as the baseline.
//
// NEXMARK_BENCH_EVENTS (default 10,000,000) makes the stream smaller, to check that the
// benchmark runs: for example NEXMARK_BENCH_EVENTS=1000000 with -benchtime 1x.
func BenchmarkNexmark(b *testing.B) {
	c := Config{Events: int64(benchSize(b, "NEXMARK_BENCH_EVENTS", 10_000_000)), Seed: 1}.withDefaults()
	if d, err := time.ParseDuration(os.Getenv("NEXMARK_BENCH_DRIFT")); err == nil {
		c.MaxDrift = d
	}
	for _, q := range Queries {
		b.Run(q.Name, func(b *testing.B) {
			rates := map[string]float64{}
			want := int64(-1)
			b.Run("baseline", func(b *testing.B) {
				for b.Loop() {
					want, _ = q.Baseline(c, false)
				}
				rates["baseline"] = eventsPerSecond(b, c.Events)
			})
			flow := func(name string, workers int, withRecovery bool) {
				b.Run(name, func(b *testing.B) {
					for b.Loop() {
						opts := dataflow.Options{Workers: workers, EpochInterval: time.Second, Logger: quiet}
						if withRecovery {
							store, err := recovery.OpenSQLite(context.Background(), b.TempDir(), recovery.SQLiteOptions{})
							if err != nil {
								b.Fatal(err)
							}
							defer store.Close()
							opts.Recovery = store
						}
						m := &Meter{}
						if err := dataflow.Run(context.Background(), q.Build(c, m, nil), opts); err != nil {
							b.Fatal(err)
						}
						if m.Events.Load() != c.Events {
							b.Fatalf("generated %d events, want %d", m.Events.Load(), c.Events)
						}
						if q.Name != "q12" && want >= 0 && m.Rows.Load() != want {
							b.Fatalf("%d rows, the baseline made %d", m.Rows.Load(), want)
						}
					}
					rates[name] = eventsPerSecond(b, c.Events)
				})
			}
			flow("workers=1", 1, false)
			flow("workers=2", 2, false)
			flow("workers=2,recovery", 2, true)
			b.Run("ratios", func(b *testing.B) {
				n := 0
				ratio := func(unit, num, den string) {
					if rates[num] > 0 && rates[den] > 0 {
						b.ReportMetric(rates[num]/rates[den], unit)
						n++
					}
				}
				ratio("workers=1/baseline", "workers=1", "baseline")
				ratio("workers=2/workers=1", "workers=2", "workers=1")
				ratio("recovery/workers=2", "workers=2,recovery", "workers=2")
				if n == 0 {
					b.Skip("none of the compared cases ran")
				}
				b.ReportMetric(0, "ns/op") // nothing is timed here
			})
		})
	}
}

// benchSize returns the value of the environment variable name, a positive integer, or def if
// it is not set.
func benchSize(b *testing.B, name string, def int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		b.Fatalf("%s=%q: want a positive integer", name, v)
	}
	return n
}

func eventsPerSecond(b *testing.B, n int64) float64 {
	r := float64(n) * float64(b.N) / b.Elapsed().Seconds()
	b.ReportMetric(r, "events/s")
	return r
}
