package v1alpha1

import "testing"

func TestBlockName(t *testing.T) {
	cases := map[string]struct {
		spec ProviderConfigSpec
		want string
	}{
		"None":       {},
		"KVM":        {spec: ProviderConfigSpec{KVM: &KVMConfig{}}, want: "kvm"},
		"Proxmox":    {spec: ProviderConfigSpec{Proxmox: &ProxmoxConfig{}}, want: "proxmox"},
		"GCP":        {spec: ProviderConfigSpec{GCP: &GCPConfig{}}, want: "gcp"},
		"Kubernetes": {spec: ProviderConfigSpec{Kubernetes: &KubernetesConfig{}}, want: "kubernetes"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if got := tc.spec.BlockName(); got != tc.want {
				t.Errorf("BlockName() = %q, want %q", got, tc.want)
			}
		})
	}
}
