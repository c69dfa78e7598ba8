package v1alpha1

import (
	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ProviderConfigSpec says where proxies run and with which credentials. It
// holds exactly one backend block.
// +kubebuilder:validation:XValidation:rule="[has(self.kvm), has(self.proxmox), has(self.gcp), has(self.kubernetes)].filter(x, x).size() == 1",message="exactly one of kvm, proxmox, gcp or kubernetes must be set"
// +kubebuilder:validation:XValidation:rule="!has(oldSelf.installationID) || (has(self.installationID) && self.installationID == oldSelf.installationID)",message="installationID cannot change once set: instances are marked with it",fieldPath=".installationID"
type ProviderConfigSpec struct {
	// InstallationID is the installation part of the ownership mark written
	// on every instance. Optional: the provider's own installation ID (its
	// --installation-id flag, by default the UID of the kube-system
	// namespace) is used when absent. Set it when two control planes share a
	// backend under the same name. Cannot change once set.
	// +optional
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	InstallationID string `json:"installationID,omitempty"`

	// NoProxy extends the NO_PROXY (and no_proxy) key of the connection
	// Secret of every proxy using this config: destinations its clients
	// reach directly, after the default localhost, 127.0.0.1, ::1, .svc and
	// .cluster.local. Host names, domains (".corp.example" matches its
	// subdomains), addresses, or CIDRs for clients that read them.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=253
	// +kubebuilder:validation:items:Pattern=`^[^,\s]+$`
	NoProxy []string `json:"noProxy,omitempty"`

	// Orphans says what becomes of instances this config's backend holds
	// with this installation's mark whose managed resource no longer exists
	// (its finalizer was removed by hand, or the provider crashed between
	// Create and recording it). Default: reported, never deleted.
	// +optional
	Orphans *OrphanPolicy `json:"orphans,omitempty"`

	// AllowTenantImports lets namespaced proxies (a tenant's) that use this
	// config as a ClusterProviderConfig import an instance made by hand (one
	// without the provider's mark) with spec.managementPolicies:
	// ["Observe"]: they then read its state and address, and its Squid is
	// probed. Default false: an external name would otherwise read any
	// instance of the platform's on this config's backend. An instance made
	// for another resource is never imported. Cluster-scoped proxies, and a
	// namespaced ProviderConfig's own proxies, import without it.
	// +optional
	AllowTenantImports bool `json:"allowTenantImports,omitempty"`

	// AllowTenantRelease lets namespaced proxies (a tenant's) that use this
	// config as a ClusterProviderConfig keep their instance when deleted
	// with management policies without Delete: the release is recorded
	// (status.released) and the orphan sweep never touches the instance.
	// Default false: such an instance is left to this config's orphan
	// sweep (reported in status.orphans, deleted under orphans.policy
	// Delete), so that a tenant cannot keep instances on the platform's
	// backend outside its namespace, nor fill status.released.
	// Cluster-scoped proxies, and a namespaced ProviderConfig's own
	// proxies, release without it.
	// +optional
	AllowTenantRelease bool `json:"allowTenantRelease,omitempty"`

	// KVM runs proxies as libvirt domains on hosts reached over SSH.
	// +optional
	KVM *KVMConfig `json:"kvm,omitempty"`
	// Proxmox runs proxies as VMs cloned from templates on Proxmox VE.
	// +optional
	Proxmox *ProxmoxConfig `json:"proxmox,omitempty"`
	// GCP runs proxies as Compute Engine instances.
	// +optional
	GCP *GCPConfig `json:"gcp,omitempty"`
	// Kubernetes runs proxies as pods in a Kubernetes cluster.
	// +optional
	Kubernetes *KubernetesConfig `json:"kubernetes,omitempty"`
}

// OrphanPolicy is what the periodic orphan sweep does with an instance
// carrying this installation's mark whose managed resource is gone.
type OrphanPolicy struct {
	// Policy: Report lists orphans in status.orphans, as an event and in the
	// egressproxy_orphans metric; Delete also deletes those older than
	// minAge. Instances of another installation and unmarked ones are never
	// touched.
	// +optional
	// +kubebuilder:default=Report
	// +kubebuilder:validation:Enum=Report;Delete
	Policy string `json:"policy,omitempty"`
	// MinAge is how old an orphan must be before Delete removes it.
	// +optional
	// +kubebuilder:default="1h"
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:XValidation:rule="self.matches('^(0|(([0-9]+([.][0-9]*)?|[.][0-9]+)(ns|us|µs|ms|s|m|h))+)$')",message="must be a duration such as 30m, 1h or 168h: numbers with the units ns, us, ms, s, m or h (no d for days), no sign"
	// +kubebuilder:validation:XValidation:rule="!self.matches('^(0|(([0-9]+([.][0-9]*)?|[.][0-9]+)(ns|us|µs|ms|s|m|h))+)$') || duration(self) < duration('2562047h')",message="must be under 2562047h"
	MinAge *metav1.Duration `json:"minAge,omitempty"`
}

// Orphan policies.
const (
	OrphanPolicyReport = "Report"
	OrphanPolicyDelete = "Delete"
)

// OrphanStatus is what the last orphan sweep found.
type OrphanStatus struct {
	// LastSweepTime is when the sweep last listed the backend.
	// +optional
	LastSweepTime *metav1.Time `json:"lastSweepTime,omitempty"`
	// Count of orphans found by the last sweep (after any deletions).
	Count int32 `json:"count"`
	// Released is how many of the instances (or pieces of one) the last
	// sweep listed were left on purpose by their resource (status.released):
	// not orphans, never deleted.
	// +optional
	Released int32 `json:"released,omitempty"`
	// Instances are the orphans found, at most 20 (oldest first).
	// +optional
	// +listType=atomic
	Instances []OrphanInstance `json:"instances,omitempty"`
	// Hosts are the KVM hosts the sweep last listed, with what of this
	// installation stands on each: what it remembers of a host should the
	// host leave the config.
	// +optional
	// +listType=atomic
	Hosts []OrphanHost `json:"hosts,omitempty"`
	// DepartedHosts are hosts the sweep listed that have since left the
	// config, with what stood on them when last listed. The provider no
	// longer reaches them: what stands there is neither observed nor
	// deleted. An entry goes when its host is back in the config (and is
	// listed again); remove it from the status by hand once dealt with.
	// +optional
	// +listType=atomic
	DepartedHosts []OrphanHost `json:"departedHosts,omitempty"`
}

// OrphanHost is one host and what of this installation stood on it.
type OrphanHost struct {
	// Name of the host in the config.
	Name string `json:"name"`
	// Address it was reached at.
	// +optional
	Address string `json:"address,omitempty"`
	// Count of this installation's instances (and pieces left without
	// one) on the host when last listed.
	Count int32 `json:"count"`
	// Instances are their names, at most 20.
	// +optional
	// +listType=atomic
	Instances []string `json:"instances,omitempty"`
	// LastListedTime is when the sweep last listed the host.
	// +optional
	LastListedTime *metav1.Time `json:"lastListedTime,omitempty"`
	// DepartedTime is when the sweep first found the host gone from the
	// config.
	// +optional
	DepartedTime *metav1.Time `json:"departedTime,omitempty"`
}

// OrphanInstance is one instance whose managed resource is gone, or the
// pieces of one that stand without it.
type OrphanInstance struct {
	// ID is the instance's backend ID.
	ID string `json:"id"`
	// Name of the instance.
	Name string `json:"name"`
	// UID of the managed resource the instance's mark names; empty when
	// the pieces carry only a prefix of it (uidPrefix).
	UID string `json:"uid"`
	// UIDPrefix is, for pieces whose names carry only a prefix of their
	// resource's UID and no installation (Proxmox seed ISOs), that
	// prefix: they are reported, never deleted.
	// +optional
	UIDPrefix string `json:"uidPrefix,omitempty"`
	// Leftovers, when set, says no instance exists: these pieces of it
	// (volumes, seeds, firewall rules, addresses, Secrets, ReplicaSets)
	// stand without it.
	// +optional
	// +listType=atomic
	Leftovers []string `json:"leftovers,omitempty"`
	// CreatedAt is when the instance was created, if the backend says.
	// +optional
	CreatedAt *metav1.Time `json:"createdAt,omitempty"`
}

// KVMConfig is the kvm backend block.
type KVMConfig struct {
	// Credentials for SSH.
	Credentials KVMCredentials `json:"credentials"`
	// DiskSizeGB is the size of each proxy's disk (an overlay on the image).
	// +optional
	// +kubebuilder:default=10
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=2048
	DiskSizeGB int32 `json:"diskSizeGb,omitempty"`
	// InstallGuestAgent installs qemu-guest-agent at first boot, which the
	// provider uses to learn the address.
	// +optional
	// +kubebuilder:default=true
	InstallGuestAgent *bool `json:"installGuestAgent,omitempty"`
	// VendorData is the platform's own cloud-init for every proxy of this
	// config: the seed's vendor-data file, as it is (a #cloud-config
	// document, a script starting with #!, or MIME multipart). cloud-init
	// applies it under the user-data, so a cloud-config key the user-data
	// sets too (runcmd and write_files: the provider's setup always sets
	// them) is dropped by its merge: run commands with a script. Read by
	// instances created after it is set; never logged.
	// +optional
	// +kubebuilder:validation:MaxLength=65536
	VendorData string `json:"vendorData,omitempty"`
	// AllowImageURLs lets a KVMProxy name its image by an http(s) URL
	// instead of a key of images. Off by default: then proxies run only
	// the catalogue's images.
	// +optional
	AllowImageURLs bool `json:"allowImageURLs,omitempty"`
	// AllowTenantImageURLs lets namespaced proxies (a tenant's) that use
	// this config as a ClusterProviderConfig name an image by URL, where
	// allowImageURLs allows it. Default false: a tenant's image runs as
	// root on a VM of the platform's, on the platform's network, like a
	// tenant's cloud-init (allowTenantCloudInit). Cluster-scoped proxies,
	// and a namespaced ProviderConfig's own proxies, follow allowImageURLs
	// alone.
	// +optional
	AllowTenantImageURLs bool `json:"allowTenantImageURLs,omitempty"`
	// AllowUserCloudInit lets proxies add their own cloudInit. Default
	// true; set false so that the proxies of this config run exactly the
	// provider's setup (a proxy's cloudInit is then refused with a
	// condition). User cloud-init runs as root on the VM. On a
	// ClusterProviderConfig, namespaced proxies need allowTenantCloudInit
	// as well.
	// +optional
	// +kubebuilder:default=true
	AllowUserCloudInit *bool `json:"allowUserCloudInit,omitempty"`
	// AllowTenantCloudInit lets namespaced proxies (a tenant's) that use
	// this config as a ClusterProviderConfig add their own cloudInit.
	// Default false: a tenant's cloud-init runs as root on a VM of the
	// platform's, on the platform's network, and can rewrite Squid's
	// configuration. allowUserCloudInit: false refuses everyone's still.
	// Cluster-scoped proxies, and a namespaced ProviderConfig's own
	// proxies (the tenant's own hypervisor), follow allowUserCloudInit
	// alone: there it means nothing.
	// +optional
	AllowTenantCloudInit bool `json:"allowTenantCloudInit,omitempty"`
	// Images is the catalogue of base images by key.
	// +optional
	// +kubebuilder:validation:MaxProperties=64
	// +kubebuilder:validation:XValidation:rule="self.all(k, k.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$') && size(k) <= 63)",message="image keys must be lowercase letters, digits and dashes (at most 63): they name volumes"
	Images map[string]KVMImage `json:"images,omitempty"`
	// MachineTypes is the catalogue of sizes by key.
	// +kubebuilder:validation:MinProperties=1
	// +kubebuilder:validation:MaxProperties=64
	// +kubebuilder:validation:XValidation:rule="self.all(k, k.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$') && size(k) <= 63)",message="machine type keys must be lowercase letters, digits and dashes (at most 63)"
	MachineTypes map[string]KVMMachineType `json:"machineTypes"`
	// Hosts are the libvirt hosts proxies may run on.
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=64
	// +listType=map
	// +listMapKey=name
	Hosts []KVMHost `json:"hosts"`
	// MaxImageSizeGiB is the largest image this config's proxies boot
	// from, whether they download it, join another config's download of
	// it, or find it in the pool already: a larger image fails them. A
	// download is held to it as the server declares the size and as it
	// streams, and one this config starts leaves nothing in the pool.
	// +optional
	// +kubebuilder:default=20
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1024
	MaxImageSizeGiB int32 `json:"maxImageSizeGiB,omitempty"`
	// MaxConcurrentDownloadsPerHost is how many images download to one
	// host at a time; more wait their turn.
	// +optional
	// +kubebuilder:default=2
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=16
	MaxConcurrentDownloadsPerHost int32 `json:"maxConcurrentDownloadsPerHost,omitempty"`
	// UnusedImageRetention is how long a base image stays in a host's
	// pool once no overlay and no domain uses it; the orphan sweep then
	// deletes it (a proxy that needs it again downloads it again). 0s
	// keeps every image. The time is counted by the running provider: a
	// restart starts it again.
	// +optional
	// +kubebuilder:default="168h"
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:XValidation:rule="self.matches('^(0|(([0-9]+([.][0-9]*)?|[.][0-9]+)(ns|us|µs|ms|s|m|h))+)$')",message="must be a duration such as 30m, 1h or 168h: numbers with the units ns, us, ms, s, m or h (no d for days), no sign"
	// +kubebuilder:validation:XValidation:rule="!self.matches('^(0|(([0-9]+([.][0-9]*)?|[.][0-9]+)(ns|us|µs|ms|s|m|h))+)$') || duration(self) < duration('2562047h')",message="must be under 2562047h"
	UnusedImageRetention *metav1.Duration `json:"unusedImageRetention,omitempty"`
	// EgressCheck, when set, has the provider verify each Ready proxy's
	// egress address: it asks the echo endpoint through the proxy and
	// records what the endpoint saw (docs/allow-listing.md).
	// +optional
	EgressCheck *EgressCheck `json:"egressCheck,omitempty"`
}

// KVMCredentials are the SSH credentials for every host of a kvm block.
// +kubebuilder:validation:XValidation:rule="has(self.knownHostsSecretRef) || (has(self.insecureIgnoreHostKey) && self.insecureIgnoreHostKey)",message="knownHostsSecretRef is required unless insecureIgnoreHostKey is true",fieldPath=".knownHostsSecretRef"
type KVMCredentials struct {
	// SSHKeySecretRef names the SSH private key (OpenSSH or PEM format).
	SSHKeySecretRef SecretKeySelector `json:"sshKeySecretRef"`
	// KnownHostsSecretRef names a known_hosts file used to verify hosts.
	// +optional
	KnownHostsSecretRef *SecretKeySelector `json:"knownHostsSecretRef,omitempty"`
	// InsecureIgnoreHostKey turns off host key verification. Never in
	// production: it logs a warning and sets a condition on the config.
	// +optional
	InsecureIgnoreHostKey bool `json:"insecureIgnoreHostKey,omitempty"`
}

// KVMImage is one base image.
type KVMImage struct {
	// URL to download the image from (http or https). Its host must not be
	// a loopback, unspecified, link-local or cloud metadata address, nor a
	// name for one (localhost, metadata.google.internal). At most 900
	// characters (the admission check's cost budget).
	// +kubebuilder:validation:MaxLength=900
	// +kubebuilder:validation:Pattern=`^https?://[^ ]+$`
	// +kubebuilder:validation:XValidation:rule="!self.matches('^https?://.*') || (!self.split('/')[2].split('?')[0].split('#')[0].contains('@') && (isIP((self.split('/')[2].split('?')[0].split('#')[0].startsWith('[') ? self.split('/')[2].split('?')[0].split('#')[0].substring(1, self.split('/')[2].split('?')[0].split('#')[0].indexOf(']') < 1 ? 1 : self.split('/')[2].split('?')[0].split('#')[0].indexOf(']')) : self.split('/')[2].split('?')[0].split('#')[0].split(':')[0])) ? !['0.0.0.0/8', '127.0.0.0/8', '169.254.0.0/16', '100.100.100.200/32', '168.63.129.16/32', '192.0.0.192/32', '::/96', 'fe80::/10', 'fd00:ec2::/32', 'fd20:ce::254/128', '64:ff9b::/96', '2002::/16'].exists(m, cidr(m).containsIP((self.split('/')[2].split('?')[0].split('#')[0].startsWith('[') ? self.split('/')[2].split('?')[0].split('#')[0].substring(1, self.split('/')[2].split('?')[0].split('#')[0].indexOf(']') < 1 ? 1 : self.split('/')[2].split('?')[0].split('#')[0].indexOf(']')) : self.split('/')[2].split('?')[0].split('#')[0].split(':')[0]))) : ((self.split('/')[2].split('?')[0].split('#')[0].startsWith('[') ? self.split('/')[2].split('?')[0].split('#')[0].substring(1, self.split('/')[2].split('?')[0].split('#')[0].indexOf(']') < 1 ? 1 : self.split('/')[2].split('?')[0].split('#')[0].indexOf(']')) : self.split('/')[2].split('?')[0].split('#')[0].split(':')[0]).matches('^([a-zA-Z0-9]([-a-zA-Z0-9]*[a-zA-Z0-9])?[.])*[a-zA-Z]([-a-zA-Z0-9]*[a-zA-Z0-9])?$') && !((self.split('/')[2].split('?')[0].split('#')[0].startsWith('[') ? self.split('/')[2].split('?')[0].split('#')[0].substring(1, self.split('/')[2].split('?')[0].split('#')[0].indexOf(']') < 1 ? 1 : self.split('/')[2].split('?')[0].split('#')[0].indexOf(']')) : self.split('/')[2].split('?')[0].split('#')[0].split(':')[0]).lowerAscii() in ['localhost', 'localhost6', 'ip6-localhost', 'ip6-loopback', 'localhost.localdomain', 'localhost6.localdomain6', 'metadata', 'metadata.google.internal', 'instance-data', 'instance-data.ec2.internal']) && !(self.split('/')[2].split('?')[0].split('#')[0].startsWith('[') ? self.split('/')[2].split('?')[0].split('#')[0].substring(1, self.split('/')[2].split('?')[0].split('#')[0].indexOf(']') < 1 ? 1 : self.split('/')[2].split('?')[0].split('#')[0].indexOf(']')) : self.split('/')[2].split('?')[0].split('#')[0].split(':')[0]).lowerAscii().endsWith('.localhost'))))",message="the URL's host must be a DNS name or a routable address: not loopback, unspecified, link-local, a cloud metadata address or a name for one (localhost, *.localhost, ip6-localhost, ip6-loopback, metadata.google.internal), not an IP in another spelling (a numeric last label, ::ffff:127.0.0.1), without a trailing dot or user info"
	URL string `json:"url"`
	// SHA256 of the image file, checked after download.
	// +optional
	// +kubebuilder:validation:Pattern=`^[a-f0-9]{64}$`
	SHA256 string `json:"sha256,omitempty"`
	// Format of the image file.
	// +optional
	// +kubebuilder:default=qcow2
	// +kubebuilder:validation:Enum=qcow2;raw
	Format string `json:"format,omitempty"`
	// Firmware the image boots with.
	// +optional
	// +kubebuilder:default=bios
	// +kubebuilder:validation:Enum=bios;uefi
	Firmware string `json:"firmware,omitempty"`
}

// KVMMachineType is one size.
type KVMMachineType struct {
	// VCPUs of the domain.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=64
	VCPUs int32 `json:"vcpus"`
	// MemoryMiB of the domain.
	// +kubebuilder:validation:Minimum=256
	// +kubebuilder:validation:Maximum=262144
	MemoryMiB int32 `json:"memoryMiB"`
}

// KVMHost is one libvirt host.
// +kubebuilder:validation:XValidation:rule="has(self.bridge) != has(self.network)",message="exactly one of bridge (a host bridge such as br0) and network (a libvirt network such as default) must be set",fieldPath=".bridge"
type KVMHost struct {
	// Name of the host, used in placement and IDs.
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	Name string `json:"name"`
	// Address is host:port of the SSH server.
	// +kubebuilder:validation:MaxLength=261
	// +kubebuilder:validation:XValidation:rule="self.matches('^([[][0-9a-fA-F:.]+[]]|[a-zA-Z0-9]([-a-zA-Z0-9.]*[a-zA-Z0-9])?):[0-9]{1,5}$')",message="must be host:port of the SSH server, such as 10.0.0.5:22, kvm1.example:22 or [fd00::5]:22"
	// +kubebuilder:validation:XValidation:rule="!self.matches(':[0-9]{1,5}$') || (int(self.substring(self.lastIndexOf(':') + 1)) >= 1 && int(self.substring(self.lastIndexOf(':') + 1)) <= 65535)",message="the port must be 1 to 65535"
	Address string `json:"address"`
	// User to log in as; it must be allowed to use the libvirt socket.
	// +kubebuilder:validation:Pattern=`^[a-z_][a-z0-9_-]{0,31}$`
	User string `json:"user"`
	// Socket is the path of libvirtd's read-write socket on the host.
	// +optional
	// +kubebuilder:default="/var/run/libvirt/libvirt-sock"
	// +kubebuilder:validation:Pattern=`^/[^ ]*$`
	Socket string `json:"socket,omitempty"`
	// Pool is the libvirt storage pool for images, disks and seeds.
	// +optional
	// +kubebuilder:default=default
	// +kubebuilder:validation:Pattern=`^[a-zA-Z0-9_][-a-zA-Z0-9_.]*$`
	Pool string `json:"pool,omitempty"`
	// Bridge the domain's NIC joins. Exactly one of bridge and network.
	// +optional
	// +kubebuilder:validation:Pattern=`^[a-zA-Z0-9_][-a-zA-Z0-9_.]{0,14}$`
	Bridge string `json:"bridge,omitempty"`
	// Network is a libvirt network the domain's NIC joins, instead of a
	// bridge.
	// +optional
	// +kubebuilder:validation:Pattern=`^[a-zA-Z0-9_][-a-zA-Z0-9_.]*$`
	Network string `json:"network,omitempty"`
	// DomainType is the libvirt domain type: kvm (hardware
	// virtualisation) or qemu (software emulation, for hosts without it;
	// much slower).
	// +optional
	// +kubebuilder:default=kvm
	// +kubebuilder:validation:Enum=kvm;qemu
	DomainType string `json:"domainType,omitempty"`
	// GuestNetwork says how the guests' traffic leaves the host: NAT (the
	// host translates it to its own address, as libvirt's default network
	// does) or Routed (the guests' own addresses reach the destination).
	// Only with Routed is a guest's own address published as its egress
	// address without an egress check; behind NAT the address a
	// destination sees is the host's, which only the check finds.
	// +optional
	// +kubebuilder:default=NAT
	// +kubebuilder:validation:Enum=NAT;Routed
	GuestNetwork string `json:"guestNetwork,omitempty"`
}

// ProxmoxConfig is the proxmox backend block.
// +kubebuilder:validation:XValidation:rule="!has(self.vmidRange) || self.vmidRange.min <= self.vmidRange.max",message="vmidRange.min must not exceed vmidRange.max",fieldPath=".vmidRange"
type ProxmoxConfig struct {
	// URL of the Proxmox VE API, such as https://pve.example:8006.
	// +kubebuilder:validation:MaxLength=2048
	// +kubebuilder:validation:XValidation:rule="self.startsWith('https://')",message="must be https:// (the Proxmox VE API speaks TLS), such as https://pve.example:8006"
	// +kubebuilder:validation:XValidation:rule="!self.startsWith('https://') || !self.substring(8).contains('/') || self.substring(8).indexOf('/') == self.substring(8).size() - 1",message="must be the base URL alone, such as https://pve.example:8006, without a path: the provider adds /api2/json"
	// +kubebuilder:validation:XValidation:rule="!self.startsWith('https://') || self.matches('^https://[^/ @?#]+(:[0-9]{1,5})?/?$')",message="must be https://host or https://host:port, with no spaces, user info, query or fragment (the token goes in credentials.tokenSecretRef)"
	URL string `json:"url"`
	// Credentials for the API.
	Credentials ProxmoxCredentials `json:"credentials"`
	// InsecureSkipTLSVerify turns off TLS verification. Never in
	// production: it logs a warning and sets a condition on the config.
	// +optional
	InsecureSkipTLSVerify bool `json:"insecureSkipTLSVerify,omitempty"`
	// Nodes proxies may run on.
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:Pattern=`^[a-zA-Z0-9]([-a-zA-Z0-9]*[a-zA-Z0-9])?$`
	// +listType=set
	Nodes []string `json:"nodes"`
	// ISOStorage is the storage the seed ISOs are uploaded to; the token
	// needs Datastore.Allocate there.
	// +kubebuilder:validation:Pattern=`^[a-zA-Z][-a-zA-Z0-9_.]*$`
	ISOStorage string `json:"isoStorage"`
	// Bridge the VM's net0 joins; the template's when absent.
	// +optional
	// +kubebuilder:validation:Pattern=`^[a-zA-Z0-9_][-a-zA-Z0-9_.]{0,14}$`
	Bridge string `json:"bridge,omitempty"`
	// VLANTag of net0.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=4094
	VLANTag *int32 `json:"vlanTag,omitempty"`
	// VMIDRange proxies' VMIDs are allocated from.
	// +optional
	VMIDRange *VMIDRange `json:"vmidRange,omitempty"`
	// DiskGiB grows the boot disk to this size when it is smaller.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=4096
	DiskGiB int32 `json:"diskGiB,omitempty"`
	// InstallGuestAgent installs qemu-guest-agent at first boot.
	// +optional
	// +kubebuilder:default=true
	InstallGuestAgent *bool `json:"installGuestAgent,omitempty"`
	// AllowUserCloudInit lets proxies add their own cloudInit; see
	// kvm.allowUserCloudInit.
	// +optional
	// +kubebuilder:default=true
	AllowUserCloudInit *bool `json:"allowUserCloudInit,omitempty"`
	// AllowTenantCloudInit lets namespaced proxies that use this config as
	// a ClusterProviderConfig add their own cloudInit; see
	// kvm.allowTenantCloudInit. Default false.
	// +optional
	AllowTenantCloudInit bool `json:"allowTenantCloudInit,omitempty"`
	// RequestTimeoutSeconds bounds each API request.
	// +optional
	// +kubebuilder:default=30
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=600
	RequestTimeoutSeconds int32 `json:"requestTimeoutSeconds,omitempty"`
	// Templates is the catalogue of templates by key.
	// +kubebuilder:validation:MinProperties=1
	// +kubebuilder:validation:MaxProperties=64
	// +kubebuilder:validation:XValidation:rule="self.all(k, k.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$') && size(k) <= 63)",message="template keys must be lowercase letters, digits and dashes (at most 63)"
	Templates map[string]ProxmoxTemplate `json:"templates"`
	// MachineTypes is the catalogue of sizes by key.
	// +kubebuilder:validation:MinProperties=1
	// +kubebuilder:validation:MaxProperties=64
	// +kubebuilder:validation:XValidation:rule="self.all(k, k.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$') && size(k) <= 63)",message="machine type keys must be lowercase letters, digits and dashes (at most 63)"
	MachineTypes map[string]ProxmoxMachineType `json:"machineTypes"`
	// EgressCheck, when set, has the provider verify each Ready proxy's
	// egress address: it asks the echo endpoint through the proxy and
	// records what the endpoint saw (docs/allow-listing.md).
	// +optional
	EgressCheck *EgressCheck `json:"egressCheck,omitempty"`
}

// ProxmoxCredentials are the API credentials of a proxmox block.
type ProxmoxCredentials struct {
	// TokenSecretRef names an API token in the form user@realm!tokenid=secret.
	TokenSecretRef SecretKeySelector `json:"tokenSecretRef"`
	// CASecretRef names a PEM CA bundle to verify the API's certificate.
	// +optional
	CASecretRef *SecretKeySelector `json:"caSecretRef,omitempty"`
}

// VMIDRange is an inclusive range of VMIDs.
type VMIDRange struct {
	// Min VMID.
	// +kubebuilder:validation:Minimum=100
	// +kubebuilder:validation:Maximum=999999999
	Min int32 `json:"min"`
	// Max VMID.
	// +kubebuilder:validation:Minimum=100
	// +kubebuilder:validation:Maximum=999999999
	Max int32 `json:"max"`
}

// ProxmoxTemplate is one template VM.
type ProxmoxTemplate struct {
	// VMID of the template.
	// +kubebuilder:validation:Minimum=100
	// +kubebuilder:validation:Maximum=999999999
	VMID int32 `json:"vmid"`
}

// ProxmoxMachineType is one size.
type ProxmoxMachineType struct {
	// Cores of the VM.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=128
	Cores int32 `json:"cores"`
	// MemoryMiB of the VM.
	// +kubebuilder:validation:Minimum=256
	// +kubebuilder:validation:Maximum=1048576
	MemoryMiB int32 `json:"memoryMiB"`
}

// GCPConfig is the gcp backend block.
// +kubebuilder:validation:XValidation:rule="self.credentials.source != 'Secret' || has(self.credentials.secretRef)",message="credentials.secretRef is required when credentials.source is Secret",fieldPath=".credentials"
type GCPConfig struct {
	// Project ID instances are created in.
	// +kubebuilder:validation:Pattern=`^[a-z][-a-z0-9]{4,28}[a-z0-9]$`
	Project string `json:"project"`
	// Credentials for the Compute Engine API.
	Credentials GCPCredentials `json:"credentials"`
	// Endpoint is the base URL of the Compute Engine API, for a private
	// or restricted endpoint (a Private Service Connect endpoint such as
	// https://compute-myendpoint.p.googleapis.com) and for tests against
	// a fake; default https://compute.googleapis.com. HTTPS only, no user
	// info, query or fragment. Only the Compute Engine calls go there: the
	// key's token_uri and the IAM Credentials API (impersonation) are not
	// redirected. Allowed on cluster-scoped configs only (the platform
	// team's): the provider sends the config's access tokens to it and
	// reports its answers, so a namespaced ProviderConfig may not set it
	// (docs/security.md).
	// +optional
	// +kubebuilder:validation:MaxLength=512
	// +kubebuilder:validation:XValidation:rule="isURL(self) && url(self).getScheme() == 'https' && url(self).getHostname() != '' && !self.contains('@') && !self.contains('?') && !self.contains('#') && !self.contains(' ')",message="must be an https:// URL: a host, an optional port and path, no user info, query or fragment (for example https://compute-myendpoint.p.googleapis.com)"
	Endpoint string `json:"endpoint,omitempty"`
	// Network is the VPC network.
	// +optional
	// +kubebuilder:default=default
	// +kubebuilder:validation:Pattern=`^[a-z]([-a-z0-9]*[a-z0-9])?$`
	Network string `json:"network,omitempty"`
	// Subnetwork in the instance's region; the network's default when
	// absent.
	// +optional
	// +kubebuilder:validation:Pattern=`^[a-z]([-a-z0-9]*[a-z0-9])?$`
	Subnetwork string `json:"subnetwork,omitempty"`
	// AllowUserCloudInit lets proxies add their own cloudInit; see
	// kvm.allowUserCloudInit.
	// +optional
	// +kubebuilder:default=true
	AllowUserCloudInit *bool `json:"allowUserCloudInit,omitempty"`
	// AllowTenantCloudInit lets namespaced proxies that use this config as
	// a ClusterProviderConfig add their own cloudInit; see
	// kvm.allowTenantCloudInit. Default false.
	// +optional
	AllowTenantCloudInit bool `json:"allowTenantCloudInit,omitempty"`
	// NetworkTags put on every instance, besides the provider's own tag
	// for the proxy (egressproxy- and a digest), which its firewall rule
	// targets.
	// +optional
	// +kubebuilder:validation:MaxItems=32
	// +kubebuilder:validation:items:MaxLength=63
	// +kubebuilder:validation:items:Pattern=`^[a-z]([-a-z0-9]*[a-z0-9])?$`
	// +kubebuilder:validation:items:XValidation:rule="!self.startsWith('egressproxy-')",message="the egressproxy- prefix is the provider's own: its proxies' tags, which their firewall rules target"
	// +listType=set
	NetworkTags []string `json:"networkTags,omitempty"`
	// DiskSizeGB of the boot disk.
	// +optional
	// +kubebuilder:default=10
	// +kubebuilder:validation:Minimum=10
	// +kubebuilder:validation:Maximum=65536
	DiskSizeGB int32 `json:"diskSizeGb,omitempty"`
	// Zones, when set, are the only zones proxies may use; the first is the
	// default.
	// +optional
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:Pattern=`^[a-z]+-[a-z]+[0-9]+-[a-z]$`
	// +listType=set
	Zones []string `json:"zones,omitempty"`
	// Images is the catalogue of images by key. Use images with cloud-init
	// (Ubuntu, or Debian's genericcloud): Squid is installed by cloud-init.
	// +kubebuilder:validation:MinProperties=1
	// +kubebuilder:validation:MaxProperties=64
	// +kubebuilder:validation:XValidation:rule="self.all(k, k.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$') && size(k) <= 63)",message="image keys must be lowercase letters, digits and dashes (at most 63)"
	Images map[string]GCPImage `json:"images"`
	// MachineTypes is the catalogue of sizes by key.
	// +kubebuilder:validation:MinProperties=1
	// +kubebuilder:validation:MaxProperties=64
	// +kubebuilder:validation:XValidation:rule="self.all(k, k.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$') && size(k) <= 63)",message="machine type keys must be lowercase letters, digits and dashes (at most 63)"
	MachineTypes map[string]GCPMachineType `json:"machineTypes"`
	// EgressCheck, when set, has the provider verify each Ready proxy's
	// egress address: it asks the echo endpoint through the proxy and
	// records what the endpoint saw (docs/allow-listing.md).
	// +optional
	EgressCheck *EgressCheck `json:"egressCheck,omitempty"`
}

// GCPCredentials says how to authenticate to Compute Engine.
// +kubebuilder:validation:XValidation:rule="!has(self.delegates) || has(self.impersonateServiceAccount)",message="delegates need impersonateServiceAccount: they are the chain to it",fieldPath=".delegates"
type GCPCredentials struct {
	// Source is Secret (a service-account key) or InjectedIdentity
	// (Application Default Credentials of the provider's pod).
	// +kubebuilder:validation:Enum=Secret;InjectedIdentity
	Source xpv2.CredentialsSource `json:"source"`
	// SecretRef names a service-account key (JSON).
	// +optional
	SecretRef *SecretKeySelector `json:"secretRef,omitempty"`
	// ImpersonateServiceAccount is the email of the service account the
	// provider acts as on Compute Engine. The key's account (or the
	// injected identity) trades its token for one of this account's
	// through the IAM Service Account Credentials API, so it needs only
	// roles/iam.serviceAccountTokenCreator on this account, and this
	// account holds the Compute roles.
	// +optional
	// +kubebuilder:validation:MaxLength=254
	// +kubebuilder:validation:Pattern=`^[a-z0-9][-a-z0-9]*@[a-z0-9][-a-z0-9.]*\.gserviceaccount\.com$`
	ImpersonateServiceAccount string `json:"impersonateServiceAccount,omitempty"`
	// Delegates is a delegation chain to ImpersonateServiceAccount: service
	// accounts in order, each holding the token creator role on the next
	// (the first on the caller's behalf, the last on
	// ImpersonateServiceAccount).
	// +optional
	// +kubebuilder:validation:MaxItems=8
	// +kubebuilder:validation:items:MaxLength=254
	// +kubebuilder:validation:items:Pattern=`^[a-z0-9][-a-z0-9]*@[a-z0-9][-a-z0-9.]*\.gserviceaccount\.com$`
	Delegates []string `json:"delegates,omitempty"`
}

// GCPImage is one image.
type GCPImage struct {
	// Image is an image or image family URL, such as
	// projects/ubuntu-os-cloud/global/images/family/ubuntu-2404-lts-amd64.
	// +kubebuilder:validation:MaxLength=1024
	// +kubebuilder:validation:Pattern=`^(https://[^ ]+|projects/[a-z][-a-z0-9]*/global/images/[^ ]+)$`
	Image string `json:"image"`
}

// GCPMachineType is one size.
type GCPMachineType struct {
	// MachineType such as e2-small.
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	MachineType string `json:"machineType"`
}

// KubernetesConfig is the kubernetes backend block.
// +kubebuilder:validation:XValidation:rule="self.credentials.source != 'Secret' || has(self.credentials.secretRef)",message="credentials.secretRef is required when credentials.source is Secret",fieldPath=".credentials"
type KubernetesConfig struct {
	// Credentials for the target cluster.
	Credentials KubernetesCredentials `json:"credentials"`
	// Namespace proxies run in, in the target cluster. It must exist.
	// +optional
	// +kubebuilder:default=egress-proxies
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	Namespace string `json:"namespace,omitempty"`
	// Image is the Squid container image. It must run squid as a non-root
	// user and ship basic_ncsa_auth. When empty, the provider runs the
	// image its release ships: Debian bookworm's squid, built by the
	// project and pushed next to the packages, by digest (the provider
	// fills it in; it is not stored here).
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	// +kubebuilder:validation:Pattern=`^[^ ]+$`
	Image string `json:"image,omitempty"`
	// ImagePullSecrets for the image.
	// +optional
	// +kubebuilder:validation:MaxItems=8
	ImagePullSecrets []corev1.LocalObjectReference `json:"imagePullSecrets,omitempty"`
	// Resources of the Squid container.
	// +optional
	Resources *corev1.ResourceRequirements `json:"resources,omitempty"`
	// NodeSelector for the proxy pods.
	// +optional
	NodeSelector map[string]string `json:"nodeSelector,omitempty"`
	// Tolerations of the proxy pods, for a pool of egress nodes kept for
	// them by a taint (egressproxy.io/egress=true:NoSchedule, say): with
	// NodeSelector or Affinity they put proxies there and nowhere else.
	// Placement is the config's, not a proxy's: a namespace user cannot
	// tolerate their way onto nodes the platform keeps for others.
	// +optional
	// +kubebuilder:validation:MaxItems=32
	// +kubebuilder:validation:items:XValidation:rule="!has(self.operator) || self.operator in ['Exists', 'Equal']",message="operator must be Exists or Equal"
	// +kubebuilder:validation:items:XValidation:rule="!has(self.effect) || self.effect in ['NoSchedule', 'PreferNoSchedule', 'NoExecute']",message="effect must be NoSchedule, PreferNoSchedule, NoExecute or empty (all three)"
	// +kubebuilder:validation:items:XValidation:rule="!has(self.operator) || self.operator != 'Exists' || !has(self.value) || self.value == ''",message="value must be empty when operator is Exists"
	// +kubebuilder:validation:items:XValidation:rule="(has(self.key) && self.key != '') || (has(self.operator) && self.operator == 'Exists')",message="a toleration without a key must have operator Exists (it tolerates every taint)"
	// +kubebuilder:validation:items:XValidation:rule="!has(self.tolerationSeconds) || (has(self.effect) && self.effect == 'NoExecute')",message="tolerationSeconds applies to effect NoExecute only"
	// +listType=atomic
	Tolerations []corev1.Toleration `json:"tolerations,omitempty"`
	// Affinity of the proxy pods: node affinity to choose egress nodes,
	// pod affinity or anti-affinity. A PodProxy of two or more replicas
	// is also spread over nodes by the provider (docs/pod-proxy.md).
	// +optional
	Affinity *corev1.Affinity `json:"affinity,omitempty"`
	// ClusterNetworks are the target cluster's own networks (Service and
	// Pod CIDRs) and API server addresses, which proxies never reach (a
	// proxy's allowedDestinationCIDRs cannot open them). Added to what the
	// provider discovers: the API server's endpoints, the kubernetes
	// Service, ServiceCIDRs, the nodes' podCIDRs and the nodes' internal
	// and external addresses. Set them where
	// discovery cannot see them: a cluster without ServiceCIDR objects, or
	// a network plugin that assigns pod addresses itself (Calico's IPAM
	// pools, Cilium's cluster-pool, the AWS VPC CNI), where nodes carry no
	// podCIDRs or not the ones pods use.
	// +optional
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=43
	// +kubebuilder:validation:items:XValidation:rule="isCIDR(self) || isIP(self)",message="must be a CIDR such as 10.96.0.0/12 or an IP address"
	// +kubebuilder:validation:items:XValidation:rule="!isCIDR(self) || cidr(self) == cidr(self).masked()",message="must not have host bits set: write the network (10.96.0.0/12 rather than 10.96.0.1/12), or one address"
	// +listType=set
	ClusterNetworks []string `json:"clusterNetworks,omitempty"`
	// NetworkPolicy puts a NetworkPolicy on each proxy's pods that denies
	// egress to what Squid denies (where the cluster enforces policies).
	// Default true.
	// +optional
	// +kubebuilder:default=true
	NetworkPolicy *bool `json:"networkPolicy,omitempty"`
	// EgressCheck, when set, has the provider verify each Ready proxy's
	// egress address: it asks the echo endpoint through the proxy and
	// records what the endpoint saw (docs/allow-listing.md).
	// +optional
	EgressCheck *EgressCheck `json:"egressCheck,omitempty"`
}

// BlockName is the name of the backend block s holds, as the API spells it
// (kvm, proxmox, gcp or kubernetes), or "" when it holds none. Admission
// lets a config hold exactly one. It is what status.backend reports and
// what the provider's messages name, whether or not the build has a
// backend for the block.
func (s *ProviderConfigSpec) BlockName() string {
	switch {
	case s.KVM != nil:
		return "kvm"
	case s.Proxmox != nil:
		return "proxmox"
	case s.GCP != nil:
		return "gcp"
	case s.Kubernetes != nil:
		return "kubernetes"
	}
	return ""
}

// KubernetesCredentials says how to reach the target cluster.
type KubernetesCredentials struct {
	// Source is InjectedIdentity (this cluster, the provider's own service
	// account) or Secret (a kubeconfig for another cluster).
	// +kubebuilder:validation:Enum=Secret;InjectedIdentity
	Source xpv2.CredentialsSource `json:"source"`
	// SecretRef names a kubeconfig.
	// +optional
	SecretRef *SecretKeySelector `json:"secretRef,omitempty"`
}

// ProviderConfigStatus is the observed state of a ProviderConfig: whether
// its backend is healthy, target by target.
type ProviderConfigStatus struct {
	xpv2.ProviderConfigStatus `json:",inline"`
	// InstallationID in effect for this config's instances.
	// +optional
	InstallationID string `json:"installationID,omitempty"`
	// Backend is the block this config holds (kvm, proxmox, gcp, kubernetes).
	// +optional
	Backend string `json:"backend,omitempty"`
	// LastCheckTime is when the health check last ran.
	// +optional
	LastCheckTime *metav1.Time `json:"lastCheckTime,omitempty"`
	// Targets are the health of each backend target.
	// +optional
	// +listType=map
	// +listMapKey=target
	Targets []TargetHealth `json:"targets,omitempty"`
	// Orphans is what the last orphan sweep found: instances with this
	// installation's mark whose managed resource no longer exists.
	// +optional
	Orphans *OrphanStatus `json:"orphans,omitempty"`
	// Released records the instances this config's managed resources left
	// on purpose when they were deleted (deletionPolicy Orphan, management
	// policies without Delete): the orphan sweep never calls them orphans,
	// so never deletes them. A namespaced resource's on a
	// ClusterProviderConfig is recorded, and honoured, only while the config
	// sets allowTenantRelease.
	// +optional
	Released *ReleasedStatus `json:"released,omitempty"`
}

// MaxReleased is how many released instances a config records.
const MaxReleased = 512

// ReleasedStatus is the record of the instances left on purpose by the
// managed resources of a config. The provider adds an entry as a
// resource's finalizer goes, and the orphan sweep removes it once no
// instance carries the UID any more (it was deleted by hand).
type ReleasedStatus struct {
	// Instances are the UIDs of the managed resources whose deletion left
	// their instance, at most 512.
	// +optional
	// +listType=map
	// +listMapKey=uid
	// +kubebuilder:validation:MaxItems=512
	Instances []ReleasedInstance `json:"instances,omitempty"`
	// UnrecordedTime is, when set, the last time a release could not be
	// recorded (the list was full). The sweep then deletes no orphan
	// created before it (with a margin for clock skew): any of them may be
	// the one left on purpose. It goes once no such orphan remains.
	// +optional
	UnrecordedTime *metav1.Time `json:"unrecordedTime,omitempty"`
}

// ReleasedInstance is one instance left on purpose.
type ReleasedInstance struct {
	// UID of the managed resource, which the instance's mark names.
	// +kubebuilder:validation:MaxLength=64
	UID string `json:"uid"`
	// ReleasedAt is when the resource's finalizer went.
	ReleasedAt metav1.Time `json:"releasedAt"`
	// Namespace of the resource, for a namespaced resource on a
	// ClusterProviderConfig (a tenant's): the sweep honours such an entry
	// only while the config sets allowTenantRelease.
	// +optional
	// +kubebuilder:validation:MaxLength=63
	Namespace string `json:"namespace,omitempty"`
}

// TargetHealth is the health of one backend target (a host, a node, a
// project, an API server).
type TargetHealth struct {
	// Target names what was checked.
	Target string `json:"target"`
	// Address where it was reached.
	// +optional
	Address string `json:"address,omitempty"`
	// Healthy is true when every check passed.
	Healthy bool `json:"healthy"`
	// Reason why not, in CamelCase.
	// +optional
	Reason string `json:"reason,omitempty"`
	// Message explains the reason.
	// +optional
	Message string `json:"message,omitempty"`
	// Details found on the way (versions, free space).
	// +optional
	Details map[string]string `json:"details,omitempty"`
}

// EgressCheck names an echo endpoint: a URL that answers a GET with the
// caller's address, as plain text (an address and nothing else, as
// https://api.ipify.org does) or as JSON with the address in "ip" or
// "origin" (httpbin's /ip; a URL takes no query). The
// provider sends one request through each Ready proxy, with a credential
// of its own that the proxy accepts for this URL alone, and publishes the
// address the endpoint saw (status.atProvider.egressIP, the connection
// Secret's egressIP).
type EgressCheck struct {
	// URL of the echo endpoint, http:// or https:// with a host (a name,
	// an IPv4 address, or an IPv6 address in brackets), an optional port
	// (1 to 65535) and an optional path (% only in escapes of two hex
	// digits, such as %2F), no query, no user info. Over http the proxy
	// admits the check credential for this exact URL; over https (a
	// CONNECT tunnel, whose path the proxy cannot see) for this host and
	// port. At most 480 characters: escaped as a pattern, it must fit one
	// squid.conf line.
	// +kubebuilder:validation:MaxLength=480
	// +kubebuilder:validation:Pattern=`^https?://(\[[0-9a-fA-F:.]+\]|[a-zA-Z0-9]([-a-zA-Z0-9.]*[a-zA-Z0-9])?)(:[0-9]{1,5})?(/[-a-zA-Z0-9._~/%]*)?$`
	// +kubebuilder:validation:XValidation:rule="!self.matches('^https?://[^/]*:[0-9]{1,5}(/.*)?$') || (int(self.split('/')[2].substring(self.split('/')[2].lastIndexOf(':') + 1)) >= 1 && int(self.split('/')[2].substring(self.split('/')[2].lastIndexOf(':') + 1)) <= 65535)",message="egressCheck.url's port must be 1 to 65535, such as http://echo.example:8080/ip; without a port, 80 for http and 443 for https"
	// +kubebuilder:validation:XValidation:rule="!self.matches('%([0-9a-fA-F]?$|[0-9a-fA-F]?[^0-9a-fA-F])')",message="egressCheck.url may hold % only as an escape of two hex digits, such as %2F"
	// +kubebuilder:validation:XValidation:rule="!self.matches('^https?://[[][^]]*[]]') || (isIP(self.substring(self.indexOf('[') + 1, self.indexOf(']')).lowerAscii().replace('ffff', 'fffe')) && ip(self.substring(self.indexOf('[') + 1, self.indexOf(']')).lowerAscii().replace('ffff', 'fffe')).family() == 6)",message="egressCheck.url's host in brackets must be an IPv6 address, such as https://[2001:db8::1]/ip; an IPv4 address or a name goes without brackets"
	URL string `json:"url"`
	// Interval between checks of a proxy that stays Ready; another
	// instance or address (a new pod, another node, a recreated VM) is
	// checked at once, a spec changed in place as soon as the gap allows.
	// Default 1h; at least 1m. Two checks through the same proxy are at
	// least 65s apart: Squid keeps an idle connection to the echo endpoint
	// for a minute, and a check over it would see the address it was
	// opened from.
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:XValidation:rule="self.matches('^(0|(([0-9]+([.][0-9]*)?|[.][0-9]+)(ns|us|µs|ms|s|m|h))+)$')",message="must be a duration such as 30m, 1h or 168h: numbers with the units ns, us, ms, s, m or h (no d for days), no sign"
	// +kubebuilder:validation:XValidation:rule="!self.matches('^(0|(([0-9]+([.][0-9]*)?|[.][0-9]+)(ns|us|µs|ms|s|m|h))+)$') || duration(self) < duration('2562047h')",message="must be under 2562047h"
	// +kubebuilder:validation:XValidation:rule="!self.matches('^(0|(([0-9]+([.][0-9]*)?|[.][0-9]+)(ns|us|µs|ms|s|m|h))+)$') || duration(self) >= duration('1m')",message="egressCheck.interval must be at least 1m: the check is a request through every proxy"
	Interval *metav1.Duration `json:"interval,omitempty"`
}
