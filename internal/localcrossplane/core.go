package localcrossplane

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

// Namespace is the namespace Crossplane runs in.
const Namespace = "crossplane-system"

// CoreOptions configures StartCore.
type CoreOptions struct {
	// BinDir is what hack/crossplane-bins.sh prints: the crossplane core
	// binary and Crossplane's CRDs (crds/).
	BinDir string
	// Kubeconfig is an admin kubeconfig of the cluster.
	Kubeconfig string
	// Dir gets core's client certificates, package cache, hosts file and
	// the two logs (crossplane.log, crossplane-rbac.log).
	Dir string
	// CAFile is a PEM bundle core trusts for registries (the local
	// registry's CA), besides the system's.
	CAFile string
	// Hosts are names core resolves to the given IPs (function Service
	// names to the loopback addresses their processes listen on).
	Hosts map[string]string
}

// Core is Crossplane core v2.4.0 running out of cluster: the package
// manager (on the Deployment runtime, the default: it makes the provider's
// and the function's Deployment, ServiceAccount and Service) and the RBAC
// manager, as two processes.
type Core struct {
	// Core and RBAC are the two processes.
	Core, RBAC *Process
}

// StartCore runs `crossplane core init` (Crossplane's CRDs, its TLS
// Secrets) and then `crossplane core start` and `crossplane rbac start`
// against the cluster, with webhooks off (there is no in-cluster Service
// for them). The namespace crossplane-system and the ServiceAccount
// crossplane (which Crossplane's Helm chart makes; the package manager
// copies its image pull secrets) must exist. Core dials a function at its
// Service's DNS name: it runs in a mount namespace of its own whose
// /etc/hosts adds Hosts (nothing changes for the rest of the machine).
func StartCore(ctx context.Context, o CoreOptions) (*Core, error) {
	env := []string{
		"KUBECONFIG=" + o.Kubeconfig,
		"CRDS_PATH=" + filepath.Join(o.BinDir, "crds"),
		"TLS_CA_SECRET_NAME=crossplane-root-ca",
		"TLS_CLIENT_SECRET_NAME=crossplane-tls-client",
		"TLS_SERVER_SECRET_NAME=crossplane-tls-server",
		"POD_NAMESPACE=" + Namespace,
		"POD_SERVICE_ACCOUNT=crossplane",
	}
	xp := filepath.Join(o.BinDir, "crossplane")
	init := exec.CommandContext(ctx, xp, "core", "init", "--enable-webhooks=false") //nolint:gosec // our build.
	init.Env = append(os.Environ(), env...)
	if out, err := init.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("crossplane core init: %w\n%s", err, out)
	}
	// core start reads its client certificate from a folder, as it would
	// from the mounted Secret in a cluster.
	certs := filepath.Join(o.Dir, "tls-client")
	if err := os.MkdirAll(certs, 0o700); err != nil {
		return nil, err
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", o.Kubeconfig)
	if err != nil {
		return nil, err
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	sec, err := cs.CoreV1().Secrets(Namespace).Get(ctx, "crossplane-tls-client", metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("core's client certificate: %w", err)
	}
	for _, k := range []string{"ca.crt", "tls.crt", "tls.key"} {
		if err := os.WriteFile(filepath.Join(certs, k), sec.Data[k], 0o600); err != nil {
			return nil, err
		}
	}
	// The package cache must exist: core streams each package.yaml into
	// it while parsing, and a failed write fails the parse.
	if err := os.MkdirAll(filepath.Join(o.Dir, "xpkg-cache"), 0o700); err != nil {
		return nil, err
	}
	hostsFile := filepath.Join(o.Dir, "hosts")
	b, _ := os.ReadFile("/etc/hosts")
	for name, ip := range o.Hosts {
		b = fmt.Appendf(b, "\n%s %s\n", ip, name)
	}
	if err := os.WriteFile(hostsFile, b, 0o644); err != nil { //nolint:gosec // a hosts file.
		return nil, err
	}
	args := []string{"--mount", "--propagation", "private", "sh", "-c", `mount --bind "$0" /etc/hosts && exec "$@"`, hostsFile,
		xp, "core", "start", "--enable-webhooks=false",
		"--tls-client-certs-dir=" + certs, "--xpkg-cache-dir=" + filepath.Join(o.Dir, "xpkg-cache"),
		"--ca-bundle-path=" + o.CAFile,
		"--metrics-port=0", "--health-probe-port=0"}
	c := &Core{}
	if c.Core, err = StartProcess("crossplane core", filepath.Join(o.Dir, "crossplane.log"), env, "unshare", args...); err != nil {
		return nil, err
	}
	if c.RBAC, err = StartProcess("crossplane rbac", filepath.Join(o.Dir, "crossplane-rbac.log"), append(env, "SSL_CERT_FILE="+o.CAFile), xp, "rbac", "start"); err != nil {
		c.Stop()
		return nil, err
	}
	return c, nil
}

// Stop stops both processes (SIGTERM, SIGKILL after 10 s).
func (c *Core) Stop() {
	for _, p := range []*Process{c.RBAC, c.Core} {
		if p != nil {
			p.Stop(10 * time.Second)
		}
	}
}

// Running is an error naming a process that has exited.
func (c *Core) Running() error {
	var errs []error
	for _, p := range []*Process{c.Core, c.RBAC} {
		select {
		case <-p.Exited():
			errs = append(errs, fmt.Errorf("%s exited; last lines of %s:\n%s", p.Name, p.LogPath, p.Tail(20)))
		default:
		}
	}
	return errors.Join(errs...)
}
