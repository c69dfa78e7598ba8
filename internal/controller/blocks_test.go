package controller_test

import (
	"testing"

	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"k8s.io/utils/ptr"

	spec "github.com/egressproxy/provider-egressproxy/apis/spec/v1alpha1"
	"github.com/egressproxy/provider-egressproxy/internal/controller/external"
	"github.com/egressproxy/provider-egressproxy/internal/controller/gcp"
	"github.com/egressproxy/provider-egressproxy/internal/controller/kvm"
	"github.com/egressproxy/provider-egressproxy/internal/controller/proxmox"
)

// TestBlocks: each binding's backend reads its own block of a
// ProviderConfig spec and no other, and gives the generic layer what it
// enforces of it (catalogue by URL, cloud-init, credentials source,
// verification turned off, settings only a cluster-scoped config may
// make).
func TestBlocks(t *testing.T) {
	kvmBackend := kvm.New(nil, kvm.Options{}).Backend
	proxmoxBackend := proxmox.New(nil, proxmox.Options{}).Backend
	gcpBackend := gcp.New(nil, gcp.Options{}).Backend
	injected := xpv2.CredentialsSourceInjectedIdentity
	cases := map[string]struct {
		backend external.Backend
		spec    spec.ProviderConfigSpec
		want    external.Block
		wantOK  bool
	}{
		"KVM/NotItsBlock": {backend: kvmBackend, spec: spec.ProviderConfigSpec{Proxmox: &spec.ProxmoxConfig{}}},
		"KVM/Defaults": {
			backend: kvmBackend,
			spec:    spec.ProviderConfigSpec{KVM: &spec.KVMConfig{Images: map[string]spec.KVMImage{"debian-12": {}}}},
			want:    external.Block{GuestReportsAddress: true, ImagesByURL: &external.ImagesByURL{Keys: []string{"debian-12"}}},
			wantOK:  true,
		},
		"KVM/InsecureAndRestricted": {
			backend: kvmBackend,
			spec: spec.ProviderConfigSpec{KVM: &spec.KVMConfig{AllowImageURLs: true, AllowUserCloudInit: ptr.To(false),
				Credentials: spec.KVMCredentials{InsecureIgnoreHostKey: true}}},
			want: external.Block{AllowUserCloudInit: ptr.To(false), GuestReportsAddress: true, ImagesByURL: &external.ImagesByURL{Allowed: true, Keys: []string{}},
				Insecure: "kvm.credentials.insecureIgnoreHostKey is true: SSH host keys are not verified, so a host can be impersonated"},
			wantOK: true,
		},
		"KVM/TenantCloudInit": {
			backend: kvmBackend,
			spec:    spec.ProviderConfigSpec{KVM: &spec.KVMConfig{AllowTenantCloudInit: true}},
			want:    external.Block{AllowTenantCloudInit: true, GuestReportsAddress: true, ImagesByURL: &external.ImagesByURL{Keys: []string{}}},
			wantOK:  true,
		},
		"Proxmox/TenantCloudInit": {
			backend: proxmoxBackend,
			spec:    spec.ProviderConfigSpec{Proxmox: &spec.ProxmoxConfig{AllowTenantCloudInit: true}},
			want:    external.Block{AllowTenantCloudInit: true, GuestReportsAddress: true},
			wantOK:  true,
		},
		"GCP/TenantCloudInit": {
			backend: gcpBackend,
			spec:    spec.ProviderConfigSpec{GCP: &spec.GCPConfig{AllowTenantCloudInit: true, Credentials: spec.GCPCredentials{Source: injected}}},
			want:    external.Block{AllowTenantCloudInit: true, CredentialsSource: &injected},
			wantOK:  true,
		},
		"Proxmox/NotItsBlock": {backend: proxmoxBackend, spec: spec.ProviderConfigSpec{KVM: &spec.KVMConfig{}}},
		"Proxmox/Verified": {
			backend: proxmoxBackend,
			spec:    spec.ProviderConfigSpec{Proxmox: &spec.ProxmoxConfig{AllowUserCloudInit: ptr.To(false)}},
			want:    external.Block{AllowUserCloudInit: ptr.To(false), GuestReportsAddress: true},
			wantOK:  true,
		},
		"Proxmox/TLSOff": {
			backend: proxmoxBackend,
			spec:    spec.ProviderConfigSpec{Proxmox: &spec.ProxmoxConfig{InsecureSkipTLSVerify: true}},
			want:    external.Block{GuestReportsAddress: true, Insecure: "proxmox.insecureSkipTLSVerify is true: the API's certificate is not verified, so the token can be intercepted"},
			wantOK:  true,
		},
		"GCP/NotItsBlock": {backend: gcpBackend, spec: spec.ProviderConfigSpec{KVM: &spec.KVMConfig{}}},
		"GCP/CredentialsSource": {
			backend: gcpBackend,
			spec:    spec.ProviderConfigSpec{GCP: &spec.GCPConfig{Credentials: spec.GCPCredentials{Source: injected}}},
			want:    external.Block{CredentialsSource: &injected},
			wantOK:  true,
		},
		"GCP/EndpointIsClusterOnly": {
			backend: gcpBackend,
			spec:    spec.ProviderConfigSpec{GCP: &spec.GCPConfig{Endpoint: "https://kubernetes.default.svc"}},
			want: external.Block{CredentialsSource: ptr.To(xpv2.CredentialsSource("")),
				ClusterOnly: "gcp.endpoint is not allowed on a namespaced ProviderConfig: the provider would send this config's tokens to it and report its answers from inside the cluster; use a ClusterProviderConfig the platform team provides"},
			wantOK: true,
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got, ok := tc.backend.Block(&tc.spec)
			if ok != tc.wantOK {
				t.Errorf("%s Block(...): ok %v, want %v", tc.backend.Name, ok, tc.wantOK)
			}
			if diff := cmp.Diff(tc.want, got, cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("%s Block(...): -want, +got:\n%s", tc.backend.Name, diff)
			}
		})
	}
}
