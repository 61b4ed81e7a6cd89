package dataflow

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// helperEnv names the flow of helperFlows that the test binary runs through mainFunc, as a
// program built on Main would, instead of its tests: the tests of signals run it as a child
// process, so their signals reach a process of its own.
const helperEnv = "EPOCHFLOW_TEST_MAIN_FLOW"

// helperFlows are the flows a child test binary can run (see helperEnv).
var helperFlows = map[string]func() (*Flow, error){
	// held: worker 0 reads 1, 2, 3; the sink says so on standard error and holds its Write
	// until the run's context is cancelled, so a graceful stop can never finish its epoch.
	"held": func() (*Flow, error) {
		f := New("held")
		Output("out", Input(f, "in", FromDynamic[int](oneBatch{})), ToDynamic[int](heldSink{}))
		return f, nil
	},
	// failing: the sink's every Write fails, as one whose server is down would.
	"failing": func() (*Flow, error) {
		f := New("failing")
		Output("out", Input(f, "in", FromDynamic[int](oneBatch{})), ToDynamic[int](downSink{}))
		return f, nil
	},
}

func TestMain(m *testing.M) {
	if name := os.Getenv(helperEnv); name != "" {
		build, ok := helperFlows[name]
		if !ok {
			fmt.Fprintf(os.Stderr, "%s=%s: no such flow\n", helperEnv, name)
			os.Exit(3)
		}
		os.Exit(mainFunc(flag.NewFlagSet(name, flag.ContinueOnError), os.Args[1:], os.Stdout, os.Stderr, build))
	}
	os.Exit(m.Run())
}

// heldWriteMsg is what heldSink writes on standard error when it holds a Write.
const heldWriteMsg = "heldSink: holding a Write until the run is cancelled"

type heldSink struct{}

func (heldSink) Build(context.Context, Worker) (WorkerSink[int], error) { return heldSink{}, nil }
func (heldSink) Write(ctx context.Context, _ []int) error {
	fmt.Fprintln(os.Stderr, heldWriteMsg)
	<-ctx.Done()
	return ctx.Err()
}
func (heldSink) Close() error { return nil }

type downSink struct{}

func (downSink) Build(context.Context, Worker) (WorkerSink[int], error) { return downSink{}, nil }
func (downSink) Write(context.Context, []int) error {
	return errors.New("server closed the connection")
}
func (downSink) Close() error { return nil }

// child is a run of a helper flow in a child process.
type child struct {
	cmd    *exec.Cmd
	stderr *lockedBuffer
	exit   chan error // cmd.Wait's error
}

// startChild runs the helper flow name with args in a child process.
func startChild(t *testing.T, name string, args ...string) *child {
	t.Helper()
	c := &child{cmd: exec.Command(os.Args[0], args...), stderr: &lockedBuffer{}, exit: make(chan error, 1)}
	c.cmd.Env = append(os.Environ(), helperEnv+"="+name)
	c.cmd.Stderr = c.stderr
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { c.exit <- c.cmd.Wait() }()
	t.Cleanup(func() {
		c.cmd.Process.Kill()
		<-c.exit
	})
	return c
}

// waitFor waits until the child's standard error holds want; it fails the test if the child
// ends first or after a minute.
func (c *child) waitFor(t *testing.T, want string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !strings.Contains(c.stderr.String(), want) {
		select {
		case err := <-c.exit:
			c.exit <- err
			t.Fatalf("the child ended (%v) before writing %q:\n%s", err, want, c.stderr.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("the child did not write %q within a minute:\n%s", want, c.stderr.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// signal sends sig to the child.
func (c *child) signal(t *testing.T, sig os.Signal) {
	t.Helper()
	if err := c.cmd.Process.Signal(sig); err != nil {
		t.Fatalf("signal %v: %v", sig, err)
	}
}

// exitCode waits for the child to end (a minute at most) and returns its exit status.
func (c *child) exitCode(t *testing.T) int {
	t.Helper()
	select {
	case err := <-c.exit:
		c.exit <- err
		var ee *exec.ExitError
		if err == nil {
			return 0
		} else if errors.As(err, &ee) {
			return ee.ExitCode()
		}
		t.Fatalf("the child: %v", err)
	case <-time.After(time.Minute):
		t.Fatalf("the child did not end within a minute:\n%s", c.stderr.String())
	}
	return -1
}

// A second SIGINT, while the graceful stop the first one began cannot finish (a sink holds its
// Write), aborts the run: exit 1, with the "aborted by a second signal" closing line that
// says what the abort means with and without a recovery store.
func TestMainSecondSignalAborts(t *testing.T) {
	for _, c := range []struct {
		withStore bool
		want      string
	}{
		{false, `level=ERROR msg="aborted by a second signal without a recovery store: the flow's state is lost`},
		{true, `level=ERROR msg="aborted by a second signal: the open epochs are not committed; what was written up to the last committed epoch is final`},
	} {
		t.Run(fmt.Sprintf("recovery=%v", c.withStore), func(t *testing.T) {
			args := []string{"-epoch-interval", "20ms"}
			if c.withStore {
				args = append(args, "-recovery", t.TempDir())
			}
			ch := startChild(t, "held", args...)
			ch.waitFor(t, heldWriteMsg) // running, with the signals caught
			ch.signal(t, syscall.SIGINT)
			ch.waitFor(t, `msg="stopping: finishing`)
			ch.signal(t, syscall.SIGINT)
			if code := ch.exitCode(t); code != 1 {
				t.Fatalf("exit %d after two SIGINTs; want 1:\n%s", code, ch.stderr.String())
			}
			log := ch.stderr.String()
			for _, want := range []string{`level=WARN msg=aborting signal=interrupt`, c.want, "items_read=3"} {
				if !strings.Contains(log, want) {
					t.Errorf("stderr lacks %q:\n%s", want, log)
				}
			}
			if strings.Contains(log, `msg="stopped by a signal`) {
				t.Errorf("the closing line says stopped, not aborted:\n%s", log)
			}
		})
	}
}

// A SIGTERM that comes while a failed flow waits to be restarted is a clean stop: exit 0,
// the failure logged, and the "stopped" closing line.
func TestMainStopDuringRestartWait(t *testing.T) {
	ch := startChild(t, "failing", "-recovery", t.TempDir(), "-restart-backoff", "1h", "-epoch-interval", "20ms")
	ch.waitFor(t, `msg="the flow failed; restarting it from the last committed epoch"`)
	ch.signal(t, syscall.SIGTERM)
	if code := ch.exitCode(t); code != 0 {
		t.Fatalf("exit %d after SIGTERM during the restart's wait; want 0:\n%s", code, ch.stderr.String())
	}
	log := ch.stderr.String()
	for _, want := range []string{
		`level=WARN msg="stopped while waiting to restart after a failure`,
		`server closed the connection`,
		`level=INFO msg="stopped by a signal: what was written up to the last committed epoch is final`,
		"restarts=1",
	} {
		if !strings.Contains(log, want) {
			t.Errorf("stderr lacks %q:\n%s", want, log)
		}
	}
	if strings.Contains(log, `msg="failed`) || strings.Contains(log, "epochflow: ") {
		t.Errorf("the stop is reported as a failure:\n%s", log)
	}
}
