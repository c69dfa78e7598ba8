package external

import (
	"strings"
	"testing"

	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
	"k8s.io/utils/ptr"

	namespacedv1alpha1 "github.com/egressproxy/provider-egressproxy/apis/namespaced/v1alpha1"
	spec "github.com/egressproxy/provider-egressproxy/apis/spec/v1alpha1"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

// fixed is a backend named name whose block, present whenever the config
// holds a kvm block, is b.
func fixed(name string, b Block) Backend {
	return Backend{Name: name, Block: func(s *spec.ProviderConfigSpec) (Block, bool) { return b, s.KVM != nil }}
}

// TestNamespacedConfigNeverUsesTheProvidersIdentity is the attack of a
// namespace user whose ProviderConfig got past admission (written before
// the rule, or with validation off): the controller layer refuses it too.
func TestNamespacedConfigNeverUsesTheProvidersIdentity(t *testing.T) {
	for name, src := range map[string]xpv2.CredentialsSource{
		"InjectedIdentity": xpv2.CredentialsSourceInjectedIdentity,
		"Environment":      xpv2.CredentialsSourceEnvironment,
	} {
		t.Run(name, func(t *testing.T) {
			r := ConfigReader{Backends: []Backend{fixed("cloud", Block{CredentialsSource: &src})}}
			s := spec.ProviderConfigSpec{KVM: &spec.KVMConfig{}}
			pc := &namespacedv1alpha1.ProviderConfig{Spec: namespacedv1alpha1.NamespacedProviderConfigSpec{ProviderConfigSpec: s}}
			pc.Namespace, pc.Name = "team-a", "mine"
			err := r.Of(pc).CheckTenancy()
			if err == nil || !proxy.IsPermanent(err) || !strings.Contains(err.Error(), "cloud.credentials.source "+name+" is not allowed on a namespaced ProviderConfig") {
				t.Errorf("CheckTenancy() = %v, want a Permanent error naming cloud.credentials.source", err)
			}
			// The same block on a ClusterProviderConfig is the platform's
			// to write, and allowed.
			cpc := &namespacedv1alpha1.ClusterProviderConfig{Spec: namespacedv1alpha1.ClusterProviderConfigSpec{ProviderConfigSpec: s}}
			if err := r.Of(cpc).CheckTenancy(); err != nil {
				t.Errorf("ClusterProviderConfig: CheckTenancy() = %v, want nil", err)
			}
		})
	}
	t.Run("Secret", func(t *testing.T) {
		src := xpv2.CredentialsSourceSecret
		r := ConfigReader{Backends: []Backend{fixed("cloud", Block{CredentialsSource: &src})}}
		pc := &namespacedv1alpha1.ProviderConfig{Spec: namespacedv1alpha1.NamespacedProviderConfigSpec{ProviderConfigSpec: spec.ProviderConfigSpec{KVM: &spec.KVMConfig{}}}}
		if err := r.Of(pc).CheckTenancy(); err != nil {
			t.Errorf("CheckTenancy() = %v, want nil", err)
		}
	})
}

func TestConfigOfFindsItsBackend(t *testing.T) {
	r := ConfigReader{Backends: []Backend{
		{Name: "other", Block: func(*spec.ProviderConfigSpec) (Block, bool) { return Block{}, false }},
		fixed("kvm", Block{}),
	}}
	cfg := r.Of(&namespacedv1alpha1.ClusterProviderConfig{Spec: namespacedv1alpha1.ClusterProviderConfigSpec{ProviderConfigSpec: spec.ProviderConfigSpec{KVM: &spec.KVMConfig{}}}})
	if got := cfg.BackendName(); got != "kvm" {
		t.Errorf("BackendName() = %q, want kvm", got)
	}
	none := r.Of(&namespacedv1alpha1.ClusterProviderConfig{})
	if none.Backend != nil || none.BackendName() != "" {
		t.Errorf("a config with no known block: Backend %v, BackendName %q; want nil and empty", none.Backend, none.BackendName())
	}
}

// TestNamespacedConfigNeverMakesAClusterOnlySetting: a namespace user's
// config with a setting only the platform may make (gcp.endpoint would
// point the Compute Engine client, and its tokens, at any HTTPS server the
// user names), past admission, is refused too.
func TestNamespacedConfigNeverMakesAClusterOnlySetting(t *testing.T) {
	r := ConfigReader{Backends: []Backend{fixed("gcp", Block{ClusterOnly: "gcp.endpoint is not allowed on a namespaced ProviderConfig"})}}
	s := spec.ProviderConfigSpec{KVM: &spec.KVMConfig{}}
	pc := &namespacedv1alpha1.ProviderConfig{Spec: namespacedv1alpha1.NamespacedProviderConfigSpec{ProviderConfigSpec: s}}
	pc.Namespace, pc.Name = "team-a", "mine"
	err := r.Of(pc).CheckTenancy()
	if err == nil || !proxy.IsPermanent(err) || !strings.Contains(err.Error(), "ProviderConfig team-a/mine: gcp.endpoint is not allowed on a namespaced ProviderConfig") {
		t.Errorf("CheckTenancy() = %v, want a Permanent error naming gcp.endpoint", err)
	}
	cpc := &namespacedv1alpha1.ClusterProviderConfig{Spec: namespacedv1alpha1.ClusterProviderConfigSpec{ProviderConfigSpec: s}}
	if err := r.Of(cpc).CheckTenancy(); err != nil {
		t.Errorf("ClusterProviderConfig: CheckTenancy() = %v, want nil", err)
	}
}

func TestConfigAllows(t *testing.T) {
	const secretCloudInit = "#cloud-config\nSENTINEL-cloudinit-secret: 1\n"
	cfg := func(b Block) *Config {
		bk := fixed("kvm", b)
		return &Config{Name: "ClusterProviderConfig home", Spec: spec.ProviderConfigSpec{KVM: &spec.KVMConfig{}}, Backend: &bk}
	}
	tenant := func(c *Config) *Config { c.Tenant = true; return c }
	urls := func(allowed bool) *ImagesByURL {
		return &ImagesByURL{Allowed: allowed, Keys: []string{"debian-12", "alpine"}}
	}
	for name, tc := range map[string]struct {
		cfg  *Config
		req  proxy.Request
		want string
	}{
		"catalogue image":            {cfg(Block{ImagesByURL: urls(false)}), proxy.Request{Placement: proxy.Placement{Image: "debian-12"}}, ""},
		"URL image not allowed":      {cfg(Block{ImagesByURL: urls(false)}), proxy.Request{Placement: proxy.Placement{Image: "https://example.com/i.qcow2"}}, "spec.forProvider.image: ClusterProviderConfig home does not allow images by URL (its kvm.allowImageURLs is false): name a key of its kvm.images (alpine, debian-12)"},
		"URL image allowed":          {cfg(Block{ImagesByURL: urls(true)}), proxy.Request{Placement: proxy.Placement{Image: "https://example.com/i.qcow2"}}, ""},
		"no images by URL":           {cfg(Block{}), proxy.Request{Placement: proxy.Placement{Image: "https://example.com/i.qcow2"}}, ""},
		"cloud-init by default":      {cfg(Block{}), proxy.Request{CloudInit: secretCloudInit}, ""},
		"cloud-init forbidden":       {cfg(Block{AllowUserCloudInit: ptr.To(false)}), proxy.Request{CloudInit: secretCloudInit}, "spec.forProvider.cloudInit: ClusterProviderConfig home does not allow a proxy's own cloud-init (its kvm.allowUserCloudInit is false): remove it"},
		"cloud-init allowed":         {cfg(Block{AllowUserCloudInit: ptr.To(true)}), proxy.Request{CloudInit: secretCloudInit}, ""},
		"forbidden but none given":   {cfg(Block{AllowUserCloudInit: ptr.To(false)}), proxy.Request{}, ""},
		"config without its backend": {&Config{Name: "c"}, proxy.Request{CloudInit: secretCloudInit}, ""},
		"tenant's cloud-init on a cluster config": {tenant(cfg(Block{})), proxy.Request{CloudInit: secretCloudInit},
			"spec.forProvider.cloudInit: ClusterProviderConfig home does not allow the cloud-init of namespaced proxies (its kvm.allowTenantCloudInit is false, the default)"},
		"tenant's cloud-init allowed":           {tenant(cfg(Block{AllowTenantCloudInit: true})), proxy.Request{CloudInit: secretCloudInit}, ""},
		"tenant's but allowUserCloudInit false": {tenant(cfg(Block{AllowTenantCloudInit: true, AllowUserCloudInit: ptr.To(false)})), proxy.Request{CloudInit: secretCloudInit}, "its kvm.allowUserCloudInit is false"},
		"tenant without cloud-init":             {tenant(cfg(Block{})), proxy.Request{}, ""},
		"tenant's URL image on a cluster config": {tenant(cfg(Block{ImagesByURL: urls(true)})), proxy.Request{Placement: proxy.Placement{Image: "https://tenant.example/evil.qcow2"}},
			"spec.forProvider.image: ClusterProviderConfig home does not allow the images by URL of namespaced proxies (its kvm.allowTenantImageURLs is false, the default)"},
		"tenant's URL image allowed": {tenant(cfg(Block{ImagesByURL: &ImagesByURL{Allowed: true, TenantAllowed: true}})), proxy.Request{Placement: proxy.Placement{Image: "https://tenant.example/i.qcow2"}}, ""},
		"tenant's URL image without allowImageURLs": {tenant(cfg(Block{ImagesByURL: &ImagesByURL{TenantAllowed: true}})), proxy.Request{Placement: proxy.Placement{Image: "https://tenant.example/i.qcow2"}},
			"its kvm.allowImageURLs is false"},
		"tenant's catalogue image": {tenant(cfg(Block{ImagesByURL: urls(true)})), proxy.Request{Placement: proxy.Placement{Image: "debian-12"}}, ""},
	} {
		t.Run(name, func(t *testing.T) {
			err := tc.cfg.Allows(tc.req)
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("Allows() = %v, want nil", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want) || !proxy.IsPermanent(err)):
				t.Errorf("Allows() = %v, want a Permanent error saying %q", err, tc.want)
			case err != nil && strings.Contains(err.Error(), "SENTINEL"):
				t.Errorf("Allows() quotes the cloud-init: %v", err)
			}
		})
	}
}
