package proxmox_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
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

	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	nsproxy "github.com/egressproxy/provider-egressproxy/apis/namespaced/proxy/v1alpha1"
	spec "github.com/egressproxy/provider-egressproxy/apis/spec/v1alpha1"
	"github.com/egressproxy/provider-egressproxy/internal/devenv/testenv"
	"github.com/egressproxy/provider-egressproxy/internal/devenv/testenv/providerenv"
)

// tlsToTheProxy: a ProxmoxProxy with proxy.tls on the fake,
// whose guest runs real Squid from its seed. The first certificate names
// another host (the guest's address is not known before it boots): the
// provider's probe, which verifies the chain and not the name, finds it
// Ready. The team then renews the Secret with a certificate for the
// guest's address: the VM gets a new seed and reboots, and curl
// (--proxy https://, --proxy-cacert) and a Go client with the connection
// Secret's ca.crt fetch a page through it with its credentials.
func tlsToTheProxy(t *testing.T, e *env) {
	ctx := context.Background()
	first := testenv.NewCerts(t, "placeholder.example")
	sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "pve-proxy-tls"}, Type: corev1.SecretTypeTLS, Data: first.Secret()}
	if err := e.Kube.Create(ctx, sec); err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(e.upstream)
	if err != nil {
		t.Fatal(err)
	}
	upPort, _ := strconv.Atoi(u.Port())
	p := &nsproxy.ProxmoxProxy{
		ObjectMeta: metav1.ObjectMeta{Name: "tls", Namespace: "team-a"},
		Spec: nsproxy.ProxmoxProxySpec{
			ManagedResourceSpec: providerenv.ManagedSpec("home-pve", "tls-proxy"),
			ForProvider: spec.ProxmoxProxyParameters{Node: "pve1", Proxy: spec.ProxySettings{
				AllowedClientCIDRs: []string{"127.0.0.0/8"},
				AllowedPorts:       []int32{443, int32(upPort)}, //nolint:gosec // a port.
				Auth:               &spec.ProxyAuth{Enabled: true},
				TLS:                &spec.ProxyTLS{SecretRef: spec.SecretReference{Name: sec.Name}},
			}},
		},
	}
	if err := e.Kube.Create(ctx, p); err != nil {
		t.Fatal(err)
	}
	e.WaitReady(t, p)
	if c := p.GetCondition(spec.TypeSecure); c.Status != corev1.ConditionTrue || c.Reason != "TLS" {
		t.Errorf("Secure = %s %s; want True TLS", c.Status, c.Reason)
	}
	ip := p.Status.AtProvider.IP

	renewed := testenv.NewCerts(t, ip)
	sec.Data = renewed.Secret()
	if err := e.Kube.Update(ctx, sec); err != nil {
		t.Fatal(err)
	}
	var d map[string]string
	testenv.WaitFor(t, "the connection Secret to carry the renewed CA", 60*time.Second, func() (bool, string) {
		s := &corev1.Secret{}
		if err := e.Kube.Get(ctx, types.NamespacedName{Namespace: "team-a", Name: "tls-proxy"}, s); err != nil {
			return false, err.Error()
		}
		d = map[string]string{}
		for k, v := range s.Data {
			d[k] = string(v)
		}
		return strings.HasPrefix(d["ca.crt"], renewed.CA), "still the first CA"
	})
	e.WaitForCondition(t, p, xpv2.TypeReady, corev1.ConditionTrue, "")
	if want := "https://proxy:" + d["password"] + "@" + net.JoinHostPort(ip, d["port"]); d["url"] != want {
		t.Errorf("connection Secret url %q; want https:// with the credentials", d["url"])
	}

	// The renewed certificate is served once the VM rebooted onto its seed.
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM([]byte(d["ca.crt"]))
	pu, err := url.Parse(d["url"])
	if err != nil {
		t.Fatal(err)
	}
	var got string
	testenv.WaitFor(t, "a Go client to fetch through the TLS proxy", 60*time.Second, func() (bool, string) {
		tr := &http.Transport{Proxy: http.ProxyURL(pu), DisableKeepAlives: true, TLSClientConfig: &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}}
		defer tr.CloseIdleConnections()
		resp, err := (&http.Client{Transport: tr, Timeout: 10 * time.Second}).Get(e.upstream)
		if err != nil {
			return false, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		got = string(b)
		return resp.StatusCode == http.StatusOK, resp.Status
	})
	if got != testenv.UpstreamBody {
		t.Errorf("Go client through the TLS proxy got %q", got)
	}
	caFile := filepath.Join(t.TempDir(), "ca.crt")
	if err := os.WriteFile(caFile, []byte(d["ca.crt"]), 0o600); err != nil {
		t.Fatal(err)
	}
	curl, err := exec.LookPath("curl")
	if err != nil {
		t.Fatalf("curl: %v", err)
	}
	cmd := exec.Command(curl, "-q", "-sS", "--max-time", "10", "--proxy", d["url"], "--proxy-cacert", caFile, e.upstream)
	cmd.Env = []string{}
	if out, err := cmd.Output(); err != nil || string(out) != testenv.UpstreamBody {
		t.Errorf("curl --proxy https://... = %q, %v", out, err)
	}

	if err := e.Kube.Delete(ctx, p); err != nil {
		t.Fatal(err)
	}
	e.WaitGone(t, p)
	_ = e.Kube.Delete(ctx, sec, &client.DeleteOptions{})
}
