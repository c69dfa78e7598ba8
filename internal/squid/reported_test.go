package squid_test

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/egressproxy/provider-egressproxy/internal/netguard"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
	"github.com/egressproxy/provider-egressproxy/internal/squid"
)

const sentinel = "SENTINEL-7f3a"

// counted is a loopback listener that counts the connections it accepts
// and answers each with answer (nil: as Squid named identity answers a
// probe).
func counted(t *testing.T, answer func(net.Conn)) (string, *atomic.Int32) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	n := &atomic.Int32{}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			n.Add(1)
			go func() {
				defer func() { _ = c.Close() }()
				_ = c.SetDeadline(time.Now().Add(5 * time.Second))
				buf := make([]byte, 4096)
				_, _ = c.Read(buf)
				answer(c)
			}()
		}
	}()
	return ln.Addr().String(), n
}

func squidAnswer(identity string) func(net.Conn) {
	return func(c net.Conn) {
		_, _ = fmt.Fprintf(c, "HTTP/1.1 400 Bad Request\r\nServer: squid\r\nX-Cache: MISS from %s\r\nConnection: close\r\n\r\n", identity)
	}
}

const uid = "6f1c2a7e-3b4d-4c5e-9f60-718293a4b5c6"

// TestProbeOfAReportedAddressIsGuarded: a tenant's backend reports its
// proxy at an address of the provider's own (loopback, metadata, in any
// spelling). With the config's guard the probe refuses it, saying it is
// the address the backend reported and why, and nothing connects there,
// neither the real Ask nor a fake's; with a guard that allows the range,
// or none (the platform's configs), the same Squid is found serving.
func TestProbeOfAReportedAddressIsGuarded(t *testing.T) {
	addr, n := counted(t, squidAnswer(squid.Identity(uid)))
	_, port, _ := net.SplitHostPort(addr)
	tenant := netguard.New(netguard.Options{})
	ctx := context.Background()

	var asked atomic.Int32
	fake := &squid.Prober{Wait: time.Minute, Ask: func(context.Context, string) (string, error) {
		asked.Add(1)
		return squid.Identity(uid), nil
	}}
	real := &squid.Prober{Wait: time.Minute, Timeout: 20 * time.Second}
	for _, reported := range []string{addr, "[::ffff:127.0.0.1]:" + port, "[64:ff9b::7f00:1]:" + port, "169.254.169.254:3128", "[fd00:ec2::254]:3128", "localhost:" + port} {
		for name, p := range map[string]*squid.Prober{"real": real, "fake": fake} {
			got := p.Check(ctx, tenant.Reported(), name+reported, reported, squid.Identity(uid), "")
			if got.Serving || !got.Refused || !strings.Contains(got.Message, "the backend reports the proxy's address as "+reported) || !strings.Contains(got.Message, "does not connect to") {
				t.Errorf("%s probe of %s = %+v; want refused, naming the address the backend reported", name, reported, got)
			}
		}
	}
	if c, a := n.Load(), asked.Load(); c != 0 || a != 0 {
		t.Fatalf("refused probes connected %d times and asked the fake %d times; want 0", c, a)
	}

	allowed := netguard.New(netguard.Options{Allowed: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}})
	if got := real.Check(ctx, allowed.Reported(), "allowed", addr, squid.Identity(uid), ""); !got.Serving {
		t.Errorf("probe with 127.0.0.0/8 allowed = %+v; want Serving", got)
	}
	var none *netguard.Guard
	if got := real.Check(ctx, none.Reported(), "platform", addr, squid.Identity(uid), ""); !got.Serving {
		t.Errorf("probe of the platform's config = %+v; want Serving", got)
	}
	if c := n.Load(); c != 2 {
		t.Errorf("the allowed probes connected %d times; want 2", c)
	}
}

// TestEgressCheckOfAReportedAddressIsGuarded: the egress check connects
// to the proxy at the address the backend reports; a refused one is never
// connected to, and the check's error says so.
func TestEgressCheckOfAReportedAddressIsGuarded(t *testing.T) {
	addr, n := counted(t, func(c net.Conn) { _, _ = fmt.Fprint(c, "HTTP/1.1 200 OK\r\nContent-Length: 11\r\n\r\n203.0.113.7") })
	check := proxy.EgressCheck{URL: "http://echo.example/ip", Username: squid.CheckUsername, Password: "sentinel-check-password"}
	c := &squid.EgressChecker{Wait: 20 * time.Second, Timeout: 15 * time.Second}
	got := c.Check(t.Context(), netguard.New(netguard.Options{}).Reported(), "uid", "i1", addr, check, time.Hour)
	if got.IP != "" || !strings.Contains(got.Error, "the backend reports the proxy's address as "+addr) {
		t.Errorf("egress check through a refused address = %+v; want an error naming it", got)
	}
	if k := n.Load(); k != 0 {
		t.Fatalf("the refused egress check connected %d times; want 0", k)
	}
	var none *netguard.Guard
	if got := c.Check(t.Context(), none.Reported(), "platform", "i1", addr, check, time.Hour); got.IP != "203.0.113.7" {
		t.Errorf("egress check of the platform's config = %+v; want the echo's address", got)
	}
}

// TestProbeAndEgressCheckDoNotQuoteAnswers: what answers at a proxy's
// address (a tenant's VM, or whatever the address it reported is) chooses
// the X-Cache name, the status text of an answer or of a refused CONNECT
// and the bytes of an answer that is not HTTP: none is quoted.
func TestProbeAndEgressCheckDoNotQuoteAnswers(t *testing.T) {
	ctx := context.Background()
	p := &squid.Prober{Wait: time.Minute, Timeout: 20 * time.Second}
	addr, _ := counted(t, squidAnswer(sentinel))
	if got := p.Check(ctx, nil, "k", addr, squid.Identity(uid), ""); got.Serving || strings.Contains(got.Message, sentinel) {
		t.Errorf("probe of a Squid named %s = %+v; want not Serving, not quoting the name", sentinel, got)
	}
	other := squid.Identity("0a0a0a0a-0000-4000-8000-000000000000")
	addr, _ = counted(t, squidAnswer(other))
	if got := p.Check(ctx, nil, "k2", addr, squid.Identity(uid), ""); got.Serving || !strings.Contains(got.Message, other) {
		t.Errorf("probe of another resource's Squid = %+v; want its name, one of the provider's", got)
	}

	for name, answer := range map[string]string{
		"status text":      "HTTP/1.1 502 " + sentinel + "\r\nContent-Length: 0\r\n\r\n",
		"not HTTP":         "SSH-2.0-" + sentinel + "\r\n",
		"header":           "HTTP/1.1 200 OK\r\nX-" + sentinel + ": " + sentinel + "\r\nContent-Length: 7\r\n\r\n" + sentinel,
		"connect refused":  "HTTP/1.1 403 " + sentinel + "\r\nContent-Length: 0\r\n\r\n",
		"malformed status": "HTTP/1.1 " + sentinel + "\r\n\r\n",
	} {
		addr, _ := counted(t, func(c net.Conn) { _, _ = fmt.Fprint(c, answer) })
		for _, url := range []string{"http://echo.example/ip", "https://echo.example/ip"} {
			cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			_, err := squid.AskEgress(cctx, nil, addr, proxy.EgressCheck{URL: url, Username: squid.CheckUsername, Password: "pw"})
			cancel()
			if err == nil || strings.Contains(err.Error(), sentinel) {
				t.Errorf("%s, %s: AskEgress = %v; want an error that does not quote the answer", name, url, err)
			}
		}
	}
}
