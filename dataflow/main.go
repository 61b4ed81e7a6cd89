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
	"sync"
	"syscall"

	"github.com/epochflow/epochflow/recovery"
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
//	-recovery DIR       EPOCHFLOW_RECOVERY        recovery store directory (created if missing);
//	                                              without it the flow keeps no state across runs
//	-backup-interval D  EPOCHFLOW_BACKUP_INTERVAL how long superseded snapshots are kept (default 0)
//	-log-level L        EPOCHFLOW_LOG_LEVEL       debug, info, warn or error (default info)
//	-graph                                        print the flow as a Mermaid chart and exit
//
// A malformed environment variable is an error (exit 2) that names it, unless its flag is given.
// When the flow starts, the program logs "running" with its settings.
//
// The first SIGINT or SIGTERM stops the flow gracefully, even one that arrives while the
// program is still starting (opening the store): sources stop reading, the open epoch is
// finished and committed, the last Commits are called, and the program exits 0. A second
// signal aborts at once (exit 1); with -recovery, the next run resumes from the last commit.
//
// For crash tests, EPOCHFLOW_CRASH_AT=POINT:N kills the process with SIGKILL the Nth time the
// engine reaches POINT (see Options.CrashHook for the points).
func MainFunc(build func() (*Flow, error)) {
	os.Exit(mainFunc(flag.CommandLine, os.Args[1:], os.Stdout, os.Stderr, build))
}

// mainFunc is MainFunc without the process: it returns the exit code.
func mainFunc(fs *flag.FlagSet, args []string, stdout, stderr io.Writer, build func() (*Flow, error)) int {
	workers := fs.Int("workers", 1, "workers in this process (env EPOCHFLOW_WORKERS)")
	interval := fs.Duration("epoch-interval", DefaultEpochInterval,
		"how often each worker closes its epoch (env EPOCHFLOW_EPOCH_INTERVAL)")
	level := fs.String("log-level", "info", "log level: debug, info, warn or error (env EPOCHFLOW_LOG_LEVEL)")
	graph := fs.Bool("graph", false, "print the flow as a Mermaid chart and exit")
	recoveryDir := fs.String("recovery", "",
		"recovery store directory, created if missing (env EPOCHFLOW_RECOVERY); without it a crash loses the flow's state")
	backup := fs.Duration("backup-interval", 0,
		"how long a snapshot is kept after a newer one of the same key is committed (env EPOCHFLOW_BACKUP_INTERVAL)")
	fs.SetOutput(stderr)
	if err := fs.Parse(args); err != nil {
		return 2
	}
	// A variable sets its flag, through the flag's own parsing, unless the command line did.
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	for _, ev := range envFlags {
		v, ok := os.LookupEnv(ev.env)
		if !ok || set[ev.flag] {
			continue
		}
		if ev.want != "" {
			v = strings.TrimSpace(v)
		}
		if err := fs.Set(ev.flag, v); err != nil {
			fmt.Fprintf(stderr, "invalid value %q for %s (flag -%s): want %s\n", v, ev.env, ev.flag, ev.want)
			return 2
		}
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
	if *backup < 0 {
		fmt.Fprintf(stderr, "invalid value %v for flag -backup-interval: want 0 or a positive duration\n", *backup)
		return 2
	}
	crash, err := crashFromEnv(os.Getenv("EPOCHFLOW_CRASH_AT"))
	if err != nil {
		fmt.Fprintf(stderr, "invalid EPOCHFLOW_CRASH_AT: %v\n", err)
		return 2
	}
	// Signals are caught before anything slow (building the flow, opening the store), so a
	// SIGTERM that lands while the program starts up still stops it gracefully.
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: lv}))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// The first signal stops gracefully, the second aborts.
	stop := make(chan struct{})
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sigs)
	watchDone := make(chan struct{})
	defer close(watchDone)
	go func() {
		select {
		case s := <-sigs:
			logger.Info("stopping: finishing and committing the current epoch; signal again to abort", "signal", s.String())
			close(stop)
		case <-watchDone:
			return
		}
		select {
		case s := <-sigs:
			logger.Warn("aborting", "signal", s.String())
			cancel()
		case <-watchDone:
		}
	}()

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
	opts := Options{Workers: *workers, EpochInterval: *interval, Logger: logger, CrashHook: crash, Stop: stop}
	if *recoveryDir != "" {
		store, err := recovery.OpenSQLite(ctx, *recoveryDir, recovery.SQLiteOptions{BackupInterval: *backup})
		if err != nil {
			fmt.Fprintf(stderr, "epochflow: -recovery %s: %v\n", *recoveryDir, err)
			return 1
		}
		defer store.Close()
		opts.Recovery = store
	} else {
		logger.Info("running without a recovery store: a crash loses the flow's state and progress; use -recovery DIR to keep them", "flow", flow.Name())
	}
	logger.Info("running", "flow", flow.Name(), "workers", *workers, "epoch_interval", *interval, "recovery", *recoveryDir)
	if err := Run(ctx, flow, opts); err != nil {
		fmt.Fprintf(stderr, "epochflow: %v\n", err)
		return 1
	}
	return 0
}

// crashFromEnv parses EPOCHFLOW_CRASH_AT (POINT:N) into a hook that kills the process with
// SIGKILL the Nth time the engine reaches POINT.
func crashFromEnv(v string) (func(string) bool, error) {
	if v == "" {
		return nil, nil
	}
	point, count, ok := strings.Cut(v, ":")
	n, err := strconv.Atoi(count)
	if !ok || err != nil || n < 1 || point == "" {
		return nil, fmt.Errorf("%q: want POINT:N, such as after-commit-record:3", v)
	}
	var mu sync.Mutex
	return func(p string) bool {
		if p != point {
			return false
		}
		mu.Lock()
		n--
		hit := n == 0
		mu.Unlock()
		if hit {
			syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {} // SIGKILL is not handled: the process ends here
		}
		return false
	}, nil
}

// envFlags are the engine flags an environment variable sets when the command line does not;
// want says what a malformed value should have been ("" for a string, which cannot be).
var envFlags = []struct{ flag, env, want string }{
	{"workers", "EPOCHFLOW_WORKERS", "a whole number"},
	{"epoch-interval", "EPOCHFLOW_EPOCH_INTERVAL", "a duration such as 500ms"},
	{"recovery", "EPOCHFLOW_RECOVERY", ""},
	{"backup-interval", "EPOCHFLOW_BACKUP_INTERVAL", "a duration such as 500ms"},
	{"log-level", "EPOCHFLOW_LOG_LEVEL", ""},
}
