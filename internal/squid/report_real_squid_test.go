package squid

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/egressproxy/provider-egressproxy/internal/devenv/netnshost"
	"github.com/egressproxy/provider-egressproxy/internal/devenv/testenv"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

// TestRealSquidReportScript runs the check from inside an instance as an
// instance runs it (bash -c ReportScript, the request file ReportRequest
// writes) against a real Squid whose clients are elsewhere: the line it
// prints parses to the address the upstream saw; with a wrong password
// it reports Squid's 407, and against a port where nothing listens 000,
// neither of which publishes an address.
func TestRealSquidReportScript(t *testing.T) {
	bin := squidBinary(t)
	helper := helperPath(t, bin)
	up := startUpstreams(t, nil)
	const checkPassword = "check-password-0123456789abcdef"
	check := proxy.EgressCheck{URL: up.plain + netnshost.EchoPath, Username: CheckUsername, Password: checkPassword}
	sq := startSquid(t, bin, proxy.Settings{
		AllowedClientCIDRs: []string{"192.0.2.0/24"},
		EgressCheck:        &check,
	}, up.options(helper))
	host, port, _ := strings.Cut(sq.addr, ":")

	run := func(c proxy.EgressCheck, port string) (Report, string) {
		t.Helper()
		req, err := ReportRequest(c)
		if err != nil {
			t.Fatal(err)
		}
		file := filepath.Join(t.TempDir(), "request")
		if err := os.WriteFile(file, []byte(req), 0o600); err != nil {
			t.Fatal(err)
		}
		before := time.Now().Add(-time.Second)
		out, _ := exec.CommandContext(t.Context(), "bash", "-c", ReportScript, "egress-check", file, port, host).Output()
		if strings.Contains(string(out), checkPassword) {
			t.Errorf("the report holds the check's password: %q", out)
		}
		if n := strings.Count(string(out), "\n"); n != 1 {
			t.Fatalf("the script printed %d lines, want 1: %q", n, out)
		}
		r, err := ParseReport(out)
		if err != nil {
			t.Fatalf("ParseReport(%q): %v", out, err)
		}
		if r.At.Before(before.Truncate(time.Second)) || r.At.After(time.Now()) {
			t.Errorf("report time %v; want now", r.At)
		}
		return r, string(out)
	}
	want := up.host.Gateway.String()
	if r, out := run(check, port); r.IP != want || r.Failure != "" {
		t.Errorf("report %q = %+v; want %s, the address the upstream saw", out, r, want)
	}
	wrong := check
	wrong.Password = "wrong"
	if r, out := run(wrong, port); r.IP != "" || !strings.Contains(r.Failure, "407") {
		t.Errorf("report with a wrong password %q = %+v; want the 407 as a failure", out, r)
	}
	if r, out := run(check, strconv.Itoa(freePort(t))); r.IP != "" || r.Failure == "" {
		t.Errorf("report with no Squid %q = %+v; want a failure", out, r)
	}

	// A proxy listening with TLS only: the check from inside reaches it on
	// its plain loopback listener (ReportPort), and the TLS port answers
	// the script nothing it could take for an address.
	certs := testenv.NewCerts(t, "127.0.0.1")
	tlsOf, err := LoadTLS(certs.Secret(), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	tlsCheck := check
	tlsCheck.ProxyCA = tlsOf.CA
	s := proxy.Settings{AllowedClientCIDRs: []string{"192.0.2.0/24"}, EgressCheck: &tlsCheck, TLS: tlsOf}
	tq := startSquid(t, bin, s, up.options(helper))
	_, tlsPort, _ := strings.Cut(tq.addr, ":")
	n, _ := strconv.Atoi(tlsPort)
	s.Port = int32(n) //nolint:gosec // a port.
	if r, out := run(tlsCheck, strconv.Itoa(int(ReportPort(s)))); r.IP != want || r.Failure != "" {
		t.Errorf("report through the TLS proxy's loopback listener %q = %+v; want %s", out, r, want)
	}
	if r, out := run(tlsCheck, tlsPort); r.IP != "" {
		t.Errorf("report against the TLS port in clear %q = %+v; want no address", out, r)
	}
}

// freePort is a loopback port nothing listens on (a moment ago).
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = l.Close() }()
	return l.Addr().(*net.TCPAddr).Port //nolint:forcetypeassert // A TCP listener.
}
