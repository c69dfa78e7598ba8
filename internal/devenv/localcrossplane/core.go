package localcrossplane

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/egressproxy/provider-egressproxy/internal/devenv/netnshost"
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
	// Activations are the entries of the default
	// ManagedResourceActivationPolicy core init makes (`--activation`;
	// Crossplane's Helm chart passes "*"). None: no default policy, so no
	// managed resource kind is active until a policy activates it.
	Activations []string
}

// Core is Crossplane core v2.4.0 running out of cluster: the package
// manager (on the Deployment runtime, the default: it makes the provider's
// and the function's Deployment, ServiceAccount and Service) and the RBAC
// manager, as two processes (the RBAC manager in a network namespace of
// its own, see StartCore).
type Core struct {
	// Core and RBAC are the two processes.
	Core, RBAC *Process

	rbacNet   *netnshost.Host
	rbacRelay net.Listener
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
	initArgs := []string{"core", "init", "--enable-webhooks=false"}
	for _, a := range o.Activations {
		initArgs = append(initArgs, "--activation="+a)
	}
	init := exec.CommandContext(ctx, xp, initArgs...) //nolint:gosec // our build.
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
	// The RBAC manager serves metrics on :8080 of every address, with no
	// flag to move or stop it; it runs in a network namespace of its own
	// (so two of them, or anything else on 8080, never collide) and
	// reaches the API server through a relay from that namespace's
	// loopback to this machine's.
	u, err := url.Parse(cfg.Host)
	if err != nil || u.Host == "" {
		c.Stop()
		return nil, fmt.Errorf("the kubeconfig's server %q: %w", cfg.Host, err)
	}
	if c.rbacNet, err = netnshost.New(); err != nil {
		c.Stop()
		return nil, fmt.Errorf("a network namespace for the RBAC manager: %w", err)
	}
	if c.rbacRelay, err = c.rbacNet.Listen("tcp", u.Host); err != nil {
		c.Stop()
		return nil, err
	}
	go relay(c.rbacRelay, u.Host)
	if c.RBAC, err = StartProcess("crossplane rbac", filepath.Join(o.Dir, "crossplane-rbac.log"), append(env, "SSL_CERT_FILE="+o.CAFile),
		"ip", "netns", "exec", c.rbacNet.Netns, xp, "rbac", "start"); err != nil {
		c.Stop()
		return nil, err
	}
	return c, nil
}

// relay copies each connection accepted on l to a new one to addr, both
// ways, until l is closed.
func relay(l net.Listener, addr string) {
	for {
		in, err := l.Accept()
		if err != nil {
			return
		}
		go func() {
			defer in.Close()
			out, err := net.DialTimeout("tcp", addr, 10*time.Second)
			if err != nil {
				return
			}
			defer out.Close()
			done := make(chan struct{}, 2)
			go func() { _, _ = io.Copy(out, in); done <- struct{}{} }()
			go func() { _, _ = io.Copy(in, out); done <- struct{}{} }()
			<-done
		}()
	}
}

// RBACNetns is the network namespace the RBAC manager runs in.
func (c *Core) RBACNetns() string { return c.rbacNet.Netns }

// Stop stops both processes (SIGTERM, SIGKILL after 10 s).
func (c *Core) Stop() {
	for _, p := range []*Process{c.RBAC, c.Core} {
		if p != nil {
			p.Stop(10 * time.Second)
		}
	}
	if c.rbacRelay != nil {
		_ = c.rbacRelay.Close()
	}
	if c.rbacNet != nil {
		_ = c.rbacNet.Close()
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
