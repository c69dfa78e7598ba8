package health_test

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
	"golang.org/x/crypto/ssh"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	nsv1alpha1 "github.com/egressproxy/provider-egressproxy/apis/namespaced/v1alpha1"
	spec "github.com/egressproxy/provider-egressproxy/apis/spec/v1alpha1"
	pcontroller "github.com/egressproxy/provider-egressproxy/internal/controller"
	"github.com/egressproxy/provider-egressproxy/internal/controller/health"
	"github.com/egressproxy/provider-egressproxy/internal/devenv/testenv/providerenv"
	"github.com/egressproxy/provider-egressproxy/internal/netguard"
)

// acceptCounter counts the TCP connections made to a loopback port.
type acceptCounter struct {
	ln net.Listener
	n  atomic.Int32
}

func newAcceptCounter(t *testing.T) *acceptCounter {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c := &acceptCounter{ln: ln}
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			c.n.Add(1)
			_ = conn.Close()
		}
	}()
	t.Cleanup(func() { _ = ln.Close() })
	return c
}

// TestIntegrationTenantEndpointsRefused: a tenant's namespaced
// ProviderConfigs aim every endpoint field at the provider's own loopback
// (the Proxmox url, a kubeconfig's server, a KVM host, a GCP key's
// token_uri). With the provider's guard (no range allowed for tenants),
// each config's health check is refused with a message naming what was
// refused, and nothing ever connects to the listeners.
func TestIntegrationTenantEndpointsRefused(t *testing.T) {
	const ns = "team-a"
	e := providerenv.Start(t, providerenv.Options{
		Namespaces:  []string{ns},
		TenantGuard: netguard.New(netguard.Options{}),
		Health:      pcontroller.HealthOptions{Interval: 2 * time.Second, Timeout: 10 * time.Second},
	})
	pve, kube, host, token := newAcceptCounter(t), newAcceptCounter(t), newAcceptCounter(t), newAcceptCounter(t)

	_, key, _ := ed25519.GenerateKey(rand.Reader)
	block, err := ssh.MarshalPrivateKey(key, "")
	if err != nil {
		t.Fatal(err)
	}
	rsaKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	gcpKey, _ := json.Marshal(map[string]string{
		"type": "service_account", "project_id": "tenant-project", "client_email": "sa@tenant-project.iam.gserviceaccount.com", "private_key_id": "1",
		"private_key": string(pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(rsaKey)})),
		"token_uri":   "http://" + token.ln.Addr().String() + "/token",
	})
	kubeconfig := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://%s", insecure-skip-tls-verify: true}}]
users: [{name: u, user: {token: abc}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`, kube.ln.Addr())
	e.Create(t, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "creds"}, Data: map[string][]byte{
		"token":      []byte("root@pam!t=00000000-0000-0000-0000-000000000000"),
		"kubeconfig": []byte(kubeconfig),
		"ssh":        pem.EncodeToMemory(block),
		"key.json":   gcpKey,
	}})
	ref := func(k string) *spec.SecretKeySelector { return &spec.SecretKeySelector{Name: "creds", Key: k} }
	configs := map[string]spec.ProviderConfigSpec{
		"proxmox": {Proxmox: &spec.ProxmoxConfig{
			URL:         "https://" + pve.ln.Addr().String(),
			Credentials: spec.ProxmoxCredentials{TokenSecretRef: *ref("token")},
			Nodes:       []string{"pve1"}, ISOStorage: "local", Templates: map[string]spec.ProxmoxTemplate{"debian-12": {VMID: 9000}},
			MachineTypes: map[string]spec.ProxmoxMachineType{"small": {Cores: 1, MemoryMiB: 512}},
		}},
		"kubernetes": {Kubernetes: &spec.KubernetesConfig{
			Credentials: spec.KubernetesCredentials{Source: xpv2.CredentialsSourceSecret, SecretRef: ref("kubeconfig")},
			Namespace:   "proxies",
		}},
		"kvm": {KVM: &spec.KVMConfig{
			Credentials:  spec.KVMCredentials{SSHKeySecretRef: *ref("ssh"), InsecureIgnoreHostKey: true},
			Images:       map[string]spec.KVMImage{"debian-12": {URL: "https://example.com/d.qcow2"}},
			MachineTypes: map[string]spec.KVMMachineType{"small": {VCPUs: 1, MemoryMiB: 512}},
			Hosts:        []spec.KVMHost{{Name: "h1", Address: host.ln.Addr().String(), User: "proxy", Bridge: "br0"}},
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
	for name := range configs {
		t.Run(name, func(t *testing.T) {
			pc := &nsv1alpha1.ProviderConfig{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
			c := e.WaitForCondition(t, pc, health.TypeHealthy, corev1.ConditionFalse, "does not connect to")
			t.Logf("Healthy=False %s: %s", c.Reason, c.Message)
			if !strings.Contains(c.Message, "loopback") && !strings.Contains(c.Message, "127.0.0.1") {
				t.Errorf("the message does not say what was refused: %s", c.Message)
			}
		})
	}
	// A check more, in case one was still on its way.
	time.Sleep(3 * time.Second)
	for name, l := range map[string]*acceptCounter{"proxmox.url": pve, "kubeconfig server": kube, "kvm host": host, "token_uri": token} {
		if n := l.n.Load(); n != 0 {
			t.Errorf("the %s listener accepted %d connections, want 0", name, n)
		}
	}
}
