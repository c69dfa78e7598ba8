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

	"golang.org/x/crypto/ssh"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"

	nsv1alpha1 "github.com/egressproxy/provider-egressproxy/apis/namespaced/v1alpha1"
	spec "github.com/egressproxy/provider-egressproxy/apis/spec/v1alpha1"
	pcontroller "github.com/egressproxy/provider-egressproxy/internal/controller"
	"github.com/egressproxy/provider-egressproxy/internal/controller/external"
	"github.com/egressproxy/provider-egressproxy/internal/controller/health"
	"github.com/egressproxy/provider-egressproxy/internal/controller/kvm"
	"github.com/egressproxy/provider-egressproxy/internal/devenv/testenv"
	"github.com/egressproxy/provider-egressproxy/internal/devenv/testenv/providerenv"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
	"github.com/egressproxy/provider-egressproxy/internal/proxy/proxytest"
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
	mem := proxytest.NewMemory("memory", "test-install")
	e := providerenv.Start(t, providerenv.Options{
		Bindings: func(mgr ctrl.Manager, _ external.Options) []external.Binding {
			kind := kvm.New(mgr, kvm.Options{})
			connect := kind.Backend.Connect
			kind.Backend.Connect = func(ctx context.Context, cfg *external.Config) (proxy.Driver, error) {
				if strings.HasSuffix(cfg.Name, " healthy") {
					return mem, nil
				}
				return connect(ctx, cfg) // the real driver, dialling the blackhole
			}
			return []external.Binding{kind}
		},
		// Far longer than the test: the stuck check must not end by itself
		// before the healthy config is checked.
		Health: pcontroller.HealthOptions{Interval: time.Hour, Timeout: 10 * time.Minute},
	})
	kube, ctx := e.Kube, context.Background()
	_, key, _ := ed25519.GenerateKey(rand.Reader)
	block, err := ssh.MarshalPrivateKey(key, "")
	if err != nil {
		t.Fatal(err)
	}
	// Made after the controllers, so that it closes its connections (and
	// so ends the stuck check) before they are stopped.
	hole := newBlackhole(t)
	signer, _ := ssh.NewSignerFromKey(key)
	e.Create(t, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "crossplane-system", Name: "ssh"}, Data: map[string][]byte{
		"id_ed25519":  pem.EncodeToMemory(block),
		"known_hosts": []byte(fmt.Sprintf("%s %s", hole.ln.Addr().String(), ssh.MarshalAuthorizedKey(signer.PublicKey()))),
	}})

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
