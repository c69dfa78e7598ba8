package squid

import (
	"encoding/base64"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/egressproxy/provider-egressproxy/internal/devenv/netnshost"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

// TestRealSquidEgressCheck runs the egress check's rules in real squids:
// the check's credential fetches the echo endpoint from an address that
// is not among the clients, and the address the endpoint reports is the
// one the upstream saw (the test host's side of the veth pair, not the
// loopback address the proxy listens on); the same credential gets nothing
// else, the proxy stays closed to everyone else, and the destination
// denials still hold for the check.
func TestRealSquidEgressCheck(t *testing.T) {
	bin := squidBinary(t)
	helper := helperPath(t, bin)
	up := startUpstreams(t, nil)
	echo := up.plain + netnshost.EchoPath
	const checkPassword = "check-password-0123456789abcdef"
	check := &proxy.EgressCheck{URL: echo, Username: CheckUsername, Password: checkPassword}
	wantIP := up.host.Gateway.String()
	if wantIP == "127.0.0.1" {
		t.Fatalf("the test host sees requests from %s; the test needs an egress address that differs from the proxy's", wantIP)
	}

	// The proxy's clients are elsewhere: the test (on loopback) is not one,
	// as the provider usually is not. Its echo port is not an allowed port.
	closed := startSquid(t, bin, proxy.Settings{
		AllowedClientCIDRs:  []string{"192.0.2.0/24"},
		AllowedDestinations: []string{"other.test"},
		EgressCheck:         check,
	}, up.options(helper))
	asCheck := &url.URL{Scheme: "http", Host: closed.addr, User: url.UserPassword(CheckUsername, checkPassword)}
	anonymous := &url.URL{Scheme: "http", Host: closed.addr}

	got, err := AskEgress(t.Context(), nil, closed.addr, *check)
	if err != nil || got != wantIP {
		t.Errorf("AskEgress through a proxy the provider is no client of = %q, %v; want %s, the address the upstream saw", got, err, wantIP)
	}
	expect(t, "check credential, another path of the echo host", client{proxy: asCheck}.get(t, up.plain+"/other"), 403)
	expect(t, "check credential, the echo URL with a query", client{proxy: asCheck}.get(t, echo+"?x=1"), 403)
	expect(t, "check credential, a tunnel to the echo host", client{proxy: asCheck, roots: up.roots}.get(t, up.secure), 403)
	expect(t, "no credential, another URL", client{proxy: anonymous}.get(t, up.plain+"/other"), 403)
	// The one URL where a stranger is asked for credentials.
	expect(t, "no credential, the echo URL", client{proxy: anonymous}.get(t, echo), 407)
	wrong := &proxy.EgressCheck{URL: echo, Username: CheckUsername, Password: "wrong"}
	if got, err := AskEgress(t.Context(), nil, closed.addr, *wrong); err == nil || !strings.Contains(err.Error(), "407") {
		t.Errorf("AskEgress with a wrong password = %q, %v; want a 407", got, err)
	}

	// A check URL the destination denials refuse stays refused.
	loop := startSquid(t, bin, proxy.Settings{
		AllowedClientCIDRs: []string{"192.0.2.0/24"},
		EgressCheck:        &proxy.EgressCheck{URL: "http://127.0.0.1:9/ip", Username: CheckUsername, Password: checkPassword},
	}, up.options(helper))
	if got, err := AskEgress(t.Context(), nil, loop.addr, proxy.EgressCheck{URL: "http://127.0.0.1:9/ip", Username: CheckUsername, Password: checkPassword}); err == nil || !strings.Contains(err.Error(), "403") {
		t.Errorf("AskEgress to a loopback echo URL = %q, %v; want the proxy's 403", got, err)
	}

	// With the proxy's own user: the check's credential is not the user's.
	const user, pw = "team", "team-password-0123456789"
	open := startSquid(t, bin, proxy.Settings{
		AllowedClientCIDRs: []string{"127.0.0.0/8"},
		AllowedPorts:       []int32{up.plainPort},
		Auth:               proxy.Auth{Enabled: true, Username: user, Password: pw},
		EgressCheck:        check,
	}, up.options(helper))
	asCheck.Host = open.addr
	asUser := &url.URL{Scheme: "http", Host: open.addr, User: url.UserPassword(user, pw)}
	if got, err := AskEgress(t.Context(), nil, open.addr, *check); err != nil || got != wantIP {
		t.Errorf("AskEgress with auth on = %q, %v; want %s", got, err, wantIP)
	}
	expect(t, "check credential from a client, another URL", client{proxy: asCheck}.get(t, up.plain+"/other"), 407)
	expect(t, "the user from a client", client{proxy: asUser}.get(t, up.plain+"/other"), 200)
	expect(t, "no credential from a client", client{proxy: &url.URL{Scheme: "http", Host: open.addr}}.get(t, up.plain+"/other"), 407)
	expect(t, "a wrong password from a client", client{proxy: &url.URL{Scheme: "http", Host: open.addr, User: url.UserPassword(user, "nope")}}.get(t, up.plain+"/other"), 407)
}

// TestRealSquidLogsNoSecrets reads everything a real Squid logged (its
// access log on stdout, where kubectl logs shows a PodProxy's, and its own
// messages) after requests with the right, a wrong and the check's
// credentials: an access line per request, with the user's name, and
// never a password or a Proxy-Authorization value.
func TestRealSquidLogsNoSecrets(t *testing.T) {
	bin := squidBinary(t)
	helper := helperPath(t, bin)
	up := startUpstreams(t, nil)
	const user, pw, checkPW = "team", "sentinel-user-password-41", "sentinel-check-password-42"
	check := proxy.EgressCheck{URL: up.plain + netnshost.EchoPath, Username: CheckUsername, Password: checkPW}
	sq := startSquid(t, bin, proxy.Settings{
		AllowedClientCIDRs: []string{"127.0.0.0/8"},
		AllowedPorts:       []int32{up.plainPort},
		Auth:               proxy.Auth{Enabled: true, Username: user, Password: pw},
		EgressCheck:        &check,
	}, up.options(helper))
	as := func(u, p string) client {
		return client{proxy: &url.URL{Scheme: "http", Host: sq.addr, User: url.UserPassword(u, p)}}
	}
	expect(t, "the user", as(user, pw).get(t, up.plain+"/logged"), 200)
	expect(t, "a wrong password", as(user, pw+"-wrong").get(t, up.plain+"/logged"), 407)
	if _, err := AskEgress(t.Context(), nil, sq.addr, check); err != nil {
		t.Fatal(err)
	}
	// Squid writes an access line when a transaction ends; give it a moment.
	var log string
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		b, _ := os.ReadFile(sq.log)
		log = string(b)
		if strings.Count(log, "/logged") >= 2 && strings.Contains(log, netnshost.EchoPath) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if strings.Count(log, "/logged") < 2 || !strings.Contains(log, " "+user+" ") || !strings.Contains(log, " "+CheckUsername+" ") {
		t.Errorf("the access log lacks a line per request with its user:\n%s", log)
	}
	for _, secret := range []string{pw, checkPW,
		base64.StdEncoding.EncodeToString([]byte(user + ":" + pw)),
		base64.StdEncoding.EncodeToString([]byte(CheckUsername + ":" + checkPW)),
		"Proxy-Authorization", "Basic "} {
		if strings.Contains(log, secret) {
			t.Errorf("Squid's log holds %q:\n%s", secret, log)
		}
	}
}
