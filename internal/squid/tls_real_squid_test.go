package squid

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"io"
	"net"
	"net/http"
	"net/url"
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

// TestRealSquidTLS runs a proxy with TLS (https_port) in Debian's real
// Squid, its certificate issued by an intermediate as cert-manager's CA
// issuer does: curl (--proxy https://, --proxy-cacert) and Go's client
// (an https proxy URL, the CA in RootCAs) fetch plain http and https
// pages through it with the proxy's credentials; nothing answers plain
// HTTP on the port; a client that does not trust the CA refuses the
// proxy; the readiness probe and the egress check speak TLS and verify
// against the CA.
func TestRealSquidTLS(t *testing.T) {
	bin := squidBinary(t)
	helper := helperPath(t, bin)
	up := startUpstreams(t, nil)
	upHost := up.host.Addr.String()
	// The upstream's test certificate names example.com: Squid resolves
	// it to the test host.
	hosts, err := os.ReadFile(up.hostsFile)
	if err != nil {
		t.Fatal(err)
	}
	writeReadable(t, up.hostsFile, string(hosts)+upHost+" example.com\n")
	certs := testenv.NewCerts(t, "127.0.0.1", "proxy.example")
	tlsOf, err := LoadTLS(certs.Secret(), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	const user, pw = "team", "tls-password-0123456789"
	echo := up.plain + netnshost.EchoPath
	check := &proxy.EgressCheck{URL: echo, Username: CheckUsername, Password: "check-password-0123456789abcdef", ProxyCA: tlsOf.CA}
	sq := startSquid(t, bin, proxy.Settings{
		AllowedClientCIDRs: []string{"127.0.0.0/8"},
		AllowedPorts:       []int32{up.plainPort, up.securePort},
		Auth:               proxy.Auth{Enabled: true, Username: user, Password: pw},
		EgressCheck:        check,
		TLS:                tlsOf,
	}, up.options(helper))
	proxyURL := "https://" + user + ":" + pw + "@" + sq.addr
	secureURL := "https://" + net.JoinHostPort("example.com", strconv.Itoa(int(up.securePort))) + "/"
	dir := t.TempDir()
	caFile, upstreamCA := filepath.Join(dir, "ca.crt"), filepath.Join(dir, "upstream.crt")
	if err := os.WriteFile(caFile, []byte(tlsOf.CA), 0o600); err != nil {
		t.Fatal(err)
	}
	upstreamPEM := upstreamCertPEM(t, up)
	if err := os.WriteFile(upstreamCA, upstreamPEM, 0o600); err != nil {
		t.Fatal(err)
	}

	t.Run("curl", func(t *testing.T) {
		curl, err := exec.LookPath("curl")
		if err != nil {
			if testenv.CI() {
				t.Fatalf("curl is not installed: %v", err)
			}
			t.Skip("curl is not installed")
		}
		run := func(args ...string) (string, error) {
			cmd := exec.Command(curl, append([]string{"-q", "-sS", "--max-time", "10", "-o", "/dev/null", "-w", "%{http_code}"}, args...)...)
			cmd.Env = []string{} // no proxy or CA settings of this machine
			out, err := cmd.Output()
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				return string(out), errors.New(strings.TrimSpace(string(ee.Stderr)))
			}
			return string(out), err
		}
		if code, err := run("--proxy", proxyURL, "--proxy-cacert", caFile, up.plain); code != "200" {
			t.Errorf("curl --proxy https://... http:// page = %s, %v; want 200", code, err)
		}
		if code, err := run("--proxy", proxyURL, "--proxy-cacert", caFile, "--cacert", upstreamCA, secureURL); code != "200" {
			t.Errorf("curl --proxy https://... https:// page (CONNECT inside TLS) = %s, %v; want 200", code, err)
		}
		if code, err := run("--proxy", "https://"+sq.addr, "--proxy-cacert", caFile, up.plain); code != "407" {
			t.Errorf("curl through the TLS proxy without credentials = %s, %v; want 407", code, err)
		}
		if code, err := run("--proxy", proxyURL, up.plain); err == nil || code == "200" {
			t.Errorf("curl without the proxy's CA = %s, %v; want a certificate error", code, err)
		}
		if code, err := run("--proxy", "http://"+user+":"+pw+"@"+sq.addr, up.plain); code == "200" || code == "407" {
			t.Errorf("curl with plain http:// to the TLS port = %s, %v; want no HTTP answer", code, err)
		}
	})

	t.Run("Go", func(t *testing.T) {
		roots := x509.NewCertPool()
		roots.AppendCertsFromPEM([]byte(tlsOf.CA))
		roots.AppendCertsFromPEM(upstreamPEM)
		get := func(proxyURL, target string, roots *x509.CertPool) (int, error) {
			u, err := url.Parse(proxyURL)
			if err != nil {
				t.Fatal(err)
			}
			// One pool for the proxy and the destination: Go verifies
			// both with TLSClientConfig.
			tr := &http.Transport{Proxy: http.ProxyURL(u), DisableKeepAlives: true, TLSClientConfig: &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}}
			defer tr.CloseIdleConnections()
			resp, err := (&http.Client{Transport: tr, Timeout: 10 * time.Second}).Get(target)
			if err != nil {
				return 0, err
			}
			defer resp.Body.Close()
			_, _ = io.Copy(io.Discard, resp.Body)
			return resp.StatusCode, nil
		}
		if code, err := get(proxyURL, up.plain, roots); code != http.StatusOK {
			t.Errorf("Go, https proxy, http:// page = %d, %v; want 200", code, err)
		}
		if code, err := get(proxyURL, secureURL, roots); code != http.StatusOK {
			t.Errorf("Go, https proxy, https:// page = %d, %v; want 200", code, err)
		}
		var unknown x509.UnknownAuthorityError
		if code, err := get(proxyURL, up.plain, x509.NewCertPool()); !errors.As(err, &unknown) {
			t.Errorf("Go, https proxy, CA not trusted = %d, %v; want an unknown-authority error", code, err)
		}
	})

	t.Run("ReadinessProbe", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		defer cancel()
		if got, err := AskTLS(ctx, nil, sq.addr, tlsOf.CA); err != nil || got != Identity("") {
			t.Errorf("AskTLS = %q, %v; want %q", got, err, Identity(""))
		}
		if got, err := Ask(ctx, nil, sq.addr); err == nil {
			t.Errorf("Ask in plain HTTP of a TLS proxy = %q; want an error", got)
		}
		other := testenv.NewCerts(t, "127.0.0.1")
		if got, err := AskTLS(ctx, nil, sq.addr, other.CA); err == nil || !strings.Contains(err.Error(), "does not verify against its CA") {
			t.Errorf("AskTLS with another CA = %q, %v; want a verification error", got, err)
		}
		p := &Prober{Wait: 5 * time.Second}
		if pr := p.Check(ctx, nil, "k", sq.addr, Identity(""), tlsOf.CA); !pr.Serving {
			t.Errorf("Prober.Check with the CA = %+v; want Serving", pr)
		}
		if pr := p.Check(ctx, nil, "k", sq.addr, Identity(""), ""); pr.Serving {
			t.Errorf("Prober.Check without the CA (plain) = %+v; want not Serving", pr)
		}
	})

	t.Run("EgressCheck", func(t *testing.T) {
		if got, err := AskEgress(t.Context(), nil, sq.addr, *check); err != nil || got != up.host.Gateway.String() {
			t.Errorf("AskEgress through the TLS proxy = %q, %v; want %s", got, err, up.host.Gateway)
		}
		plain := *check
		plain.ProxyCA = ""
		if got, err := AskEgress(t.Context(), nil, sq.addr, plain); err == nil {
			t.Errorf("AskEgress in plain HTTP to the TLS proxy = %q; want an error", got)
		}
	})

	// Squid's log shows neither the password nor the key.
	b, _ := os.ReadFile(sq.log)
	for _, secret := range []string{pw, strings.Split(tlsOf.Key, "\n")[1]} {
		if strings.Contains(string(b), secret) {
			t.Errorf("Squid's output holds a secret")
		}
	}
}

// upstreamCertPEM is the PEM of the upstreams' HTTPS test certificate.
func upstreamCertPEM(t *testing.T, up *upstreams) []byte {
	t.Helper()
	conn, err := tls.Dial("tcp", net.JoinHostPort(up.host.Addr.String(), strconv.Itoa(int(up.securePort))), &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // Only to read the test's own certificate.
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: conn.ConnectionState().PeerCertificates[0].Raw})
}
