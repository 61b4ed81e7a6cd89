package cluster

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"time"

	"google.golang.org/grpc/credentials"
)

// The handshake runs on the raw TCP connection before gRPC speaks (it is the connection's
// TransportCredentials), so a stranger who connects gets nothing of gRPC:
//
//	server -> client: magic, nonceS
//	client -> server: magic, from, to, nonceC, HMAC(secret, "client", nonceS, nonceC, from, to)
//	server -> client: HMAC(secret, "server", nonceS, nonceC, from, to)
//
// Both sides prove that they know the secret without sending it, a proof cannot be replayed
// (the other side's nonce is in it), and the server learns which process dialed it.
const (
	magic        = "EFLW1\n"
	nonceLen     = 16
	macLen       = sha256.Size
	handshakeMax = 10 * time.Second
)

// With TLS (Config.TLS), the handshake runs inside a mutual TLS 1.3 connection, with an empty
// secret when there is none (see TLS).

// authInfo is what a handshake tells gRPC about the peer: its process number.
type authInfo struct {
	credentials.CommonAuthInfo
	process int
}

func (authInfo) AuthType() string { return "epochflow-cluster-secret" }

// creds implements credentials.TransportCredentials with the handshake above. A client's creds
// know the process it dials (to); a server's know its own process (self).
type creds struct {
	secret []byte
	self   int
	to     int // for a client: the process it dials
	log    *slog.Logger
	tls    *TLS     // nil without mutual TLS
	addrs  []string // every process's address, for the names of TLS certificates
}

func (c *creds) level() credentials.SecurityLevel {
	if c.tls != nil {
		return credentials.PrivacyAndIntegrity
	}
	return credentials.NoSecurity
}

func mac(secret []byte, role string, nonceS, nonceC []byte, from, to int) []byte {
	h := hmac.New(sha256.New, secret)
	h.Write([]byte(role))
	h.Write(nonceS)
	h.Write(nonceC)
	var b [8]byte
	binary.BigEndian.PutUint32(b[:4], uint32(from))
	binary.BigEndian.PutUint32(b[4:], uint32(to))
	h.Write(b[:])
	return h.Sum(nil)
}

func (c *creds) ClientHandshake(ctx context.Context, _ string, conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	deadline := time.Now().Add(handshakeMax)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	conn.SetDeadline(deadline)
	defer conn.SetDeadline(time.Time{})
	if c.tls != nil {
		tc := tls.Client(conn, c.tls.client(host(c.addrs[c.to])))
		if err := tc.HandshakeContext(ctx); err != nil {
			return nil, nil, fmt.Errorf("TLS handshake with process %d: %w", c.to, err)
		}
		conn = tc
	}
	hello := make([]byte, len(magic)+nonceLen)
	if _, err := io.ReadFull(conn, hello); err != nil {
		return nil, nil, fmt.Errorf("handshake with process %d: reading its greeting: %w", c.to, err)
	}
	if string(hello[:len(magic)]) != magic {
		return nil, nil, fmt.Errorf("handshake with process %d: it does not speak the epochflow cluster protocol", c.to)
	}
	nonceS := hello[len(magic):]
	nonceC := make([]byte, nonceLen)
	rand.Read(nonceC)
	msg := make([]byte, 0, len(magic)+8+nonceLen+macLen)
	msg = append(msg, magic...)
	msg = binary.BigEndian.AppendUint32(msg, uint32(c.self))
	msg = binary.BigEndian.AppendUint32(msg, uint32(c.to))
	msg = append(msg, nonceC...)
	msg = append(msg, mac(c.secret, "client", nonceS, nonceC, c.self, c.to)...)
	if _, err := conn.Write(msg); err != nil {
		return nil, nil, fmt.Errorf("handshake with process %d: %w", c.to, err)
	}
	proof := make([]byte, macLen)
	if _, err := io.ReadFull(conn, proof); err != nil {
		return nil, nil, fmt.Errorf("handshake with process %d: it refused this process (a wrong cluster secret, or "+
			"a process number it does not expect): %w", c.to, err)
	}
	if !hmac.Equal(proof, mac(c.secret, "server", nonceS, nonceC, c.self, c.to)) {
		return nil, nil, fmt.Errorf("handshake with process %d: it does not know the cluster secret", c.to)
	}
	return conn, authInfo{CommonAuthInfo: credentials.CommonAuthInfo{SecurityLevel: c.level()}, process: c.to}, nil
}

// errRefused is the error of a refused connection (already logged).
var errRefused = errors.New("refused")

func (c *creds) ServerHandshake(conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	conn, from, err := c.serverHandshake(conn)
	if err != nil {
		c.log.Warn("refused a connection to the cluster port", "remote", conn.RemoteAddr().String(), "reason", err.Error())
		return nil, nil, fmt.Errorf("%w: %v", errRefused, err)
	}
	return conn, authInfo{CommonAuthInfo: credentials.CommonAuthInfo{SecurityLevel: c.level()}, process: from}, nil
}

// serverHandshake returns the connection to use (the TLS one with TLS) and the dialer's process.
func (c *creds) serverHandshake(conn net.Conn) (net.Conn, int, error) {
	conn.SetDeadline(time.Now().Add(handshakeMax))
	defer conn.SetDeadline(time.Time{})
	if c.tls == nil {
		from, err := c.secretHandshake(conn, nil)
		return conn, from, err
	}
	tc := tls.Server(conn, c.tls.server())
	if err := tc.Handshake(); err != nil {
		return conn, 0, fmt.Errorf("TLS handshake: %w", err)
	}
	from, err := c.secretHandshake(tc, func(from int) error { return checkClientName(tc, c.addrs, from) })
	return tc, from, err
}

// secretHandshake is the server's side of the secret handshake; check, if not nil, may refuse
// the dialer's process before the server proves itself.
func (c *creds) secretHandshake(conn net.Conn, check func(from int) error) (int, error) {
	nonceS := make([]byte, nonceLen)
	rand.Read(nonceS)
	if _, err := conn.Write(append([]byte(magic), nonceS...)); err != nil {
		return 0, fmt.Errorf("writing the greeting: %w", err)
	}
	msg := make([]byte, len(magic)+8+nonceLen+macLen)
	if _, err := io.ReadFull(conn, msg[:len(magic)]); err != nil {
		return 0, fmt.Errorf("reading the handshake: %w", err)
	}
	if string(msg[:len(magic)]) != magic {
		return 0, errors.New("not an epochflow cluster peer (its first bytes are not the cluster handshake)")
	}
	if _, err := io.ReadFull(conn, msg[len(magic):]); err != nil {
		return 0, fmt.Errorf("reading the handshake: %w", err)
	}
	b := msg[len(magic):]
	from, to := int(binary.BigEndian.Uint32(b[:4])), int(binary.BigEndian.Uint32(b[4:8]))
	nonceC, proof := b[8:8+nonceLen], b[8+nonceLen:]
	if !hmac.Equal(proof, mac(c.secret, "client", nonceS, nonceC, from, to)) {
		return 0, errors.New("it does not prove the cluster secret (a wrong or missing -cluster-secret)")
	}
	if to != c.self {
		return 0, fmt.Errorf("it wants process %d, this is process %d (the -addresses lists differ)", to, c.self)
	}
	if check != nil {
		if err := check(from); err != nil {
			return 0, err
		}
	}
	if _, err := conn.Write(mac(c.secret, "server", nonceS, nonceC, from, to)); err != nil {
		return 0, fmt.Errorf("writing the proof: %w", err)
	}
	return from, nil
}

func (c *creds) Info() credentials.ProtocolInfo {
	return credentials.ProtocolInfo{SecurityProtocol: "epochflow-cluster-secret"}
}

func (c *creds) Clone() credentials.TransportCredentials { cc := *c; return &cc }

// OverrideServerName is deprecated in gRPC and unused here.
func (c *creds) OverrideServerName(string) error { return nil }
