package config

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/util/validation"

	spec "github.com/egressproxy/provider-egressproxy/apis/spec/v1alpha1"
)

// TestSecretNames: every Secret a config of any block reads is found,
// each once, optional refs only when set.
func TestSecretNames(t *testing.T) {
	sel := func(name string) spec.SecretKeySelector { return spec.SecretKeySelector{Name: name, Key: "k"} }
	ptr := func(name string) *spec.SecretKeySelector { s := sel(name); return &s }
	cases := map[string]struct {
		spec spec.ProviderConfigSpec
		want []string
	}{
		"KVM": {spec: spec.ProviderConfigSpec{KVM: &spec.KVMConfig{Credentials: spec.KVMCredentials{SSHKeySecretRef: sel("ssh"), KnownHostsSecretRef: ptr("known-hosts")}}},
			want: []string{"known-hosts", "ssh"}},
		"KVMWithoutKnownHosts": {spec: spec.ProviderConfigSpec{KVM: &spec.KVMConfig{Credentials: spec.KVMCredentials{SSHKeySecretRef: sel("ssh"), InsecureIgnoreHostKey: true}}},
			want: []string{"ssh"}},
		"ProxmoxOneSecret": {spec: spec.ProviderConfigSpec{Proxmox: &spec.ProxmoxConfig{Credentials: spec.ProxmoxCredentials{TokenSecretRef: sel("pve"), CASecretRef: ptr("pve")}}},
			want: []string{"pve"}},
		"ProxmoxTwo": {spec: spec.ProviderConfigSpec{Proxmox: &spec.ProxmoxConfig{Credentials: spec.ProxmoxCredentials{TokenSecretRef: sel("token"), CASecretRef: ptr("ca")}}},
			want: []string{"ca", "token"}},
		"GCP":        {spec: spec.ProviderConfigSpec{GCP: &spec.GCPConfig{Credentials: spec.GCPCredentials{SecretRef: ptr("key")}}}, want: []string{"key"}},
		"Kubernetes": {spec: spec.ProviderConfigSpec{Kubernetes: &spec.KubernetesConfig{Credentials: spec.KubernetesCredentials{SecretRef: ptr("kubeconfig")}}}, want: []string{"kubeconfig"}},
		"None":       {spec: spec.ProviderConfigSpec{Kubernetes: &spec.KubernetesConfig{}}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, SecretNames(&tc.spec)); diff != "" {
				t.Errorf("SecretNames: -want, +got:\n%s", diff)
			}
		})
	}
}

// TestSecretFinalizer: the finalizer names its config and is a valid
// finalizer name for any config name, and two long names that share 54
// characters still differ.
func TestSecretFinalizer(t *testing.T) {
	if got, want := SecretFinalizer("team-pods"), "providerconfig.m.egressproxy.io/team-pods"; got != want {
		t.Errorf("SecretFinalizer(team-pods) = %q; want %q", got, want)
	}
	long := strings.Repeat("a", 253)
	other := strings.Repeat("a", 252) + "b"
	for _, n := range []string{"team-pods", strings.Repeat("b", 63), long, other, "a.b.c"} {
		if errs := validation.IsQualifiedName(SecretFinalizer(n)); len(errs) > 0 {
			t.Errorf("SecretFinalizer(%q) = %q: %v", n, SecretFinalizer(n), errs)
		}
	}
	if SecretFinalizer(long) == SecretFinalizer(other) {
		t.Errorf("two long config names get one finalizer %q", SecretFinalizer(long))
	}
}
