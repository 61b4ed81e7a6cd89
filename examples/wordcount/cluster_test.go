package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/epochflow/epochflow/internal/exampletest"
)

// syncBuffer is a process's standard error, read while the process writes it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// proc is one process of a cluster started by a test.
type proc struct {
	cmd    *exec.Cmd
	stderr *syncBuffer
	done   chan struct{}
	err    error
	ended  time.Time
}

func startProc(t *testing.T, bin string, env []string, stdin io.Reader, args ...string) *proc {
	t.Helper()
	p := &proc{cmd: exec.Command(bin, args...), stderr: &syncBuffer{}, done: make(chan struct{})}
	p.cmd.Env = append(os.Environ(), env...)
	p.cmd.Stderr = p.stderr
	p.cmd.Stdin = stdin
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		p.err = p.cmd.Wait()
		p.ended = time.Now()
		close(p.done)
	}()
	t.Cleanup(func() {
		p.cmd.Process.Kill()
		<-p.done
	})
	return p
}

// waitExit waits for the process to end and returns its exit code.
func (p *proc) waitExit(t *testing.T, within time.Duration) int {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(within):
		t.Fatalf("%s did not end within %v; its log:\n%s", p.cmd.Args, within, p.stderr.String())
	}
	return p.cmd.ProcessState.ExitCode()
}

// waitLog waits until the process's log holds s n times.
func (p *proc) waitLog(t *testing.T, s string, n int, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for strings.Count(p.stderr.String(), s) < n {
		select {
		case <-p.done:
			t.Fatalf("%s ended before logging %q; its log:\n%s", p.cmd.Args, s, p.stderr.String())
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not log %q within %v; its log:\n%s", p.cmd.Args, s, within, p.stderr.String())
		}
	}
}

func freeAddrs(t *testing.T, n int) []string {
	t.Helper()
	var addrs []string
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addrs = append(addrs, l.Addr().String())
		l.Close()
	}
	return addrs
}

const secretEnv = "EPOCHFLOW_CLUSTER_SECRET=wordcount-test-secret"

// clusterArgs are the flags of process p of a cluster at addrs.
func clusterArgs(addrs []string, p int, more ...string) []string {
	return append([]string{"-addresses", strings.Join(addrs, ","), "-process-id", fmt.Sprint(p), "-workers", "2",
		"-epoch-interval", "50ms", "-status-interval", "0"}, more...)
}

// Three processes of two workers each, on loopback addresses, write the same counts as one
// process.
func TestClusterOutputEqualsOneProcess(t *testing.T) {
	bin := buildBinary(t)
	dir := t.TempDir()
	input := filepath.Join(dir, "input.txt")
	writeText(t, input, 150000, 5000, 1)

	one := filepath.Join(dir, "one.txt")
	single := startProc(t, bin, nil, nil, "-input", input, "-output", one, "-workers", "2", "-status-interval", "0")
	if code := single.waitExit(t, 2*time.Minute); code != 0 {
		t.Fatalf("one process: exit %d\n%s", code, single.stderr.String())
	}

	three := filepath.Join(dir, "three.txt")
	addrs := freeAddrs(t, 3)
	var procs []*proc
	for p := range addrs {
		procs = append(procs, startProc(t, bin, []string{secretEnv}, nil, clusterArgs(addrs, p, "-input", input, "-output", three)...))
	}
	for i, p := range procs {
		if code := p.waitExit(t, 2*time.Minute); code != 0 {
			t.Fatalf("process %d: exit %d\n%s", i, code, p.stderr.String())
		}
	}
	want := exampletest.SortedLines(t, one)
	if len(want) < 4000 {
		t.Fatalf("one process wrote %d lines, want about 5000", len(want))
	}
	if d := exampletest.Diff(exampletest.SortedLines(t, three), want); d != "" {
		t.Fatalf("3 processes x 2 workers differ from one process: %s", d)
	}
}

// A stranger who connects to a process's port (plain TCP garbage, a gRPC client without the
// secret, a process with a wrong secret) is refused, the refusal is logged, and the flow's
// output is unaffected.
func TestClusterRefusesStrangers(t *testing.T) {
	bin := buildBinary(t)
	dir := t.TempDir()
	input := filepath.Join(dir, "input.txt")
	writeText(t, input, 10000, 300, 2)
	one := filepath.Join(dir, "one.txt")
	single := startProc(t, bin, nil, nil, "-input", input, "-output", one, "-status-interval", "0")
	if code := single.waitExit(t, time.Minute); code != 0 {
		t.Fatalf("one process: exit %d\n%s", code, single.stderr.String())
	}

	out := filepath.Join(dir, "out.txt")
	addrs := freeAddrs(t, 3)
	p0 := startProc(t, bin, []string{secretEnv}, nil, clusterArgs(addrs, 0, "-input", input, "-output", out)...)
	// Process 0 listens before it waits for its peers.
	p0.waitLog(t, "waiting for peers to connect", 1, time.Minute)

	// Plain TCP garbage.
	c, err := net.Dial("tcp", addrs[0])
	if err != nil {
		t.Fatal(err)
	}
	c.Write([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"))
	io.Copy(io.Discard, c) // the server closes it
	c.Close()
	p0.waitLog(t, "refused a connection to the cluster port", 1, 30*time.Second)

	// A gRPC client without credentials.
	cc, err := grpc.NewClient("passthrough:///"+addrs[0], grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	_, err = cc.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true, ClientStreams: true}, "/epochflow.Cluster/Exchange")
	cancel()
	cc.Close()
	if err == nil {
		t.Fatal("a gRPC client without the secret opened a stream")
	}
	p0.waitLog(t, "refused a connection to the cluster port", 2, 30*time.Second)

	// A process with a wrong secret, posing as process 2.
	wrong := startProc(t, bin, []string{"EPOCHFLOW_CLUSTER_SECRET=wrong"}, nil, clusterArgs(addrs, 2, "-input", input, "-output", out)...)
	p0.waitLog(t, "does not prove the cluster secret", 1, 30*time.Second)
	wrong.cmd.Process.Signal(syscall.SIGKILL)
	<-wrong.done

	p1 := startProc(t, bin, []string{secretEnv}, nil, clusterArgs(addrs, 1, "-input", input, "-output", out)...)
	p2 := startProc(t, bin, []string{secretEnv}, nil, clusterArgs(addrs, 2, "-input", input, "-output", out)...)
	for i, p := range []*proc{p0, p1, p2} {
		if code := p.waitExit(t, time.Minute); code != 0 {
			t.Fatalf("process %d: exit %d\n%s", i, code, p.stderr.String())
		}
	}
	if d := exampletest.Diff(exampletest.SortedLines(t, out), exampletest.SortedLines(t, one)); d != "" {
		t.Fatalf("the output differs from one process's: %s", d)
	}
}

// A process killed with SIGKILL makes the others exit non-zero within the peer timeout, with
// an error that names it.
func TestClusterPeerKilled(t *testing.T) {
	bin := buildBinary(t)
	dir := t.TempDir()
	addrs := freeAddrs(t, 3)
	const timeout = 2 * time.Second
	var procs []*proc
	var inputs []*os.File
	for p := range addrs {
		r, w, err := os.Pipe() // a file: exec copies nothing, and Wait does not wait for it
		if err != nil {
			t.Fatal(err)
		}
		inputs = append(inputs, w)
		t.Cleanup(func() { w.Close() })
		defer r.Close()
		procs = append(procs, startProc(t, bin, []string{secretEnv}, r,
			clusterArgs(addrs, p, "-output", filepath.Join(dir, fmt.Sprint("out", p)), "-peer-timeout", timeout.String())...))
	}
	for _, p := range procs {
		p.waitLog(t, "connected to every peer", 1, time.Minute)
	}
	// Standard input stays open: the flow runs until a process dies.
	go fmt.Fprintln(inputs[0], "a b c a")
	killed := time.Now()
	if err := procs[1].cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for _, i := range []int{0, 2} {
		p := procs[i]
		if code := p.waitExit(t, time.Minute); code == 0 {
			t.Fatalf("process %d exited 0 after process 1 was killed\n%s", i, p.stderr.String())
		}
		if took := p.ended.Sub(killed); took > timeout+3*time.Second {
			t.Errorf("process %d took %v to stop, the bound is %v", i, took, timeout)
		}
		if log := p.stderr.String(); !strings.Contains(log, "process 1 (") {
			t.Errorf("process %d's error does not name process 1:\n%s", i, log)
		}
	}
}
