// Package gcp binds the GCPProxy kind (both scopes) to the gcp backend.
package gcp

import (
	"context"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
	"k8s.io/apimachinery/pkg/runtime/schema"
	ctrl "sigs.k8s.io/controller-runtime"

	clusterproxy "github.com/egressproxy/provider-egressproxy/apis/cluster/proxy/v1alpha1"
	nsproxy "github.com/egressproxy/provider-egressproxy/apis/namespaced/proxy/v1alpha1"
	spec "github.com/egressproxy/provider-egressproxy/apis/spec/v1alpha1"
	gcpbackend "github.com/egressproxy/provider-egressproxy/internal/backend/gcp"
	"github.com/egressproxy/provider-egressproxy/internal/controller/external"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

// Options are the GCPProxy binding's seams for tests.
type Options struct {
	// Connector builds the drivers; nil means the production one (real
	// Compute Engine, credentials from the config). Tests hand it one
	// pointed at a fake.
	Connector *gcpbackend.Connector
	// ObserveMaxAge is how old the aggregated listing a steady instance's
	// Get may answer from can be (internal/backend/batch), when the
	// connector sets none; zero: every Get reads its own instance.
	ObserveMaxAge time.Duration
}

// New returns the GCPProxy binding. Its connector's pooled clients are
// shared by every config, both scopes and the health checks.
func New(_ ctrl.Manager, o Options) external.Kind[spec.GCPProxyParameters] {
	c := o.Connector
	if c == nil {
		c = &gcpbackend.Connector{}
	}
	if c.ObserveMaxAge == 0 {
		c.ObserveMaxAge = o.ObserveMaxAge
	}
	return external.Kind[spec.GCPProxyParameters]{
		Name:     "GCPProxy",
		GVKs:     []schema.GroupVersionKind{nsproxy.GCPProxyGroupVersionKind, clusterproxy.GCPProxyGroupVersionKind},
		Location: func(p *spec.Placement) *string { return &p.Zone },
		Proxy:    func(p *spec.GCPProxyParameters) *spec.ProxySettings { return &p.Proxy },
		Request:  request,
		PublicListener: func(p *spec.GCPProxyParameters) string {
			if p.Address != nil && p.Address.Type == gcpbackend.AddressInternal {
				return ""
			}
			return "an external address (spec.forProvider.address.type)"
		},
		Backend: external.Backend{Name: "gcp", Block: block, Connect: connect(c)},
	}
}

// block is what the generic layer enforces of a gcp block.
func block(s *spec.ProviderConfigSpec) (external.Block, bool) {
	g := s.GCP
	if g == nil {
		return external.Block{}, false
	}
	b := external.Block{AllowUserCloudInit: g.AllowUserCloudInit, AllowTenantCloudInit: g.AllowTenantCloudInit, CredentialsSource: &g.Credentials.Source, EgressCheck: g.EgressCheck}
	if g.Endpoint != "" {
		// The provider would send the config's tokens to the endpoint and
		// report its answers, from where the provider sits in the network.
		b.ClusterOnly = "gcp.endpoint is not allowed on a namespaced ProviderConfig: the provider would send this config's tokens to it and report its answers from inside the cluster; use a ClusterProviderConfig the platform team provides"
	}
	return b, true
}

// connect builds a driver from a config: the service-account key is read
// from its Secret on every call (the connector pools clients by the key's
// digest, so a rotated key applies at once), or Application Default
// Credentials are used (InjectedIdentity).
func connect(c *gcpbackend.Connector) func(ctx context.Context, cfg *external.Config) (proxy.Driver, error) {
	return func(ctx context.Context, cfg *external.Config) (proxy.Driver, error) {
		g := cfg.Spec.GCP
		if g == nil {
			return nil, errors.Errorf("%s has no gcp block", cfg.Name)
		}
		if err := checkEndpoint(g.Endpoint); err != nil {
			return nil, err
		}
		var creds gcpbackend.Credentials
		switch g.Credentials.Source {
		case xpv2.CredentialsSourceInjectedIdentity:
			creds.Injected = true
		case xpv2.CredentialsSourceSecret:
			key, err := cfg.Secrets.Get(ctx, "spec.gcp.credentials.secretRef", g.Credentials.SecretRef)
			if err != nil {
				return nil, err
			}
			creds.Key = key
		default:
			return nil, errors.Errorf("spec.gcp.credentials.source %q is not supported: want Secret or InjectedIdentity", g.Credentials.Source)
		}
		creds.Impersonate, creds.Delegates = g.Credentials.ImpersonateServiceAccount, g.Credentials.Delegates
		creds.Guard = cfg.Guard
		bc := gcpbackend.Config{
			Project:      g.Project,
			Network:      g.Network,
			Subnetwork:   g.Subnetwork,
			NetworkTags:  g.NetworkTags,
			DiskSizeGB:   g.DiskSizeGB,
			Zones:        g.Zones,
			Endpoint:     g.Endpoint,
			Images:       map[string]string{},
			MachineTypes: map[string]string{},
		}
		for k, v := range g.Images {
			bc.Images[k] = v.Image
		}
		for k, v := range g.MachineTypes {
			bc.MachineTypes[k] = v.MachineType
		}
		d, err := c.Driver(ctx, cfg.Name, bc, creds)
		if err != nil {
			return nil, errors.Wrap(err, "spec.gcp.credentials")
		}
		return d, nil
	}
}

// checkEndpoint is admission's rule for spec.gcp.endpoint again, for a
// config written past it: the access tokens go there, so never in clear
// text and never to a URL whose user info or query could hide the host.
func checkEndpoint(e string) error {
	if e == "" {
		return nil
	}
	u, err := url.Parse(e)
	if err != nil || u.Scheme != "https" || u.Hostname() == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" || strings.ContainsAny(e, "?# ") {
		return proxy.Permanentf("spec.gcp.endpoint must be an https:// URL: a host, an optional port and path, no user info, query or fragment (for example https://compute-myendpoint.p.googleapis.com)")
	}
	return nil
}

func request(cfg *external.Config, p *spec.GCPProxyParameters, req *proxy.Request) error {
	g := cfg.Spec.GCP
	zone := p.Zone
	switch {
	case zone == "" && slices.Contains(g.Zones, req.Placement.Location):
		// The zone the instance was made in: the first may have changed.
		zone = req.Placement.Location
	case zone == "" && len(g.Zones) > 0:
		zone = g.Zones[0]
	case zone == "":
		return errors.Errorf("spec.forProvider.zone is required: %s lists no zones to default to", cfg.Name)
	case len(g.Zones) > 0:
		if _, err := external.Pick("spec.forProvider.zone", zone, req.Placement.Location, g.Zones, cfg); err != nil {
			return err
		}
	}
	req.Placement.Location = zone
	var err error
	if req.Placement.MachineType, err = external.Pick("spec.forProvider.machineType", p.MachineType, req.Placement.MachineType, external.Keys(g.MachineTypes), cfg); err != nil {
		return err
	}
	if req.Placement.Image, err = external.Pick("spec.forProvider.image", p.Image, req.Placement.Image, external.Keys(g.Images), cfg); err != nil {
		return err
	}
	req.CloudInit = p.CloudInit
	x := gcpbackend.Exposure{AddressType: gcpbackend.AddressEphemeral, ManageFirewall: true}
	if p.Address != nil {
		x.AddressType, x.RetainAddress = p.Address.Type, p.Address.Retain
	}
	if p.Firewall != nil {
		x.ManageFirewall = p.Firewall.Manage
	}
	req.Extension = x
	return nil
}
