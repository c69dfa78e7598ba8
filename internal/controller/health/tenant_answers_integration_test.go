package health_test

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	nsv1alpha1 "github.com/egressproxy/provider-egressproxy/apis/namespaced/v1alpha1"
	spec "github.com/egressproxy/provider-egressproxy/apis/spec/v1alpha1"
	pcontroller "github.com/egressproxy/provider-egressproxy/internal/controller"
	"github.com/egressproxy/provider-egressproxy/internal/controller/health"
	"github.com/egressproxy/provider-egressproxy/internal/devenv/testenv/providerenv"
)

// answerSentinel is a tenant's endpoint (over TLS or not) that answers everything with
// sentinel: in its headers, in every string of the data it answers at the
// paths of data, and in the message of an error everywhere else.
func answerSentinel(t *testing.T, tls bool, sentinel string, data map[string]string, errorBody string) *httptest.Server {
	t.Helper()
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-"+sentinel, sentinel)
		w.Header().Set("Content-Type", "application/json")
		if d, ok := data[r.URL.Path]; ok {
			_, _ = fmt.Fprint(w, d)
			return
		}
		w.WriteHeader(http.StatusForbidden)
		_, _ = fmt.Fprint(w, errorBody)
	}))
	if tls {
		srv.StartTLS()
	} else {
		srv.Start()
	}
	t.Cleanup(srv.Close)
	return srv
}

// TestIntegrationTenantEndpointAnswersNotQuoted: a tenant's namespaced
// ProviderConfigs name endpoints (allowed for tenants, here loopback)
// that answer a sentinel everywhere: a Proxmox API in its version, its
// node's state, its templates' node, its error messages and headers; an
// API server in its version, its refusals and headers; a key file's
// token_uri in its error. Each config's health is checked and is
// unhealthy, and the sentinel appears nowhere: not in the config (its
// status, conditions, target details), not in an event, not in the
// provider's log.
func TestIntegrationTenantEndpointAnswersNotQuoted(t *testing.T) {
	const sentinel = "SENTINEL-c0ffee"
	const ns = "team-answers"
	e := providerenv.Start(t, providerenv.Options{
		Namespaces: []string{ns},
		Health:     pcontroller.HealthOptions{Interval: 2 * time.Second, Timeout: 10 * time.Second},
	})
	pve := answerSentinel(t, true, sentinel, map[string]string{
		"/api2/json/version":           `{"data":{"version":"8.2.4-` + sentinel + `","release":"` + sentinel + `"}}`,
		"/api2/json/cluster/resources": `{"data":[{"type":"node","node":"pve1","status":"` + sentinel + `"},{"type":"qemu","vmid":9000,"node":"` + sentinel + `","template":1,"name":"` + sentinel + `"}]}`,
	}, `{"data":null,"message":"`+sentinel+`","errors":{"node":"`+sentinel+`"}}`)
	kube := answerSentinel(t, true, sentinel, map[string]string{
		"/version": `{"major":"1","minor":"31","gitVersion":"v1.31.0-` + sentinel + `","platform":"` + sentinel + `"}`,
	}, `{"kind":"Status","apiVersion":"v1","status":"Failure","message":"`+sentinel+`","reason":"Forbidden","details":{"name":"`+sentinel+`"},"code":403}`)
	token := answerSentinel(t, false, sentinel, nil, `{"error":"`+sentinel+`","error_description":"`+sentinel+`"}`)

	rsaKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	gcpKey, _ := json.Marshal(map[string]string{
		"type": "service_account", "project_id": "tenant-project", "client_email": "sa@tenant-project.iam.gserviceaccount.com", "private_key_id": "1",
		"private_key": string(pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(rsaKey)})),
		"token_uri":   token.URL + "/token",
	})
	kubeconfig := fmt.Sprintf("apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: %q, insecure-skip-tls-verify: true}}]\nusers: [{name: u, user: {token: abc}}]\ncontexts: [{name: x, context: {cluster: c, user: u}}]\ncurrent-context: x\n", kube.URL)
	e.Create(t, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "creds"}, Data: map[string][]byte{
		"token":      []byte("root@pam!t=00000000-0000-0000-0000-000000000000"),
		"ca.pem":     pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: pve.Certificate().Raw}),
		"kubeconfig": []byte(kubeconfig),
		"key.json":   gcpKey,
	}})
	ref := func(k string) *spec.SecretKeySelector { return &spec.SecretKeySelector{Name: "creds", Key: k} }
	configs := map[string]spec.ProviderConfigSpec{
		"proxmox": {Proxmox: &spec.ProxmoxConfig{
			URL:         pve.URL,
			Credentials: spec.ProxmoxCredentials{TokenSecretRef: *ref("token"), CASecretRef: ref("ca.pem")},
			Nodes:       []string{"pve1"}, ISOStorage: "local", Templates: map[string]spec.ProxmoxTemplate{"debian-12": {VMID: 9000}},
			MachineTypes: map[string]spec.ProxmoxMachineType{"small": {Cores: 1, MemoryMiB: 512}},
		}},
		"kubernetes": {Kubernetes: &spec.KubernetesConfig{
			Credentials: spec.KubernetesCredentials{Source: xpv2.CredentialsSourceSecret, SecretRef: ref("kubeconfig")},
			Namespace:   "proxies",
		}},
		"gcp": {GCP: &spec.GCPConfig{
			Project:      "tenant-project",
			Credentials:  spec.GCPCredentials{Source: xpv2.CredentialsSourceSecret, SecretRef: ref("key.json")},
			Zones:        []string{"europe-west1-b"},
			Images:       map[string]spec.GCPImage{"debian": {Image: "projects/debian-cloud/global/images/family/debian-12"}},
			MachineTypes: map[string]spec.GCPMachineType{"small": {MachineType: "e2-micro"}},
		}},
	}
	for name, s := range configs {
		e.Create(t, &nsv1alpha1.ProviderConfig{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec: nsv1alpha1.NamespacedProviderConfigSpec{ProviderConfigSpec: s}})
	}
	want := map[string]func(*nsv1alpha1.ProviderConfig) string{
		// The check read the answers: their numbers are shown.
		"proxmox": func(pc *nsv1alpha1.ProviderConfig) string {
			if len(pc.Status.Targets) != 1 || pc.Status.Targets[0].Details["pveVersion"] != "8.2.4" {
				return fmt.Sprintf("targets %+v; want pveVersion 8.2.4", pc.Status.Targets)
			}
			return ""
		},
		"kubernetes": func(pc *nsv1alpha1.ProviderConfig) string {
			if len(pc.Status.Targets) != 1 || pc.Status.Targets[0].Details["serverVersion"] != "1.31.0" {
				return fmt.Sprintf("targets %+v; want serverVersion 1.31.0", pc.Status.Targets)
			}
			return ""
		},
		"gcp": func(pc *nsv1alpha1.ProviderConfig) string {
			if c := pc.GetCondition(health.TypeHealthy); !strings.Contains(c.Message, "403") {
				return "the token endpoint's refusal is not in " + c.Message
			}
			return ""
		},
	}
	for name := range configs {
		t.Run(name, func(t *testing.T) {
			pc := &nsv1alpha1.ProviderConfig{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
			c := e.WaitForCondition(t, pc, health.TypeHealthy, corev1.ConditionFalse, "")
			t.Logf("Healthy=False %s: %s", c.Reason, c.Message)
			if msg := want[name](pc); msg != "" {
				t.Error(msg)
			}
		})
	}
	// Checks more, and their events.
	time.Sleep(5 * time.Second)
	for name := range configs {
		pc := &nsv1alpha1.ProviderConfig{}
		if err := e.Kube.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, pc); err != nil {
			t.Fatal(err)
		}
		if b, _ := json.Marshal(pc); strings.Contains(string(b), sentinel) {
			t.Errorf("ProviderConfig %s quotes its endpoint: %s", name, b)
		}
		for _, ev := range e.Events(t, ns, name) {
			if strings.Contains(ev.Message, sentinel) {
				t.Errorf("an event of %s quotes its endpoint: %s", name, ev.Message)
			}
		}
	}
	if logs := e.Logs.String(); strings.Contains(logs, sentinel) {
		for _, l := range strings.Split(logs, "\n") {
			if strings.Contains(l, sentinel) {
				t.Errorf("the provider's log quotes a tenant's endpoint: %s", l)
			}
		}
	}
}
