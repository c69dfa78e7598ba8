// Package crossplanetest brings up, for a test, what installing the
// project the Crossplane way needs (internal/devenv/localcrossplane): an OCI
// registry on loopback with TLS from a CA made for it, a real control
// plane, Crossplane core v2.4.0 with its package manager and RBAC manager
// trusting that CA, and the process runtime that runs the packages' pods;
// and the steps the tests of that path share (the hack/ scripts, the
// Crossplane CLI, objects and their conditions, a ProxmoxProxy on the fake
// Proxmox VE). test/install and test/quickstart use it.
package crossplanetest

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/egressproxy/provider-egressproxy/internal/backend/proxmox/pvetest"
	"github.com/egressproxy/provider-egressproxy/internal/devenv/controlplane"
	"github.com/egressproxy/provider-egressproxy/internal/devenv/localcrossplane"
	"github.com/egressproxy/provider-egressproxy/internal/devenv/ociimage/registrytest"
	"github.com/egressproxy/provider-egressproxy/internal/devenv/testenv"
)

// The names the packages install as (docs/install.md).
const (
	// Namespace is the namespace Crossplane runs in.
	Namespace = localcrossplane.Namespace
	// ProviderPackage, FunctionPackage and ConfigurationPackage are the
	// packages' names in the registry; the Configuration installs under
	// the same name.
	ProviderPackage      = "provider-egressproxy"
	FunctionPackage      = "function-egressproxy"
	ConfigurationPackage = "configuration-egressproxy"
	// ProviderObject is the Provider's name: the one Crossplane's
	// dependency resolver gives the Configuration's dependency (the
	// repository path as a DNS label), so that the resolver finds it
	// installed, even in the moment of an upgrade when neither revision is
	// in the Lock, and makes no second Provider of the same package.
	ProviderObject = "egressproxy-provider-egressproxy"
	// FunctionObject is the Function's name: the one the resolver gives
	// it, which the Compositions call (make xpkg writes it).
	FunctionObject = "egressproxy-function-egressproxy"
)

// Tools are the Crossplane CLI and core, built from the Go module proxy
// by hack/crossplane-bins.sh when missing, and the repository's root.
type Tools struct {
	Root string
	// CLI is the crossplane CLI binary.
	CLI string
	// CoreBins holds the crossplane core binary and Crossplane's CRDs
	// (crds/).
	CoreBins string
}

// GetTools builds (when missing) and finds the Crossplane CLI and core.
func GetTools(t testing.TB) Tools {
	t.Helper()
	root, err := controlplane.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	return Tools{Root: root, CLI: Script(t, root, nil, "crossplane-bins.sh", "cli"), CoreBins: Script(t, root, nil, "crossplane-bins.sh")}
}

// Registry is a registry on a free loopback port until the test ends, its
// CA written to dir/registry-ca.pem (for SSL_CERT_FILE and
// CoreOptions.CAFile), and the repository "HOST:PORT/egressproxy" on it
// that the packages are built for.
func Registry(t testing.TB, dir string) (reg *registrytest.Registry, caFile, repo string) {
	t.Helper()
	reg = registrytest.Start(t)
	caFile = filepath.Join(dir, "registry-ca.pem")
	if err := os.WriteFile(caFile, reg.CAPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	return reg, caFile, reg.Host + "/egressproxy"
}

// StartCore runs Crossplane core out of cluster (localcrossplane.StartCore)
// until the test ends; when it failed, the tails of core's logs are
// logged.
func StartCore(t testing.TB, o localcrossplane.CoreOptions) *localcrossplane.Core {
	t.Helper()
	c, err := localcrossplane.StartCore(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.Stop()
		if t.Failed() {
			for _, p := range []*localcrossplane.Process{c.Core, c.RBAC} {
				t.Logf("%s: last lines of its log:\n%s", p.Name, p.Tail(60))
			}
		}
	})
	return c
}

// Options configures Start.
type Options struct {
	// Activations: see localcrossplane.CoreOptions (none: no managed
	// resource kind is active until a policy the test makes activates it;
	// "*" as Crossplane's Helm chart).
	Activations []string
	// Namespaces are made besides crossplane-system.
	Namespaces []string
}

// Cluster is a control plane running Crossplane core, with nothing
// installed: what a user's cluster with Crossplane is before make run or
// crossplane xpkg install.
type Cluster struct {
	Tools
	// Dir holds the registry's CA, core's files and the pods' folders.
	Dir string
	// Registry, its CA file and the repository the packages are built for.
	Registry *registrytest.Registry
	CAFile   string
	Repo     string

	CP        *controlplane.ControlPlane
	Kube      client.Client
	Clientset *kubernetes.Clientset
	Core      *localcrossplane.Core
	// Pods runs the pods of the packages' Deployments as processes.
	Pods *localcrossplane.ProcessRuntime
}

// Start brings up a Cluster until the test ends: the registry, a control
// plane with Crossplane's CRDs and kube-controller-manager (which makes
// the Deployments' pods), the namespaces, the ServiceAccount crossplane
// (which Crossplane's Helm chart makes; the package manager copies its
// image pull secrets), Crossplane core trusting the registry, and the
// process runtime, stopped before the control plane is.
func Start(t testing.TB, o Options) *Cluster {
	t.Helper()
	c := &Cluster{Tools: GetTools(t), Dir: t.TempDir()}
	c.Registry, c.CAFile, c.Repo = Registry(t, c.Dir)
	c.CP = controlplane.ForTest(t, controlplane.Options{CRDDirectories: []string{filepath.Join(c.CoreBins, "crds")}, ControllerManager: true})
	c.Kube = Client(t, c.CP, append([]string{Namespace}, o.Namespaces...)...)
	var err error
	if c.Clientset, err = kubernetes.NewForConfig(c.CP.Config); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := c.Kube.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: Namespace, Name: "crossplane"}}); err != nil {
		t.Fatal(err)
	}
	fnIP := localcrossplane.FunctionIP(os.Getpid())
	c.Core = StartCore(t, localcrossplane.CoreOptions{BinDir: c.CoreBins, Kubeconfig: c.CP.KubeconfigPath, Dir: c.Dir, CAFile: c.CAFile,
		Hosts: map[string]string{FunctionObject + "." + Namespace: fnIP}, Activations: o.Activations})

	c.Pods = &localcrossplane.ProcessRuntime{Kube: c.Kube, Clientset: c.Clientset, Config: c.CP.Config, Registry: c.Registry.Client,
		Dir: filepath.Join(c.Dir, "pods"), FunctionAddrs: map[string]string{FunctionObject: fnIP}, Log: func(s string) { t.Log(s) }}
	podsCtx, stopPods := context.WithCancel(ctx)
	podsDone := make(chan struct{})
	go func() { c.Pods.Run(podsCtx); close(podsDone) }()
	t.Cleanup(func() {
		stopPods()
		<-podsDone
		if t.Failed() {
			for pod, tail := range c.Pods.LogTails(40) {
				t.Logf("pod %s: last lines of its log:\n%s", pod, tail)
			}
		}
	})
	return c
}

// Client is an admin client of cp (client-go's scheme; unstructured
// objects for the rest), after it made the namespaces.
func Client(t testing.TB, cp *controlplane.ControlPlane, namespaces ...string) client.Client {
	t.Helper()
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	kube, err := client.New(cp.Config, client.Options{Scheme: s})
	if err != nil {
		t.Fatal(err)
	}
	for _, ns := range namespaces {
		if err := kube.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
			t.Fatal(err)
		}
	}
	return kube
}

// Script runs hack/NAME with args (env added to this process's), its
// progress shown (cold builds take minutes), and returns the last line it
// printed.
func Script(t testing.TB, root string, env []string, name string, args ...string) string {
	t.Helper()
	var out, errb bytes.Buffer
	cmd := exec.Command("bash", append([]string{filepath.Join(root, "hack", name)}, args...)...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout = &out
	cmd.Stderr = io.MultiWriter(&errb, os.Stderr)
	if err := cmd.Run(); err != nil {
		t.Fatalf("hack/%s %v: %v\n%s", name, args, err, errb.String())
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	return lines[len(lines)-1]
}

// StartProcess is localcrossplane.StartProcess until the test ends, when
// it is stopped (SIGKILL 10 s after SIGTERM at the latest); when the test
// failed, the last lines of its log are logged.
func StartProcess(t testing.TB, name, logPath string, env []string, bin string, args ...string) *localcrossplane.Process {
	t.Helper()
	p, err := localcrossplane.StartProcess(name, logPath, env, bin, args...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		p.Stop(10 * time.Second)
		if t.Failed() {
			t.Logf("%s: last lines of its log:\n%s", name, p.Tail(60))
		}
	})
	return p
}

// CLI runs the Crossplane CLI bin with args (env added to this
// process's) and returns what it printed.
func CLI(t testing.TB, bin string, env []string, args ...string) string {
	t.Helper()
	cmd := exec.Command(bin, args...) //nolint:gosec // the CLI built by hack/crossplane-bins.sh.
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("crossplane %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// U is an object to Get or Create by its apiVersion, kind, namespace and
// name.
func U(apiVersion, kind, ns, name string) *unstructured.Unstructured {
	o := &unstructured.Unstructured{}
	o.SetAPIVersion(apiVersion)
	o.SetKind(kind)
	o.SetNamespace(ns)
	o.SetName(name)
	return o
}

// ApplyYAML creates every object of doc.
func ApplyYAML(t testing.TB, kube client.Client, doc string) {
	t.Helper()
	objs, err := localcrossplane.DecodeYAML(doc)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		if err := kube.Create(context.Background(), o); err != nil {
			t.Fatalf("creating %s %s: %v", o.GetKind(), o.GetName(), err)
		}
	}
}

// CreateOnceServed creates o as soon as its kind is served (the CRD
// that an XRD, a package or an activation policy makes is established),
// waiting up to two minutes.
func CreateOnceServed(t testing.TB, kube client.Client, o *unstructured.Unstructured) {
	t.Helper()
	testenv.WaitFor(t, fmt.Sprintf("%s to be served, to create %s", o.GetKind(), o.GetName()), 2*time.Minute, func() (bool, string) {
		err := kube.Create(context.Background(), o.DeepCopy())
		return err == nil, fmt.Sprint(err)
	})
}

// WaitCondition waits for o's condition typ to be True; o is what was
// last read.
func WaitCondition(t testing.TB, kube client.Client, o *unstructured.Unstructured, typ string, timeout time.Duration) {
	t.Helper()
	testenv.WaitFor(t, fmt.Sprintf("%s %s to be %s", o.GetKind(), o.GetName(), typ), timeout, func() (bool, string) {
		if err := kube.Get(context.Background(), client.ObjectKeyFromObject(o), o); err != nil {
			return false, err.Error()
		}
		s, m := localcrossplane.Condition(o, typ)
		return s == "True", s + " " + m
	})
}

// ProxmoxProxy starts the fake Proxmox VE (its guests listening on the
// proxy port once they run) and creates what a user would for it: the
// Secret pve in crossplane-system with its token and CA, the
// ClusterProviderConfig home-pve, and the ProxmoxProxy ns/egress-pve on
// node pve1. It returns the ProxmoxProxy, to wait for, and the fake.
func ProxmoxProxy(t testing.TB, kube client.Client, ns string) (*unstructured.Unstructured, *pvetest.Server) {
	t.Helper()
	fake := pvetest.New(t, pvetest.Options{Listen: true})
	if err := kube.Create(context.Background(), fake.Secret(Namespace, "pve")); err != nil {
		t.Fatal(err)
	}
	ApplyYAML(t, kube, `
apiVersion: m.egressproxy.io/v1alpha1
kind: ClusterProviderConfig
metadata:
  name: home-pve
spec:
  proxmox:
    url: `+fake.URL+`
    credentials:
      tokenSecretRef: {namespace: `+Namespace+`, name: pve, key: token}
      caSecretRef: {namespace: `+Namespace+`, name: pve, key: ca.pem}
    nodes: [pve1]
    isoStorage: local
    bridge: vmbr0
    vmidRange: {min: 100000, max: 199999}
    diskGiB: 10
    templates: {debian-12: {vmid: 9000}}
    machineTypes: {small: {cores: 1, memoryMiB: 1024}}
---
apiVersion: proxy.m.egressproxy.io/v1alpha1
kind: ProxmoxProxy
metadata:
  name: egress-pve
  namespace: `+ns+`
spec:
  providerConfigRef:
    kind: ClusterProviderConfig
    name: home-pve
  forProvider:
    node: pve1
    proxy:
      allowedClientCIDRs: ["10.0.0.0/8"]
`)
	return U("proxy.m.egressproxy.io/v1alpha1", "ProxmoxProxy", ns, "egress-pve"), fake
}
