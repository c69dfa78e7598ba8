package gcp_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/meta"
	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	nsproxy "github.com/egressproxy/provider-egressproxy/apis/namespaced/proxy/v1alpha1"
	nsv1alpha1 "github.com/egressproxy/provider-egressproxy/apis/namespaced/v1alpha1"
	spec "github.com/egressproxy/provider-egressproxy/apis/spec/v1alpha1"
	"github.com/egressproxy/provider-egressproxy/internal/devenv/controlplane"
	"github.com/egressproxy/provider-egressproxy/internal/devenv/testenv"
)

// TestGCPProxyNamespaceDeletionIntegration: kubectl delete namespace of a
// tenant's namespace holding its own ProviderConfig, the key Secret it
// reads, a password Secret and GCPProxies on that config and on the
// platform's ClusterProviderConfig completes, with the real namespace
// controller (kube-controller-manager) deleting in its own order, and the
// fake Compute Engine is left with no instance, address or firewall rule
// of the namespace. Each round is a namespace of its own; the second
// deletes it while the proxies are still being created, the others hold
// the instances' deletion until the namespace controller has deleted
// everything else in it.
func TestGCPProxyNamespaceDeletionIntegration(t *testing.T) {
	e := start(t, controlplane.Options{ControllerManager: true})
	ctx := context.Background()
	platform := &nsv1alpha1.ClusterProviderConfig{}
	if err := e.Kube.Get(ctx, types.NamespacedName{Name: "gcp-prod"}, platform); err != nil {
		t.Fatal(err)
	}
	for i, ready := range []bool{true, false, true} {
		t.Run(fmt.Sprintf("Round%d", i+1), func(t *testing.T) {
			ns := fmt.Sprintf("tenant-gcp-%d", i+1)
			block := platform.Spec.GCP.DeepCopy()
			block.Credentials.SecretRef = &spec.SecretKeySelector{Name: "gcp-key", Key: "key.json"}
			e.Create(t,
				&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}},
				&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "gcp-key", Namespace: ns}, StringData: map[string]string{"key.json": e.key}},
				&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "proxy-password", Namespace: ns}, StringData: map[string]string{"password": "tenant-password-0123"}},
				&nsv1alpha1.ProviderConfig{ObjectMeta: metav1.ObjectMeta{Name: "own-gcp", Namespace: ns},
					Spec: nsv1alpha1.NamespacedProviderConfigSpec{ProviderConfigSpec: spec.ProviderConfigSpec{GCP: block}}},
			)
			mk := func(name, kind, config string, mutate func(*nsproxy.GCPProxy)) *nsproxy.GCPProxy {
				p := nsProxy(name, testenv.FreePort(t), mutate)
				p.Namespace = ns
				p.Spec.ProviderConfigReference = &xpv2.ProviderConfigReference{Kind: kind, Name: config}
				return p
			}
			proxies := []*nsproxy.GCPProxy{
				mk("own", "ProviderConfig", "own-gcp", func(p *nsproxy.GCPProxy) {
					p.Spec.ForProvider.Address = &spec.GCPAddress{Type: "Static"}
					p.Spec.ForProvider.Firewall = &spec.GCPFirewall{Manage: true}
				}),
				mk("own-password", "ProviderConfig", "own-gcp", func(p *nsproxy.GCPProxy) {
					p.Spec.ForProvider.Proxy.Auth.PasswordSecretRef = &spec.SecretKeySelector{Name: "proxy-password", Key: "password"}
				}),
				mk("platform", "ClusterProviderConfig", "gcp-prod", func(*nsproxy.GCPProxy) {}),
			}
			for _, p := range proxies {
				e.Create(t, p)
			}
			e.WaitProtected(t, ns, "own-gcp", "gcp-key")
			var names []string
			for _, p := range proxies {
				e.WaitFor(t, p.Name+"'s external name", func() (bool, string) {
					_ = e.Kube.Get(ctx, client.ObjectKeyFromObject(p), p)
					return meta.GetExternalName(p) != "", ""
				})
				names = append(names, meta.GetExternalName(p))
				if !ready {
					continue
				}
				e.WaitFor(t, p.Name+"'s address", func() (bool, string) {
					_ = e.Kube.Get(ctx, client.ObjectKeyFromObject(p), p)
					return p.Status.AtProvider.IP != "", fmt.Sprintf("%+v", p.Status.AtProvider)
				})
				listen(t, p.Status.AtProvider.IP, *p.Spec.ForProvider.Proxy.Port, p)
				e.WaitReady(t, p)
			}

			// In the rounds with Ready proxies, the instances' deletion is
			// held until the namespace controller has deleted everything
			// else in it: the proxies' last reconciles read the config and
			// Secrets being deleted.
			var release []func()
			if ready {
				for _, n := range names {
					release = append(release, e.srv.HoldDelete(n))
				}
			}
			start := time.Now()
			if err := e.Kube.Delete(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
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
			e.srv.SettleAll()
			for _, n := range e.srv.Names() {
				for _, name := range names {
					if n == "instance "+zone+"/"+name || n == "address "+region+"/"+name || n == "firewall "+name {
						t.Errorf("%s of the deleted namespace is left on the fake", n)
					}
				}
			}
			e.CheckNoFinalizerLeft(t, "crossplane-system")
		})
	}
}
