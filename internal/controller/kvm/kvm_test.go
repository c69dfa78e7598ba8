package kvm

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"k8s.io/utils/ptr"

	spec "github.com/egressproxy/provider-egressproxy/apis/spec/v1alpha1"
	"github.com/egressproxy/provider-egressproxy/internal/controller/external"
)

func TestBlock(t *testing.T) {
	cases := map[string]struct {
		spec   spec.ProviderConfigSpec
		want   external.Block
		wantOK bool
	}{
		"NoKVMBlock": {spec: spec.ProviderConfigSpec{Proxmox: &spec.ProxmoxConfig{}}},
		"Defaults": {
			spec:   spec.ProviderConfigSpec{KVM: &spec.KVMConfig{Images: map[string]spec.KVMImage{"debian-12": {}}}},
			want:   external.Block{ImagesByURL: &external.ImagesByURL{Keys: []string{"debian-12"}}},
			wantOK: true,
		},
		"InsecureAndRestricted": {
			spec: spec.ProviderConfigSpec{KVM: &spec.KVMConfig{AllowImageURLs: true, AllowUserCloudInit: ptr.To(false),
				Credentials: spec.KVMCredentials{InsecureIgnoreHostKey: true}}},
			want: external.Block{AllowUserCloudInit: ptr.To(false), ImagesByURL: &external.ImagesByURL{Allowed: true, Keys: []string{}},
				Insecure: "kvm.credentials.insecureIgnoreHostKey is true: SSH host keys are not verified, so a host can be impersonated"},
			wantOK: true,
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got, ok := block(&tc.spec)
			if ok != tc.wantOK {
				t.Errorf("block(...): ok %v, want %v", ok, tc.wantOK)
			}
			if diff := cmp.Diff(tc.want, got, cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("block(...): -want, +got:\n%s", diff)
			}
		})
	}
}

func TestKindDescribesItsBackend(t *testing.T) {
	k := New(nil, Options{})
	b, gvks := k.Describe()
	if b.Name != "kvm" || len(gvks) != 2 || b.Connect == nil {
		t.Errorf("Describe() = backend %q (Connect set: %v), kinds %v; want kvm, a Connect, both scopes", b.Name, b.Connect != nil, gvks)
	}
	p := &spec.Placement{}
	*k.Location(p) = "host-a"
	if p.Host != "host-a" {
		t.Errorf("Location writes %+v; want Host", p)
	}
}
