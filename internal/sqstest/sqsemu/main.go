// Command sqsemu serves the goaws SQS emulator for the tests of this module (see
// internal/sqstest, which builds and starts it, and internal/sqstest/emulator).
//
//	sqsemu [-addr 127.0.0.1:0] [-control 127.0.0.1:0]
//
// It serves SQS on -addr and the emulator's control handler (emulator.Server.Control) on
// -control, both on loopback, and once both listen writes one line to standard output:
//
//	sqs=http://127.0.0.1:PORT control=http://127.0.0.1:PORT
//
// It runs until its standard input ends (so it ends with the test process that started it,
// however that ends) or it gets SIGINT or SIGTERM.
package main

import (
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"

	"github.com/epochflow/epochflow/internal/sqstest/emulator"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:0", "`host:port` to serve SQS on (port 0: a free one)")
	control := flag.String("control", "127.0.0.1:0", "`host:port` to serve the control handler on (port 0: a free one)")
	flag.Parse()
	if flag.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "sqsemu: unexpected arguments %q\n", flag.Args())
		os.Exit(2)
	}
	if err := run(*addr, *control); err != nil {
		fmt.Fprintln(os.Stderr, "sqsemu:", err)
		os.Exit(1)
	}
}

func run(addr, control string) error {
	s, err := emulator.Start(addr)
	if err != nil {
		return err
	}
	defer s.Close()
	ln, err := net.Listen("tcp", control)
	if err != nil {
		return fmt.Errorf("control listener on %s (flag -control): %w", control, err)
	}
	csrv := &http.Server{Handler: s.Control()}
	served := make(chan error, 1)
	go func() { served <- csrv.Serve(ln) }()
	defer csrv.Close()
	if _, err := fmt.Printf("sqs=%s control=http://%s\n", s.URL, ln.Addr()); err != nil {
		return fmt.Errorf("write the addresses to standard output: %w", err)
	}

	stdin := make(chan struct{})
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		close(stdin)
	}()
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	select {
	case <-stdin:
		return nil
	case <-sig:
		return nil
	case err := <-served:
		return fmt.Errorf("control handler: %w", err)
	}
}
