package cluster

import (
	"context"
	"fmt"
	"net"
)

// dialPeer opens a TCP connection to a peer's address for gRPC. A connection that reached
// itself is refused: while the peer is not listening yet, the kernel may pick the peer's own
// port as the ephemeral source port of a dial to it (processes on one host, with ports in the
// ephemeral range), and TCP's simultaneous open then connects the socket to itself. Closed
// normally, such a socket would sit in TIME_WAIT on the peer's port for a minute and keep the
// peer from listening there; it is reset instead, so the peer can bind at once, and the dial
// is retried like any other refused one.
func dialPeer(ctx context.Context, addr string) (net.Conn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	return refuseSelf(c, addr)
}

// refuseSelf returns c, or an error (having reset c) when c is connected to itself.
func refuseSelf(c net.Conn, addr string) (net.Conn, error) {
	if c.LocalAddr().String() != c.RemoteAddr().String() {
		return c, nil
	}
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetLinger(0) // close with a reset: no TIME_WAIT left on the peer's port
	}
	c.Close()
	return nil, fmt.Errorf("nothing listens on %s yet (the connection reached itself)", addr)
}
