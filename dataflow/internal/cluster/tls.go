package cluster

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
)

// TLS is what mutual TLS between the processes needs: this process's certificate and key, and
// the CA that signed every process's certificate. With it, every connection first completes a
// TLS 1.3 handshake in which both sides present a certificate of that CA, then the secret
// handshake (with an empty secret when there is none). The dialer checks that the server's
// certificate is valid for the host it dialed (its entry in Addresses), and the server checks
// that the dialer's certificate is valid for the host of the process it says it is, so a
// certificate names the processes that may use it: a DNS or IP subject alternative name per
// host, or a wildcard such as *.flow.NS.svc.cluster.local for a whole StatefulSet.
type TLS struct {
	cert tls.Certificate
	pool *x509.CertPool
}

// LoadTLS reads the PEM files of this process's certificate (with its chain, if any), its
// private key and the cluster's CA certificates.
func LoadTLS(certFile, keyFile, caFile string) (*TLS, error) {
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("loading the certificate %s and key %s: %w", certFile, keyFile, err)
	}
	ca, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("reading the CA %s: %w", caFile, err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		return nil, fmt.Errorf("the CA file %s holds no PEM certificate", caFile)
	}
	return &TLS{cert: cert, pool: pool}, nil
}

func (t *TLS) server() *tls.Config {
	return &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{t.cert},
		ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: t.pool}
}

func (t *TLS) client(serverName string) *tls.Config {
	return &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{t.cert},
		RootCAs: t.pool, ServerName: serverName}
}

// host returns the host of a host:port address.
func host(addr string) string {
	h, _, err := net.SplitHostPort(addr)
	if err != nil {
		return addr
	}
	return h
}

// checkClientName checks that the verified certificate of a TLS client is valid for the host
// of the process it says it is.
func checkClientName(conn *tls.Conn, addrs []string, from int) error {
	if from < 0 || from >= len(addrs) {
		return fmt.Errorf("it says it is process %d, which -addresses does not list", from)
	}
	certs := conn.ConnectionState().PeerCertificates
	if len(certs) == 0 {
		return errors.New("it presented no certificate")
	}
	if err := certs[0].VerifyHostname(host(addrs[from])); err != nil {
		return fmt.Errorf("it says it is process %d, but its certificate is not valid for that process's host: %w", from, err)
	}
	return nil
}
