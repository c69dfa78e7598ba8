package proxmox_test

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	nsproxy "github.com/egressproxy/provider-egressproxy/apis/namespaced/proxy/v1alpha1"
	nsv1alpha1 "github.com/egressproxy/provider-egressproxy/apis/namespaced/v1alpha1"
	spec "github.com/egressproxy/provider-egressproxy/apis/spec/v1alpha1"
	"github.com/egressproxy/provider-egressproxy/internal/backend/proxmox/pvetest"
	pcontroller "github.com/egressproxy/provider-egressproxy/internal/controller"
	"github.com/egressproxy/provider-egressproxy/internal/controller/external"
	proxmoxctl "github.com/egressproxy/provider-egressproxy/internal/controller/proxmox"
	"github.com/egressproxy/provider-egressproxy/internal/devenv/testenv/providerenv"
	"github.com/egressproxy/provider-egressproxy/internal/netguard"
)

// TestIntegrationTenantReportedAddressRefused: a tenant's Proxmox (the
// fake, whose API the platform team allowed: 127.0.0.1/32) reports its
// VM's address on the provider's loopback (127.77.x.y, where a listener
// answers as the VM's Squid). The proxy on the tenant's namespaced config
// is never Ready: its Ready condition names the address as the one the
// backend reported and says why it is refused, and nothing connects to
// the guest's listener. The same fake's VM of a proxy on the platform's
// ClusterProviderConfig is probed there and becomes Ready.
func TestIntegrationTenantReportedAddressRefused(t *testing.T) {
	fake := pvetest.New(t, pvetest.Options{Listen: true})
	const ns = "tenant-reported"
	e := providerenv.Start(t, providerenv.Options{
		Bindings: func(mgr ctrl.Manager, _ external.Options) []external.Binding {
			return []external.Binding{proxmoxctl.New(mgr, proxmoxctl.Options{})}
		},
		TenantGuard:    netguard.New(netguard.Options{Allowed: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}}),
		InstallationID: testInstallation, NotReadyPollInterval: 300 * time.Millisecond,
		Health:     pcontroller.HealthOptions{Interval: time.Hour},
		Namespaces: []string{ns},
		Objects: []client.Object{
			fake.Secret("crossplane-system", "pve"),
			&nsv1alpha1.ClusterProviderConfig{ObjectMeta: metav1.ObjectMeta{Name: "home-pve"},
				Spec: nsv1alpha1.ClusterProviderConfigSpec{ProviderConfigSpec: spec.ProviderConfigSpec{Proxmox: fake.ProviderConfig("crossplane-system", "pve")}}},
		},
		Timeout: 90 * time.Second,
	})
	block := fake.ProviderConfig("", "pve-token")
	block.Credentials.CASecretRef = &spec.SecretKeySelector{Name: "pve-ca", Key: "ca.pem"}
	e.Create(t,
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "pve-token", Namespace: ns}, Data: map[string][]byte{"token": []byte(fake.Token())}},
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "pve-ca", Namespace: ns}, Data: map[string][]byte{"ca.pem": fake.CAPEM()}},
		&nsv1alpha1.ProviderConfig{ObjectMeta: metav1.ObjectMeta{Name: "own-pve", Namespace: ns},
			Spec: nsv1alpha1.NamespacedProviderConfigSpec{ProviderConfigSpec: spec.ProviderConfigSpec{Proxmox: block}}},
	)
	mk := func(name, kind, config string) *nsproxy.ProxmoxProxy {
		return &nsproxy.ProxmoxProxy{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			Spec: nsproxy.ProxmoxProxySpec{
				ManagedResourceSpec: xpv2.ManagedResourceSpec{ProviderConfigReference: &xpv2.ProviderConfigReference{Kind: kind, Name: config}},
				ForProvider:         spec.ProxmoxProxyParameters{Node: "pve1", Proxy: spec.ProxySettings{AllowedClientCIDRs: []string{"10.20.0.0/16"}, Auth: &spec.ProxyAuth{Enabled: true}}},
			},
		}
	}

	own := mk("own", "ProviderConfig", "own-pve")
	e.Create(t, own)
	c := e.WaitForCondition(t, own, xpv2.TypeReady, corev1.ConditionFalse, "the backend reports the proxy's address as 127.77.")
	t.Logf("Ready=False %s: %s", c.Reason, c.Message)
	if !strings.Contains(c.Message, "does not connect to 127.77.") || !strings.Contains(c.Message, "loopback") {
		t.Errorf("the condition does not say why the address is refused: %s", c.Message)
	}
	if own.Status.AtProvider.ProxyReachable {
		t.Errorf("status.atProvider = %+v; want the proxy unreachable", own.Status.AtProvider)
	}
	// More reconciles, in case a probe was on its way.
	time.Sleep(3 * time.Second)
	if n := fake.GuestConnections(); n != 0 {
		t.Fatalf("the guest's listener accepted %d connections for the tenant's proxy; want 0", n)
	}

	platform := mk("platform", "ClusterProviderConfig", "home-pve")
	e.Create(t, platform)
	e.WaitReady(t, platform)
	if n := fake.GuestConnections(); n == 0 {
		t.Errorf("the platform's proxy became Ready without a probe of its guest")
	}
	if err := e.Kube.Get(t.Context(), client.ObjectKeyFromObject(own), own); err != nil || own.GetCondition(xpv2.TypeReady).Status == corev1.ConditionTrue {
		t.Errorf("the tenant's proxy: %v, Ready %+v; want not Ready", err, own.GetCondition(xpv2.TypeReady))
	}
}
