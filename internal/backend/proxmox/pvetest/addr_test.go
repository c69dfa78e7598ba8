package pvetest

import (
	"net"
	"strconv"
	"testing"
)

// TestNextAddrSkipsAnAddressInUse: a guest never gets an address on which
// something (another process's fake) already listens at the proxy port;
// its probes would reach that listener, which answers as another proxy.
func TestNextAddrSkipsAnAddressInUse(t *testing.T) {
	held, err := net.Listen("tcp", "127.77.9.9:0")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	port := held.Addr().(*net.TCPAddr).Port //nolint:forcetypeassert // a TCP listener.
	addrCounter.Store(9<<8 | 9 - 1)         // the next candidate is 127.77.9.9
	got := nextAddr(port)
	if got == "127.77.9.9" {
		t.Fatalf("nextAddr(%d) = %s, where another listener holds the port", port, got)
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(got, strconv.Itoa(port)))
	if err != nil {
		t.Fatalf("the address handed out, %s, is not free at port %d: %v", got, port, err)
	}
	_ = ln.Close()
}
