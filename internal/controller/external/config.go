package external

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/crossplane/crossplane-runtime/v2/pkg/resource"
	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
	corev1 "k8s.io/api/core/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1alpha1 "github.com/egressproxy/provider-egressproxy/apis/cluster/v1alpha1"
	namespacedv1alpha1 "github.com/egressproxy/provider-egressproxy/apis/namespaced/v1alpha1"
	spec "github.com/egressproxy/provider-egressproxy/apis/spec/v1alpha1"
	"github.com/egressproxy/provider-egressproxy/internal/netguard"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

// Config is a resolved ProviderConfig of any of the three config kinds.
type Config struct {
	// Name identifies the config in messages and as the drivers' configured
	// provider name: "ClusterProviderConfig home-kvm",
	// "ProviderConfig team-a/home-kvm" or "ProviderConfig home-kvm".
	Name string
	// Spec is the config's spec.
	Spec spec.ProviderConfigSpec
	// InstallationID in effect: the config's own, else the provider's.
	InstallationID string
	// Secrets reads the config's Secret refs.
	Secrets Secrets
	// Namespaced is true for a namespaced ProviderConfig, written by a
	// namespace user: it never acts with the provider's own identity.
	Namespaced bool
	// Tenant is true for a ClusterProviderConfig resolved for a namespaced
	// resource: the platform team's config used by a namespace user, whose
	// cloud-init it refuses unless its block allows tenants'.
	Tenant bool
	// Backend is the backend whose block the config holds; nil when it
	// holds none of ConfigReader.Backends'.
	Backend *Backend
	// namespacedConfig is the namespaced ProviderConfig the config was
	// read from (nil for the other kinds), for Connect to protect it.
	namespacedConfig *namespacedv1alpha1.ProviderConfig
	// Guard is the dialer of every connection made to an endpoint the
	// config names (its API URL, kubeconfig server, hosts, key file URLs,
	// image URLs): for a namespaced config the tenant chose them, and the
	// guard refuses the provider's own network; nil (no check) for the
	// platform team's configs.
	Guard *netguard.Guard
	// TenantGuard is the guard of what a proxy names itself, whatever its
	// config (a KVMProxy's image URL: proxies are written by tenants, or
	// composed from their claims); never nil.
	TenantGuard *netguard.Guard
}

// CheckTenancy returns why the config may not be used, or nil: a namespaced
// ProviderConfig with InjectedIdentity would act with the provider's own
// cluster or Google identity, and one with a setting only a cluster-scoped
// config may make (Block.ClusterOnly, such as gcp.endpoint) would make the
// provider a client of any server the tenant names. Admission refuses such
// configs; this is the same rule again, for configs written before it or
// past it.
func (c *Config) CheckTenancy() error {
	if !c.Namespaced || c.Backend == nil {
		return nil
	}
	b, _ := c.Backend.Block(&c.Spec)
	if src := b.CredentialsSource; src != nil && *src != xpv2.CredentialsSourceSecret {
		return proxy.Permanentf("%s: %s.credentials.source %s is not allowed on a namespaced ProviderConfig: it would act with the provider's own identity; use source Secret with credentials in namespace %s, or a ClusterProviderConfig", c.Name, c.Backend.Name, *src, c.Secrets.Namespace)
	}
	if b.ClusterOnly != "" {
		return proxy.Permanentf("%s: %s", c.Name, b.ClusterOnly)
	}
	return nil
}

// Allows returns why the config does not allow what req asks for, or nil:
// an image by URL (unless the block's allowImageURLs, and for a tenant's
// proxy on a ClusterProviderConfig its allowTenantImageURLs) and the proxy's own
// cloudInit (unless the block's allowUserCloudInit, true by default, and
// for a tenant's proxy on a ClusterProviderConfig its
// allowTenantCloudInit, false by default: the cloud-init would run as
// root on the platform's VM).
func (c *Config) Allows(req proxy.Request) error {
	if c.Backend == nil {
		return nil
	}
	b, _ := c.Backend.Block(&c.Spec)
	if img, u := req.Placement.Image, b.ImagesByURL; u != nil && (strings.HasPrefix(img, "http://") || strings.HasPrefix(img, "https://")) {
		keys := slices.Clone(u.Keys)
		slices.Sort(keys)
		if !u.Allowed {
			return proxy.Permanentf("spec.forProvider.image: %s does not allow images by URL (its %s.allowImageURLs is false): name a key of its %s.images (%s)", c.Name, c.Backend.Name, c.Backend.Name, strings.Join(keys, ", "))
		}
		if c.Tenant && !u.TenantAllowed {
			// The image would run as root on the platform's network.
			return proxy.Permanentf("spec.forProvider.image: %s does not allow the images by URL of namespaced proxies (its %s.allowTenantImageURLs is false, the default): it would run as root on a VM of the platform's; name a key of its %s.images (%s), use a ProviderConfig of this namespace, or ask the platform team to set %s.allowTenantImageURLs: true", c.Name, c.Backend.Name, c.Backend.Name, strings.Join(keys, ", "), c.Backend.Name)
		}
	}
	if req.CloudInit != "" && b.AllowUserCloudInit != nil && !*b.AllowUserCloudInit {
		// Never quote the cloudInit: it is secret.
		return proxy.Permanentf("spec.forProvider.cloudInit: %s does not allow a proxy's own cloud-init (its %s.allowUserCloudInit is false): remove it", c.Name, c.Backend.Name)
	}
	if req.CloudInit != "" && c.Tenant && !b.AllowTenantCloudInit {
		return proxy.Permanentf("spec.forProvider.cloudInit: %s does not allow the cloud-init of namespaced proxies (its %s.allowTenantCloudInit is false, the default): it would run as root on a VM of the platform's; remove it, use a ProviderConfig of this namespace, or ask the platform team to set %s.allowTenantCloudInit: true", c.Name, c.Backend.Name, c.Backend.Name)
	}
	return nil
}

// TenantGuest says req's guest runs what a tenant wrote and the backend
// takes the instance's address from the guest (Block.GuestReportsAddress):
// any proxy of a namespaced config, a namespaced proxy on a
// ClusterProviderConfig with its own cloud-init, and a proxy of either
// scope booted from an image by URL (whose image, as its download, is
// treated as a tenant's on every config: proxies are composed from
// claims). The addresses reported for such an instance are dialled
// through ReportedGuard(true) (proxy.Request.TenantGuest).
func (c *Config) TenantGuest(req proxy.Request) bool {
	if c.Namespaced {
		return true
	}
	img := req.Placement.Image
	byURL := strings.HasPrefix(img, "http://") || strings.HasPrefix(img, "https://")
	return byURL && c.guestReportsAddress() || c.TenantMayWriteGuest() && req.CloudInit != ""
}

// guestReportsAddress says the config's backend takes an instance's
// address from its guest (Block.GuestReportsAddress).
func (c *Config) guestReportsAddress() bool {
	if c.Backend == nil {
		return false
	}
	b, _ := c.Backend.Block(&c.Spec)
	return b.GuestReportsAddress
}

// TenantMayWriteGuest says a proxy on the config may run a guest a tenant
// wrote whose address the backend takes from it: TenantGuest of a request
// not known in full.
func (c *Config) TenantMayWriteGuest() bool {
	if c.Namespaced {
		return true
	}
	return c.Tenant && c.guestReportsAddress()
}

// ReportedGuard is the guard of the addresses reported for an instance
// (its probe, the egress check): the config's Guard, or TenantGuard for
// a tenant's guest (TenantGuest) on the platform's config.
func (c *Config) ReportedGuard(tenantGuest bool) *netguard.Guard {
	if c.Guard == nil && tenantGuest {
		return c.TenantGuard
	}
	return c.Guard
}

// BackendName is the name of the config's backend block (the API's
// spelling, also for a block this build has no backend for), "" when it
// holds none.
func (c *Config) BackendName() string { return c.Spec.BlockName() }

// ConfigReader resolves the ProviderConfig a managed resource references.
type ConfigReader struct {
	// Kube reads configs (through the manager's cache).
	Kube client.Reader
	// SecretReader reads credentials. It should be uncached: caching would
	// watch every Secret of the cluster.
	SecretReader client.Reader
	// InstallationID is the provider's own installation ID, used when a
	// config sets none.
	InstallationID string
	// Backends are the backends of this build, each given by its kind's
	// binding; a config's Backend is the one whose block it holds.
	Backends []Backend
	// Guard is the namespaced configs' Guard; nil refuses the defaults
	// (no allowed range, no discovered cluster network).
	Guard *netguard.Guard
}

// defaultGuard is the Guard of namespaced configs when none is given: a
// reader built without one still never lets a tenant's endpoint be
// loopback or metadata.
var defaultGuard = netguard.New(netguard.Options{})

// Resolve returns the config mg references: a ProviderConfig in mg's own
// namespace or a ClusterProviderConfig for namespaced resources, and a
// legacy ProviderConfig for cluster-scoped ones.
func (r ConfigReader) Resolve(ctx context.Context, mg resource.Managed) (*Config, error) {
	switch m := mg.(type) {
	case resource.ModernManaged:
		ref := m.GetProviderConfigReference()
		if ref == nil || ref.Name == "" {
			return nil, errors.New("spec.providerConfigRef is not set")
		}
		switch ref.Kind {
		case "ProviderConfig":
			pc := &namespacedv1alpha1.ProviderConfig{}
			if err := r.Kube.Get(ctx, types.NamespacedName{Namespace: m.GetNamespace(), Name: ref.Name}, pc); err != nil {
				return nil, notFoundHint(err, fmt.Sprintf("ProviderConfig %q in namespace %q", ref.Name, m.GetNamespace()),
					"a namespaced resource can use a ProviderConfig of its own namespace or a ClusterProviderConfig")
			}
			cfg := r.Of(pc)
			if err := cfg.CheckTenancy(); err != nil {
				return nil, err
			}
			return cfg, nil
		case "ClusterProviderConfig":
			pc := &namespacedv1alpha1.ClusterProviderConfig{}
			if err := r.Kube.Get(ctx, types.NamespacedName{Name: ref.Name}, pc); err != nil {
				return nil, notFoundHint(err, fmt.Sprintf("ClusterProviderConfig %q", ref.Name), "")
			}
			cfg := r.Of(pc)
			cfg.Tenant = true
			return cfg, nil
		default:
			return nil, errors.Errorf("spec.providerConfigRef.kind %q is not supported: want ProviderConfig or ClusterProviderConfig", ref.Kind)
		}
	case resource.LegacyManaged:
		ref := m.GetProviderConfigReference()
		if ref == nil || ref.Name == "" {
			return nil, errors.New("spec.providerConfigRef is not set")
		}
		pc := &clusterv1alpha1.ProviderConfig{}
		if err := r.Kube.Get(ctx, types.NamespacedName{Name: ref.Name}, pc); err != nil {
			return nil, notFoundHint(err, fmt.Sprintf("ProviderConfig %q (egressproxy.io)", ref.Name), "")
		}
		return r.Of(pc), nil
	}
	return nil, errors.Errorf("%T is not a managed resource this provider knows", mg)
}

func (r ConfigReader) config(name string, s spec.ProviderConfigSpec, secretNamespace string) *Config {
	id := s.InstallationID
	if id == "" {
		id = r.InstallationID
	}
	c := &Config{Name: name, Spec: s, InstallationID: id, Secrets: Secrets{Kube: r.SecretReader, Namespace: secretNamespace}, TenantGuard: r.Guard}
	if c.TenantGuard == nil {
		c.TenantGuard = defaultGuard
	}
	for i := range r.Backends {
		if _, ok := r.Backends[i].Block(&c.Spec); ok {
			c.Backend = &r.Backends[i]
			break
		}
	}
	return c
}

func notFoundHint(err error, what, hint string) error {
	if kerrors.IsNotFound(err) {
		msg := what + " does not exist"
		if hint != "" {
			msg += " (" + hint + ")"
		}
		return errors.New(msg)
	}
	return errors.Wrapf(err, "cannot get %s", what)
}

// Secrets reads Secret keys named by refs of one config or resource.
type Secrets struct {
	Kube client.Reader
	// Namespace is where refs without a namespace are read from (the
	// namespaced config's or resource's own namespace); empty for
	// cluster-scoped ones, whose refs name their namespace.
	Namespace string
}

// Get reads the key ref names. field is the ref's path, such as
// kvm.credentials.sshKeySecretRef, so errors say which ref is wrong.
// Errors never include the Secret's data.
func (s Secrets) Get(ctx context.Context, field string, ref *spec.SecretKeySelector) ([]byte, error) {
	if ref == nil {
		return nil, errors.Errorf("%s is not set", field)
	}
	sec, err := s.Secret(ctx, field, spec.SecretReference{Namespace: ref.Namespace, Name: ref.Name})
	if err != nil {
		return nil, err
	}
	v, ok := sec.Data[ref.Key]
	if !ok || len(v) == 0 {
		return nil, errors.Errorf("%s: Secret %s/%s has no key %q", field, sec.Namespace, ref.Name, ref.Key)
	}
	return v, nil
}

// Secret reads the Secret ref names, by the same rules as Get: a
// namespaced reader reads its own namespace only, whatever ref says.
// Errors never include the Secret's data.
func (s Secrets) Secret(ctx context.Context, field string, ref spec.SecretReference) (*corev1.Secret, error) {
	ns := ref.Namespace
	if s.Namespace != "" {
		ns = s.Namespace
	}
	if ns == "" {
		return nil, errors.Errorf("%s.namespace is required", field)
	}
	sec := &corev1.Secret{}
	if err := s.Kube.Get(ctx, types.NamespacedName{Namespace: ns, Name: ref.Name}, sec); err != nil {
		if kerrors.IsNotFound(err) {
			return nil, errors.Errorf("%s: Secret %s/%s does not exist", field, ns, ref.Name)
		}
		return nil, errors.Wrapf(err, "%s: cannot get Secret %s/%s", field, ns, ref.Name)
	}
	sec.Namespace = ns
	return sec, nil
}

// Of returns the Config of a ProviderConfig object of any of the three
// config kinds, or nil for another object.
func (r ConfigReader) Of(obj client.Object) *Config {
	switch pc := obj.(type) {
	case *namespacedv1alpha1.ProviderConfig:
		c := r.config(fmt.Sprintf("ProviderConfig %s/%s", pc.Namespace, pc.Name), pc.Spec.ProviderConfigSpec, pc.Namespace)
		c.Namespaced, c.namespacedConfig = true, pc
		c.Guard = c.TenantGuard
		return c
	case *namespacedv1alpha1.ClusterProviderConfig:
		return r.config("ClusterProviderConfig "+pc.Name, pc.Spec.ProviderConfigSpec, "")
	case *clusterv1alpha1.ProviderConfig:
		return r.config("ProviderConfig "+pc.Name, pc.Spec.ProviderConfigSpec, "")
	}
	return nil
}
