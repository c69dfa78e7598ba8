package pvetest

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	spec "github.com/egressproxy/provider-egressproxy/apis/spec/v1alpha1"
)

// ProviderConfig is a proxmox block for a server of the default Options
// (nodes pve1 and pve2, ISO storage local, bridge vmbr0, template 9000 as
// debian-12, machine type small), its credentials in the Secret
// namespace/name that Secret returns.
func (s *Server) ProviderConfig(namespace, name string) *spec.ProxmoxConfig {
	return &spec.ProxmoxConfig{
		URL: s.URL,
		Credentials: spec.ProxmoxCredentials{
			TokenSecretRef: spec.SecretKeySelector{Namespace: namespace, Name: name, Key: "token"},
			CASecretRef:    &spec.SecretKeySelector{Namespace: namespace, Name: name, Key: "ca.pem"},
		},
		Nodes:        []string{"pve1", "pve2"},
		ISOStorage:   "local",
		Bridge:       "vmbr0",
		VMIDRange:    &spec.VMIDRange{Min: 100000, Max: 199999},
		DiskGiB:      10,
		Templates:    map[string]spec.ProxmoxTemplate{"debian-12": {VMID: 9000}},
		MachineTypes: map[string]spec.ProxmoxMachineType{"small": {Cores: 1, MemoryMiB: 1024}},
	}
}

// Secret is the Secret namespace/name with the server's API token and CA
// certificate, as ProviderConfig reads them.
func (s *Server) Secret(namespace, name string) *corev1.Secret {
	return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		Data: map[string][]byte{"token": []byte(s.Token()), "ca.pem": s.CAPEM()}}
}
