package benchutil

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/egressproxy/provider-egressproxy/apis"
	nsproxy "github.com/egressproxy/provider-egressproxy/apis/namespaced/proxy/v1alpha1"
	nsv1alpha1 "github.com/egressproxy/provider-egressproxy/apis/namespaced/v1alpha1"
	spec "github.com/egressproxy/provider-egressproxy/apis/spec/v1alpha1"
	"github.com/egressproxy/provider-egressproxy/internal/devenv/controlplane"
)

// Cluster is a local control plane with the repository's CRDs installed,
// and a client of it that knows the provider's kinds.
type Cluster struct {
	CP *controlplane.ControlPlane
	// Scheme holds client-go's kinds and the provider's.
	Scheme *runtime.Scheme
	// Config is the control plane's, with client-side rate limits raised
	// so that this program's creates and watches are not what is measured.
	Config *rest.Config
	Client client.Client
	// Dir holds the control plane's files (in Dir/controlplane) and the
	// benchmark's logs.
	Dir  string
	keep bool
}

// ClusterOptions says which cluster StartCluster starts.
type ClusterOptions struct {
	// Name prefixes the temporary folder (the benchmark's name).
	Name string
	// KeepLogs keeps the folder when the cluster stops.
	KeepLogs bool
	// ControlPlane is passed on; its Dir is set, its CRDDirectories
	// default to the repository's package/crds.
	ControlPlane controlplane.Options
	// Namespaces are created.
	Namespaces []string
}

// StartCluster starts a control plane in a new temporary folder and
// creates o.Namespaces. The caller calls Stop.
func StartCluster(ctx context.Context, o ClusterOptions) (*Cluster, error) {
	if len(o.ControlPlane.CRDDirectories) == 0 {
		root, err := controlplane.RepoRoot()
		if err != nil {
			return nil, err
		}
		o.ControlPlane.CRDDirectories = []string{filepath.Join(root, "package", "crds")}
	}
	dir, err := os.MkdirTemp("", o.Name+"-")
	if err != nil {
		return nil, err
	}
	o.ControlPlane.Dir = filepath.Join(dir, "controlplane")
	Logf("starting the control plane")
	cp, err := controlplane.Start(ctx, o.ControlPlane)
	if err != nil {
		if !o.KeepLogs {
			_ = os.RemoveAll(dir)
		}
		return nil, err
	}
	c, err := clusterOf(ctx, cp, o.Namespaces)
	if err != nil {
		_ = cp.Stop()
		return nil, err
	}
	c.Dir, c.keep = dir, o.KeepLogs
	return c, nil
}

// Stop stops the control plane and removes Dir unless its logs are kept.
func (c *Cluster) Stop() error {
	err := c.CP.Stop()
	if !c.keep {
		_ = os.RemoveAll(c.Dir)
	}
	return err
}

func clusterOf(ctx context.Context, cp *controlplane.ControlPlane, namespaces []string) (*Cluster, error) {
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		return nil, err
	}
	if err := apis.AddToScheme(s); err != nil {
		return nil, err
	}
	cfg := rest.CopyConfig(cp.Config)
	cfg.QPS, cfg.Burst = 2000, 4000
	kube, err := client.New(cfg, client.Options{Scheme: s})
	if err != nil {
		return nil, err
	}
	for _, ns := range namespaces {
		if err := kube.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
			return nil, fmt.Errorf("namespace %s: %w", ns, err)
		}
	}
	return &Cluster{CP: cp, Scheme: s, Config: cfg, Client: kube}, nil
}

// CreatePodsConfig creates the ClusterProviderConfig "pods": the
// kubernetes backend on the provider's own cluster, proxies in the
// namespace egress-proxies, with image as the Squid image ("" for the
// provider's default), and a NetworkPolicy per proxy unless networkPolicy
// is false (what that piece costs, measured by leaving it out).
func CreatePodsConfig(ctx context.Context, kube client.Client, image string, networkPolicy bool) error {
	return kube.Create(ctx, &nsv1alpha1.ClusterProviderConfig{
		ObjectMeta: metav1.ObjectMeta{Name: "pods"},
		Spec: nsv1alpha1.ClusterProviderConfigSpec{ProviderConfigSpec: spec.ProviderConfigSpec{Kubernetes: &spec.KubernetesConfig{
			Credentials: spec.KubernetesCredentials{Source: xpv2.CredentialsSourceInjectedIdentity},
			Namespace:   "egress-proxies", Image: image, NetworkPolicy: &networkPolicy,
		}}},
	})
}

// CreateMemoryConfig creates the ClusterProviderConfig "memory": a KVM
// config for the benchmark's provider (hack/benchprovider), whose
// KVMProxy backend is in memory and
// never reads the key or reaches the host.
func CreateMemoryConfig(ctx context.Context, kube client.Client) error {
	return kube.Create(ctx, &nsv1alpha1.ClusterProviderConfig{
		ObjectMeta: metav1.ObjectMeta{Name: "memory"},
		Spec: nsv1alpha1.ClusterProviderConfigSpec{ProviderConfigSpec: spec.ProviderConfigSpec{KVM: &spec.KVMConfig{
			Credentials:  spec.KVMCredentials{SSHKeySecretRef: spec.SecretKeySelector{Namespace: "crossplane-system", Name: "ssh", Key: "key"}, InsecureIgnoreHostKey: true},
			Images:       map[string]spec.KVMImage{"debian-12": {URL: "https://example.com/debian-12.qcow2"}},
			MachineTypes: map[string]spec.KVMMachineType{"small": {VCPUs: 1, MemoryMiB: 512}},
			Hosts:        []spec.KVMHost{{Name: "h1", Address: "10.0.0.5:22", User: "proxy", Bridge: "br0"}},
		}}},
	})
}

// MemoryProxy is a KVMProxy named name in the namespace bench on the
// config of CreateMemoryConfig, with a connection Secret if secret.
func MemoryProxy(name string, secret bool) *nsproxy.KVMProxy {
	p := &nsproxy.KVMProxy{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "bench"},
		Spec: nsproxy.KVMProxySpec{
			ManagedResourceSpec: xpv2.ManagedResourceSpec{
				ProviderConfigReference: &xpv2.ProviderConfigReference{Kind: "ClusterProviderConfig", Name: "memory"},
			},
			ForProvider: spec.KVMProxyParameters{Host: "h1", MachineType: "small", Image: "debian-12",
				Proxy: spec.ProxySettings{AllowedClientCIDRs: []string{"10.0.0.0/8"}}},
		},
	}
	if secret {
		p.Spec.WriteConnectionSecretToReference = &xpv2.LocalSecretReference{Name: name + "-proxy"}
	}
	return p
}

// Logf prints a progress line, with the time, to stderr (the figures go
// to stdout).
func Logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "[%s] %s\n", time.Now().Format("15:04:05.000"), fmt.Sprintf(format, args...))
}

// Sleep waits d, or less if ctx ends.
func Sleep(ctx context.Context, d time.Duration) error {
	select {
	case <-time.After(d):
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Main runs a benchmark's run until it returns or the program gets
// SIGINT or SIGTERM (its context is then cancelled, so that what run
// started is stopped), with controller-runtime's logs discarded, and
// exits 1 with "name: error" if it fails.
func Main(name string, run func(ctx context.Context) error) {
	ctrl.SetLogger(logr.Discard())
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx)
	cancel()
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
		os.Exit(1)
	}
}
