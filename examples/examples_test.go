// Package examples_test checks what every example program promises on its command line: -help
// starts with what the program does and an example command line, and -graph describes the flow
// with no flag and no server.
package examples_test

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// examples are the example programs, by directory.
var examples = []string{"amqp-to-file", "clicks", "kafka-copy", "nats-to-file", "nexmark", "pg-cdc", "sqs-to-file", "wordcount"}

// bin is the directory TestMain built every example into.
var bin string

// TestMain builds every example into a temporary directory, in one go build.
func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "epochflow-examples-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	args := []string{"build", "-o", dir + string(filepath.Separator)}
	for _, e := range examples {
		args = append(args, "./"+e)
	}
	if out, err := exec.Command("go", args...).CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "go build: %v\n%s", err, out)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	bin = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// closedEnv is the environment with every server the examples know of at a port where nothing
// listens (port 1 of loopback), and no AWS region: a program that connected would fail.
func closedEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); strings.HasPrefix(k, "AWS_") || strings.HasPrefix(k, "EPOCHFLOW_") {
			continue
		}
		env = append(env, kv)
	}
	return append(env, "AMQP_URL=amqp://guest:guest@127.0.0.1:1/", "NATS_URL=nats://127.0.0.1:1",
		"KAFKA_BROKERS=127.0.0.1:1", "AWS_CONFIG_FILE=/nonexistent", "AWS_SHARED_CREDENTIALS_FILE=/nonexistent")
}

func run(t *testing.T, bin string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = closedEnv()
	var o, e strings.Builder
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		code = exit.ExitCode()
	case err != nil:
		t.Fatalf("%s: %v", bin, err)
	}
	return o.String(), e.String(), code
}

// Every example's -help starts with one sentence of what the program does, then an example
// command line of the program whose flags all exist, then the flags.
func TestHelpStartsWithWhatAndExample(t *testing.T) {
	for _, e := range examples {
		t.Run(e, func(t *testing.T) {
			_, stderr, code := run(t, filepath.Join(bin, e), "-help")
			if code != 0 && code != 2 {
				t.Fatalf("-help: exit %d\n%s", code, stderr)
			}
			lines := strings.Split(stderr, "\n")
			if len(lines) < 5 {
				t.Fatalf("-help:\n%s", stderr)
			}
			what := lines[0]
			if !strings.HasPrefix(what, e+" ") || !strings.HasSuffix(what, ".") || strings.Count(what, ". ") > 0 {
				t.Errorf("-help starts with %q, want one sentence beginning with %q", what, e+" ")
			}
			if lines[1] != "" || lines[2] != "Example:" || !strings.HasPrefix(lines[3], "  "+e+" -") {
				t.Fatalf("-help does not go on with an example command line of %s:\n%s", e, stderr)
			}
			for _, arg := range strings.Fields(lines[3])[1:] {
				if name, ok := strings.CutPrefix(arg, "-"); ok && !strings.Contains(stderr, "\n  -"+name+" ") && !strings.Contains(stderr, "\n  -"+name+"\n") {
					t.Errorf("the example command line %q uses %s, which -help does not list", lines[3], arg)
				}
			}
			if !strings.Contains(stderr, "\n  -graph") || !strings.Contains(stderr, "\n  -recovery") {
				t.Errorf("-help does not list the engine's flags:\n%s", stderr)
			}
		})
	}
}

// Every example's -graph prints the flow's chart and exits 0 with none of its required flags,
// with every server it knows of unreachable (pg-cdc with both databases at a closed port).
func TestGraphNeedsNoFlagsAndNoServer(t *testing.T) {
	for _, e := range examples {
		t.Run(e, func(t *testing.T) {
			args := []string{"-graph"}
			if e == "pg-cdc" {
				args = append(args, "-source", "postgres://postgres@127.0.0.1:1/db", "-target", "postgres://postgres@127.0.0.1:1/db")
			}
			stdout, stderr, code := run(t, filepath.Join(bin, e), args...)
			if code != 0 {
				t.Fatalf("-graph: exit %d\n%s", code, stderr)
			}
			if !strings.HasPrefix(stdout, "flowchart") || !strings.Contains(stdout, e+".read") {
				t.Errorf("-graph printed no chart of the flow:\n%s", stdout)
			}
			if strings.Contains(stderr, "level=ERROR") || strings.Contains(stderr, "epochflow:") {
				t.Errorf("-graph logged an error:\n%s", stderr)
			}
		})
	}
}
