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

// TestNamespacedConfigNeverUsesTheProvidersIdentity is the attack of a
// namespace user whose ProviderConfig got past admission (written before
// the rule, or with validation off): the controller layer refuses it too.
func TestNamespacedConfigNeverUsesTheProvidersIdentity(t *testing.T) {
	r := ConfigReader{}
	for name, s := range map[string]spec.ProviderConfigSpec{
		"kubernetes": {Kubernetes: &spec.KubernetesConfig{Credentials: spec.KubernetesCredentials{Source: xpv2.CredentialsSourceInjectedIdentity}}},
		"gcp":        {GCP: &spec.GCPConfig{Project: "p", Credentials: spec.GCPCredentials{Source: xpv2.CredentialsSourceInjectedIdentity}}},
	} {
		t.Run(name, func(t *testing.T) {
			pc := &namespacedv1alpha1.ProviderConfig{Spec: namespacedv1alpha1.NamespacedProviderConfigSpec{ProviderConfigSpec: s}}
			pc.Namespace, pc.Name = "team-a", "mine"
			err := r.Of(pc).CheckTenancy()
			if err == nil || !proxy.IsPermanent(err) || !strings.Contains(err.Error(), name+".credentials.source InjectedIdentity is not allowed on a namespaced ProviderConfig") {
				t.Errorf("CheckTenancy() = %v, want a Permanent error naming %s.credentials.source", err, name)
			}
			// The same block on a ClusterProviderConfig is the platform's
			// to write, and allowed.
			cpc := &namespacedv1alpha1.ClusterProviderConfig{Spec: namespacedv1alpha1.ClusterProviderConfigSpec{ProviderConfigSpec: s}}
			if err := r.Of(cpc).CheckTenancy(); err != nil {
				t.Errorf("ClusterProviderConfig: CheckTenancy() = %v, want nil", err)
			}
		})
	}
}

// TestNamespacedConfigNeverSetsTheGCPEndpoint: a namespace user's config
// that points the Compute Engine client elsewhere (past admission) would
// make the provider send its tokens to, and report the answers of, any
// HTTPS server the user names, from inside the cluster.
func TestNamespacedConfigNeverSetsTheGCPEndpoint(t *testing.T) {
	r := ConfigReader{}
	s := spec.ProviderConfigSpec{GCP: &spec.GCPConfig{Project: "p", Endpoint: "https://kubernetes.default.svc",
		Credentials: spec.GCPCredentials{Source: xpv2.CredentialsSourceSecret, SecretRef: &spec.SecretKeySelector{Key: "k"}}}}
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
	kvm := func(urls bool, userCI *bool) *Config {
		return &Config{Name: "ClusterProviderConfig home", Spec: spec.ProviderConfigSpec{KVM: &spec.KVMConfig{
			AllowImageURLs: urls, AllowUserCloudInit: userCI, Images: map[string]spec.KVMImage{"debian-12": {}},
		}}}
	}
	for name, tc := range map[string]struct {
		cfg  *Config
		req  proxy.Request
		want string
	}{
		"catalogue image":          {kvm(false, nil), proxy.Request{Placement: proxy.Placement{Image: "debian-12"}}, ""},
		"URL image not allowed":    {kvm(false, nil), proxy.Request{Placement: proxy.Placement{Image: "https://example.com/i.qcow2"}}, "spec.forProvider.image: ClusterProviderConfig home does not allow images by URL (its kvm.allowImageURLs is false): name a key of its kvm.images (debian-12)"},
		"URL image allowed":        {kvm(true, nil), proxy.Request{Placement: proxy.Placement{Image: "https://example.com/i.qcow2"}}, ""},
		"cloud-init by default":    {kvm(false, nil), proxy.Request{CloudInit: secretCloudInit}, ""},
		"cloud-init forbidden":     {kvm(false, ptr.To(false)), proxy.Request{CloudInit: secretCloudInit}, "spec.forProvider.cloudInit: ClusterProviderConfig home does not allow a proxy's own cloud-init (its kvm.allowUserCloudInit is false): remove it"},
		"proxmox cloud-init":       {&Config{Name: "c", Spec: spec.ProviderConfigSpec{Proxmox: &spec.ProxmoxConfig{AllowUserCloudInit: ptr.To(false)}}}, proxy.Request{CloudInit: secretCloudInit}, "its proxmox.allowUserCloudInit is false"},
		"gcp cloud-init":           {&Config{Name: "c", Spec: spec.ProviderConfigSpec{GCP: &spec.GCPConfig{AllowUserCloudInit: ptr.To(false)}}}, proxy.Request{CloudInit: secretCloudInit}, "its gcp.allowUserCloudInit is false"},
		"gcp cloud-init allowed":   {&Config{Name: "c", Spec: spec.ProviderConfigSpec{GCP: &spec.GCPConfig{AllowUserCloudInit: ptr.To(true)}}}, proxy.Request{CloudInit: secretCloudInit}, ""},
		"forbidden but none given": {kvm(false, ptr.To(false)), proxy.Request{}, ""},
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
