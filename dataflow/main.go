package dataflow

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/epochflow/epochflow/recovery"
)

// Main runs flow as the program: it parses the command line (see MainFunc), runs the flow, and
// exits 0 when the flow finishes, 1 with the error on standard error when it fails.
func Main(flow *Flow) {
	MainFunc(func() (*Flow, error) { return flow, nil })
}

// MainFunc is Main for programs whose flow depends on their own flags: it adds the engine's
// flags to flag.CommandLine, parses it (so flags the program defined before are parsed too),
// then calls build and runs the flow it returns. The program takes flags only: an argument
// left after them (a file name without its flag, such as "wordcount sample.txt") is an error
// (exit 2) that names it.
//
// Engine flags, each also read from an environment variable (the flag wins):
//
//	-workers N           EPOCHFLOW_WORKERS          workers in this process (default 1)
//	-epoch-interval D    EPOCHFLOW_EPOCH_INTERVAL   how often epochs close (default 1s)
//	-recovery DIR|URL    EPOCHFLOW_RECOVERY         recovery store: a directory (created if missing)
//	                                                for SQLite, or a postgres:// URL of a PostgreSQL
//	                                                database (schema from ?schema=, default
//	                                                epochflow); without it the flow keeps no state
//	                                                across runs
//	-backup-interval D   EPOCHFLOW_BACKUP_INTERVAL  how long superseded snapshots are kept (default 0)
//	-restart-attempts N  EPOCHFLOW_RESTART_ATTEMPTS restarts in a row after failures (default 3
//	                                                with -recovery, 0 without; more than 0
//	                                                without -recovery is an error, exit 2)
//	-restart-backoff D   EPOCHFLOW_RESTART_BACKOFF  wait before the first restart, doubling up to
//	                                                1m (default 1s)
//	-log-level L         EPOCHFLOW_LOG_LEVEL        debug, info, warn or error (default info)
//	-metrics-addr ADDR   EPOCHFLOW_METRICS_ADDR     serve /metrics, /livez, /readyz and /dataflow
//	                                                over HTTP at ADDR (host:port; port 0 picks
//	                                                one, and the address is logged); off by default
//	-pprof                                          also serve /debug/pprof/ (needs -metrics-addr)
//	-status-interval D   EPOCHFLOW_STATUS_INTERVAL  how often a "progress" line is logged: items
//	                                                read and written and their rates, epochs,
//	                                                commit latency, source lag (default 30s; 0
//	                                                turns it off); when standard error is a
//	                                                terminal, a status line with the same is
//	                                                rewritten in place about once a second
//	                                                instead, below the log lines
//	-graph                                          print the flow as a Mermaid chart and exit,
//	                                                without running it (see GraphOnly)
//	-addresses A,B,...   EPOCHFLOW_ADDRESSES        run on several processes: every process's
//	                                                host:port, in process order (see ClusterOptions)
//	-process-id N        EPOCHFLOW_PROCESS_ID       this process's number in -addresses; a pod
//	                                                name such as flow-3 gives 3 (default 0)
//	-cluster-secret S    EPOCHFLOW_CLUSTER_SECRET   shared by the processes; required with more
//	                                                than one address, unless TLS is on
//	-tls-cert F, -tls-key F, -tls-ca F              mutual TLS between the processes: this
//	                     EPOCHFLOW_TLS_CERT, _KEY,  process's certificate and key, and the CA of
//	                     _CA                        all; all three or none (see ClusterTLS)
//	-peer-timeout D      EPOCHFLOW_PEER_TIMEOUT     a peer silent or gone this long stops every
//	                                                process with an error naming it (default 10s)
//
// With -addresses of several processes, only process 0 opens the -recovery store: the others
// get the state to resume from process 0 and send it their snapshots (their -recovery is
// ignored), and -restart-attempts is ignored (the processes are started again together).
//
// -help (or -h) prints the usage on standard error and exits 0. A malformed flag is an error
// (exit 2), and so is a malformed environment variable, which the error names, unless its flag
// is given.
// When the flow starts, the program logs "running" with its settings; when it ends, however it
// ends, a closing line says how (finished, stopped, failed), the items read and written, the
// last committed epoch and the restarts.
//
// Workers: each is a goroutine that runs every step on its share of the data, so more workers
// than cores add no speed. Their cost grows with the square of their number, because every
// exchange (a keyed step, Redistribute, a partitioned sink) has a channel from every worker to
// every other: wordcount (three exchanges) on a 1 KB text peaks at 7 MB of memory with 1
// worker, 15 MB with 100, 54 MB with 300 and 450 MB (and 25 s) with 1000 (peak RSS measured
// with /usr/bin/time). The program warns at start when -workers is above 4 times the cores
// (runtime.NumCPU): enough to overlap a connector's waits, and past it the channels cost more
// than they give.
//
// Restarts: with -recovery, a flow that fails while it runs (a source, a sink or the store
// cannot reach its server) is restarted in the process from its last committed epoch, after a
// wait, up to -restart-attempts times in a row (an attempt that commits an epoch resets the
// count); the output stays exactly once. Each restart is logged at warn level. An error of the
// configuration or of building the flow, and an error or a panic of a user function, are not
// retried (see RestartPolicy). -restart-attempts 0 turns restarts off.
//
// The first SIGINT or SIGTERM stops the flow gracefully, even one that arrives while the
// program is still starting (opening the store): sources stop reading, the open epoch is
// finished and committed, the last Commits are called, and the program exits 0. One that
// arrives while a failed flow waits to be restarted also stops it cleanly (exit 0): nothing
// runs then, and the next run resumes after the last committed epoch. Steps do not
// see the end of their input: with -recovery their state is in the store and the next run
// carries on from it; without -recovery it is discarded, so what a stateful step had not yet
// emitted (wordcount's counts, any aggregate that waits for the end of its input) is never
// written, and the next run starts from the beginning. The program warns when such a stop
// begins. A second signal aborts at once (exit 1); with -recovery, the next run resumes from
// the last commit.
//
// For crash tests, EPOCHFLOW_CRASH_AT=POINT:N kills the process with SIGKILL the Nth time the
// engine reaches POINT (see Options.CrashHook for the points).
func MainFunc(build func() (*Flow, error)) {
	os.Exit(mainFunc(flag.CommandLine, os.Args[1:], os.Stdout, os.Stderr, build))
}

// mainFunc is MainFunc without the process: it returns the exit code.
func mainFunc(fs *flag.FlagSet, args []string, stdout, stderr io.Writer, build func() (*Flow, error)) int {
	workers := fs.Int("workers", 1, "workers in this process (env EPOCHFLOW_WORKERS); more than the cores add no speed, "+
		"and their memory grows with the square of their number (a warning above 4 per core)")
	interval := fs.Duration("epoch-interval", DefaultEpochInterval,
		"how often each worker closes its epoch (env EPOCHFLOW_EPOCH_INTERVAL)")
	level := fs.String("log-level", "info", "log level: debug, info, warn or error (env EPOCHFLOW_LOG_LEVEL)")
	graph := fs.Bool("graph", false, "print the flow as a Mermaid chart and exit")
	recoveryDir := fs.String("recovery", "",
		"recovery store: a directory, created if missing (SQLite), or a postgres:// or postgresql:// URL of a PostgreSQL "+
			"database, its schema created if missing (?schema=NAME, default epochflow) (env EPOCHFLOW_RECOVERY); without it a crash or a stop "+
			"(SIGINT, SIGTERM) loses the flow's state: what stateful steps hold (counts, aggregates) is not written, "+
			"and the next run starts from the beginning")
	backup := fs.Duration("backup-interval", 0,
		"how long a snapshot is kept after a newer one of the same key is committed (env EPOCHFLOW_BACKUP_INTERVAL)")
	restarts := fs.Int("restart-attempts", defaultRestarts,
		"with -recovery, how many times in a row a failed flow is restarted from its last committed epoch; "+
			"0 never restarts (env EPOCHFLOW_RESTART_ATTEMPTS)")
	restartWait := fs.Duration("restart-backoff", DefaultRestartBackoff,
		"wait before the first restart of a row, doubled for each next one up to 1m (env EPOCHFLOW_RESTART_BACKOFF)")
	metricsAddr := fs.String("metrics-addr", "",
		"serve Prometheus /metrics, /livez, /readyz and the flow's graph at /dataflow over HTTP at this host:port "+
			"(port 0 picks a free one, logged); off when empty (env EPOCHFLOW_METRICS_ADDR)")
	withPprof := fs.Bool("pprof", false, "with -metrics-addr, also serve the Go profiles at /debug/pprof/")
	statusEvery := fs.Duration("status-interval", defaultStatusInterval,
		"how often a progress line (items read and written, rates, epochs, commit latency, source lag) is logged; "+
			"on a terminal a status line with the same is rewritten in place once a second instead; "+
			"0 turns both off (env EPOCHFLOW_STATUS_INTERVAL)")
	cluster := addClusterFlags(fs)
	fs.SetOutput(stderr)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0 // -help or -h: the flag set printed the usage, as asked
		}
		return 2
	}
	if fs.NArg() > 0 {
		hint := ""
		if fs.Lookup("input") != nil {
			hint = fmt.Sprintf(" (to read %s, give -input %s)", fs.Arg(0), fs.Arg(0))
		}
		fmt.Fprintf(stderr, "unexpected argument %q: the program takes flags only%s; see -help\n", fs.Arg(0), hint)
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
	if *restarts < 0 {
		fmt.Fprintf(stderr, "invalid value %d for flag -restart-attempts: want 0 or more\n", *restarts)
		return 2
	}
	if *restartWait <= 0 {
		fmt.Fprintf(stderr, "invalid value %v for flag -restart-backoff: want a positive duration such as 1s\n", *restartWait)
		return 2
	}
	if *statusEvery < 0 {
		fmt.Fprintf(stderr, "invalid value %v for flag -status-interval: want 0 (off) or a positive duration such as 30s\n", *statusEvery)
		return 2
	}
	if *withPprof && *metricsAddr == "" {
		fmt.Fprintf(stderr, "-pprof needs -metrics-addr ADDR: the profiles are served by the metrics server\n")
		return 2
	}
	set = map[string]bool{} // now with the variables
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if *recoveryDir == "" && *restarts > 0 {
		if set["restart-attempts"] {
			fmt.Fprintf(stderr, "-restart-attempts %d needs -recovery DIR: a restart without a recovery store would read "+
				"every source again from the start and write the output twice\n", *restarts)
			return 2
		}
		*restarts = 0 // the default restarts only flows with a store
	}
	clusterOpts, ok := cluster.options(stderr, *recoveryDir)
	if !ok {
		return 2
	}
	// A cluster shares fate: its processes are started again together (by hand or by
	// Kubernetes), not one by one; and only process 0 opens the recovery store.
	follower := false
	ignoredRestarts := 0 // a -restart-attempts that a cluster ignores, to say so
	if clusterOpts != nil && len(clusterOpts.Addresses) > 1 {
		if set["restart-attempts"] {
			ignoredRestarts = *restarts
		}
		*restarts = 0
		follower = clusterOpts.Process != 0
	}
	crash, err := crashFromEnv(os.Getenv("EPOCHFLOW_CRASH_AT"))
	if err != nil {
		fmt.Fprintf(stderr, "invalid EPOCHFLOW_CRASH_AT: %v\n", err)
		return 2
	}
	// Signals are caught before anything slow (building the flow, opening the store), so a
	// SIGTERM that lands while the program starts up still stops it gracefully.
	// On a terminal, the log lines go above a live status line (see liveStatus).
	logOut := stderr
	var status *statusLine
	if tty := terminal(stderr); tty != nil && *statusEvery > 0 {
		status = &statusLine{tty: tty}
		logOut = status
	}
	logger := slog.New(slog.NewTextHandler(logOut, &slog.HandlerOptions{Level: lv}))
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
			if *recoveryDir == "" {
				// The engine warns of what the stop discards when it begins.
				logger.Info("stopping: finishing the current epoch (-recovery DIR would keep the state); signal again to abort",
					"signal", s.String())
			} else {
				logger.Info("stopping: finishing and committing the current epoch; signal again to abort", "signal", s.String())
			}
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

	graphOnly.Store(*graph) // GraphOnly, for build
	flow, err := build()
	if err == nil && flow == nil {
		err = fmt.Errorf("the build function returned no flow")
	}
	if err != nil {
		fmt.Fprintf(stderr, "epochflow: %v\n", err)
		logger.Error("failed before the flow started: nothing was read or written", "error", err.Error(),
			"items_read", 0, "items_written", 0)
		return 1
	}
	if *graph {
		fmt.Fprint(stdout, flow.Mermaid())
		return 0
	}
	if ignoredRestarts > 0 {
		logger.Warn(fmt.Sprintf("-restart-attempts %d is ignored on a cluster of several processes: a failed run exits "+
			"non-zero, and the processes are started again together (by hand, a supervisor or Kubernetes)", ignoredRestarts),
			"restart_attempts", ignoredRestarts)
	}
	if cores := runtime.NumCPU(); *workers > maxWorkersPerCore*cores {
		logger.Warn(fmt.Sprintf("-workers %d is more than %d times the %d cores: workers beyond the cores add no speed, "+
			"and their cost grows with the square of their number (every exchange has a channel between every two "+
			"workers: 1000 workers take about 450 MB and 25 s for wordcount on a 1 KB text)",
			*workers, maxWorkersPerCore, cores), "workers", *workers, "cores", cores)
	}
	opts := Options{Workers: *workers, EpochInterval: *interval, Logger: logger, CrashHook: crash, Stop: stop,
		Restart: RestartPolicy{Attempts: *restarts, Backoff: *restartWait}, Monitor: NewMonitor(), Cluster: clusterOpts}
	if *metricsAddr != "" {
		srv, err := serveMonitor(*metricsAddr, opts.Monitor.Handler(flow, *withPprof))
		if err != nil {
			fmt.Fprintf(stderr, "epochflow: -metrics-addr %s: %v\n", *metricsAddr, err)
			logger.Error("failed before the flow started: nothing was read or written", "flow", flow.Name(), "error", err.Error(),
				"items_read", 0, "items_written", 0)
			return 1
		}
		defer srv.stop()
		logger.Info("serving metrics", "addr", srv.addr, "metrics", "http://"+srv.addr+"/metrics", "pprof", *withPprof)
	}
	if *recoveryDir != "" && follower {
		logger.Info("the recovery store is process 0's: this process gets the state to resume from process 0, "+
			"and sends it its snapshots", "flow", flow.Name(), "recovery", storeName(*recoveryDir))
	} else if *recoveryDir != "" {
		store, err := openStore(ctx, *recoveryDir, *backup)
		if err != nil {
			fmt.Fprintf(stderr, "epochflow: -recovery %s: %v\n", storeName(*recoveryDir), err)
			logger.Error("failed before the flow started: nothing was read or written", "flow", flow.Name(), "error", err.Error(),
				"items_read", 0, "items_written", 0)
			return 1
		}
		defer store.Close()
		opts.Recovery = store
	} else {
		logger.Info("running without a recovery store: a crash or a stop loses the flow's state and progress; use -recovery DIR to keep them", "flow", flow.Name())
	}
	logger.Info("running", "flow", flow.Name(), "workers", *workers, "epoch_interval", *interval, "recovery", storeName(*recoveryDir),
		"restart_attempts", *restarts)
	if status != nil {
		stopStatus := liveStatus(status, flow.Name(), opts.Monitor)
		defer stopStatus() // the closing line goes above the status line, which is then erased
	} else if *statusEvery > 0 {
		stopSummary := summarize(logger, flow.Name(), opts.Monitor, *statusEvery)
		defer stopSummary()
	}
	st, err := RunStats(ctx, flow, opts)
	closingLine(logger, flow.Name(), storeName(*recoveryDir), st, err)
	if err != nil {
		fmt.Fprintf(logOut, "epochflow: %v\n", err)
		return 1
	}
	return 0
}

// defaultStatusInterval is -status-interval's default.
const defaultStatusInterval = 30 * time.Second

// maxWorkersPerCore is how many workers per core -workers may have before the program warns.
const maxWorkersPerCore = 4

// stoppedBy says what stopped a run that was stopped: a signal to this process, or, in a
// cluster, to another one (the processes stop together).
func stoppedBy(st Stats) string {
	if st.stopPeer > 0 {
		return fmt.Sprintf("stopped with the cluster, as process %d was stopped by a signal", st.stopPeer-1)
	}
	return "stopped by a signal"
}

// closingLine logs how the run ended and what it wrote.
func closingLine(logger *slog.Logger, flow, recoveryDir string, st Stats, err error) {
	attrs := []any{"flow", flow, "items_read", st.Read, "items_written", st.Written, "restarts", st.Restarts}
	if recoveryDir != "" {
		attrs = append(attrs, "committed_epoch", st.Committed, "recovery", recoveryDir)
	}
	switch {
	case err == nil && !st.Stopped && st.Read == 0 && st.ResumedAfter > 0:
		logger.Info("finished with nothing to read: every source ended at once, with nothing after the position "+
			"the recovery store resumed from (an earlier run had read it up to there); nothing was written. "+
			"A new -recovery directory (with a PostgreSQL store, another ?schema=) reads the sources from the start", append(attrs, "resumed_after_epoch", st.ResumedAfter)...)
	case err == nil && !st.Stopped:
		logger.Info("finished: every source ended, and everything read was processed, written and committed", attrs...)
	case err == nil && recoveryDir != "":
		logger.Info(stoppedBy(st)+": what was written up to the last committed epoch is final; "+
			"the stateful steps' state is in the store, and a run with the same -recovery resumes after that epoch", attrs...)
	case err == nil:
		logger.Warn(stoppedBy(st)+" without a recovery store: the sinks have what was written before the stop, "+
			"and what the stateful steps held (counts, aggregates not yet emitted) was discarded, not written; "+
			"the next run starts from the beginning", attrs...)
	case errors.Is(err, context.Canceled) && recoveryDir != "":
		logger.Error("aborted by a second signal: the open epochs are not committed; what was written up to the "+
			"last committed epoch is final, and a run with the same -recovery resumes after it", attrs...)
	case errors.Is(err, context.Canceled):
		logger.Error("aborted by a second signal without a recovery store: the flow's state is lost, and the next "+
			"run starts from the beginning", attrs...)
	case recoveryDir != "" && st.Read == 0 && st.Written == 0 && (errors.Is(err, recovery.ErrDamaged) || errors.Is(err, recovery.ErrSchemaVersion) ||
		errors.Is(err, recovery.ErrNotStore) || errors.Is(err, recovery.ErrOtherFlow) || errors.Is(err, recovery.ErrInUse)):
		logger.Error("refused the recovery store: nothing was read or written, and the store was left as it was; "+
			"the error says what to do", append(attrs, "error", err.Error())...)
	case recoveryDir != "":
		logger.Error("failed: what was written up to the last committed epoch is final, what came after it is not; "+
			"a run with the same -recovery resumes after that epoch", append(attrs, "error", err.Error())...)
	default:
		logger.Error("failed without a recovery store: the sinks have what was written before the failure, "+
			"the flow's state is lost, and the next run starts from the beginning", append(attrs, "error", err.Error())...)
	}
}

// defaultRestarts is -restart-attempts' default, for runs with -recovery.
const defaultRestarts = 3

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
	{"restart-attempts", "EPOCHFLOW_RESTART_ATTEMPTS", "a whole number"},
	{"restart-backoff", "EPOCHFLOW_RESTART_BACKOFF", "a duration such as 1s"},
	{"log-level", "EPOCHFLOW_LOG_LEVEL", ""},
	{"metrics-addr", "EPOCHFLOW_METRICS_ADDR", ""},
	{"status-interval", "EPOCHFLOW_STATUS_INTERVAL", "a duration such as 30s"},
}
