package dataflow

import (
	"bytes"
	"context"
	"flag"
	"io"
	"strings"
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
	} {
		var stdout, stderr bytes.Buffer
		fs := flag.NewFlagSet("test", flag.ContinueOnError)
		code := mainFunc(fs, c.args, &stdout, &stderr, func() (*Flow, error) { return smallFlow(), nil })
		if code != c.code || !strings.Contains(stdout.String(), c.out) || !strings.Contains(stderr.String(), c.err) {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want exit %d, %q, %q",
				c.args, code, stdout.String(), stderr.String(), c.code, c.out, c.err)
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
