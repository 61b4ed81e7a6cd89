package dataflow

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
)

type noSource struct{}

func (noSource) Build(context.Context, Worker) (WorkerSource[int], error) { return noSource{}, nil }
func (noSource) Next(context.Context) ([]int, error)                      { return nil, io.EOF }
func (noSource) Close() error                                             { return nil }

type noSink struct{}

func (noSink) Build(context.Context, Worker) (WorkerSink[KV[int]], error) { return noSink{}, nil }
func (noSink) Write(context.Context, []KV[int]) error                     { return nil }
func (noSink) Close() error                                               { return nil }

func smallFlow() *Flow {
	f := New("small")
	in := Input(f, "in", FromDynamic[int](noSource{}))
	kv := Transform("key", in, func(b []int) ([]KV[int], error) { return nil, nil })
	st := Stateful("state", kv, StatefulLogic[int, int, int]{
		OnItem: func(string, *int, bool, int, *Emitter[int]) (bool, error) { return true, nil }})
	Output("out", st, ToDynamic[KV[int]](noSink{}))
	return f
}

func TestMainFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		code int
		out  string // in stdout
		err  string // in stderr
	}{
		{args: nil, code: 0},
		{args: []string{"-workers", "3", "-epoch-interval", "5ms"}, code: 0},
		{args: []string{"-graph"}, code: 0, out: `s1 -- exchange --> s2`},
		{args: []string{"-workers", "0"}, code: 2, err: "-workers"},
		{args: []string{"-epoch-interval", "-1s"}, code: 2, err: "-epoch-interval"},
		{args: []string{"-backup-interval", "-1s"}, code: 2, err: "-backup-interval"},
		{args: []string{"-log-level", "loud"}, code: 2, err: "-log-level"},
		{args: []string{"-nope"}, code: 2, err: "-nope"},
		{args: []string{"-recovery", t.TempDir()}, code: 0},
		{args: []string{"-help"}, code: 0, err: "without it a crash or a stop (SIGINT, SIGTERM) loses the flow's state: " +
			"what stateful steps hold (counts, aggregates) is not written"},
		{args: []string{"-help"}, code: 0, err: "memory grows with the square of their number"},
		{args: []string{"-h"}, code: 0, err: "-epoch-interval duration"},
		{args: []string{"-workers", "2", "-help"}, code: 0, err: "-metrics-addr string"},
		{args: []string{"sample.txt"}, code: 2, err: `unexpected argument "sample.txt"`},
		{args: []string{"-workers", "2", "extra"}, code: 2, err: `unexpected argument "extra"`},
		{args: []string{"-restart-attempts", "2"}, code: 2, err: "-restart-attempts 2 needs -recovery DIR"},
		{args: []string{"-restart-attempts", "-1"}, code: 2, err: "-restart-attempts"},
		{args: []string{"-restart-backoff", "0s"}, code: 2, err: "-restart-backoff"},
		{args: []string{"-restart-attempts", "0"}, code: 0},
		{args: []string{"-recovery", t.TempDir(), "-restart-attempts", "5", "-restart-backoff", "10ms"}, code: 0,
			err: "restart_attempts=5"},
		{args: []string{"-recovery", t.TempDir()}, code: 0, err: "restart_attempts=3"},
		{args: nil, code: 0, err: "restart_attempts=0"},
		{args: []string{"-status-interval", "-1s"}, code: 2, err: "-status-interval"},
		{args: []string{"-pprof"}, code: 2, err: "-pprof needs -metrics-addr"},
		{args: []string{"-metrics-addr", "127.0.0.1:0", "-pprof"}, code: 0, err: `msg="serving metrics" addr=127.0.0.1:`},
		{args: []string{"-metrics-addr", "127.0.0.1:-5"}, code: 1, err: "-metrics-addr 127.0.0.1:-5"},
	} {
		var stdout, stderr bytes.Buffer
		fs := flag.NewFlagSet("test", flag.ContinueOnError)
		code := mainFunc(fs, c.args, &stdout, &stderr, func() (*Flow, error) { return smallFlow(), nil })
		if code != c.code || !strings.Contains(stdout.String(), c.out) || !strings.Contains(stderr.String(), c.err) {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want exit %d, %q, %q",
				c.args, code, stdout.String(), stderr.String(), c.code, c.out, c.err)
		}
		if (slices.Contains(c.args, "-help") || slices.Contains(c.args, "-h")) && strings.Contains(stderr.String(), "msg=running") {
			t.Errorf("%v: the flow ran instead of only printing the usage: %q", c.args, stderr.String())
		}
	}
}

func TestMainReportsBuildAndRunErrors(t *testing.T) {
	var stdout, stderr bytes.Buffer
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	code := mainFunc(fs, nil, &stdout, &stderr, func() (*Flow, error) {
		f := New("bad")
		Input(f, "in", FromDynamic[int](noSource{}))
		Input(f, "in", FromDynamic[int](noSource{}))
		return f, nil
	})
	if code != 1 || !strings.Contains(stderr.String(), `"bad.in" is used twice`) {
		t.Errorf("exit %d, stderr %q", code, stderr.String())
	}
}

// A malformed EPOCHFLOW_* variable stops the program with an error that names it, unless the
// flag it stands for is given (the flag wins); a well-formed one is used.
func TestMainEnvironment(t *testing.T) {
	for _, c := range []struct {
		name, value string
		args        []string
		code        int
		err         string
	}{
		{name: "EPOCHFLOW_WORKERS", value: "two", code: 2, err: `invalid value "two" for EPOCHFLOW_WORKERS (flag -workers)`},
		{name: "EPOCHFLOW_WORKERS", value: "two", args: []string{"-workers", "2"}, code: 0},
		{name: "EPOCHFLOW_WORKERS", value: "0", code: 2, err: "-workers"},
		{name: "EPOCHFLOW_WORKERS", value: " 3 ", code: 0},
		{name: "EPOCHFLOW_EPOCH_INTERVAL", value: "5", code: 2, err: `invalid value "5" for EPOCHFLOW_EPOCH_INTERVAL (flag -epoch-interval)`},
		{name: "EPOCHFLOW_EPOCH_INTERVAL", value: "5ms", code: 0},
		{name: "EPOCHFLOW_BACKUP_INTERVAL", value: "soon", code: 2, err: "EPOCHFLOW_BACKUP_INTERVAL"},
		{name: "EPOCHFLOW_LOG_LEVEL", value: "loud", code: 2, err: "-log-level"},
		{name: "EPOCHFLOW_RESTART_ATTEMPTS", value: "many", code: 2, err: `invalid value "many" for EPOCHFLOW_RESTART_ATTEMPTS (flag -restart-attempts)`},
		{name: "EPOCHFLOW_RESTART_ATTEMPTS", value: "2", code: 2, err: "-restart-attempts 2 needs -recovery DIR"},
		{name: "EPOCHFLOW_RESTART_BACKOFF", value: "soon", code: 2, err: "EPOCHFLOW_RESTART_BACKOFF"},
		{name: "EPOCHFLOW_RESTART_BACKOFF", value: "5ms", code: 0},
		{name: "EPOCHFLOW_METRICS_ADDR", value: "127.0.0.1:0", code: 0, err: `msg="serving metrics" addr=127.0.0.1:`},
		{name: "EPOCHFLOW_METRICS_ADDR", value: "nowhere:x", code: 1, err: "-metrics-addr nowhere:x"},
		{name: "EPOCHFLOW_STATUS_INTERVAL", value: "often", code: 2, err: "EPOCHFLOW_STATUS_INTERVAL"},
	} {
		t.Run(c.name+"="+c.value, func(t *testing.T) {
			t.Setenv(c.name, c.value)
			var stdout, stderr bytes.Buffer
			fs := flag.NewFlagSet("test", flag.ContinueOnError)
			code := mainFunc(fs, c.args, &stdout, &stderr, func() (*Flow, error) { return smallFlow(), nil })
			if code != c.code || !strings.Contains(stderr.String(), c.err) {
				t.Errorf("%v: exit %d, stderr %q; want exit %d, %q", c.args, code, stderr.String(), c.code, c.err)
			}
		})
	}
}

// Every run ends with a closing line that says how it ended and what it read and wrote.
func TestMainClosingLine(t *testing.T) {
	for _, c := range []struct {
		args  []string
		build func() (*Flow, error)
		code  int
		want  string
	}{
		{nil, func() (*Flow, error) { return smallFlow(), nil }, 0,
			`level=INFO msg="finished: every source ended`},
		{[]string{"-recovery", t.TempDir()}, func() (*Flow, error) { return smallFlow(), nil }, 0,
			"committed_epoch=1"},
		{nil, func() (*Flow, error) { return nil, errors.New("no such table") }, 1,
			`level=ERROR msg="failed before the flow started: nothing was read or written" error="no such table"`},
		{nil, func() (*Flow, error) {
			f := New("fails")
			in := Input(f, "in", FromDynamic[int](noSource{}))
			Output("out", in, ToDynamic[int](badSink{}))
			return f, nil
		}, 1, `level=ERROR msg="failed without a recovery store`},
	} {
		var stdout, stderr bytes.Buffer
		fs := flag.NewFlagSet("test", flag.ContinueOnError)
		code := mainFunc(fs, c.args, &stdout, &stderr, c.build)
		if code != c.code || !strings.Contains(stderr.String(), c.want) || !strings.Contains(stderr.String(), "items_read=") {
			t.Errorf("%v: exit %d, stderr %q; want exit %d and %q", c.args, code, stderr.String(), c.code, c.want)
		}
	}
}

type badSink struct{}

func (badSink) Build(context.Context, Worker) (WorkerSink[int], error) {
	return nil, errors.New("cannot connect")
}

// A worker count far above the cores is warned about at start; one within 4 per core is not.
func TestMainWarnsAboutTooManyWorkers(t *testing.T) {
	for _, c := range []struct {
		workers int
		warn    bool
	}{{4 * runtime.NumCPU(), false}, {4*runtime.NumCPU() + 1, true}} {
		var stdout, stderr bytes.Buffer
		fs := flag.NewFlagSet("test", flag.ContinueOnError)
		code := mainFunc(fs, []string{"-workers", strconv.Itoa(c.workers)}, &stdout, &stderr,
			func() (*Flow, error) { return smallFlow(), nil })
		warned := strings.Contains(stderr.String(), fmt.Sprintf("level=WARN msg=\"-workers %d is more than 4 times the %d cores", c.workers, runtime.NumCPU()))
		if code != 0 || warned != c.warn {
			t.Errorf("-workers %d: exit %d, warned %v (want %v); stderr %q", c.workers, code, warned, c.warn, stderr.String())
		}
	}
}

// oneBatch is a dynamic source that yields 1, 2, 3 on worker 0, then ends.
type oneBatch struct{ done bool }

func (oneBatch) Build(_ context.Context, w Worker) (WorkerSource[int], error) {
	return &oneBatch{done: w.Index != 0}, nil
}

func (s *oneBatch) Next(context.Context) ([]int, error) {
	if s.done {
		return nil, io.EOF
	}
	s.done = true
	return []int{1, 2, 3}, nil
}

func (*oneBatch) Close() error { return nil }

// failOnce is a sink whose first Write fails, as one whose server restarted would.
type failOnce struct{ failed *atomic.Bool }

func (s failOnce) Build(context.Context, Worker) (WorkerSink[int], error) { return s, nil }
func (s failOnce) Write(context.Context, []int) error {
	if s.failed.CompareAndSwap(false, true) {
		return errors.New("server closed the connection")
	}
	return nil
}
func (failOnce) Close() error { return nil }

// With -recovery, a flow whose sink fails once is restarted by the program (logged at warn
// level with the error, the attempt and the wait) and exits 0; the closing line counts the
// restart. -restart-attempts 0 turns that off.
func TestMainRestartsAFailedFlow(t *testing.T) {
	for _, c := range []struct {
		args []string
		code int
		want []string
	}{
		{[]string{"-restart-backoff", "5ms"}, 0, []string{
			`level=WARN msg="the flow failed; restarting it from the last committed epoch" flow=retry error="flow \"retry\": step \"retry.out\" (worker 0): server closed the connection" restart=1 attempt=1 of=3 wait=5ms`,
			`msg="finished: every source ended`, "restarts=1"}},
		{[]string{"-restart-attempts", "0"}, 1, []string{`level=ERROR msg="failed: what was written`, "restarts=0",
			"server closed the connection"}},
	} {
		var stdout, stderr bytes.Buffer
		fs := flag.NewFlagSet("test", flag.ContinueOnError)
		var failed atomic.Bool
		args := append([]string{"-recovery", t.TempDir()}, c.args...)
		code := mainFunc(fs, args, &stdout, &stderr, func() (*Flow, error) {
			f := New("retry")
			in := Input(f, "in", FromDynamic[int](oneBatch{}))
			Output("out", in, ToDynamic[int](failOnce{&failed}))
			return f, nil
		})
		if code != c.code {
			t.Errorf("%v: exit %d, want %d; stderr %q", c.args, code, c.code, stderr.String())
		}
		for _, w := range c.want {
			if !strings.Contains(stderr.String(), w) {
				t.Errorf("%v: stderr lacks %q:\n%s", c.args, w, stderr.String())
			}
		}
	}
}

// A run on a recovery store whose sources have nothing after the position it resumes from
// says so in its closing line, instead of the plain "finished".
func TestMainClosingLineOnAnEndedStore(t *testing.T) {
	dir := t.TempDir()
	for i, want := range []string{
		`msg="finished: every source ended`,
		`msg="finished with nothing to read: every source ended at once, with nothing after the position the recovery store resumed from`,
	} {
		var stdout, stderr bytes.Buffer
		fs := flag.NewFlagSet("test", flag.ContinueOnError)
		code := mainFunc(fs, []string{"-recovery", dir}, &stdout, &stderr, func() (*Flow, error) { return smallFlow(), nil })
		if code != 0 || !strings.Contains(stderr.String(), want) {
			t.Errorf("run %d: exit %d, stderr %q; want 0 and %q", i+1, code, stderr.String(), want)
		}
		if i == 1 && !strings.Contains(stderr.String(), "resumed_after_epoch=1") {
			t.Errorf("run 2 does not say which epoch it resumed after: %q", stderr.String())
		}
	}
}
