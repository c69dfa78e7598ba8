package proxmox_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/meta"
	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	nsproxy "github.com/egressproxy/provider-egressproxy/apis/namespaced/proxy/v1alpha1"
	nsv1alpha1 "github.com/egressproxy/provider-egressproxy/apis/namespaced/v1alpha1"
	spec "github.com/egressproxy/provider-egressproxy/apis/spec/v1alpha1"
	backend "github.com/egressproxy/provider-egressproxy/internal/backend/proxmox"
	"github.com/egressproxy/provider-egressproxy/internal/backend/proxmox/pvetest"
	pcontroller "github.com/egressproxy/provider-egressproxy/internal/controller"
	"github.com/egressproxy/provider-egressproxy/internal/controller/external"
	proxmoxctl "github.com/egressproxy/provider-egressproxy/internal/controller/proxmox"
	"github.com/egressproxy/provider-egressproxy/internal/devenv/controlplane"
	"github.com/egressproxy/provider-egressproxy/internal/devenv/testenv/providerenv"
)

// TestProxmoxNamespaceDeletionIntegration: kubectl delete namespace of a
// tenant's namespace holding its own ProviderConfig, the Secrets it reads
// (token and CA apart), a proxy password Secret and ProxmoxProxies on that
// config and on the platform's ClusterProviderConfig completes, with the
// real namespace controller (kube-controller-manager) deleting in its own
// order, and every VM of the namespace is deleted on the fake. Each round
// is a namespace of its own; one deletes the namespace while the proxies
// are still being created; in the others the fake answers nothing until
// the namespace controller has deleted everything else in it.
func TestProxmoxNamespaceDeletionIntegration(t *testing.T) {
	fake := pvetest.New(t, pvetest.Options{Listen: true})
	e := providerenv.Start(t, providerenv.Options{
		ControlPlane: controlplane.Options{ControllerManager: true},
		Bindings: func(mgr ctrl.Manager, _ external.Options) []external.Binding {
			return []external.Binding{proxmoxctl.New(mgr, proxmoxctl.Options{Driver: func(o *backend.Options) {
				o.RetryFailedTaskAfter = 3 * time.Second
			}})}
		},
		InstallationID: testInstallation, PollInterval: 400 * time.Millisecond, NotReadyPollInterval: 200 * time.Millisecond,
		Health: pcontroller.HealthOptions{Interval: time.Hour},
		Objects: []client.Object{
			fake.Secret("crossplane-system", "pve"),
			&nsv1alpha1.ClusterProviderConfig{ObjectMeta: metav1.ObjectMeta{Name: "home-pve"},
				Spec: nsv1alpha1.ClusterProviderConfigSpec{ProviderConfigSpec: spec.ProviderConfigSpec{Proxmox: fake.ProviderConfig("crossplane-system", "pve")}}},
		},
		Timeout: 90 * time.Second,
	})
	for i, ready := range []bool{true, false, true} {
		t.Run(fmt.Sprintf("Round%d", i+1), func(t *testing.T) {
			ns := fmt.Sprintf("tenant-pve-%d", i+1)
			proxies := tenantProxmox(t, e, fake, ns)
			if ready {
				for _, p := range proxies {
					e.WaitReady(t, p)
				}
			}
			names := map[string]bool{}
			for _, p := range proxies {
				e.WaitFor(t, p.Name+"'s external name", func() (bool, string) {
					_ = e.Kube.Get(context.Background(), client.ObjectKeyFromObject(p), p)
					return meta.GetExternalName(p) != "", ""
				})
				names[meta.GetExternalName(p)] = true
			}
			// In the rounds with Ready proxies, the server answers nothing
			// until the namespace controller has deleted everything else
			// in the namespace: the proxies' Delete reads the config and
			// Secrets being deleted.
			if ready {
				fake.SetBusy(true)
				t.Cleanup(func() { fake.SetBusy(false) })
			}
			start := time.Now()
			if err := e.Kube.Delete(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
				t.Fatal(err)
			}
			if ready {
				e.WaitSwept(t, ns, 2*time.Minute)
				time.Sleep(3 * time.Second)
				fake.SetBusy(false)
			}
			e.WaitNamespaceGone(t, ns, 3*time.Minute)
			t.Logf("namespace %s gone %.1fs after its delete", ns, time.Since(start).Seconds())
			fake.FinishTasks()
			for _, vm := range fake.VMs() {
				if names[vm.Name] {
					t.Errorf("VM %d (%s) of the deleted namespace is left", vm.VMID, vm.Name)
				}
			}
			e.CheckNoFinalizerLeft(t, "crossplane-system")
		})
	}
}

// tenantProxmox creates namespace ns with its own ProviderConfig
// (pve-token and pve-ca), a password Secret and three ProxmoxProxies: two
// on the tenant's config (one with the password Secret), one on the
// ClusterProviderConfig home-pve.
func tenantProxmox(t *testing.T, e *providerenv.Env, fake *pvetest.Server, ns string) []*nsproxy.ProxmoxProxy {
	t.Helper()
	block := fake.ProviderConfig("", "pve-token")
	block.Credentials.CASecretRef = &spec.SecretKeySelector{Name: "pve-ca", Key: "ca.pem"}
	block.VLANTag = ptr.To[int32](30)
	e.Create(t,
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}},
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "pve-token", Namespace: ns}, Data: map[string][]byte{"token": []byte(fake.Token())}},
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "pve-ca", Namespace: ns}, Data: map[string][]byte{"ca.pem": fake.CAPEM()}},
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "proxy-password", Namespace: ns}, StringData: map[string]string{"password": "tenant-password-0123"}},
		&nsv1alpha1.ProviderConfig{ObjectMeta: metav1.ObjectMeta{Name: "own-pve", Namespace: ns},
			Spec: nsv1alpha1.NamespacedProviderConfigSpec{ProviderConfigSpec: spec.ProviderConfigSpec{Proxmox: block}}},
	)
	mk := func(name, kind, config string, auth *spec.ProxyAuth) *nsproxy.ProxmoxProxy {
		return &nsproxy.ProxmoxProxy{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			Spec: nsproxy.ProxmoxProxySpec{
				ManagedResourceSpec: xpv2.ManagedResourceSpec{
					ProviderConfigReference:          &xpv2.ProviderConfigReference{Kind: kind, Name: config},
					WriteConnectionSecretToReference: &xpv2.LocalSecretReference{Name: name + "-conn"},
				},
				ForProvider: spec.ProxmoxProxyParameters{Node: "pve1", Proxy: spec.ProxySettings{AllowedClientCIDRs: []string{"10.20.0.0/16"}, Auth: auth}},
			},
		}
	}
	ps := []*nsproxy.ProxmoxProxy{
		mk("own-a", "ProviderConfig", "own-pve", &spec.ProxyAuth{Enabled: true}),
		mk("own-b", "ProviderConfig", "own-pve", &spec.ProxyAuth{Enabled: true, PasswordSecretRef: &spec.SecretKeySelector{Name: "proxy-password", Key: "password"}}),
		mk("platform", "ClusterProviderConfig", "home-pve", nil),
	}
	for _, p := range ps {
		e.Create(t, p)
	}
	e.WaitProtected(t, ns, "own-pve", "pve-token", "pve-ca")
	return ps
}
