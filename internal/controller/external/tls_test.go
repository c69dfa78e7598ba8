package external

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/crossplane/crossplane-runtime/v2/pkg/test"
	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
	corev1 "k8s.io/api/core/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	nsproxy "github.com/egressproxy/provider-egressproxy/apis/namespaced/proxy/v1alpha1"
	spec "github.com/egressproxy/provider-egressproxy/apis/spec/v1alpha1"
	"github.com/egressproxy/provider-egressproxy/internal/devenv/testenv"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
	"github.com/egressproxy/provider-egressproxy/internal/proxy/proxytest"
	"github.com/egressproxy/provider-egressproxy/internal/telemetry/otlptest"
)

// secretsIn is a client whose Secrets are secrets ("namespace/name"),
// recording every Secret it was asked for.
func secretsIn(secrets map[string]map[string][]byte, asked *[]string) *test.MockClient {
	return &test.MockClient{
		MockGet: func(_ context.Context, key client.ObjectKey, obj client.Object) error {
			*asked = append(*asked, key.String())
			s, ok := obj.(*corev1.Secret)
			data, found := secrets[key.String()]
			if !ok || !found {
				return kerrors.NewNotFound(schema.GroupResource{Resource: "secrets"}, key.Name)
			}
			s.Name, s.Namespace, s.Data = key.Name, key.Namespace, data
			return nil
		},
		MockStatusPatch: test.NewMockSubResourcePatchFn(nil),
	}
}

func withTLS(ref spec.SecretReference) func(*nsproxy.KVMProxy) {
	return func(cr *nsproxy.KVMProxy) {
		cr.Spec.ForProvider.Proxy.TLS = &spec.ProxyTLS{SecretRef: ref}
		cr.Spec.ForProvider.Proxy.Auth = &spec.ProxyAuth{Enabled: true, Username: "team"}
	}
}

// TestProxyTLS: a namespaced proxy's TLS Secret is read from its own
// namespace, whatever its ref says; the driver gets the certificate, key
// and CA, the readiness probe the CA (Ref.ProxyCA), and the connection
// Secret an https:// URL and ca.crt, never the key; a broken Secret is a
// Permanent error naming the field and the Secret's key, and the key
// material is in no error, event, condition or span.
func TestProxyTLS(t *testing.T) {
	certs := testenv.NewCerts(t, "10.0.0.5")
	other := testenv.NewCerts(t, "10.0.0.5")
	keyLine := strings.Split(certs.Key, "\n")[1]
	otherKeyLine := strings.Split(other.Key, "\n")[1]

	t.Run("ReadFromTheResourcesNamespace", func(t *testing.T) {
		var asked []string
		kube := secretsIn(map[string]map[string][]byte{"team-a/proxy-tls": certs.Secret(), "other/proxy-tls": other.Secret()}, &asked)
		mem := proxytest.NewMemory("memory", "proxytest-installation")
		e := newExternal(testKind(nil), mem, kube)
		e.secrets = Secrets{Kube: kube, Namespace: "team-a"}
		// A namespace in the ref (admission refuses it) changes nothing.
		cr := proxyResource(withTLS(spec.SecretReference{Namespace: "other", Name: "proxy-tls"}))
		c, err := e.Create(context.Background(), cr)
		if err != nil {
			t.Fatal(err)
		}
		if fmt.Sprint(asked) != "[team-a/proxy-tls]" {
			t.Errorf("Secrets read: %v; want team-a/proxy-tls alone", asked)
		}
		req, _ := mem.Spec(testName)
		if tl := req.Proxy.TLS; tl == nil || tl.Cert != certs.Chain || tl.Key != certs.Key || !strings.HasPrefix(tl.CA, certs.CA) {
			t.Fatalf("the driver got TLS %v; want the Secret's certificate, key and CA", tl)
		}
		if err := mem.Settle(cr.Status.AtProvider.ID); err != nil {
			t.Fatal(err)
		}
		obs, err := e.Observe(context.Background(), cr)
		if err != nil {
			t.Fatal(err)
		}
		d := obs.ConnectionDetails
		if d == nil {
			d = c.ConnectionDetails
		}
		if u := string(d[spec.ConnectionURL]); !strings.HasPrefix(u, "https://team:") || string(d[spec.ConnectionCA]) != req.Proxy.TLS.CA {
			t.Errorf("connection Secret url %q, ca.crt is the CA %v; want https:// and the CA", u, string(d[spec.ConnectionCA]) == req.Proxy.TLS.CA)
		}
		for k, v := range d {
			if strings.Contains(string(v), keyLine) {
				t.Errorf("connection Secret key %s holds the private key", k)
			}
		}
		if r := ref(cr, req, cr.Observation()); r.ProxyCA != req.Proxy.TLS.CA {
			t.Errorf("Ref.ProxyCA is not the proxy's CA: the readiness probe would not speak TLS")
		}
		if c := cr.GetCondition(spec.TypeSecure); c.Status != corev1.ConditionTrue || c.Reason != reasonSecureTLS {
			t.Errorf("Secure = %s %s %q; want True TLS", c.Status, c.Reason, c.Message)
		}
	})

	t.Run("BrokenSecret", func(t *testing.T) {
		rec := otlptest.Record(t)
		broken := certs.Secret()
		broken["tls.key"] = []byte(other.Key)
		var asked []string
		kube := secretsIn(map[string]map[string][]byte{"team-a/proxy-tls": broken}, &asked)
		mem := proxytest.NewMemory("memory", "proxytest-installation")
		e := newExternal(testKind(nil), mem, kube)
		e.secrets = Secrets{Kube: kube, Namespace: "team-a"}
		r := &recorder{}
		e.record = r
		cr := proxyResource(withTLS(spec.SecretReference{Name: "proxy-tls"}))
		_, err := e.Create(context.Background(), cr)
		want := "spec.forProvider.proxy.tls.secretRef: Secret team-a/proxy-tls: tls.key is not the private key of the first certificate in tls.crt"
		if err == nil || !strings.Contains(err.Error(), want) || !proxy.IsPermanent(err) {
			t.Fatalf("Create with another key in tls.key = %v; want a Permanent error containing %q", err, want)
		}
		if _, ok := mem.Spec(testName); ok {
			t.Errorf("an instance was created from a broken TLS Secret")
		}
		texts := []string{err.Error(), fmt.Sprint(r.reasons), fmt.Sprintf("%+v", cr.Status)}
		for _, s := range rec.Ended() {
			for _, a := range s.Attributes() {
				texts = append(texts, a.Value.String())
			}
			for _, ev := range s.Events() {
				texts = append(texts, fmt.Sprint(ev.Attributes))
			}
		}
		for _, s := range texts {
			if strings.Contains(s, keyLine) || strings.Contains(s, otherKeyLine) || strings.Contains(s, "PRIVATE KEY") {
				t.Errorf("key material in %q", s)
			}
		}
	})
}

// TestSecureCondition: auth without TLS on a public listener is
// Secure=False naming spec.forProvider.proxy.tls, with a Warning event
// once; TLS, no auth or a private listener are Secure=True.
func TestSecureCondition(t *testing.T) {
	public := testKind(nil)
	public.PublicListener = func(*spec.KVMProxyParameters) string { return "a LoadBalancer Service" }
	auth := proxy.Request{Proxy: proxy.Settings{Auth: proxy.Auth{Enabled: true}}}
	tlsAuth := auth
	tlsAuth.Proxy.TLS = &proxy.TLS{}
	for name, tc := range map[string]struct {
		kind       Kind[spec.KVMProxyParameters]
		ip         string
		req        proxy.Request
		status     corev1.ConditionStatus
		reason     xpv2.ConditionReason
		wantEvents []string
	}{
		"AuthPublicListener":     {kind: public, ip: "10.0.0.5", req: auth, status: corev1.ConditionFalse, reason: reasonCredentialsInClear, wantEvents: []string{"Warning CredentialsInClear"}},
		"AuthPublicIP":           {kind: testKind(nil), ip: "34.1.2.3", req: auth, status: corev1.ConditionFalse, reason: reasonCredentialsInClear, wantEvents: []string{"Warning CredentialsInClear"}},
		"AuthPrivateIP":          {kind: testKind(nil), ip: "192.168.1.5", req: auth, status: corev1.ConditionTrue, reason: reasonNoCredentialsExposed},
		"AuthCarrierGradeNAT":    {kind: testKind(nil), ip: "100.64.1.5", req: auth, status: corev1.ConditionTrue, reason: reasonNoCredentialsExposed},
		"TLSPublicListener":      {kind: public, ip: "34.1.2.3", req: tlsAuth, status: corev1.ConditionTrue, reason: reasonSecureTLS},
		"NoAuthPublicListener":   {kind: public, ip: "34.1.2.3", req: proxy.Request{}, status: corev1.ConditionTrue, reason: reasonNoCredentialsExposed},
		"AuthPublicNoAddressYet": {kind: public, req: auth, status: corev1.ConditionFalse, reason: reasonCredentialsInClear, wantEvents: []string{"Warning CredentialsInClear"}},
	} {
		t.Run(name, func(t *testing.T) {
			r := &recorder{}
			e := newExternal(tc.kind, nil, nil)
			e.record = r
			cr := proxyResource()
			for range 2 { // the second reconcile records nothing new
				e.setSecure(cr, proxy.Instance{IP: tc.ip}, tc.req)
			}
			c := cr.GetCondition(spec.TypeSecure)
			if c.Status != tc.status || c.Reason != tc.reason || c.ObservedGeneration != 3 {
				t.Errorf("Secure = %s %s (generation %d) %q; want %s %s", c.Status, c.Reason, c.ObservedGeneration, c.Message, tc.status, tc.reason)
			}
			if c.Status == corev1.ConditionFalse && !strings.Contains(c.Message, "spec.forProvider.proxy.tls") {
				t.Errorf("Secure=False message %q does not name spec.forProvider.proxy.tls", c.Message)
			}
			if fmt.Sprint(r.reasons) != fmt.Sprint(tc.wantEvents) {
				t.Errorf("events %v; want %v", r.reasons, tc.wantEvents)
			}
		})
	}
}
