package kvm_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/meta"
	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
	"golang.org/x/crypto/ssh"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	nsproxy "github.com/egressproxy/provider-egressproxy/apis/namespaced/proxy/v1alpha1"
	nsv1alpha1 "github.com/egressproxy/provider-egressproxy/apis/namespaced/v1alpha1"
	spec "github.com/egressproxy/provider-egressproxy/apis/spec/v1alpha1"
	"github.com/egressproxy/provider-egressproxy/internal/controller/external"
	"github.com/egressproxy/provider-egressproxy/internal/controller/kvm"
	"github.com/egressproxy/provider-egressproxy/internal/devenv/controlplane"
	"github.com/egressproxy/provider-egressproxy/internal/devenv/testenv/providerenv"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
	"github.com/egressproxy/provider-egressproxy/internal/proxy/proxytest"
)

// TestKVMProxyNamespaceDeletionIntegration: kubectl delete namespace of a
// tenant's namespace holding its own kvm ProviderConfig, the SSH key and
// known_hosts Secrets it reads, a password Secret and KVMProxies on it
// completes, with the real namespace controller (kube-controller-manager)
// deleting in its own order, and leaves no instance. The binding is the
// production one, whose Connect reads and parses both Secrets on every
// reconcile, the Delete's included; only the driver it builds is swapped
// for the in-memory one (TestIntegrationKVMProxyEndToEnd runs the real
// libvirtd, which a namespace's deletion adds nothing to: what it needs
// is the config and its Secrets). Each round is a namespace of its own;
// the second deletes it while the proxies are still being created, the
// others hold the instances' deletion until the namespace controller has
// deleted everything else in it.
func TestKVMProxyNamespaceDeletionIntegration(t *testing.T) {
	mem := proxytest.NewMemory("memory", "kvm-ns")
	mem.Quiet()
	e := providerenv.Start(t, providerenv.Options{
		ControlPlane: controlplane.Options{ControllerManager: true},
		Bindings: func(mgr ctrl.Manager, _ external.Options) []external.Binding {
			kind := kvm.New(mgr, kvm.Options{})
			connect := kind.Backend.Connect
			kind.Backend.Connect = func(ctx context.Context, cfg *external.Config) (proxy.Driver, error) {
				if _, err := connect(ctx, cfg); err != nil {
					return nil, err
				}
				return mem, nil
			}
			return []external.Binding{kind}
		},
		InstallationID: "kvm-ns", NotReadyPollInterval: 500 * time.Millisecond,
		Timeout: 60 * time.Second,
	})
	// A real key and known_hosts line (the binding parses the key).
	key, knownHosts := sshMaterial(t)
	for i, ready := range []bool{true, false, true} {
		t.Run(fmt.Sprintf("Round%d", i+1), func(t *testing.T) {
			ns := fmt.Sprintf("tenant-kvm-%d", i+1)
			e.Create(t,
				&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}},
				&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "ssh-key", Namespace: ns}, Data: map[string][]byte{"id_ed25519": key}},
				&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "known-hosts", Namespace: ns}, Data: map[string][]byte{"known_hosts": knownHosts}},
				&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "proxy-password", Namespace: ns}, StringData: map[string]string{"password": "tenant-password-0123"}},
				&nsv1alpha1.ProviderConfig{ObjectMeta: metav1.ObjectMeta{Name: "own-kvm", Namespace: ns},
					Spec: nsv1alpha1.NamespacedProviderConfigSpec{ProviderConfigSpec: spec.ProviderConfigSpec{KVM: &spec.KVMConfig{
						Credentials: spec.KVMCredentials{
							SSHKeySecretRef:     spec.SecretKeySelector{Name: "ssh-key", Key: "id_ed25519"},
							KnownHostsSecretRef: &spec.SecretKeySelector{Name: "known-hosts", Key: "known_hosts"},
						},
						Images:       map[string]spec.KVMImage{"debian-12": {URL: "https://example.com/d.qcow2"}},
						MachineTypes: map[string]spec.KVMMachineType{"small": {VCPUs: 1, MemoryMiB: 512}},
						Hosts:        []spec.KVMHost{{Name: "home", Address: "198.51.100.7:22", User: "proxy", Bridge: "br0"}},
					}}}},
			)
			mk := func(name string, auth *spec.ProxyAuth) *nsproxy.KVMProxy {
				return &nsproxy.KVMProxy{
					ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
					Spec: nsproxy.KVMProxySpec{
						ManagedResourceSpec: xpv2.ManagedResourceSpec{
							ProviderConfigReference:          &xpv2.ProviderConfigReference{Kind: "ProviderConfig", Name: "own-kvm"},
							WriteConnectionSecretToReference: &xpv2.LocalSecretReference{Name: name + "-conn"},
						},
						ForProvider: spec.KVMProxyParameters{Proxy: spec.ProxySettings{AllowedClientCIDRs: []string{"10.0.0.0/8"}, Auth: auth}},
					},
				}
			}
			proxies := []*nsproxy.KVMProxy{
				mk("generated", &spec.ProxyAuth{Enabled: true}),
				mk("own-password", &spec.ProxyAuth{Enabled: true, PasswordSecretRef: &spec.SecretKeySelector{Name: "proxy-password", Key: "password"}}),
			}
			if ready {
				mem.SettleAfter(time.Second)
			} else {
				mem.SettleAfter(0)
			}
			for _, p := range proxies {
				e.Create(t, p)
			}
			e.WaitProtected(t, ns, "own-kvm", "ssh-key", "known-hosts")
			var names []string
			for _, p := range proxies {
				e.WaitFor(t, p.Name+"'s instance", func() (bool, string) {
					_ = e.Kube.Get(context.Background(), client.ObjectKeyFromObject(p), p)
					n := meta.GetExternalName(p)
					return n != "" && slices.ContainsFunc(mem.Instances(), func(i proxy.Instance) bool { return i.Name == n }), ""
				})
				names = append(names, meta.GetExternalName(p))
				if ready {
					e.WaitReady(t, p)
				}
			}

			// In the rounds with Ready proxies, the instances' deletion is
			// held until the namespace controller has deleted everything
			// else in it: the proxies' last reconciles read the config and
			// Secrets being deleted.
			var release []func()
			if ready {
				for _, n := range names {
					release = append(release, mem.HoldDelete(proxytest.MemoryIDPrefix+n))
				}
			}
			start := time.Now()
			if err := e.Kube.Delete(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
				t.Fatal(err)
			}
			if ready {
				e.WaitSwept(t, ns, 2*time.Minute)
				time.Sleep(3 * time.Second)
				for _, r := range release {
					r()
				}
			}
			e.WaitNamespaceGone(t, ns, 3*time.Minute)
			t.Logf("namespace %s gone %.1fs after its delete", ns, time.Since(start).Seconds())
			for _, i := range mem.Instances() {
				if slices.Contains(names, i.Name) {
					t.Errorf("instance %s of the deleted namespace is left", i.Name)
				}
			}
		})
	}
}

// sshMaterial is an OpenSSH private key and a known_hosts line for the
// test config's host.
func sshMaterial(t *testing.T) (key, knownHosts []byte) {
	t.Helper()
	_, k, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	block, err := ssh.MarshalPrivateKey(k, "")
	if err != nil {
		t.Fatal(err)
	}
	signer, err := ssh.NewSignerFromKey(k)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(block), []byte("[198.51.100.7]:22 " + string(ssh.MarshalAuthorizedKey(signer.PublicKey())))
}
