package dataflow

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Main runs flow as the program: it parses the command line (see MainFunc), runs the flow, and
// exits 0 when the flow finishes, 1 with the error on standard error when it fails.
func Main(flow *Flow) {
	MainFunc(func() (*Flow, error) { return flow, nil })
}

// MainFunc is Main for programs whose flow depends on their own flags: it adds the engine's
// flags to flag.CommandLine, parses it (so flags the program defined before are parsed too),
// then calls build and runs the flow it returns.
//
// Engine flags, each also read from an environment variable (the flag wins):
//
//	-workers N          EPOCHFLOW_WORKERS         workers in this process (default 1)
//	-epoch-interval D   EPOCHFLOW_EPOCH_INTERVAL  how often epochs close (default 1s)
//	-log-level L        EPOCHFLOW_LOG_LEVEL       debug, info, warn or error (default info)
//	-graph                                        print the flow as a Mermaid chart and exit
//
// SIGINT and SIGTERM stop the flow.
func MainFunc(build func() (*Flow, error)) {
	os.Exit(mainFunc(flag.CommandLine, os.Args[1:], os.Stdout, os.Stderr, build))
}

// mainFunc is MainFunc without the process: it returns the exit code.
func mainFunc(fs *flag.FlagSet, args []string, stdout, stderr io.Writer, build func() (*Flow, error)) int {
	workers := fs.Int("workers", envInt("EPOCHFLOW_WORKERS", 1), "workers in this process (env EPOCHFLOW_WORKERS)")
	interval := fs.Duration("epoch-interval", envDuration("EPOCHFLOW_EPOCH_INTERVAL", DefaultEpochInterval),
		"how often each worker closes its epoch (env EPOCHFLOW_EPOCH_INTERVAL)")
	level := fs.String("log-level", envString("EPOCHFLOW_LOG_LEVEL", "info"), "log level: debug, info, warn or error (env EPOCHFLOW_LOG_LEVEL)")
	graph := fs.Bool("graph", false, "print the flow as a Mermaid chart and exit")
	fs.SetOutput(stderr)
	if err := fs.Parse(args); err != nil {
		return 2
	}
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(*level)); err != nil {
		fmt.Fprintf(stderr, "invalid value %q for flag -log-level: want debug, info, warn or error\n", *level)
		return 2
	}
	if *workers < 1 {
		fmt.Fprintf(stderr, "invalid value %d for flag -workers: want at least 1\n", *workers)
		return 2
	}
	if *interval <= 0 {
		fmt.Fprintf(stderr, "invalid value %v for flag -epoch-interval: want a positive duration such as 500ms\n", *interval)
		return 2
	}
	flow, err := build()
	if err == nil && flow == nil {
		err = fmt.Errorf("the build function returned no flow")
	}
	if err != nil {
		fmt.Fprintf(stderr, "epochflow: %v\n", err)
		return 1
	}
	if *graph {
		fmt.Fprint(stdout, flow.Mermaid())
		return 0
	}
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: lv}))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err = Run(ctx, flow, Options{Workers: *workers, EpochInterval: *interval, Logger: logger})
	if err != nil {
		fmt.Fprintf(stderr, "epochflow: %v\n", err)
		return 1
	}
	return 0
}

func envString(name, def string) string {
	if v, ok := os.LookupEnv(name); ok {
		return v
	}
	return def
}

func envInt(name string, def int) int {
	if v, ok := os.LookupEnv(name); ok {
		n, err := strconv.Atoi(strings.TrimSpace(v))
		if err != nil {
			fmt.Fprintf(os.Stderr, "epochflow: ignoring %s=%q: not a number\n", name, v)
			return def
		}
		return n
	}
	return def
}

func envDuration(name string, def time.Duration) time.Duration {
	if v, ok := os.LookupEnv(name); ok {
		d, err := time.ParseDuration(strings.TrimSpace(v))
		if err != nil {
			fmt.Fprintf(os.Stderr, "epochflow: ignoring %s=%q: not a duration\n", name, v)
			return def
		}
		return d
	}
	return def
}
