package proxmox

import (
	"testing"

	"github.com/google/go-cmp/cmp"
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
		"NoProxmoxBlock": {spec: spec.ProviderConfigSpec{KVM: &spec.KVMConfig{}}},
		"Verified":       {spec: spec.ProviderConfigSpec{Proxmox: &spec.ProxmoxConfig{AllowUserCloudInit: ptr.To(false)}}, want: external.Block{AllowUserCloudInit: ptr.To(false)}, wantOK: true},
		"TLSOff": {
			spec:   spec.ProviderConfigSpec{Proxmox: &spec.ProxmoxConfig{InsecureSkipTLSVerify: true}},
			want:   external.Block{Insecure: "proxmox.insecureSkipTLSVerify is true: the API's certificate is not verified, so the token can be intercepted"},
			wantOK: true,
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got, ok := block(&tc.spec)
			if ok != tc.wantOK {
				t.Errorf("block(...): ok %v, want %v", ok, tc.wantOK)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("block(...): -want, +got:\n%s", diff)
			}
		})
	}
}
