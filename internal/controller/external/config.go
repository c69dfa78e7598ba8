package external

import (
	"context"
	"fmt"
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
}

// CheckTenancy returns why the config may not be used, or nil: a namespaced
// ProviderConfig with InjectedIdentity would act with the provider's own
// cluster or Google identity, and one with gcp.endpoint would make the
// provider a client of any HTTPS server the tenant names. Admission refuses such configs; this is the
// same rule again, for configs written before it or past it.
func (c *Config) CheckTenancy() error {
	if !c.Namespaced {
		return nil
	}
	for field, src := range map[string]*xpv2.CredentialsSource{
		"gcp.credentials.source":        credentialsSource(c.Spec.GCP != nil, func() xpv2.CredentialsSource { return c.Spec.GCP.Credentials.Source }),
		"kubernetes.credentials.source": credentialsSource(c.Spec.Kubernetes != nil, func() xpv2.CredentialsSource { return c.Spec.Kubernetes.Credentials.Source }),
	} {
		if src != nil && *src != xpv2.CredentialsSourceSecret {
			return proxy.Permanentf("%s: %s %s is not allowed on a namespaced ProviderConfig: it would act with the provider's own identity; use source Secret with credentials in namespace %s, or a ClusterProviderConfig", c.Name, field, *src, c.Secrets.Namespace)
		}
	}
	// The provider would send the config's tokens to the endpoint and
	// report its answers, from where the provider sits in the network.
	if c.Spec.GCP != nil && c.Spec.GCP.Endpoint != "" {
		return proxy.Permanentf("%s: gcp.endpoint is not allowed on a namespaced ProviderConfig: the provider would send this config's tokens to it and report its answers from inside the cluster; use a ClusterProviderConfig the platform team provides", c.Name)
	}
	return nil
}

func credentialsSource(set bool, get func() xpv2.CredentialsSource) *xpv2.CredentialsSource {
	if !set {
		return nil
	}
	s := get()
	return &s
}

// Allows returns why the config does not allow what req asks for, or nil:
// an image by URL (KVM, unless kvm.allowImageURLs) and the proxy's own
// cloudInit (unless the backend block's allowUserCloudInit, true by
// default).
func (c *Config) Allows(req proxy.Request) error {
	s := &c.Spec
	if img := req.Placement.Image; s.KVM != nil && !s.KVM.AllowImageURLs && (strings.HasPrefix(img, "http://") || strings.HasPrefix(img, "https://")) {
		return proxy.Permanentf("spec.forProvider.image: %s does not allow images by URL (its kvm.allowImageURLs is false): name a key of its kvm.images (%s)", c.Name, strings.Join(Keys(s.KVM.Images), ", "))
	}
	if req.CloudInit == "" {
		return nil
	}
	var allow *bool
	block := ""
	switch {
	case s.KVM != nil:
		allow, block = s.KVM.AllowUserCloudInit, "kvm"
	case s.Proxmox != nil:
		allow, block = s.Proxmox.AllowUserCloudInit, "proxmox"
	case s.GCP != nil:
		allow, block = s.GCP.AllowUserCloudInit, "gcp"
	}
	if allow != nil && !*allow {
		// Never quote the cloudInit: it is secret.
		return proxy.Permanentf("spec.forProvider.cloudInit: %s does not allow a proxy's own cloud-init (its %s.allowUserCloudInit is false): remove it", c.Name, block)
	}
	return nil
}

// Backend returns the block the config holds.
func Backend(s *spec.ProviderConfigSpec) string {
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
}

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
			return r.Of(pc), nil
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
	return &Config{Name: name, Spec: s, InstallationID: id, Secrets: Secrets{Kube: r.SecretReader, Namespace: secretNamespace}}
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
	v, ok := sec.Data[ref.Key]
	if !ok || len(v) == 0 {
		return nil, errors.Errorf("%s: Secret %s/%s has no key %q", field, ns, ref.Name, ref.Key)
	}
	return v, nil
}

// Of returns the Config of a ProviderConfig object of any of the three
// config kinds, or nil for another object.
func (r ConfigReader) Of(obj client.Object) *Config {
	switch pc := obj.(type) {
	case *namespacedv1alpha1.ProviderConfig:
		c := r.config(fmt.Sprintf("ProviderConfig %s/%s", pc.Namespace, pc.Name), pc.Spec.ProviderConfigSpec, pc.Namespace)
		c.Namespaced = true
		return c
	case *namespacedv1alpha1.ClusterProviderConfig:
		return r.config("ClusterProviderConfig "+pc.Name, pc.Spec.ProviderConfigSpec, "")
	case *clusterv1alpha1.ProviderConfig:
		return r.config("ProviderConfig "+pc.Name, pc.Spec.ProviderConfigSpec, "")
	}
	return nil
}
