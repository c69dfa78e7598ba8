package v1alpha1

// Each kind's parameters are shared by both scopes. Placement and CloudInit
// cannot change on a running VM, so they are immutable at admission; the
// proxy block is applied in place.

// KVMProxyParameters are the desired state of a KVMProxy.
// +kubebuilder:validation:XValidation:rule="has(self.host) == has(oldSelf.host) && (!has(self.host) || self.host == oldSelf.host)",message="host is immutable",fieldPath=".host"
// +kubebuilder:validation:XValidation:rule="has(self.machineType) == has(oldSelf.machineType) && (!has(self.machineType) || self.machineType == oldSelf.machineType)",message="machineType is immutable",fieldPath=".machineType"
// +kubebuilder:validation:XValidation:rule="has(self.image) == has(oldSelf.image) && (!has(self.image) || self.image == oldSelf.image)",message="image is immutable",fieldPath=".image"
// +kubebuilder:validation:XValidation:rule="has(self.cloudInit) == has(oldSelf.cloudInit) && (!has(self.cloudInit) || self.cloudInit == oldSelf.cloudInit)",message="cloudInit is immutable: it runs at first boot only",fieldPath=".cloudInit"
type KVMProxyParameters struct {
	// Host is the name of one of the ProviderConfig's kvm.hosts. Optional
	// when the config has exactly one host.
	// +optional
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	Host string `json:"host,omitempty"`
	// MachineType is a key of the ProviderConfig's kvm.machineTypes.
	// Optional when the catalogue has exactly one entry.
	// +optional
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	MachineType string `json:"machineType,omitempty"`
	// Image is a key of the ProviderConfig's kvm.images, or an http(s) URL
	// of a qcow2 cloud image when the config's kvm.allowImageURLs is true.
	// Optional when the catalogue has exactly one. A URL's host must not be
	// a loopback, unspecified, link-local or metadata address.
	// +optional
	// +kubebuilder:validation:MaxLength=2048
	// +kubebuilder:validation:XValidation:rule="self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$') || self.matches('^https?://[^ ]+$')",message="must be a catalogue key (lowercase letters, digits, dashes) or an http(s) URL"
	// +kubebuilder:validation:XValidation:rule="!self.matches('^https?://.*') || (!self.split('/')[2].split('?')[0].split('#')[0].contains('@') && (isIP((self.split('/')[2].split('?')[0].split('#')[0].startsWith('[') ? self.split('/')[2].split('?')[0].split('#')[0].substring(1, self.split('/')[2].split('?')[0].split('#')[0].indexOf(']') < 1 ? 1 : self.split('/')[2].split('?')[0].split('#')[0].indexOf(']')) : self.split('/')[2].split('?')[0].split('#')[0].split(':')[0])) ? !['0.0.0.0/8', '127.0.0.0/8', '169.254.0.0/16', '100.100.100.200/32', '168.63.129.16/32', '192.0.0.192/32', '::/96', 'fe80::/10', 'fd00:ec2::/32', 'fd20:ce::254/128', '64:ff9b::/96', '2002::/16'].exists(m, cidr(m).containsIP((self.split('/')[2].split('?')[0].split('#')[0].startsWith('[') ? self.split('/')[2].split('?')[0].split('#')[0].substring(1, self.split('/')[2].split('?')[0].split('#')[0].indexOf(']') < 1 ? 1 : self.split('/')[2].split('?')[0].split('#')[0].indexOf(']')) : self.split('/')[2].split('?')[0].split('#')[0].split(':')[0]))) : ((self.split('/')[2].split('?')[0].split('#')[0].startsWith('[') ? self.split('/')[2].split('?')[0].split('#')[0].substring(1, self.split('/')[2].split('?')[0].split('#')[0].indexOf(']') < 1 ? 1 : self.split('/')[2].split('?')[0].split('#')[0].indexOf(']')) : self.split('/')[2].split('?')[0].split('#')[0].split(':')[0]).matches('^([a-zA-Z0-9]([-a-zA-Z0-9]*[a-zA-Z0-9])?[.])*[a-zA-Z]([-a-zA-Z0-9]*[a-zA-Z0-9])?$') && !((self.split('/')[2].split('?')[0].split('#')[0].startsWith('[') ? self.split('/')[2].split('?')[0].split('#')[0].substring(1, self.split('/')[2].split('?')[0].split('#')[0].indexOf(']') < 1 ? 1 : self.split('/')[2].split('?')[0].split('#')[0].indexOf(']')) : self.split('/')[2].split('?')[0].split('#')[0].split(':')[0]).lowerAscii() in ['localhost', 'localhost6', 'ip6-localhost', 'ip6-loopback', 'localhost.localdomain', 'localhost6.localdomain6', 'metadata', 'metadata.google.internal', 'instance-data', 'instance-data.ec2.internal']) && !(self.split('/')[2].split('?')[0].split('#')[0].startsWith('[') ? self.split('/')[2].split('?')[0].split('#')[0].substring(1, self.split('/')[2].split('?')[0].split('#')[0].indexOf(']') < 1 ? 1 : self.split('/')[2].split('?')[0].split('#')[0].indexOf(']')) : self.split('/')[2].split('?')[0].split('#')[0].split(':')[0]).lowerAscii().endsWith('.localhost'))))",message="the URL's host must be a DNS name or a routable address: not loopback, unspecified, link-local, a cloud metadata address or a name for one (localhost, *.localhost, ip6-localhost, ip6-loopback, metadata.google.internal), not an IP in another spelling (a numeric last label, ::ffff:127.0.0.1), without a trailing dot or user info"
	Image string `json:"image,omitempty"`
	// CloudInit is extra cloud-init user-data, merged with the generated
	// Squid setup. Treated as secret: never logged.
	// +optional
	// +kubebuilder:validation:MaxLength=65536
	CloudInit string `json:"cloudInit,omitempty"`
	// Proxy is what Squid enforces.
	Proxy ProxySettings `json:"proxy"`
}

// ProxmoxProxyParameters are the desired state of a ProxmoxProxy.
// +kubebuilder:validation:XValidation:rule="has(self.node) == has(oldSelf.node) && (!has(self.node) || self.node == oldSelf.node)",message="node is immutable",fieldPath=".node"
// +kubebuilder:validation:XValidation:rule="has(self.machineType) == has(oldSelf.machineType) && (!has(self.machineType) || self.machineType == oldSelf.machineType)",message="machineType is immutable",fieldPath=".machineType"
// +kubebuilder:validation:XValidation:rule="has(self.image) == has(oldSelf.image) && (!has(self.image) || self.image == oldSelf.image)",message="image is immutable",fieldPath=".image"
// +kubebuilder:validation:XValidation:rule="has(self.cloudInit) == has(oldSelf.cloudInit) && (!has(self.cloudInit) || self.cloudInit == oldSelf.cloudInit)",message="cloudInit is immutable: it runs at first boot only",fieldPath=".cloudInit"
type ProxmoxProxyParameters struct {
	// Node is one of the ProviderConfig's proxmox.nodes. Optional when the
	// config has exactly one node.
	// +optional
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-zA-Z0-9]([-a-zA-Z0-9]*[a-zA-Z0-9])?$`
	Node string `json:"node,omitempty"`
	// MachineType is a key of the ProviderConfig's proxmox.machineTypes.
	// +optional
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	MachineType string `json:"machineType,omitempty"`
	// Image is a key of the ProviderConfig's proxmox.templates.
	// +optional
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	Image string `json:"image,omitempty"`
	// CloudInit is extra cloud-init user-data, merged with the generated
	// Squid setup. Treated as secret: never logged.
	// +optional
	// +kubebuilder:validation:MaxLength=65536
	CloudInit string `json:"cloudInit,omitempty"`
	// Proxy is what Squid enforces.
	Proxy ProxySettings `json:"proxy"`
}

// GCPProxyParameters are the desired state of a GCPProxy.
// +kubebuilder:validation:XValidation:rule="has(self.zone) == has(oldSelf.zone) && (!has(self.zone) || self.zone == oldSelf.zone)",message="zone is immutable",fieldPath=".zone"
// +kubebuilder:validation:XValidation:rule="has(self.machineType) == has(oldSelf.machineType) && (!has(self.machineType) || self.machineType == oldSelf.machineType)",message="machineType is immutable",fieldPath=".machineType"
// +kubebuilder:validation:XValidation:rule="has(self.image) == has(oldSelf.image) && (!has(self.image) || self.image == oldSelf.image)",message="image is immutable",fieldPath=".image"
// +kubebuilder:validation:XValidation:rule="has(self.cloudInit) == has(oldSelf.cloudInit) && (!has(self.cloudInit) || self.cloudInit == oldSelf.cloudInit)",message="cloudInit is immutable: it runs at first boot only",fieldPath=".cloudInit"
// +kubebuilder:validation:XValidation:rule="(has(self.address) ? self.address.type : 'Ephemeral') == (has(oldSelf.address) ? oldSelf.address.type : 'Ephemeral')",message="address.type is immutable (no address block is Ephemeral)",fieldPath=".address"
type GCPProxyParameters struct {
	// Zone is a Compute Engine zone such as europe-west1-b; it must be one
	// of the ProviderConfig's gcp.zones when that list is set.
	// +optional
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:XValidation:rule="self.matches('^[a-z]+-[a-z]+[0-9]+-[a-z]$')",message="must be a Compute Engine zone such as europe-west1-b (a region such as europe-west1 is not a zone)"
	Zone string `json:"zone,omitempty"`
	// MachineType is a key of the ProviderConfig's gcp.machineTypes.
	// +optional
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	MachineType string `json:"machineType,omitempty"`
	// Image is a key of the ProviderConfig's gcp.images.
	// +optional
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	Image string `json:"image,omitempty"`
	// CloudInit is extra cloud-init user-data, merged with the generated
	// Squid setup. Treated as secret: never logged.
	// +optional
	// +kubebuilder:validation:MaxLength=65536
	CloudInit string `json:"cloudInit,omitempty"`
	// Address chooses the proxy's address.
	// +optional
	Address *GCPAddress `json:"address,omitempty"`
	// Firewall manages a firewall rule admitting the allowed client CIDRs
	// to the proxy port.
	// +optional
	Firewall *GCPFirewall `json:"firewall,omitempty"`
	// Proxy is what Squid enforces.
	Proxy ProxySettings `json:"proxy"`
}

// GCPAddress chooses the proxy's address on Compute Engine.
type GCPAddress struct {
	// Type is Ephemeral (an ephemeral external IP), Static (a reserved
	// external address per proxy, its own egress IP) or Internal (no
	// external IP; clients reach the internal address).
	// +kubebuilder:default=Ephemeral
	// +kubebuilder:validation:Enum=Ephemeral;Static;Internal
	Type string `json:"type"`
	// Retain keeps a Static address when the proxy is deleted.
	// +optional
	Retain bool `json:"retain,omitempty"`
}

// GCPFirewall manages the proxy's firewall rule.
type GCPFirewall struct {
	// Manage creates a firewall rule for this proxy and deletes it with the
	// proxy. When false, admitting clients is left to the platform team.
	// +kubebuilder:default=true
	Manage bool `json:"manage"`
}

// PodProxyParameters are the desired state of a PodProxy.
type PodProxyParameters struct {
	// Replicas is how many Squid pods serve the proxy. Two or more are
	// spread over the nodes the config's placement allows (at most one
	// more on any node than on another), kept available by a
	// PodDisruptionBudget, and each one's egress address is checked
	// (status.atProvider.egressIPs). Default 1.
	// +optional
	// +kubebuilder:default=1
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=10
	Replicas *int32 `json:"replicas,omitempty"`
	// Service exposes the proxy through a Service. Without it clients use
	// the pod's address.
	// +optional
	Service *PodService `json:"service,omitempty"`
	// Proxy is what Squid enforces.
	Proxy ProxySettings `json:"proxy"`
}

// PodService is the Service in front of a PodProxy.
type PodService struct {
	// Type is ClusterIP or LoadBalancer.
	// +kubebuilder:default=ClusterIP
	// +kubebuilder:validation:Enum=ClusterIP;LoadBalancer
	Type string `json:"type"`
}
