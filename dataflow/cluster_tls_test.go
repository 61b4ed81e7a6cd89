package dataflow_test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/binary"
	"encoding/pem"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/epochflow/epochflow/connectors/flowtest"
	"github.com/epochflow/epochflow/dataflow"
)

// testCA is a certificate authority made in the test.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

var serial int64

func newTestCA(t *testing.T) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial++
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: "epochflow test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true,
		BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &testCA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// issue returns the PEM certificate and key of a leaf for ips, usable by servers and clients.
func (ca *testCA) issue(t *testing.T, ips ...string) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial++
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: "epochflow process"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}
	for _, ip := range ips {
		tmpl.IPAddresses = append(tmpl.IPAddresses, net.ParseIP(ip))
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder})
}

// files writes a leaf for 127.0.0.1 and the CA into dir and returns the ClusterTLS naming them.
func (ca *testCA) files(t *testing.T, dir string) *dataflow.ClusterTLS {
	t.Helper()
	c, k := ca.issue(t, "127.0.0.1")
	f := &dataflow.ClusterTLS{CertFile: filepath.Join(dir, "tls.crt"), KeyFile: filepath.Join(dir, "tls.key"),
		CAFile: filepath.Join(dir, "ca.crt")}
	for name, b := range map[string][]byte{f.CertFile: c, f.KeyFile: k, f.CAFile: ca.pem} {
		if err := os.WriteFile(name, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return f
}

// lockedBuffer is a bytes.Buffer for several goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// waitFor polls cond until it holds, failing the test after within.
func waitFor(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited %v for %s", within, what)
		}
		<-tick.C
	}
}

func sortedCounts(items []dataflow.KV[int]) []string {
	var s []string
	for _, kv := range items {
		s = append(s, fmt.Sprint(kv.Key, "=", kv.Value))
	}
	slices.Sort(s)
	return s
}

// With mutual TLS and no secret, 3 processes x 2 workers give the word count of one process;
// strangers that connect while process 0 waits for its last peer (a TLS client without a
// certificate, one with a certificate of another CA, one with a certificate of the cluster's CA
// for another host than the process it says it is, plain TCP garbage, a gRPC client without
// credentials) are refused, each refusal is logged, and the output is unaffected.
func TestClusterMutualTLS(t *testing.T) {
	lines := benchText(30_000, 500, 12, false)
	want := flowtest.NewSink[dataflow.KV[int]]()
	if err := dataflow.Run(context.Background(), wordcountFlow(lines, 3, want.Output()),
		dataflow.Options{Workers: 1, Logger: slog.New(slog.DiscardHandler)}); err != nil {
		t.Fatal(err)
	}

	ca := newTestCA(t)
	addrs := freeAddrs(t, 3)
	got := flowtest.NewSink[dataflow.KV[int]]()
	var logs [3]lockedBuffer
	errs := make([]error, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	start := func(p int) {
		o := dataflow.Options{Workers: 2, EpochInterval: 20 * time.Millisecond,
			Logger: slog.New(slog.NewTextHandler(&logs[p], nil)),
			Cluster: &dataflow.ClusterOptions{Addresses: addrs, Process: p, TLS: ca.files(t, t.TempDir()),
				PeerTimeout: 10 * time.Second, StartTimeout: 60 * time.Second}}
		f := wordcountFlow(lines, 3, got.Output())
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[p] = dataflow.Run(ctx, f, o)
		}()
	}
	start(0)
	start(1)
	refusals := func() int { return strings.Count(logs[0].String(), "refused a connection to the cluster port") }
	waitFor(t, 30*time.Second, "process 0 to listen", func() bool { return listening(addrs[0]) })
	waitFor(t, 30*time.Second, "the probe's refusal", func() bool { return refusals() >= 1 })
	n := refusals()

	stranger := func(name string, cfg *tls.Config) {
		t.Helper()
		c, err := tls.Dial("tcp", addrs[0], cfg)
		if err == nil {
			// TLS 1.3: the client may finish before the server checks its certificate; the
			// server's refusal then shows on the next read.
			c.Write([]byte("EFLW1\nhello"))
			c.SetReadDeadline(time.Now().Add(10 * time.Second))
			if _, err := c.Read(make([]byte, 64)); err == nil {
				t.Errorf("%s: the server answered", name)
			}
			c.Close()
		}
		n++
		waitFor(t, 30*time.Second, name+"'s refusal to be logged", func() bool { return refusals() >= n })
	}
	stranger("a TLS client without a certificate", &tls.Config{InsecureSkipVerify: true})
	other := newTestCA(t)
	oc, ok := other.issue(t, "127.0.0.1")
	pair, err := tls.X509KeyPair(oc, ok)
	if err != nil {
		t.Fatal(err)
	}
	stranger("a TLS client with a certificate of another CA", &tls.Config{InsecureSkipVerify: true, Certificates: []tls.Certificate{pair}})

	// A certificate of the cluster's CA, but for another host than process 1's, used by a
	// client that says it is process 1 (and completes the handshake, whose secret is empty).
	wc, wk := ca.issue(t, "127.0.0.9")
	wrong, err := tls.X509KeyPair(wc, wk)
	if err != nil {
		t.Fatal(err)
	}
	if tc, err := tls.Dial("tcp", addrs[0], &tls.Config{InsecureSkipVerify: true, Certificates: []tls.Certificate{wrong}}); err == nil {
		tc.SetDeadline(time.Now().Add(10 * time.Second))
		hello := make([]byte, 6+16)
		if _, err := io.ReadFull(tc, hello); err == nil {
			nonceS, nonceC := hello[6:], make([]byte, 16)
			ids := binary.BigEndian.AppendUint32(binary.BigEndian.AppendUint32(nil, 1), 0)
			m := hmac.New(sha256.New, nil)
			for _, b := range [][]byte{[]byte("client"), nonceS, nonceC, ids} {
				m.Write(b)
			}
			msg := append(append(append([]byte("EFLW1\n"), ids...), nonceC...), m.Sum(nil)...)
			tc.Write(msg)
			if _, err := io.ReadFull(tc, make([]byte, 32)); err == nil {
				t.Error("a client whose certificate is not valid for process 1's host got the server's proof")
			}
		}
		tc.Close()
	}
	n++
	waitFor(t, 30*time.Second, "the refusal of a certificate for another host", func() bool { return refusals() >= n })
	if !strings.Contains(logs[0].String(), "not valid for that process's host") {
		t.Errorf("the refusal does not say that the certificate is not valid for the process's host:\n%s", logs[0].String())
	}

	c, err := net.Dial("tcp", addrs[0])
	if err != nil {
		t.Fatal(err)
	}
	c.Write([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n\x00\x01garbage"))
	n++
	waitFor(t, 30*time.Second, "the garbage's refusal", func() bool { return refusals() >= n })
	c.Close()

	cc, err := grpc.NewClient("passthrough:///"+addrs[0], grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	sctx, scancel := context.WithTimeout(ctx, 10*time.Second)
	if s, err := cc.NewStream(sctx, &grpc.StreamDesc{ServerStreams: true, ClientStreams: true}, "/epochflow.Cluster/Exchange"); err == nil {
		if err := s.RecvMsg(new([]byte)); err == nil {
			t.Error("a gRPC client without credentials got a message")
		}
	}
	scancel()
	cc.Close()
	n++
	waitFor(t, 30*time.Second, "the gRPC client's refusal", func() bool { return refusals() >= n })

	start(2)
	wg.Wait()
	for p, err := range errs {
		if err != nil {
			t.Fatalf("process %d: %v\n%s", p, err, logs[p].String())
		}
	}
	if g, w := sortedCounts(got.Items()), sortedCounts(want.Items()); !slices.Equal(g, w) {
		t.Fatalf("3 processes with mutual TLS counted %d words differently from one process (%d)", len(g), len(w))
	}
	if !strings.Contains(logs[0].String(), "TLS handshake") {
		t.Errorf("the refusals do not say that the TLS handshake failed:\n%s", logs[0].String())
	}
}
