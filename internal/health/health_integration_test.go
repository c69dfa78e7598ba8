package health_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"
	"golang.org/x/crypto/ssh"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	nsv1alpha1 "github.com/egressproxy/provider-egressproxy/apis/namespaced/v1alpha1"
	spec "github.com/egressproxy/provider-egressproxy/apis/spec/v1alpha1"
	"github.com/egressproxy/provider-egressproxy/internal/controller/external"
	"github.com/egressproxy/provider-egressproxy/internal/controller/kvm"
	"github.com/egressproxy/provider-egressproxy/internal/controlplane"
	"github.com/egressproxy/provider-egressproxy/internal/health"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
	"github.com/egressproxy/provider-egressproxy/internal/proxy/proxytest"
	"github.com/egressproxy/provider-egressproxy/internal/testenv"
)

// blackhole accepts TCP connections on loopback and never answers: a host
// that is up at the TCP level and hangs every protocol on top.
type blackhole struct {
	ln       net.Listener
	accepted chan struct{}
	once     sync.Once
	mu       sync.Mutex
	conns    []net.Conn
}

func newBlackhole(t *testing.T) *blackhole {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &blackhole{ln: ln, accepted: make(chan struct{})}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			b.mu.Lock()
			b.conns = append(b.conns, c)
			b.mu.Unlock()
			b.once.Do(func() { close(b.accepted) })
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		b.mu.Lock()
		defer b.mu.Unlock()
		for _, c := range b.conns {
			_ = c.Close()
		}
	})
	return b
}

func kvmConfig(name, address string) *nsv1alpha1.ClusterProviderConfig {
	return &nsv1alpha1.ClusterProviderConfig{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: nsv1alpha1.ClusterProviderConfigSpec{ProviderConfigSpec: spec.ProviderConfigSpec{KVM: &spec.KVMConfig{
			Credentials: spec.KVMCredentials{
				SSHKeySecretRef:     spec.SecretKeySelector{Name: "ssh", Namespace: "crossplane-system", Key: "id_ed25519"},
				KnownHostsSecretRef: &spec.SecretKeySelector{Name: "ssh", Namespace: "crossplane-system", Key: "known_hosts"},
			},
			MachineTypes: map[string]spec.KVMMachineType{"small": {VCPUs: 1, MemoryMiB: 512}},
			Hosts:        []spec.KVMHost{{Name: "h1", Address: address, User: "proxy", Bridge: "br0"}},
		}}},
	}
}

// TestIntegrationHealthChecksDoNotWaitForAnotherConfigsHosts: one
// tenant's config names a host that accepts connections and never answers
// (its check hangs in the SSH handshake); a config created after it is
// checked, and reported Healthy, while that check still hangs.
func TestIntegrationHealthChecksDoNotWaitForAnotherConfigsHosts(t *testing.T) {
	cp, s := testenv.Start(t, controlplane.Options{})
	mgr, err := ctrl.NewManager(cp.Config, ctrl.Options{Scheme: s, Metrics: metricsserver.Options{BindAddress: "0"}})
	if err != nil {
		t.Fatal(err)
	}
	kube, err := client.New(cp.Config, client.Options{Scheme: s})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := kube.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "crossplane-system"}}); err != nil {
		t.Fatal(err)
	}
	_, key, _ := ed25519.GenerateKey(rand.Reader)
	block, err := ssh.MarshalPrivateKey(key, "")
	if err != nil {
		t.Fatal(err)
	}
	hole := newBlackhole(t)
	signer, _ := ssh.NewSignerFromKey(key)
	if err := kube.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "crossplane-system", Name: "ssh"}, Data: map[string][]byte{
		"id_ed25519":  pem.EncodeToMemory(block),
		"known_hosts": []byte(fmt.Sprintf("%s %s", hole.ln.Addr().String(), ssh.MarshalAuthorizedKey(signer.PublicKey()))),
	}}); err != nil {
		t.Fatal(err)
	}
	mem := proxytest.NewMemory("memory", "test-install")
	backend := kvm.New(mgr, kvm.Options{}).Backend
	connect := backend.Connect
	backend.Connect = func(ctx context.Context, cfg *external.Config) (proxy.Driver, error) {
		if strings.HasSuffix(cfg.Name, " healthy") {
			return mem, nil
		}
		return connect(ctx, cfg) // the real driver, dialling the blackhole
	}
	if err := health.Setup(mgr, health.Reconciler{
		Kube:    mgr.GetClient(),
		Configs: external.ConfigReader{Kube: mgr.GetClient(), SecretReader: mgr.GetAPIReader(), InstallationID: "test-install", Backends: []external.Backend{backend}},
		// Far longer than the test: the stuck check must not end by itself
		// before the healthy config is checked.
		Interval: time.Hour, Timeout: 10 * time.Minute,
	}, logging.NewNopLogger(), nsv1alpha1.ClusterProviderConfigGroupVersionKind); err != nil {
		t.Fatal(err)
	}
	mctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- mgr.Start(mctx) }()
	t.Cleanup(func() { cancel(); <-done }) //nolint:errcheck // The manager's exit status after cancel says nothing.

	if err := kube.Create(ctx, kvmConfig("stuck", hole.ln.Addr().String())); err != nil {
		t.Fatal(err)
	}
	select {
	case <-hole.accepted:
	case <-time.After(time.Minute):
		t.Fatal("the check of config stuck never reached its host")
	}
	if err := kube.Create(ctx, kvmConfig("healthy", "192.0.2.1:22")); err != nil {
		t.Fatal(err)
	}
	healthy, stuck := &nsv1alpha1.ClusterProviderConfig{}, &nsv1alpha1.ClusterProviderConfig{}
	testenv.WaitFor(t, "Healthy=True on config healthy", 30*time.Second, func() (bool, string) {
		_ = kube.Get(ctx, types.NamespacedName{Name: "healthy"}, healthy)
		c := healthy.GetCondition(health.TypeHealthy)
		return c.Status == corev1.ConditionTrue, fmt.Sprintf("%s %s", c.Status, c.Message)
	})
	if err := kube.Get(ctx, types.NamespacedName{Name: "stuck"}, stuck); err != nil {
		t.Fatal(err)
	}
	if stuck.Status.LastCheckTime != nil {
		t.Errorf("config healthy was reported only after config stuck's check had ended (%v: %s): one config's unanswering host delayed another config's check",
			stuck.Status.LastCheckTime, stuck.GetCondition(health.TypeHealthy).Message)
	}
}
