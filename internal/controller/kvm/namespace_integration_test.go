package kvm_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"fmt"
	"net/http"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
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
	kvmbackend "github.com/egressproxy/provider-egressproxy/internal/backend/kvm"
	"github.com/egressproxy/provider-egressproxy/internal/backend/kvm/kvmtest"
	"github.com/egressproxy/provider-egressproxy/internal/controller/external"
	"github.com/egressproxy/provider-egressproxy/internal/controller/kvm"
	"github.com/egressproxy/provider-egressproxy/internal/devenv/controlplane"
	"github.com/egressproxy/provider-egressproxy/internal/devenv/testenv"
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

// TestKVMProxyNamespaceDeletionRealLibvirtIntegration is the namespace's
// deletion on the real libvirtd (TCG) behind the real sshd
// (hack/libvirt-up.sh), with the production binding and driver: a
// tenant's namespace holds its own kvm ProviderConfig naming the host, the
// SSH key and known_hosts Secrets it reads, a proxy password Secret and
// two KVMProxies whose domains, overlays and seeds exist on the host.
// kubectl delete namespace, with kube-controller-manager's namespace
// controller deleting in its own order, completes and leaves no domain,
// overlay or seed of theirs on the host (asked of libvirt with virsh).
// The image is an empty qcow2 (no OS): the domains run (their firmware,
// which finds nothing to boot), so the proxies are never Ready; the test
// shows the deletion of running domains on the host, not of serving proxies
// (TestIntegrationKVMProxyEndToEnd boots the real guest). In the first
// round the instances' deletion is held until the namespace controller
// has deleted everything else in the namespace (the config, its Secrets,
// the usages): the real Delete then runs on what the protection kept. In
// the second the namespace is deleted as soon as the domains exist.
func TestKVMProxyNamespaceDeletionRealLibvirtIntegration(t *testing.T) {
	h := kvmtest.Up(t)
	dir := t.TempDir()
	if out, err := exec.Command("qemu-img", "create", "-q", "-f", "qcow2", filepath.Join(dir, "empty.qcow2"), "256M").CombinedOutput(); err != nil {
		t.Fatalf("qemu-img: %v: %s", err, out)
	}
	// From a test host of the test's own: admission refuses image URLs on
	// loopback.
	img := testenv.NewTestHost(t).Serve(t, ":0", http.FileServer(http.Dir(dir)))
	imageURL := "http://" + img.String() + "/empty.qcow2"
	// The base volume's name holds a digest of the URL, new each run: this
	// run's base goes, and no other volume of the shared pool.
	t.Cleanup(func() { h.DeleteVolumes(t, kvmbackend.BaseVolumes("empty", imageURL, "", "qcow2", true)...) })
	// What a killed run of this test left on the host.
	sweepDeadRuns(t, h, "kvm-ns-real")

	// The production driver; its Delete held until the test lets it go.
	held := &gates{m: map[string]chan struct{}{}}
	e := providerenv.Start(t, providerenv.Options{
		ControlPlane: controlplane.Options{ControllerManager: true},
		Bindings: func(mgr ctrl.Manager, _ external.Options) []external.Binding {
			kind := kvm.New(mgr, kvm.Options{})
			connect := kind.Backend.Connect
			kind.Backend.Connect = func(ctx context.Context, cfg *external.Config) (proxy.Driver, error) {
				d, err := connect(ctx, cfg)
				if err != nil {
					return nil, err
				}
				return holding{Driver: d, held: held}, nil
			}
			return []external.Binding{kind}
		},
		InstallationID: runName("kvm-ns-real"), NotReadyPollInterval: time.Second, MaxConcurrentReconciles: 2,
		Timeout: 3 * time.Minute,
	})
	for i, hold := range []bool{true, false} {
		t.Run(fmt.Sprintf("Round%d", i+1), func(t *testing.T) {
			// This run's own namespace, so its domains' names are too.
			ns := runName(fmt.Sprintf("tenant-kvm-real-%d", i+1))
			e.Create(t,
				&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}},
				&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "ssh-key", Namespace: ns}, Data: map[string][]byte{"id_ed25519": h.Key}},
				&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "known-hosts", Namespace: ns}, Data: map[string][]byte{"known_hosts": h.KnownHosts}},
				&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "proxy-password", Namespace: ns}, StringData: map[string]string{"password": "tenant-password-0123"}},
				&nsv1alpha1.ProviderConfig{ObjectMeta: metav1.ObjectMeta{Name: "own-kvm", Namespace: ns},
					Spec: nsv1alpha1.NamespacedProviderConfigSpec{ProviderConfigSpec: spec.ProviderConfigSpec{KVM: &spec.KVMConfig{
						Credentials: spec.KVMCredentials{
							SSHKeySecretRef:     spec.SecretKeySelector{Name: "ssh-key", Key: "id_ed25519"},
							KnownHostsSecretRef: &spec.SecretKeySelector{Name: "known-hosts", Key: "known_hosts"},
						},
						DiskSizeGB:   1,
						Images:       map[string]spec.KVMImage{"empty": {URL: imageURL, Format: "qcow2", Firmware: "bios"}},
						MachineTypes: map[string]spec.KVMMachineType{"tiny": {VCPUs: 1, MemoryMiB: 256}},
						Hosts: []spec.KVMHost{{Name: "local", Address: h.Values["SSH_ADDRESS"], User: h.Values["SSH_USER"],
							Socket: h.Values["SOCKET"], Pool: h.Values["POOL"], Network: h.Values["NETWORK"], DomainType: "qemu"}},
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
						ForProvider: spec.KVMProxyParameters{Image: "empty", MachineType: "tiny",
							Proxy: spec.ProxySettings{AllowedClientCIDRs: []string{"10.0.0.0/8"}, Auth: auth}},
					},
				}
			}
			proxies := []*nsproxy.KVMProxy{
				mk("generated", &spec.ProxyAuth{Enabled: true}),
				mk("own-password", &spec.ProxyAuth{Enabled: true, PasswordSecretRef: &spec.SecretKeySelector{Name: "proxy-password", Key: "password"}}),
			}
			var names []string
			for _, p := range proxies {
				name := external.InstanceName(p)
				names = append(names, name)
				if hold {
					held.hold(name)
					defer held.release(name)
				}
				e.Create(t, p)
			}
			e.WaitProtected(t, ns, "own-kvm", "ssh-key", "known-hosts")
			for _, name := range names {
				e.WaitFor(t, "domain "+name+" running, with its overlay and seed on the host", func() (bool, string) {
					left := onHost(t, h, name)
					if len(left) != 3 {
						return false, fmt.Sprintf("on the host: %v", left)
					}
					state := strings.TrimSpace(h.Virsh(t, "domstate", name))
					return state == "running", "domain state " + state
				})
			}
			for _, p := range proxies {
				_ = e.Kube.Get(context.Background(), client.ObjectKeyFromObject(p), p)
				r := p.GetCondition(xpv2.TypeReady)
				t.Logf("%s before the namespace's deletion: external name %s, Ready=%s %q", p.Name, meta.GetExternalName(p), r.Status, r.Message)
			}

			start := time.Now()
			if err := e.Kube.Delete(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
				t.Fatal(err)
			}
			if hold {
				e.WaitSwept(t, ns, 2*time.Minute)
				time.Sleep(3 * time.Second)
				for _, name := range names {
					if still := onHost(t, h, name); len(still) != 3 {
						t.Errorf("before the held deletions were let go, the host holds %v of %s", still, name)
					}
					held.release(name)
				}
			}
			e.WaitNamespaceGone(t, ns, 5*time.Minute)
			t.Logf("namespace %s gone %.1fs after its delete", ns, time.Since(start).Seconds())
			for _, name := range names {
				if left := onHost(t, h, name); len(left) > 0 {
					t.Errorf("left on the host by the deleted namespace: %v", left)
					h.Purge(name)
				}
			}
		})
	}
}

// gates are the instances whose deletion the test holds.
type gates struct {
	mu sync.Mutex
	m  map[string]chan struct{}
}

func (g *gates) hold(name string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.m[name] = make(chan struct{})
}

// release lets the deletion of name go (once).
func (g *gates) release(name string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if c, ok := g.m[name]; ok {
		close(c)
		delete(g.m, name)
	}
}

func (g *gates) held(name string) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	_, ok := g.m[name]
	return ok
}

// holding is a driver whose Delete of a held instance fails as a busy
// host would until the test lets it go, the real Delete running then.
type holding struct {
	proxy.Driver
	held *gates
}

func (d holding) Delete(ctx context.Context, ref proxy.Ref) error {
	if d.held.held(ref.Name) {
		return proxy.Transientf("the test holds the deletion of %s", ref.Name)
	}
	return d.Driver.Delete(ctx, ref)
}

// onHost lists what libvirt holds of the instance name: its domain (any
// state), its overlay volume and its NoCloud seed.
func onHost(t *testing.T, h *kvmtest.Host, name string) []string {
	t.Helper()
	var out []string
	if slices.Contains(h.Domains(t), name) {
		out = append(out, "domain "+name)
	}
	for _, v := range h.Volumes(t) {
		if v == name+".qcow2" || v == name+"-seed.iso" {
			out = append(out, "volume "+v)
		}
	}
	return out
}
