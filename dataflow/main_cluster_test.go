package dataflow

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"flag"
	"io"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// selfSigned writes a self-signed certificate (its own CA) and its key, and returns their files.
func selfSigned(t *testing.T) (certFile, keyFile string) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), NotBefore: time.Now().Add(-time.Hour),
		NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true, DNSNames: []string{"a", "b"}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	certFile, keyFile = filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600)
	os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}), 0o600)
	return certFile, keyFile
}

// The cluster flags: a pod name gives its ordinal, and a cluster without a secret, a process
// id outside the list are refused naming the flag; -recovery with several processes is accepted
// (process 0 opens the store).
func TestClusterFlags(t *testing.T) {
	certFile, keyFile := selfSigned(t)
	for _, c := range []struct {
		args []string
		want int // process, or -1 for refused
		err  string
	}{
		{args: nil, want: 0},
		{args: []string{"-addresses", "a:1,b:2", "-process-id", "flow-1", "-cluster-secret", "s"}, want: 1},
		{args: []string{"-addresses", "a:1,b:2", "-process-id", "1"}, want: -1, err: "-cluster-secret"},
		{args: []string{"-addresses", "a:1,b:2", "-process-id", "2", "-cluster-secret", "s"}, want: -1, err: "-process-id"},
		{args: []string{"-addresses", "a:1,b", "-cluster-secret", "s"}, want: -1, err: "-addresses"},
		{args: []string{"-process-id", "3"}, want: -1, err: "needs -addresses"},
		{args: []string{"-addresses", "a:1,b:2", "-tls-cert", "c", "-tls-key", "k"}, want: -1, err: "-tls-ca is missing"},
		{args: []string{"-addresses", "a:1,b:2", "-tls-key", "k", "-tls-ca", "c"}, want: -1, err: "-tls-cert is missing"},
		{args: []string{"-addresses", "a:1,b:2", "-tls-cert", "c", "-tls-ca", "c"}, want: -1, err: "-tls-key is missing"},
		{args: []string{"-addresses", "a:1,b:2", "-tls-cert", "/nonexistent/c", "-tls-key", "/nonexistent/k", "-tls-ca", "/nonexistent/ca"},
			want: -1, err: "-tls-cert"},
		{args: []string{"-tls-cert", certFile, "-tls-key", keyFile, "-tls-ca", certFile}, want: -1, err: "needs -addresses"},
		{args: []string{"-addresses", "a:1,b:2", "-process-id", "1", "-tls-cert", certFile, "-tls-key", keyFile, "-tls-ca", certFile}, want: 1},
	} {
		fs := flag.NewFlagSet("x", flag.ContinueOnError)
		cf := addClusterFlags(fs)
		if err := fs.Parse(c.args); err != nil {
			t.Fatal(err)
		}
		var stderr bytes.Buffer
		opts, ok := cf.options(&stderr, "")
		switch {
		case c.want < 0 && (ok || !strings.Contains(stderr.String(), c.err)):
			t.Errorf("%v: ok=%v, error %q, want one naming %s", c.args, ok, stderr.String(), c.err)
		case c.want >= 0 && !ok:
			t.Errorf("%v: refused: %s", c.args, stderr.String())
		case c.want > 0 && opts.Process != c.want:
			t.Errorf("%v: process %d, want %d", c.args, opts.Process, c.want)
		case c.want > 0 && strings.Contains(strings.Join(c.args, " "), "-tls-cert") && opts.TLS == nil:
			t.Errorf("%v: no TLS in the options", c.args)
		}
	}
	var stderr bytes.Buffer
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	cf := addClusterFlags(fs)
	fs.Parse([]string{"-addresses", "a:1,b:2", "-cluster-secret", "s"})
	if _, ok := cf.options(&stderr, "/tmp/store"); !ok {
		t.Errorf("-recovery with a cluster: ok=%v, %q", ok, stderr.String())
	}
}

// On a cluster of several processes, -restart-attempts is ignored (the processes are started
// again together), and a process given it says so rather than ignoring it silently.
func TestClusterSaysRestartAttemptsIsIgnored(t *testing.T) {
	var addrs []string
	for range 2 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addrs = append(addrs, l.Addr().String())
		l.Close()
	}
	dir := t.TempDir()
	var wg sync.WaitGroup
	codes := make([]int, 2)
	logs := make([]bytes.Buffer, 2)
	for p := range 2 {
		args := []string{"-addresses", strings.Join(addrs, ","), "-process-id", strconv.Itoa(p), "-cluster-secret", "s",
			"-restart-attempts", "3", "-recovery", dir}
		wg.Add(1)
		go func() {
			defer wg.Done()
			fs := flag.NewFlagSet("x", flag.ContinueOnError)
			codes[p] = mainFunc(fs, args, io.Discard, &logs[p], func() (*Flow, error) { return smallFlow(), nil })
		}()
	}
	wg.Wait()
	for p := range 2 {
		if codes[p] != 0 {
			t.Errorf("process %d: exit %d\n%s", p, codes[p], logs[p].String())
		}
		if !strings.Contains(logs[p].String(), "-restart-attempts 3 is ignored on a cluster of several processes") {
			t.Errorf("process %d does not say that -restart-attempts is ignored:\n%s", p, logs[p].String())
		}
	}
}
