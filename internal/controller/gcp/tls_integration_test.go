package gcp_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
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

	nsproxy "github.com/egressproxy/provider-egressproxy/apis/namespaced/proxy/v1alpha1"
	spec "github.com/egressproxy/provider-egressproxy/apis/spec/v1alpha1"
	"github.com/egressproxy/provider-egressproxy/internal/devenv/testenv"
	"github.com/egressproxy/provider-egressproxy/internal/devenv/testenv/providerenv"
)

// tlsOnTheExternalAddress: a GCPProxy on an ephemeral external address
// with auth and no TLS is Secure=False, naming spec.forProvider.proxy.tls,
// with a Warning event. With proxy.tls added, the instance restarts onto
// the metadata carrying the certificate and key, its real Squid (the
// fake's, from that metadata) listens with https_port, the proxy is
// Secure=True, and curl and a Go client fetch through the https:// URL
// of the connection Secret, verifying the proxy by its address against
// the Secret's ca.crt.
func tlsOnTheExternalAddress(t *testing.T, e *env) {
	ctx := context.Background()
	e.srv.RunSquid(providerenv.RequireSquid(t))
	defer e.srv.RunSquid("")
	u, err := url.Parse(e.upstream)
	if err != nil {
		t.Fatal(err)
	}
	upPort, _ := strconv.Atoi(u.Port())
	port := testenv.FreePort(t)
	p := nsProxy("tls-ext", port, func(p *nsproxy.GCPProxy) {
		p.Spec.ForProvider.Proxy.AllowedClientCIDRs = []string{"127.0.0.0/8"}
		p.Spec.ForProvider.Proxy.AllowedPorts = []int32{443, int32(upPort)} //nolint:gosec // a port.
	})
	if err := e.Kube.Create(ctx, p); err != nil {
		t.Fatal(err)
	}
	c := e.WaitForCondition(t, p, spec.TypeSecure, corev1.ConditionFalse, "spec.forProvider.proxy.tls")
	if c.Reason != "CredentialsInClear" {
		t.Errorf("Secure reason %s; want CredentialsInClear", c.Reason)
	}
	e.WaitEvent(t, "team-a", p.Name, corev1.EventTypeWarning, "CredentialsInClear", "auth is on, but the proxy listens on an external address")

	// The fake hands out ephemeral addresses in 127.0.1.0/24: a
	// certificate for all of them names the proxy's.
	var hosts []string
	for i := 1; i < 255; i++ {
		hosts = append(hosts, fmt.Sprintf("127.0.1.%d", i))
	}
	certs := testenv.NewCerts(t, hosts...)
	sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "tls-ext-cert"}, Type: corev1.SecretTypeTLS, Data: certs.Secret()}
	if err := e.Kube.Create(ctx, sec); err != nil {
		t.Fatal(err)
	}
	e.Update(t, p, func() {
		p.Spec.ForProvider.Proxy.TLS = &spec.ProxyTLS{SecretRef: spec.SecretReference{Name: sec.Name}}
	})
	e.WaitForCondition(t, p, spec.TypeSecure, corev1.ConditionTrue, "TLS")
	var d map[string]string
	testenv.WaitFor(t, "an https:// connection Secret", 60*time.Second, func() (bool, string) {
		s := &corev1.Secret{}
		if err := e.Kube.Get(ctx, types.NamespacedName{Namespace: "team-a", Name: "tls-ext-conn"}, s); err != nil {
			return false, err.Error()
		}
		d = map[string]string{}
		for k, v := range s.Data {
			d[k] = string(v)
		}
		return strings.HasPrefix(d["url"], "https://") && strings.HasPrefix(d["ca.crt"], certs.CA), d["url"]
	})
	e.WaitForCondition(t, p, xpv2.TypeReady, corev1.ConditionTrue, "")
	// The warning was recorded once, by Create: the condition it set
	// survived the annotation update, so the first Observe found it.
	warned := int32(0)
	for _, ev := range e.Events(t, "team-a", p.Name) {
		if ev.Reason == "CredentialsInClear" {
			warned += max(ev.Count, 1)
		}
	}
	if warned != 1 {
		for _, ev := range e.Events(t, "team-a", p.Name) {
			t.Logf("event %s %s x%d first %s last %s: %s", ev.Type, ev.Reason, ev.Count, ev.FirstTimestamp, ev.LastTimestamp, ev.Message)
		}
		t.Errorf("the CredentialsInClear warning was recorded %d times; want once", warned)
	}

	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM([]byte(d["ca.crt"]))
	pu, err := url.Parse(d["url"])
	if err != nil {
		t.Fatal(err)
	}
	var body string
	testenv.WaitFor(t, "a Go client to fetch through the TLS proxy", 60*time.Second, func() (bool, string) {
		tr := &http.Transport{Proxy: http.ProxyURL(pu), DisableKeepAlives: true, TLSClientConfig: &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}}
		defer tr.CloseIdleConnections()
		resp, err := (&http.Client{Transport: tr, Timeout: 10 * time.Second}).Get(e.upstream)
		if err != nil {
			return false, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		body = string(b)
		return resp.StatusCode == http.StatusOK, resp.Status
	})
	if body != testenv.UpstreamBody {
		t.Errorf("Go client through the TLS proxy got %q", body)
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
}
