// Package kvm binds the KVMProxy kind (both scopes) to the kvm backend.
package kvm

import (
	"context"
	"strings"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	ctrl "sigs.k8s.io/controller-runtime"

	clusterproxy "github.com/egressproxy/provider-egressproxy/apis/cluster/proxy/v1alpha1"
	nsproxy "github.com/egressproxy/provider-egressproxy/apis/namespaced/proxy/v1alpha1"
	spec "github.com/egressproxy/provider-egressproxy/apis/spec/v1alpha1"
	kvmbackend "github.com/egressproxy/provider-egressproxy/internal/backend/kvm"
	"github.com/egressproxy/provider-egressproxy/internal/controller/external"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

// Options are the KVMProxy binding's seams for tests.
type Options struct {
	// Backend is the kvm state the drivers share; nil means a new one.
	Backend *kvmbackend.Backend
}

// New returns the KVMProxy binding. Its backend (pooled SSH connections,
// locks, the image cache and creates waiting on it) is shared by every
// config, both scopes and the health checks; Connect only builds a cheap
// driver over it.
func New(_ ctrl.Manager, o Options) external.Kind[spec.KVMProxyParameters] {
	b := o.Backend
	if b == nil {
		b = kvmbackend.NewBackend(kvmbackend.Options{})
	}
	return external.Kind[spec.KVMProxyParameters]{
		Name:     "KVMProxy",
		GVKs:     []schema.GroupVersionKind{nsproxy.KVMProxyGroupVersionKind, clusterproxy.KVMProxyGroupVersionKind},
		Location: func(p *spec.Placement) *string { return &p.Host },
		Proxy:    func(p *spec.KVMProxyParameters) *spec.ProxySettings { return &p.Proxy },
		Request:  request,
		// libvirt reads cost no quota: a booting guest is looked at every
		// second once it has an address, so its Squid's first answer makes
		// it Ready within about a second.
		AnswerRecheck: time.Second,
		Backend: external.Backend{
			Name:    "kvm",
			Block:   block,
			Connect: func(ctx context.Context, cfg *external.Config) (proxy.Driver, error) { return connect(ctx, cfg, b) },
		},
	}
}

// block is what the generic layer enforces of a kvm block.
func block(s *spec.ProviderConfigSpec) (external.Block, bool) {
	k := s.KVM
	if k == nil {
		return external.Block{}, false
	}
	b := external.Block{
		AllowUserCloudInit:   k.AllowUserCloudInit,
		AllowTenantCloudInit: k.AllowTenantCloudInit,
		ImagesByURL:          &external.ImagesByURL{Allowed: k.AllowImageURLs, TenantAllowed: k.AllowTenantImageURLs, Keys: external.Keys(k.Images)},
		EgressCheck:          k.EgressCheck,
		Hosts:                map[string]string{},
		// The qemu guest agent and the DHCP lease.
		GuestReportsAddress: true,
	}
	for _, h := range k.Hosts {
		b.Hosts[h.Name] = h.Address
	}
	if k.Credentials.InsecureIgnoreHostKey {
		b.Insecure = "kvm.credentials.insecureIgnoreHostKey is true: SSH host keys are not verified, so a host can be impersonated"
	}
	return b, true
}

// connect builds the driver of one config. The SSH key and known_hosts are
// read from the config's Secrets on every call; the backend pools
// connections by the material they were built from, so a rotated Secret
// takes effect on the next dial. A Secret that cannot be read fails
// Connect naming the field and the Secret, as on every backend (the health
// check then reports Unhealthy, reason CredentialsUnavailable).
func connect(ctx context.Context, cfg *external.Config, b *kvmbackend.Backend) (proxy.Driver, error) {
	k := cfg.Spec.KVM
	if k == nil {
		return nil, errors.Errorf("%s has no kvm block", cfg.Name)
	}
	const keyField, khField = "spec.kvm.credentials.sshKeySecretRef", "spec.kvm.credentials.knownHostsSecretRef"
	creds := kvmbackend.Credentials{InsecureIgnoreHostKey: k.Credentials.InsecureIgnoreHostKey, KeyField: keyField, KnownHostsField: khField}
	key, err := cfg.Secrets.Get(ctx, keyField, &k.Credentials.SSHKeySecretRef)
	if err != nil {
		return nil, err
	}
	creds.Key = key
	if !k.Credentials.InsecureIgnoreHostKey {
		kh, err := cfg.Secrets.Get(ctx, khField, k.Credentials.KnownHostsSecretRef)
		if err != nil {
			return nil, err
		}
		creds.KnownHosts = kh
	}
	c := kvmbackend.Config{
		Name:              cfg.Name,
		Credentials:       creds,
		DiskSizeGB:        k.DiskSizeGB,
		InstallGuestAgent: k.InstallGuestAgent == nil || *k.InstallGuestAgent,
		VendorData:        k.VendorData,
		Images:            map[string]kvmbackend.Image{},
		MachineTypes:      map[string]kvmbackend.MachineType{},
		Guard:             cfg.Guard,
		URLGuard:          cfg.TenantGuard,
	}
	if c.DiskSizeGB == 0 {
		c.DiskSizeGB = 10
	}
	// Zero (a config written before the fields existed) means the
	// backend's defaults, the same as the API's.
	c.MaxImageBytes = int64(k.MaxImageSizeGiB) << 30
	c.MaxDownloadsPerHost = int(k.MaxConcurrentDownloadsPerHost)
	c.UnusedImageRetention = 7 * 24 * time.Hour
	if k.UnusedImageRetention != nil {
		c.UnusedImageRetention = k.UnusedImageRetention.Duration
	}
	for key, im := range k.Images {
		c.Images[key] = kvmbackend.Image{URL: im.URL, SHA256: im.SHA256, Format: im.Format, Firmware: im.Firmware}
	}
	for key, mt := range k.MachineTypes {
		c.MachineTypes[key] = kvmbackend.MachineType{VCPUs: mt.VCPUs, MemoryMiB: mt.MemoryMiB}
	}
	for _, h := range k.Hosts {
		c.Hosts = append(c.Hosts, kvmbackend.Host{Name: h.Name, Address: h.Address, User: h.User, Socket: h.Socket, Pool: h.Pool,
			Bridge: h.Bridge, Network: h.Network, DomainType: h.DomainType, Routed: h.GuestNetwork == "Routed"})
	}
	return b.Driver(c), nil
}

func request(cfg *external.Config, p *spec.KVMProxyParameters, req *proxy.Request) error {
	kvm := cfg.Spec.KVM
	hosts := make([]string, 0, len(kvm.Hosts))
	for _, h := range kvm.Hosts {
		hosts = append(hosts, h.Name)
	}
	var err error
	if req.Placement.Location, err = external.Pick("spec.forProvider.host", p.Host, req.Placement.Location, hosts, cfg); err != nil {
		return err
	}
	if req.Placement.MachineType, err = external.Pick("spec.forProvider.machineType", p.MachineType, req.Placement.MachineType, external.Keys(kvm.MachineTypes), cfg); err != nil {
		return err
	}
	// An image is a catalogue key or a URL of the image itself.
	if strings.HasPrefix(p.Image, "http://") || strings.HasPrefix(p.Image, "https://") {
		req.Placement.Image = p.Image
	} else if req.Placement.Image, err = external.Pick("spec.forProvider.image", p.Image, req.Placement.Image, external.Keys(kvm.Images), cfg); err != nil {
		return err
	}
	req.CloudInit = p.CloudInit
	return nil
}
