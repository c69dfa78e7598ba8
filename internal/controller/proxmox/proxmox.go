// Package proxmox binds the ProxmoxProxy kind (both scopes) to the proxmox
// backend.
package proxmox

import (
	"context"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	ctrl "sigs.k8s.io/controller-runtime"

	clusterproxy "github.com/egressproxy/provider-egressproxy/apis/cluster/proxy/v1alpha1"
	nsproxy "github.com/egressproxy/provider-egressproxy/apis/namespaced/proxy/v1alpha1"
	spec "github.com/egressproxy/provider-egressproxy/apis/spec/v1alpha1"
	backend "github.com/egressproxy/provider-egressproxy/internal/backend/proxmox"
	"github.com/egressproxy/provider-egressproxy/internal/controller/external"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

// Connector builds proxmox drivers from ProviderConfigs. Its Shared state
// (the connection pool keyed by the CA, the clones this process started,
// facts read from VM configs) lives as long as the process, across
// reconciles and configs; nothing in it is a credential.
type Connector struct {
	// Shared is handed to every driver; nil means one of its own.
	Shared *backend.Shared
	// Options, when set, adjusts the driver options after they are built
	// from the config (tests: a readiness probe, a clock).
	Options func(*backend.Options)
}

// connector is the process's.
var connector = &Connector{Shared: &backend.Shared{}}

// Kind is the ProxmoxProxy binding.
var Kind = external.Kind[spec.ProxmoxProxyParameters]{
	Name:          "ProxmoxProxy",
	Backend:       "proxmox",
	LocationField: "node",
	Proxy:         func(p *spec.ProxmoxProxyParameters) *spec.ProxySettings { return &p.Proxy },
	Request:       request,
	Connect:       connector.Connect,
}

func request(cfg *external.Config, p *spec.ProxmoxProxyParameters, req *proxy.Request) error {
	pve := cfg.Spec.Proxmox
	var err error
	if req.Placement.Location, err = external.Pick("spec.forProvider.node", p.Node, pve.Nodes, cfg); err != nil {
		return err
	}
	if req.Placement.MachineType, err = external.Pick("spec.forProvider.machineType", p.MachineType, external.Keys(pve.MachineTypes), cfg); err != nil {
		return err
	}
	if req.Placement.Image, err = external.Pick("spec.forProvider.image", p.Image, external.Keys(pve.Templates), cfg); err != nil {
		return err
	}
	req.CloudInit = p.CloudInit
	return nil
}

// Connect reads the config's token (and CA) Secrets, on every Connect,
// that is every reconcile and every health check, and builds a driver
// that presents them on each of its requests: a rotated Secret applies at
// the next reconcile, with no restart. Connections are pooled by the CA
// they trust, so a rotated CA gets fresh ones.
func (c *Connector) Connect(ctx context.Context, cfg *external.Config) (proxy.Driver, error) {
	p := cfg.Spec.Proxmox
	if p == nil {
		return nil, errors.Errorf("%s has no proxmox block", cfg.Name)
	}
	token, err := cfg.Secrets.Get(ctx, "spec.proxmox.credentials.tokenSecretRef", &p.Credentials.TokenSecretRef)
	if err != nil {
		return nil, err
	}
	var ca []byte
	if p.Credentials.CASecretRef != nil {
		if ca, err = cfg.Secrets.Get(ctx, "spec.proxmox.credentials.caSecretRef", p.Credentials.CASecretRef); err != nil {
			return nil, err
		}
	}
	creds := backend.Credentials{Token: string(token), CA: ca}
	o := backend.Options{
		Provider:    cfg.Name,
		Config:      Config(p),
		Credentials: func(context.Context) (backend.Credentials, error) { return creds, nil },
		Shared:      c.Shared,
	}
	if c.Options != nil {
		c.Options(&o)
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

// Setup registers the ProxmoxProxy controllers of both scopes.
func Setup(mgr ctrl.Manager, o external.Options, sh *external.Shared) error {
	// A steady VM's Get answers from a /cluster/resources snapshot at most
	// an eighth of a poll old (internal/backend/batch).
	if connector.Shared.ObserveMaxAge == 0 {
		connector.Shared.ObserveMaxAge = o.PollInterval / 8
	}
	return external.Setup(mgr, o, sh, Kind, nsproxy.ProxmoxProxyGroupVersionKind, clusterproxy.ProxmoxProxyGroupVersionKind)
}
