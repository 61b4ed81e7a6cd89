package cluster

import (
	"net"
	"strings"
	"testing"
)

// A dial that TCP connected to itself (the peer not listening yet, its port picked as the
// source port) is refused and reset, and leaves the port free for the peer to listen on.
func TestDialRefusesASelfConnection(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	// Binding the dial's source to the destination makes the self-connection certain.
	local, _ := net.ResolveTCPAddr("tcp", addr)
	d := net.Dialer{LocalAddr: local}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatalf("the self-connection this test needs did not happen: %v", err)
	}
	if _, err := refuseSelf(c, addr); err == nil || !strings.Contains(err.Error(), "nothing listens on "+addr) {
		t.Fatalf("refuseSelf of a self-connection: %v; want an error saying nothing listens on %s", err, addr)
	}
	l, err = net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("the peer cannot listen on its port after a refused self-connection: %v", err)
	}
	defer l.Close()

	// A connection to a listener is kept.
	c, err = net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if got, err := refuseSelf(c, addr); err != nil || got != c {
		t.Fatalf("refuseSelf of a real connection: %v, %v; want it back", got, err)
	}
}
