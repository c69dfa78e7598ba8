// Package proxmox binds the ProxmoxProxy kind (both scopes) to the proxmox
// backend.
package proxmox

import (
	"context"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	ctrl "sigs.k8s.io/controller-runtime"

	clusterproxy "github.com/egressproxy/provider-egressproxy/apis/cluster/proxy/v1alpha1"
	nsproxy "github.com/egressproxy/provider-egressproxy/apis/namespaced/proxy/v1alpha1"
	spec "github.com/egressproxy/provider-egressproxy/apis/spec/v1alpha1"
	backend "github.com/egressproxy/provider-egressproxy/internal/backend/proxmox"
	"github.com/egressproxy/provider-egressproxy/internal/controller/external"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

// Options are the ProxmoxProxy binding's seams for tests.
type Options struct {
	// Driver, when set, adjusts the driver options after they are built
	// from the config (a readiness probe, a clock, retry delays).
	Driver func(*backend.Options)
	// ObserveMaxAge is how old the /cluster/resources snapshot a steady
	// VM's Get may answer from can be (internal/backend/batch); zero: every
	// Get reads its own VM.
	ObserveMaxAge time.Duration
}

// New returns the ProxmoxProxy binding. Its backend state (the connection
// pool keyed by the CA, the clones this process started, facts read from
// VM configs) is shared by every config, both scopes and the health
// checks, for the binding's life; nothing in it is a credential.
func New(_ ctrl.Manager, o Options) external.Kind[spec.ProxmoxProxyParameters] {
	c := &connector{shared: &backend.Shared{ObserveMaxAge: o.ObserveMaxAge}, options: o.Driver}
	return external.Kind[spec.ProxmoxProxyParameters]{
		Name:     "ProxmoxProxy",
		GVKs:     []schema.GroupVersionKind{nsproxy.ProxmoxProxyGroupVersionKind, clusterproxy.ProxmoxProxyGroupVersionKind},
		Location: func(p *spec.Placement) *string { return &p.Node },
		Proxy:    func(p *spec.ProxmoxProxyParameters) *spec.ProxySettings { return &p.Proxy },
		Request:  request,
		Backend:  external.Backend{Name: "proxmox", Block: block, Connect: c.connect},
	}
}

// block is what the generic layer enforces of a proxmox block.
func block(s *spec.ProviderConfigSpec) (external.Block, bool) {
	p := s.Proxmox
	if p == nil {
		return external.Block{}, false
	}
	// The address is the guest agent's (network-get-interfaces).
	b := external.Block{AllowUserCloudInit: p.AllowUserCloudInit, AllowTenantCloudInit: p.AllowTenantCloudInit, EgressCheck: p.EgressCheck, GuestReportsAddress: true}
	if p.InsecureSkipTLSVerify {
		b.Insecure = "proxmox.insecureSkipTLSVerify is true: the API's certificate is not verified, so the token can be intercepted"
	}
	return b, true
}

// connector builds proxmox drivers from ProviderConfigs over one shared
// state.
type connector struct {
	shared  *backend.Shared
	options func(*backend.Options)
}

func request(cfg *external.Config, p *spec.ProxmoxProxyParameters, req *proxy.Request) error {
	pve := cfg.Spec.Proxmox
	var err error
	if req.Placement.Location, err = external.Pick("spec.forProvider.node", p.Node, req.Placement.Location, pve.Nodes, cfg); err != nil {
		return err
	}
	if req.Placement.MachineType, err = external.Pick("spec.forProvider.machineType", p.MachineType, req.Placement.MachineType, external.Keys(pve.MachineTypes), cfg); err != nil {
		return err
	}
	if req.Placement.Image, err = external.Pick("spec.forProvider.image", p.Image, req.Placement.Image, external.Keys(pve.Templates), cfg); err != nil {
		return err
	}
	req.CloudInit = p.CloudInit
	return nil
}

// connect reads the config's token (and CA) Secrets, on every Connect,
// that is every reconcile and every health check, and builds a driver
// that presents them on each of its requests: a rotated Secret applies at
// the next reconcile, with no restart. Connections are pooled by the CA
// they trust, so a rotated CA gets fresh ones.
func (c *connector) connect(ctx context.Context, cfg *external.Config) (proxy.Driver, error) {
	p := cfg.Spec.Proxmox
	if p == nil {
		return nil, errors.Errorf("%s has no proxmox block", cfg.Name)
	}
	token, err := cfg.Secrets.Get(ctx, "spec.proxmox.credentials.tokenSecretRef", &p.Credentials.TokenSecretRef)
	if err != nil {
		return nil, err
	}
	if _, err := backend.TokenID(string(token)); err != nil {
		return nil, errors.Wrapf(err, "spec.proxmox.credentials.tokenSecretRef (key %s)", p.Credentials.TokenSecretRef.Key)
	}
	var ca []byte
	if p.Credentials.CASecretRef != nil {
		if ca, err = cfg.Secrets.Get(ctx, "spec.proxmox.credentials.caSecretRef", p.Credentials.CASecretRef); err != nil {
			return nil, err
		}
	}
	creds := backend.Credentials{Token: string(token), CA: ca}
	bc := Config(p)
	bc.Guard, bc.TenantGuard = cfg.Guard, cfg.TenantGuard
	o := backend.Options{
		Provider:    cfg.Name,
		Config:      bc,
		Credentials: func(context.Context) (backend.Credentials, error) { return creds, nil },
		Shared:      c.shared,
	}
	if c.options != nil {
		c.options(&o)
	}
	return backend.New(o)
}

// Config translates the API's proxmox block into the driver's.
func Config(p *spec.ProxmoxConfig) backend.Config {
	c := backend.Config{
		URL:                   p.URL,
		InsecureSkipTLSVerify: p.InsecureSkipTLSVerify,
		Nodes:                 p.Nodes,
		ISOStorage:            p.ISOStorage,
		Bridge:                p.Bridge,
		DiskGiB:               int(p.DiskGiB),
		InstallGuestAgent:     p.InstallGuestAgent == nil || *p.InstallGuestAgent,
		RequestTimeout:        time.Duration(p.RequestTimeoutSeconds) * time.Second,
		Templates:             map[string]int{},
		MachineTypes:          map[string]backend.MachineType{},
	}
	if p.VLANTag != nil {
		c.VLANTag = int(*p.VLANTag)
	}
	if p.VMIDRange != nil {
		c.VMIDMin, c.VMIDMax = int(p.VMIDRange.Min), int(p.VMIDRange.Max)
	}
	for k, t := range p.Templates {
		c.Templates[k] = int(t.VMID)
	}
	for k, m := range p.MachineTypes {
		c.MachineTypes[k] = backend.MachineType{Cores: int(m.Cores), MemoryMiB: int(m.MemoryMiB)}
	}
	return c
}
