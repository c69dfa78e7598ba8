package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// SecretKeySelector names one key of a Secret. On namespaced resources the
// namespace must be omitted: the Secret is read from the resource's own
// namespace. On cluster-scoped resources it is required.
type SecretKeySelector struct {
	// Namespace of the Secret. Required on cluster-scoped resources, not
	// allowed on namespaced ones.
	// +optional
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	Namespace string `json:"namespace,omitempty"`
	// Name of the Secret.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$`
	Name string `json:"name"`
	// Key within the Secret's data.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[-._a-zA-Z0-9]+$`
	Key string `json:"key"`
}

// ProxySettings is the common proxy block: what Squid enforces, the same on
// every kind.
// +kubebuilder:validation:XValidation:rule="(has(self.auth) && self.auth.enabled) || self.allowedClientCIDRs.all(c, !isCIDR(c) || cidr(c).prefixLength() >= (cidr(c).ip().family() == 4 ? 8 : 32))",message="without auth, no allowedClientCIDRs entry may be broader than /8 (IPv4) or /32 (IPv6): the proxy would be open to much of the internet; narrow them, or turn on auth (auth.enabled: true), which makes them allowed",fieldPath=".allowedClientCIDRs"
// +kubebuilder:validation:XValidation:rule="(has(self.auth) && self.auth.enabled) || (self.allowedClientCIDRs.filter(c, isCIDR(c)).map(c, cidr(c)).map(n, n.ip().family() == 4 ? (n.prefixLength() >= 8 ? [4294967296, 2147483648, 1073741824, 536870912, 268435456, 134217728, 67108864, 33554432, 16777216, 8388608, 4194304, 2097152, 1048576, 524288, 262144, 131072, 65536, 32768, 16384, 8192, 4096, 2048, 1024, 512, 256, 128, 64, 32, 16, 8, 4, 2, 1][n.prefixLength()] : 0) : n.prefixLength() < 32 ? 0 : cidr('64:ff9b::/96').containsCIDR(n) ? [4294967296, 2147483648, 1073741824, 536870912, 268435456, 134217728, 67108864, 33554432, 16777216, 8388608, 4194304, 2097152, 1048576, 524288, 262144, 131072, 65536, 32768, 16384, 8192, 4096, 2048, 1024, 512, 256, 128, 64, 32, 16, 8, 4, 2, 1][n.prefixLength() - 96] : cidr('2002::/16').containsCIDR(n) ? [4294967296, 2147483648, 1073741824, 536870912, 268435456, 134217728, 67108864, 33554432, 16777216, 8388608, 4194304, 2097152, 1048576, 524288, 262144, 131072, 65536, 32768, 16384, 8192, 4096, 2048, 1024, 512, 256, 128, 64, 32, 16, 8, 4, 2, 1][n.prefixLength() <= 48 ? n.prefixLength() - 16 : 32] : (n.containsCIDR(cidr('64:ff9b::/96')) || (n.prefixLength() <= 95 && n.containsCIDR(cidr('::fffe:0:0/95')))) ? 4294967296 : 0).sum() <= 16777216)",message="without auth, allowedClientCIDRs together may admit at most a /8 of IPv4 (16777216 addresses, counting IPv6 entries that carry IPv4 clients: NAT64 64:ff9b::/96, 6to4 2002::/16, any covering ::ffff:0:0/96): admission adds up the entries' sizes, so overlapping entries count twice; merge or narrow them, or turn on auth (auth.enabled: true)",fieldPath=".allowedClientCIDRs"
// +kubebuilder:validation:XValidation:rule="(has(self.auth) && self.auth.enabled) || (self.allowedClientCIDRs.filter(c, isCIDR(c)).map(c, cidr(c)).filter(n, n.ip().family() == 6 && n.prefixLength() >= 32).map(n, n.prefixLength() <= 64 ? [4294967296, 2147483648, 1073741824, 536870912, 268435456, 134217728, 67108864, 33554432, 16777216, 8388608, 4194304, 2097152, 1048576, 524288, 262144, 131072, 65536, 32768, 16384, 8192, 4096, 2048, 1024, 512, 256, 128, 64, 32, 16, 8, 4, 2, 1][n.prefixLength() - 32] : 1).sum() <= 4294967296)",message="without auth, allowedClientCIDRs together may admit at most a /32 of IPv6: admission adds up the IPv6 entries' sizes (each narrower than a /64 counts as a /64), so overlapping entries count twice; merge or narrow them, or turn on auth (auth.enabled: true)",fieldPath=".allowedClientCIDRs"
// +kubebuilder:validation:XValidation:rule="!has(self.port) || (self.port != 80 && self.port != 443 && !(has(self.allowedPorts) && self.port in self.allowedPorts))",message="port must not be 80, 443 or one of allowedPorts: those are destination ports, and a request to the proxy's own port could loop back into it; use another port, such as 3128",fieldPath=".port"
type ProxySettings struct {
	// Port Squid listens on.
	// +optional
	// +kubebuilder:default=3128
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=65535
	Port *int32 `json:"port,omitempty"`

	// AllowedClientCIDRs may use the proxy; everyone else is refused. At
	// least one is required: the proxy is never open. Without auth none
	// may be broader than /8 (IPv4) or /32 (IPv6), and all of them
	// together may cover at most a /8 of IPv4 (IPv6 entries that carry
	// IPv4 clients, NAT64 and 6to4, count there) and a /32 of IPv6.
	// Admission adds up the entries' sizes (overlaps count twice); the
	// provider checks the exact union again. With auth any is allowed.
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=43
	// +kubebuilder:validation:items:XValidation:rule="isCIDR(self)",message="must be a CIDR such as 10.0.0.0/8 or fd00::/8 (a bare IP needs /32 or /128)"
	// +kubebuilder:validation:items:XValidation:rule="!isCIDR(self) || cidr(self) == cidr(self).masked()",message="must not have host bits set: write the network (10.1.2.0/24 rather than 10.1.2.7/24), or one address as /32 or /128"
	// +listType=set
	AllowedClientCIDRs []string `json:"allowedClientCIDRs"`

	// AllowedPorts are the ports clients may open CONNECT tunnels to.
	// Defaults to [443].
	// +optional
	// +kubebuilder:validation:MaxItems=32
	// +kubebuilder:validation:items:Minimum=1
	// +kubebuilder:validation:items:Maximum=65535
	// +listType=set
	AllowedPorts []int32 `json:"allowedPorts,omitempty"`

	// AllowedDestinations, when set, is a domain allow-list: "api.github.com"
	// matches that host, ".stripe.com" the domain and its subdomains.
	// Labels take letters, digits, '-' and '_'. Everything else is
	// refused. Names only: an IP address (in any
	// spelling: 10.0.0.1, 127.1, 2130706433, 0x7f000001) is refused.
	// +optional
	// +kubebuilder:validation:MaxItems=256
	// +kubebuilder:validation:items:MaxLength=253
	// +kubebuilder:validation:items:Pattern=`^\.?([a-zA-Z0-9_]([-a-zA-Z0-9_]*[a-zA-Z0-9_])?\.)*[a-zA-Z0-9_]([-a-zA-Z0-9_]*[a-zA-Z0-9_])?$`
	// +kubebuilder:validation:items:XValidation:rule="!self.startsWith('*')",message="a wildcard is written with a leading dot: .stripe.com matches stripe.com and every subdomain of it"
	// +kubebuilder:validation:items:XValidation:rule="!self.lowerAscii().matches('(^|[.])([0-9]+|0x[0-9a-f]*)$')",message="must be a domain name, not an IP address in any spelling (a numeric last label, as in 10.0.0.1, 127.1, 2130706433 or 0x7f000001, is an address); open private address ranges with allowedDestinationCIDRs"
	// +listType=set
	AllowedDestinations []string `json:"allowedDestinations,omitempty"`

	// AllowedDestinationCIDRs open private destination ranges, which the
	// proxy denies otherwise: RFC 1918 (10.0.0.0/8, 172.16.0.0/12,
	// 192.168.0.0/16), 100.64.0.0/10, 192.0.0.0/24 and fc00::/7 (and
	// their NAT64 and 6to4 spellings). Each entry must lie inside one of
	// them. The proxy's own host (loopback, 0.0.0.0/8), link-local, cloud
	// metadata addresses, multicast, local-use NAT64 (64:ff9b:1::/48) and,
	// for a PodProxy, the cluster's own networks and API server are never
	// reachable, also inside an opened range. Checked
	// after name resolution: a name resolving into a denied range is
	// denied.
	// +optional
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=43
	// +kubebuilder:validation:items:XValidation:rule="isCIDR(self)",message="must be a CIDR such as 10.20.0.0/16 (one address: /32 or /128)"
	// +kubebuilder:validation:items:XValidation:rule="!isCIDR(self) || cidr(self) == cidr(self).masked()",message="must not have host bits set: write the network (10.20.0.0/16 rather than 10.20.3.4/16), or one address as /32 or /128"
	// +kubebuilder:validation:items:XValidation:rule="!isCIDR(self) || ['10.0.0.0/8', '172.16.0.0/12', '192.168.0.0/16', '100.64.0.0/10', '192.0.0.0/24', 'fc00::/7', '64:ff9b::a00:0/104', '64:ff9b::ac10:0/108', '64:ff9b::c0a8:0/112', '64:ff9b::6440:0/106', '64:ff9b::c000:0/120', '2002:a00::/24', '2002:ac10::/28', '2002:c0a8::/32', '2002:6440::/26', '2002:c000::/40'].exists(p, cidr(p).containsCIDR(cidr(self)))",message="must lie inside a private range (10.0.0.0/8, 172.16.0.0/12, 192.168.0.0/16, 100.64.0.0/10, 192.0.0.0/24, fc00::/7, or their NAT64 or 6to4 spellings): only those are denied and can be opened; loopback, link-local and metadata addresses and local-use NAT64 (64:ff9b:1::/48) never are, and public addresses need no opening"
	// +listType=set
	AllowedDestinationCIDRs []string `json:"allowedDestinationCIDRs,omitempty"`

	// Auth turns on basic authentication.
	// +optional
	Auth *ProxyAuth `json:"auth,omitempty"`

	// TLS makes the proxy listen with TLS on port (Squid's https_port)
	// instead of plain HTTP: clients connect to an https:// proxy URL, so
	// that the credentials and the requests to it are encrypted. The
	// connection Secret then holds the https:// URL and ca.crt.
	// +optional
	TLS *ProxyTLS `json:"tls,omitempty"`
}

// ProxyTLS is the proxy's own certificate.
type ProxyTLS struct {
	// SecretRef names a Secret holding the certificate in tls.crt (PEM,
	// the proxy's certificate first, then its intermediates) and its
	// private key in tls.key (PEM), as cert-manager writes them. Its
	// ca.crt, when present, is what clients are told to trust; without
	// one, the last certificate of tls.crt. The certificate must name the
	// host clients connect to (the connection Secret's host). A changed
	// Secret is rolled out to the proxy.
	SecretRef SecretReference `json:"secretRef"`
}

// SecretReference names a Secret. On namespaced resources the namespace
// must be omitted: the Secret is read from the resource's own namespace.
// On cluster-scoped resources it is required.
type SecretReference struct {
	// Namespace of the Secret. Required on cluster-scoped resources, not
	// allowed on namespaced ones.
	// +optional
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	Namespace string `json:"namespace,omitempty"`
	// Name of the Secret.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$`
	Name string `json:"name"`
}

// ProxyAuth is basic authentication on the proxy.
type ProxyAuth struct {
	// Enabled turns authentication on.
	Enabled bool `json:"enabled"`
	// Username clients authenticate as: letters, digits, '.', '_' and '-',
	// not first, and not REQUIRED (to Squid, any valid user) or
	// egressproxy-check (the provider's egress check user).
	// +optional
	// +kubebuilder:default=proxy
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9._-]{1,64}$`
	// +kubebuilder:validation:XValidation:rule="self != 'REQUIRED' && !self.startsWith('-')",message="auth.username must be 1 to 64 letters, digits, '.', '_' and '-', not starting with '-' (Squid reads an option) and not REQUIRED (Squid reads any valid user)"
	// +kubebuilder:validation:XValidation:rule="self != 'egressproxy-check'",message="auth.username egressproxy-check is the provider's own egress check user: choose another name"
	Username string `json:"username,omitempty"`
	// PasswordSecretRef names the Secret key holding the password. When
	// absent a password of 32 random characters is generated, kept stable,
	// and delivered in the connection Secret.
	// +optional
	PasswordSecretRef *SecretKeySelector `json:"passwordSecretRef,omitempty"`
}

// Placement is where an instance runs and what it runs, as catalogue keys
// of the ProviderConfig. Each kind uses the word its backend uses.
type Placement struct {
	// Host (KVMProxy).
	// +optional
	Host string `json:"host,omitempty"`
	// Node (ProxmoxProxy).
	// +optional
	Node string `json:"node,omitempty"`
	// Zone (GCPProxy).
	// +optional
	Zone string `json:"zone,omitempty"`
	// MachineType key.
	// +optional
	MachineType string `json:"machineType,omitempty"`
	// Image key (a template key on ProxmoxProxy), or an image URL (KVMProxy,
	// when its config allows URLs).
	// +optional
	Image string `json:"image,omitempty"`
}

// ProxyObservation is the observed state of a proxy, the same on every kind.
type ProxyObservation struct {
	// ID is the backend's identifier of the instance.
	// +optional
	ID string `json:"id,omitempty"`
	// State is Provisioning, Running, Stopped or Terminated.
	// +optional
	State string `json:"state,omitempty"`
	// IP clients connect to.
	// +optional
	IP string `json:"ip,omitempty"`
	// EgressIP is the address the proxy's traffic leaves from, when known:
	// what an echo endpoint saw through the proxy (EgressIPSource Verified
	// or Reported), or the backend's own figure where that is the egress
	// address (Backend: a GCP instance's external address, a routed KVM
	// guest's own).
	// +optional
	EgressIP string `json:"egressIP,omitempty"`
	// EgressIPs are every egress address of the proxy, sorted: EgressIP
	// alone, or for a PodProxy whose replicas leave from several
	// addresses (several nodes) all of them, EgressIP the first. It is
	// the list to put on an allow-list.
	// +optional
	// +listType=atomic
	EgressIPs []string `json:"egressIPs,omitempty"`
	// EgressIPSource says where EgressIP comes from: Verified (the
	// provider's request through the proxy), Reported (the same check run
	// inside the instance, reported by the backend) or Backend (the
	// backend's figure, not verified).
	// +optional
	EgressIPSource string `json:"egressIPSource,omitempty"`
	// EgressIPVerifiedAt is when the egress check last saw EgressIP.
	// +optional
	EgressIPVerifiedAt *metav1.Time `json:"egressIPVerifiedAt,omitempty"`
	// EgressIPCheckedThrough is the route of the check that saw a Verified
	// or Reported EgressIP: the address clients reach the instance at (a
	// PodProxy's Service, not its pod) and the backend's own figure of its
	// egress address where it differs ("10.96.0.10", "10.0.0.5 backend
	// 203.0.113.9"), and where the check goes through each of a PodProxy's
	// replicas their addresses ("10.96.0.10 replicas
	// 10.1.0.5:3128,10.1.1.6:3128"). A failed or pending check keeps
	// EgressIP only through the same route, also after a provider restart.
	// +optional
	EgressIPCheckedThrough string `json:"egressIPCheckedThrough,omitempty"`
	// EgressIPCheckedWith is the echo URL of the check that saw a Verified
	// or Reported EgressIP (the config's egressCheck.url, which holds no
	// credentials). A failed or pending check keeps EgressIP only while
	// the config names the same URL, also after a provider restart; a
	// status without it keeps nothing a check has not seen again.
	// +optional
	EgressIPCheckedWith string `json:"egressIPCheckedWith,omitempty"`
	// EgressIPsBefore are the egress addresses last checked while the
	// instance that had them is replaced or moved to another address (a
	// new pod, a recreated VM) and its own are not checked yet: EgressIP
	// is then empty, or the backend's own figure (EgressIPSource Backend),
	// and the first check of the new instance is compared with these, so
	// that a new address is reported as a change (the EgressVerified
	// condition Changed, an EgressIPChanged event).
	// +optional
	// +listType=atomic
	EgressIPsBefore []string `json:"egressIPsBefore,omitempty"`
	// Placement actually used.
	// +optional
	Placement *Placement `json:"placement,omitempty"`
	// CreatedAt as the backend reports it.
	// +optional
	CreatedAt *metav1.Time `json:"createdAt,omitempty"`
	// ProxyReachable is true once the proxy answered on its port.
	// +optional
	ProxyReachable bool `json:"proxyReachable,omitempty"`
	// Progress of long-running work (an image download, a clone).
	// +optional
	Progress string `json:"progress,omitempty"`
	// Operation is an asynchronous backend operation still being followed.
	// +optional
	Operation string `json:"operation,omitempty"`
	// Endpoint is host:port of the proxy.
	// +optional
	Endpoint string `json:"endpoint,omitempty"`
	// Details are backend-specific facts.
	// +optional
	Details map[string]string `json:"details,omitempty"`
}

// The values of ProxyObservation.EgressIPSource.
const (
	// EgressIPVerified: the provider's own request through the proxy to the
	// config's echo endpoint saw the address.
	EgressIPVerified = "Verified"
	// EgressIPReported: the same request, sent from inside the instance
	// through its own Squid where the provider cannot reach the proxy, and
	// reported back by the backend.
	EgressIPReported = "Reported"
	// EgressIPBackend: the backend's own figure, published unverified only
	// where it is the egress address (a GCP instance's external address, a
	// routed KVM guest's own).
	EgressIPBackend = "Backend"
)

// TypeEgressVerified is the condition saying whether the egress check
// confirms the proxy's egress address: True when it does (reason Verified,
// or Changed when the address moved), False when the check fails or sees
// another address than the backend's own figure (reason Differs, such as
// a GCP instance's reserved address). Absent when no check is configured.
const TypeEgressVerified = "EgressVerified"

// TypeSecure is the condition saying whether the proxy's credentials are
// safe on the way to it: False (reason CredentialsInClear) when auth is on
// and the proxy listens on a public address (a GCPProxy's external
// address, a LoadBalancer PodProxy, any public IP) without TLS; True with
// reason TLS when it listens with TLS, NoCredentialsExposed otherwise.
const TypeSecure = "Secure"
