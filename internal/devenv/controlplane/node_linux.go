//go:build linux

package controlplane

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/egressproxy/provider-egressproxy/internal/devenv/ociimage"
	"github.com/egressproxy/provider-egressproxy/internal/devenv/pki"
)

// NodeOptions configures the node Start runs with Options.Node.
type NodeOptions struct {
	// BinDir holds kubelet, kube-proxy, kube-scheduler and pause. Default:
	// $EGRESSPROXY_NODE_BIN, or else the folder printed by
	// hack/node-bins.sh (which builds only what is missing and installs
	// containerd, runc and the CNI plugins from apt when they are missing).
	BinDir string

	// Images are image tarballs (`docker save` or OCI archives) imported
	// into containerd before Start returns, for pods to run without a
	// registry (their pull policy must not be Always).
	Images []string

	// RegistryCAs are registries (host:port) containerd pulls from over
	// TLS with a CA of their own (PEM): each gets a hosts.toml in
	// containerd's certs.d trusting it, as containerd's docs configure a
	// private registry. For pods whose image is in a test's registry (the
	// provider Crossplane's package manager installs).
	RegistryCAs map[string][]byte

	// ContainerdRoot is containerd's root folder (its images and their
	// unpacked snapshots), kept from one node to the next so that an image
	// imported before is not unpacked again: importing the Squid image
	// into an empty root takes about 10 s here, into a kept one well under
	// a second. Only images (no pods: Start and Stop remove them all)
	// stay in it, and only those of Images. Default: the node folder of
	// the tool cache ($EGRESSPROXY_CACHE, else
	// ~/.cache/provider-egressproxy, then node/containerd-root).
	ContainerdRoot string

	// locked, when set, runs once the node holds the machine's node lock
	// and has swept (a test looks at the machine before the node starts).
	locked func()
}

// EnvNodeBinDir names the environment variable that, when set, names the
// folder holding kubelet, kube-proxy, kube-scheduler and pause, and
// replaces running hack/node-bins.sh.
const EnvNodeBinDir = "EGRESSPROXY_NODE_BIN"

const nodeBinsScript = "hack/node-bins.sh"

// Node is the one node of a control plane started with Options.Node: a
// containerd, a kubelet registered with the API server as Name, the real
// kube-scheduler and a kube-proxy (iptables mode: ClusterIP Services
// route), on this machine. Pods get addresses in PodCIDR on a bridge of
// their own; the bridge holds Gateway, which is also the node's address
// (the API server reaches the kubelet there, for logs).
type Node struct {
	// Name is the Node object's name.
	Name string
	// Dir holds everything the node writes (containerd's root and state,
	// the kubelet's root, the CNI configuration and IP allocations).
	Dir string
	// Bridge is the pod network's Linux bridge.
	Bridge string
	// PodCIDR is the pod network; Gateway its first address, on Bridge.
	PodCIDR netip.Prefix
	Gateway netip.Addr
	// ContainerdSocket is containerd's socket, for ctr (--address) and
	// crictl (--runtime-endpoint unix://...).
	ContainerdSocket string
	// BinDir is where kubelet, kube-proxy, kube-scheduler and pause came from.
	BinDir string
	// ReadyIn is how long the node took from its first process to Ready
	// (the API server was up already); ImportIn the part of it spent
	// importing the images.
	ReadyIn, ImportIn time.Duration

	c    *ControlPlane
	lock *os.File
	// holdLock keeps the machine's node lock after stop, for a test to
	// look at the machine before another node starts; releaseLock ends it.
	holdLock bool
	// containerdRoot is NodeOptions.ContainerdRoot or its default.
	containerdRoot string
	registryCAs    map[string][]byte
	procs          []*nodeProc
	sysctls        map[string]string
	netnsPre       map[string]bool
	pki            string
	ports          struct{ kubelet, kubeletHealthz, proxyHealthz, proxyMetrics int }
}

type nodeProc struct {
	name string
	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

const (
	// nodeLock serialises nodes on this machine: kube-proxy's iptables
	// chains, the kubelet's cgroups (/kubepods) and containerd's network
	// namespaces (/run/netns/cni-*) are machine-wide.
	nodeLock = "/run/egressproxy-node.lock"
	// nodeDirFile records the folder of the node running (or killed):
	// its mounts and shims are what a sweep looks for.
	nodeDirFile = "/run/egressproxy-node.dir"
	// bridgePrefix names the pod bridges (epxnode<N>); a sweep removes
	// those left by a killed node.
	bridgePrefix = "epxnode"
	// pauseImage is the sandbox image made from hack/pause.
	pauseImage = "localhost/egressproxy/pause:1"
	// nodeName is the Node's name.
	nodeName = "egressproxy-node"
	// serviceCIDR is envtest's --service-cluster-ip-range.
	serviceCIDR = "10.0.0.0/24"
)

// kernelTunables are the sysctls the kubelet sets at start (it can only
// set them or refuse to start): the node puts them back once the kubelet
// is up, so a test machine keeps its own panic and overcommit settings.
var kernelTunables = []string{"vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops", "kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes"}

// nodeBinDir finds the node binaries like BinDir finds the control plane's.
func nodeBinDir(ctx context.Context, log io.Writer) (string, error) {
	if d := os.Getenv(EnvNodeBinDir); d != "" {
		return d, nil
	}
	return runBinsScript(ctx, log, nodeBinsScript)
}

// prepareNode runs before the API server starts: it takes the machine's
// node lock, removes what a killed node left behind, and sets the API
// server flags a node needs (Node authorizer, NodeRestriction, a client
// certificate for the kubelet's API).
func (c *ControlPlane) prepareNode(ctx context.Context, o *NodeOptions, api *envtest.APIServer) (*Node, error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("a node needs root (containerd, network namespaces, iptables, cgroups)")
	}
	n := &Node{Name: nodeName, Dir: filepath.Join(c.Dir, "node"), BinDir: o.BinDir, c: c}
	if n.BinDir == "" {
		d, err := nodeBinDir(ctx, c.log.writer("[node-bins] "))
		if err != nil {
			return nil, err
		}
		n.BinDir = d
	}
	if err := checkBinaries(n.BinDir, "kubelet", "kube-proxy", "kube-scheduler", "pause"); err != nil {
		return nil, err
	}
	for _, b := range []string{"containerd", "containerd-shim-runc-v2", "runc", "ctr", "iptables", "iptables-save", "ip", "conntrack"} {
		if _, err := exec.LookPath(b); err != nil {
			return nil, fmt.Errorf("the node needs %s on PATH (run %s, which installs it from apt): %w", b, nodeBinsScript, err)
		}
	}
	for _, p := range []string{"bridge", "host-local", "loopback"} {
		if _, err := os.Stat(filepath.Join(cniBinDir, p)); err != nil {
			return nil, fmt.Errorf("the CNI plugin %s is missing from %s (run %s, which installs containernetworking-plugins): %w", p, cniBinDir, nodeBinsScript, err)
		}
	}
	f, err := os.OpenFile(nodeLock, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, err
	}
	n.lock = f
	if err := flockContext(ctx, f, c.log.writer("[node] ")); err != nil {
		return nil, err
	}
	// Whatever is left now is a killed node's: this machine runs one node
	// at a time.
	if err := sweepNodes(c.log.writer("[node] ")); err != nil {
		return nil, fmt.Errorf("removing what an earlier node left behind: %w", err)
	}
	if o.locked != nil {
		o.locked()
	}
	n.netnsPre = netnsNames()
	if err := os.RemoveAll(n.Dir); err != nil {
		return nil, err
	}
	if err := os.WriteFile(nodeDirFile, []byte(n.Dir+"\n"), 0o600); err != nil {
		return nil, err
	}
	n.pki = filepath.Join(n.Dir, "pki")
	if err := os.MkdirAll(n.pki, 0o700); err != nil {
		return nil, err
	}
	if err := writeKubeletClientPKI(n.pki); err != nil {
		return nil, err
	}
	pfx, br, err := freePodCIDR()
	if err != nil {
		return nil, err
	}
	n.PodCIDR, n.Bridge = pfx, br
	n.Gateway = pfx.Addr().Next()
	n.ContainerdSocket = filepath.Join(n.Dir, "containerd", "containerd.sock")
	n.containerdRoot = o.ContainerdRoot
	n.registryCAs = o.RegistryCAs
	if n.containerdRoot == "" {
		if n.containerdRoot, err = defaultContainerdRoot(); err != nil {
			return nil, err
		}
	}
	for _, p := range []*int{&n.ports.kubelet, &n.ports.kubeletHealthz, &n.ports.proxyHealthz, &n.ports.proxyMetrics} {
		if *p, err = FreePort(); err != nil {
			return nil, err
		}
	}

	args := api.Configure()
	args.Set("authorization-mode", "Node", "RBAC")
	args.Set("enable-admission-plugins", "NodeRestriction")
	args.Set("kubelet-client-certificate", filepath.Join(n.pki, "apiserver-kubelet-client.crt"))
	args.Set("kubelet-client-key", filepath.Join(n.pki, "apiserver-kubelet-client.key"))
	args.Set("kubelet-preferred-address-types", "InternalIP")
	return n, nil
}

const cniBinDir = "/usr/lib/cni"

// start starts containerd, imports the images, then the kubelet,
// kube-scheduler and kube-proxy, and waits until the Node is Ready.
func (n *Node) start(ctx context.Context, o *NodeOptions) error {
	note := n.c.log.writer("[node] ")
	t0 := time.Now()
	if err := n.bridgeUp(); err != nil {
		return err
	}
	if err := n.startContainerd(ctx); err != nil {
		return err
	}
	// The root is kept: pods of a node that did not stop cleanly go
	// before the kubelet could see them.
	if err := n.removePods(); err != nil {
		return err
	}
	images, err := n.pauseTarball()
	if err != nil {
		return err
	}
	t1 := time.Now()
	if err := n.importImages(ctx, append([]string{images}, o.Images...)); err != nil {
		return err
	}
	n.ImportIn = time.Since(t1)
	fmt.Fprintf(note, "containerd up in %.2fs, %d image(s) imported in %.2fs\n", t1.Sub(t0).Seconds(), len(o.Images)+1, n.ImportIn.Seconds())

	n.sysctls = map[string]string{}
	for _, k := range kernelTunables {
		if b, err := os.ReadFile("/proc/sys/" + k); err == nil {
			n.sysctls[k] = strings.TrimSpace(string(b))
		}
	}
	if err := n.startKubelet(); err != nil {
		return err
	}
	if err := n.startScheduler(); err != nil {
		return err
	}
	if err := n.startKubeProxy(); err != nil {
		return err
	}
	if err := n.waitReady(ctx); err != nil {
		return err
	}
	n.restoreSysctls()
	n.ReadyIn = time.Since(t0)
	fmt.Fprintf(note, "node %s Ready in %.2fs (pods in %s on %s)\n", n.Name, time.Since(t0).Seconds(), n.PodCIDR, n.Bridge)
	return nil
}

func (n *Node) releaseLock() {
	if n.lock != nil {
		_ = n.lock.Close()
	}
}

func (n *Node) restoreSysctls() {
	for k, v := range n.sysctls {
		if b, err := os.ReadFile("/proc/sys/" + k); err == nil && strings.TrimSpace(string(b)) != v {
			_ = os.WriteFile("/proc/sys/"+k, []byte(v+"\n"), 0o644)
		}
	}
}

// bridgeUp creates the pod bridge with the gateway address, before the
// kubelet (whose node address it is) and before any pod (the CNI bridge
// plugin takes it as it is).
func (n *Node) bridgeUp() error {
	gw := netip.PrefixFrom(n.Gateway, n.PodCIDR.Bits()).String()
	for _, args := range [][]string{
		{"link", "add", n.Bridge, "type", "bridge"},
		{"addr", "add", gw, "dev", n.Bridge},
		{"link", "set", n.Bridge, "up"},
		// Cluster IPs by the bridge too: before kube-proxy's rules are in
		// place (or after they are gone) a connection to one goes nowhere,
		// never out of the machine's own interface.
		{"route", "add", serviceCIDR, "dev", n.Bridge, "src", n.Gateway.String()},
	} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			return fmt.Errorf("ip %s: %w: %s", strings.Join(args, " "), err, out)
		}
	}
	return nil
}

func (n *Node) startContainerd(ctx context.Context) error {
	d := filepath.Join(n.Dir, "containerd")
	netd := filepath.Join(n.Dir, "cni", "net.d")
	for _, p := range []string{d, netd, n.containerdRoot} {
		if err := os.MkdirAll(p, 0o700); err != nil {
			return err
		}
	}
	conf := fmt.Sprintf(`version = 2
root = %[1]q
state = %[2]q
[grpc]
  address = %[3]q
[ttrpc]
  address = %[4]q
[debug]
  address = ""
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = %[5]q
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %[6]q
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  disable_apparmor = true
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = %[7]q
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = %[8]q
    conf_dir = %[9]q
    max_conf_num = 1
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = %[10]q
`, n.containerdRoot, filepath.Join(d, "state"), n.ContainerdSocket, n.ContainerdSocket+".ttrpc",
		filepath.Join(d, "opt"), pauseImage, filepath.Join(d, "runc"), cniBinDir, netd, filepath.Join(d, "certs.d"))
	confPath := filepath.Join(d, "config.toml")
	if err := os.WriteFile(confPath, []byte(conf), 0o600); err != nil {
		return err
	}
	for host, ca := range n.registryCAs {
		hd := filepath.Join(d, "certs.d", host)
		if err := os.MkdirAll(hd, 0o700); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(hd, "ca.pem"), ca, 0o600); err != nil {
			return err
		}
		hosts := fmt.Sprintf("server = %[1]q\n\n[host.%[1]q]\n  capabilities = [\"pull\", \"resolve\"]\n  ca = %[2]q\n", "https://"+host, filepath.Join(hd, "ca.pem"))
		if err := os.WriteFile(filepath.Join(hd, "hosts.toml"), []byte(hosts), 0o600); err != nil {
			return err
		}
	}
	// The pod network: the bridge made above, addresses from host-local
	// (.2 to .200), no masquerade: pods reach the bridge, and through
	// this machine's routing what it routes (the tests' hosts).
	cni := fmt.Sprintf(`{
  "cniVersion": "0.4.0",
  "name": "egressproxy",
  "plugins": [
    {"type": "bridge", "bridge": %q, "isGateway": true, "ipMasq": false, "hairpinMode": true,
     "ipam": {"type": "host-local", "dataDir": %q, "ranges": [[{"subnet": %q, "gateway": %q, "rangeEnd": %q}]], "routes": [{"dst": "0.0.0.0/0"}]}},
    {"type": "loopback"}
  ]
}
`, n.Bridge, filepath.Join(n.Dir, "cni", "ipam"), n.PodCIDR.String(), n.Gateway.String(), lastPodAddr(n.PodCIDR).String())
	if err := os.WriteFile(filepath.Join(netd, "10-egressproxy.conflist"), []byte(cni), 0o600); err != nil {
		return err
	}
	if _, err := n.run("containerd", "containerd", []string{"--config", confPath}, nil); err != nil {
		return err
	}
	return poll(ctx, 100*time.Millisecond, 30*time.Second, func() (bool, error) {
		if _, err := n.ctr(ctx, "version"); err == nil {
			return true, nil
		}
		return false, n.exited("containerd")
	}, func() error { return errors.New("containerd did not answer on its socket within 30s") })
}

// poll calls check every interval until it says done or fails, ctx ends,
// or within has passed: then the error is late's.
func poll(ctx context.Context, interval, within time.Duration, check func() (bool, error), late func() error) error {
	deadline := time.Now().Add(within)
	for {
		if done, err := check(); done || err != nil {
			return err
		}
		if time.Now().After(deadline) {
			return late()
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(interval):
		}
	}
}

// importImages imports the tarballs and removes every other image from
// the kept root (an older Squid image, say, or an older name of the same
// one), which containerd's garbage collector then deletes.
func (n *Node) importImages(ctx context.Context, tarballs []string) error {
	keep := map[string]bool{}
	for _, img := range tarballs {
		out, err := n.ctr(ctx, "images", "import", img)
		if err != nil {
			return fmt.Errorf("importing the image %s into containerd: %w: %s", img, err, out)
		}
		// "unpacking NAME (sha256:...)...done"
		for _, l := range strings.Split(string(out), "\n") {
			if f := strings.Fields(l); len(f) >= 2 && f[0] == "unpacking" {
				keep[f[1]] = true
			}
		}
	}
	// REF TYPE DIGEST ...; the CRI adds a "sha256:<image ID>" reference
	// per image, which goes with its image's names.
	out, err := n.ctr(ctx, "images", "list")
	if err != nil {
		return fmt.Errorf("ctr images list: %w: %s", err, out)
	}
	type image struct{ ref, digest string }
	var all []image
	keptDigests := map[string]bool{}
	for _, l := range strings.Split(string(out), "\n")[1:] {
		if f := strings.Fields(l); len(f) >= 3 {
			all = append(all, image{f[0], f[2]})
			if keep[f[0]] {
				keptDigests[f[2]] = true
			}
		}
	}
	for _, img := range all {
		// Another name of a kept image goes too: the CRI reports one of an
		// image's names as a container's image, so an older tag of the same
		// content would stand in for the name the test imported.
		if keep[img.ref] || keptDigests[img.digest] && strings.HasPrefix(img.ref, "sha256:") {
			continue
		}
		if out, err := n.ctr(ctx, "images", "remove", img.ref); err != nil {
			return fmt.Errorf("removing the image %s no longer imported: %w: %s", img.ref, err, out)
		}
	}
	return nil
}

// defaultContainerdRoot is NodeOptions.ContainerdRoot's default.
func defaultContainerdRoot() (string, error) {
	cache := os.Getenv("EGRESSPROXY_CACHE")
	if cache == "" {
		d, err := os.UserCacheDir()
		if err != nil {
			return "", err
		}
		cache = filepath.Join(d, "provider-egressproxy")
	}
	return filepath.Join(cache, "node", "containerd-root"), nil
}

// lastPodAddr is the last address host-local hands out: .200 of a /24.
func lastPodAddr(p netip.Prefix) netip.Addr {
	a := p.Addr().As4()
	a[3] = 200
	return netip.AddrFrom4(a)
}

// ctr runs ctr against the node's containerd in the k8s.io namespace (the
// kubelet's).
func (n *Node) ctr(ctx context.Context, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, "ctr", append([]string{"--address", n.ContainerdSocket, "--namespace", "k8s.io"}, args...)...)
	return cmd.CombinedOutput()
}

// Ctr is ctr's command line for this node's containerd, for debugging:
// ctr --address SOCKET --namespace k8s.io.
func (n *Node) Ctr() []string {
	return []string{"ctr", "--address", n.ContainerdSocket, "--namespace", "k8s.io"}
}

// pauseTarball makes the sandbox image from hack/pause.
func (n *Node) pauseTarball() (string, error) {
	b, err := os.ReadFile(filepath.Join(n.BinDir, "pause"))
	if err != nil {
		return "", err
	}
	layer, err := ociimage.Layer([]ociimage.File{{Path: "pause", Mode: 0o755, Data: b}})
	if err != nil {
		return "", err
	}
	img, err := ociimage.Image(ociimage.Platform{OS: "linux", Architecture: runtime.GOARCH},
		ociimage.Config{Entrypoint: []string{"/pause"}, User: "65535:65535"}, layer)
	if err != nil {
		return "", err
	}
	p := filepath.Join(n.Dir, "pause.tar")
	return p, ociimage.WriteTarball(p, pauseImage, img)
}

func (n *Node) startKubelet() error {
	u, err := n.c.env.ControlPlane.AddUser(envtest.User{Name: "system:node:" + n.Name, Groups: []string{"system:nodes"}}, nil)
	if err != nil {
		return err
	}
	kc, err := u.KubeConfig()
	if err != nil {
		return err
	}
	d := filepath.Join(n.Dir, "kubelet")
	if err := os.MkdirAll(d, 0o700); err != nil {
		return err
	}
	kcPath := filepath.Join(n.pki, "kubelet.kubeconfig")
	if err := os.WriteFile(kcPath, kc, 0o600); err != nil {
		return err
	}
	conf := fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# This machine mounts cgroup v1: kubelet 1.35 refuses it unless told.
failCgroupV1: false
cgroupDriver: cgroupfs
containerRuntimeEndpoint: unix://%[1]s
address: %[2]s
port: %[3]d
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: %[4]d
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
  x509: {clientCAFile: %[5]q}
authorization:
  mode: AlwaysAllow
podCIDR: %[6]s
failSwapOn: false
registerNode: true
serializeImagePulls: false
# Never collect the imported images: they cannot be pulled again.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: 50Mi
  nodefs.available: 1%%
  nodefs.inodesFree: 1%%
  imagefs.available: 1%%
# Secret updates and pod restarts within seconds, not a minute.
syncFrequency: 10s
nodeStatusUpdateFrequency: 5s
shutdownGracePeriod: 0s
resolvConf: ""
staticPodPath: ""
rotateCertificates: false
serverTLSBootstrap: false
`, n.ContainerdSocket, n.Gateway, n.ports.kubelet, n.ports.kubeletHealthz,
		filepath.Join(n.pki, "kubelet-client-ca.crt"), n.PodCIDR)
	confPath := filepath.Join(d, "config.yaml")
	if err := os.WriteFile(confPath, []byte(conf), 0o600); err != nil {
		return err
	}
	_, err = n.run("kubelet", filepath.Join(n.BinDir, "kubelet"), []string{
		"--config=" + confPath,
		"--kubeconfig=" + kcPath,
		"--root-dir=" + filepath.Join(d, "root"),
		"--cert-dir=" + filepath.Join(d, "pki"),
		"--hostname-override=" + n.Name,
		"--node-ip=" + n.Gateway.String(),
		"--v=1",
	}, nil)
	return err
}

func (n *Node) startScheduler() error {
	kc, err := n.userKubeconfig("system:kube-scheduler", "kube-scheduler.kubeconfig")
	if err != nil {
		return err
	}
	_, err = n.run("kube-scheduler", filepath.Join(n.BinDir, "kube-scheduler"), []string{
		"--kubeconfig=" + kc,
		"--authentication-kubeconfig=" + kc,
		"--authorization-kubeconfig=" + kc,
		"--leader-elect=false",
		"--secure-port=0",
		"--v=2",
	}, nil)
	return err
}

func (n *Node) startKubeProxy() error {
	kc, err := n.userKubeconfig("system:kube-proxy", "kube-proxy.kubeconfig")
	if err != nil {
		return err
	}
	// iptables mode, touching nothing machine-wide it can leave alone:
	// conntrack limits and timeouts as they are, NodePorts only on the
	// bridge (so no route_localnet).
	conf := fmt.Sprintf(`apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: iptables
clientConnection:
  kubeconfig: %[1]q
hostnameOverride: %[2]s
bindAddress: %[3]s
clusterCIDR: %[4]s
healthzBindAddress: 127.0.0.1:%[5]d
metricsBindAddress: 127.0.0.1:%[6]d
nodePortAddresses: [%[4]s]
iptables:
  localhostNodePorts: false
  syncPeriod: 10s
  minSyncPeriod: 0s
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
  udpTimeout: 0s
  udpStreamTimeout: 0s
`, kc, n.Name, n.Gateway, n.PodCIDR, n.ports.proxyHealthz, n.ports.proxyMetrics)
	p := filepath.Join(n.Dir, "kube-proxy.yaml")
	if err := os.WriteFile(p, []byte(conf), 0o600); err != nil {
		return err
	}
	_, err = n.run("kube-proxy", filepath.Join(n.BinDir, "kube-proxy"), []string{"--config=" + p, "--v=1"}, nil)
	return err
}

// userKubeconfig writes a kubeconfig of a client certificate for user (the
// bootstrap RBAC bindings of kube-scheduler and kube-proxy name them).
func (n *Node) userKubeconfig(user, file string) (string, error) {
	u, err := n.c.env.ControlPlane.AddUser(envtest.User{Name: user}, nil)
	if err != nil {
		return "", err
	}
	kc, err := u.KubeConfig()
	if err != nil {
		return "", err
	}
	p := filepath.Join(n.pki, file)
	return p, os.WriteFile(p, kc, 0o600)
}

// run starts a node process from the control plane's thread (parent-death
// signal), its output into the log.
func (n *Node) run(name, bin string, args []string, env []string) (*nodeProc, error) {
	cmd := exec.Command(bin, args...)
	cmd.Dir = n.Dir
	cmd.Stdout = n.c.log.writer("[" + name + "] ")
	cmd.Stderr = cmd.Stdout
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = sysProcAttr()
	var err error
	n.c.thread.do(func() { err = cmd.Start() })
	if err != nil {
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	p := &nodeProc{name: name, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	n.procs = append(n.procs, p)
	_ = os.WriteFile(filepath.Join(n.c.Dir, "pids", name+".pid"), []byte(strconv.Itoa(cmd.Process.Pid)+"\n"), 0o644)
	return p, nil
}

// exited is an error when the named process has exited.
func (n *Node) exited(name string) error {
	for _, p := range n.procs {
		if p.name == name {
			select {
			case <-p.done:
				return fmt.Errorf("%s exited: %w", name, p.err)
			default:
			}
		}
	}
	return nil
}

func (n *Node) waitReady(ctx context.Context) error {
	cs, err := kubernetes.NewForConfig(n.c.Config)
	if err != nil {
		return err
	}
	last := "not registered"
	return poll(ctx, 200*time.Millisecond, 2*time.Minute, func() (bool, error) {
		node, err := cs.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		if err == nil {
			for _, c := range node.Status.Conditions {
				if c.Type == corev1.NodeReady {
					last = c.Reason + ": " + c.Message
					// Ready, and the node lifecycle controller has lifted
					// the taint the kubelet registered it with: pods can be
					// scheduled.
					if c.Status == corev1.ConditionTrue {
						if len(node.Spec.Taints) == 0 {
							return true, nil
						}
						last = fmt.Sprintf("Ready, tainted %v", node.Spec.Taints)
					}
				}
			}
		}
		for _, name := range []string{"containerd", "kubelet", "kube-scheduler", "kube-proxy"} {
			if err := n.exited(name); err != nil {
				return false, err
			}
		}
		return false, nil
	}, func() error { return fmt.Errorf("node %s not Ready within 2m: %s", n.Name, last) })
}

// stop removes every pod (through the kubelet's runtime: containers
// stopped, network namespaces and veths deleted, IPs released), stops the
// processes, and sweeps: mounts, network namespaces, the bridge, iptables
// chains and cgroups the node made. What is still there after that is an
// error.
func (n *Node) stop() error {
	var errs []error
	note := n.c.log.writer("[node] ")
	// The kubelet first: it would restart what is removed below.
	n.signal("kube-scheduler", "kube-proxy", "kubelet")
	if n.running("containerd") {
		if err := n.removePods(); err != nil {
			errs = append(errs, err)
		}
	}
	n.signal("containerd")
	// kube-proxy --cleanup removes its iptables chains (the sweep below
	// removes the kubelet's and anything it missed).
	if out, err := exec.Command(filepath.Join(n.BinDir, "kube-proxy"), "--cleanup", "--v=0").CombinedOutput(); err != nil {
		fmt.Fprintf(note, "kube-proxy --cleanup: %v: %s\n", err, out)
	}
	if err := n.sweep(); err != nil {
		errs = append(errs, err)
	}
	if n.sysctls != nil {
		n.restoreSysctls()
	}
	if n.lock != nil && !n.holdLock {
		_ = n.lock.Close()
	}
	return errors.Join(errs...)
}

// signal sends SIGTERM to the named processes and waits for them (SIGKILL
// after stopTimeout).
func (n *Node) signal(names ...string) {
	for _, p := range n.procs {
		if slices.Contains(names, p.name) {
			_ = p.cmd.Process.Signal(syscall.SIGTERM)
		}
	}
	for _, p := range n.procs {
		if !slices.Contains(names, p.name) {
			continue
		}
		select {
		case <-p.done:
		case <-time.After(stopTimeout):
			_ = p.cmd.Process.Kill()
			<-p.done
		}
	}
}

func (n *Node) running(name string) bool {
	for _, p := range n.procs {
		if p.name == name {
			select {
			case <-p.done:
				return false
			default:
				return true
			}
		}
	}
	return false
}

// removePods stops and removes every pod sandbox through the CRI (crictl
// when hack/node-bins.sh built it; else ctr, which leaves the network
// teardown to the sweep).
func (n *Node) removePods() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if crictl := filepath.Join(n.BinDir, "crictl"); fileExists(crictl) {
		ep := "unix://" + n.ContainerdSocket
		out, err := exec.CommandContext(ctx, crictl, "--runtime-endpoint", ep, "--image-endpoint", ep, "--timeout", "30s", "rmp", "--all", "--force").CombinedOutput()
		if err != nil && !bytes.Contains(out, []byte("No pods to remove")) {
			return fmt.Errorf("crictl rmp --all --force: %w: %s", err, out)
		}
		return nil
	}
	out, err := n.ctr(ctx, "tasks", "list", "--quiet")
	if err != nil {
		return fmt.Errorf("ctr tasks list: %w: %s", err, out)
	}
	for _, id := range strings.Fields(string(out)) {
		_, _ = n.ctr(ctx, "tasks", "kill", "--signal", "SIGKILL", id)
		_, _ = n.ctr(ctx, "tasks", "delete", "--force", id)
	}
	return nil
}

// sweep removes what this node made that a clean stop would have removed
// already, and reports what it had to remove as an error when the node
// ran (a clean stop leaves nothing: the test checks).
func (n *Node) sweep() error {
	if err := sweepNodes(n.c.log.writer("[node] ")); err != nil {
		return err
	}
	// containerd 1.6 keeps its pods' network namespaces in /run/netns.
	for name := range netnsNames() {
		if strings.HasPrefix(name, "cni-") && !n.netnsPre[name] {
			_ = exec.Command("ip", "netns", "delete", name).Run()
		}
	}
	if left := Leftovers(); len(left) > 0 {
		return fmt.Errorf("the node left these behind: %s", strings.Join(left, "; "))
	}
	return os.Remove(nodeDirFile)
}

// recordedNodeDir is the folder of the last node started on this machine
// that did not stop cleanly (or of the one running), or "".
func recordedNodeDir() string {
	b, err := os.ReadFile(nodeDirFile)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// sweepNodes removes what any node of this package left on this machine:
// processes in the kubelet's cgroups and containerd shims of a node folder,
// mounts below a node folder, cni-* network namespaces nothing runs in,
// the pod bridges, iptables chains KUBE-* and CNI-* and the rules jumping
// to them, and the /kubepods cgroups. Call it holding the node lock.
func sweepNodes(log io.Writer) error {
	var errs []error
	// Containers (and pause) live in /kubepods; shims are containerd's
	// children, started with its socket path on their command line.
	for _, pid := range append(kubepodsPIDs(), nodeShimPIDs()...) {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	waitGone(append(kubepodsPIDs(), nodeShimPIDs()...), 10*time.Second)

	for _, m := range nodeMounts() {
		if err := syscall.Unmount(m, syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) && !errors.Is(err, syscall.ENOENT) {
			errs = append(errs, fmt.Errorf("unmount %s: %w", m, err))
		}
	}
	for name := range netnsNames() {
		if strings.HasPrefix(name, "cni-") {
			if out, _ := exec.Command("ip", "netns", "pids", name).Output(); len(bytes.TrimSpace(out)) == 0 {
				_ = exec.Command("ip", "netns", "delete", name).Run()
			}
		}
	}
	for _, br := range bridges() {
		if out, err := exec.Command("ip", "link", "delete", br).CombinedOutput(); err != nil {
			errs = append(errs, fmt.Errorf("ip link delete %s: %w: %s", br, err, out))
		}
	}
	for _, ipt := range iptablesCommands() {
		if err := sweepChains(ipt); err != nil {
			errs = append(errs, err)
		}
	}
	for _, cg := range kubepodsCgroups() {
		removeCgroup(cg)
	}
	if len(errs) > 0 {
		fmt.Fprintf(log, "sweep: %v\n", errors.Join(errs...))
	}
	return errors.Join(errs...)
}

// Leftovers lists what a node of this package leaves on this machine when
// it is not stopped cleanly: processes in /kubepods, containerd shims of a
// node, mounts below a node folder, cni-* network namespaces, pod bridges,
// KUBE-*/CNI-* iptables chains, /kubepods cgroups. Empty after a clean
// stop.
func Leftovers() []string {
	var out []string
	if p := kubepodsPIDs(); len(p) > 0 {
		out = append(out, fmt.Sprintf("processes in /kubepods %v", p))
	}
	if p := nodeShimPIDs(); len(p) > 0 {
		out = append(out, fmt.Sprintf("containerd shims %v", p))
	}
	if m := nodeMounts(); len(m) > 0 {
		out = append(out, fmt.Sprintf("mounts %v", m))
	}
	var ns []string
	for name := range netnsNames() {
		if strings.HasPrefix(name, "cni-") {
			ns = append(ns, name)
		}
	}
	if len(ns) > 0 {
		out = append(out, fmt.Sprintf("network namespaces %v", ns))
	}
	if b := bridges(); len(b) > 0 {
		out = append(out, fmt.Sprintf("bridges %v", b))
	}
	for _, ipt := range iptablesCommands() {
		if r := nodeRules(ipt); len(r) > 0 {
			out = append(out, fmt.Sprintf("%s rules %v", ipt, r))
		}
	}
	if cg := kubepodsCgroups(); len(cg) > 0 {
		out = append(out, fmt.Sprintf("cgroups %v", cg))
	}
	return out
}

func kubepodsCgroups() []string {
	var out []string
	dirs, _ := filepath.Glob("/sys/fs/cgroup/*/kubepods*")
	out = append(out, dirs...)
	dirs, _ = filepath.Glob("/sys/fs/cgroup/kubepods*")
	for _, d := range dirs {
		if fi, err := os.Stat(d); err == nil && fi.IsDir() {
			out = append(out, d)
		}
	}
	return out
}

func kubepodsPIDs() []int {
	seen := map[int]bool{}
	var out []int
	for _, root := range kubepodsCgroups() {
		_ = filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
			if err != nil || d.Name() != "cgroup.procs" {
				return nil
			}
			b, _ := os.ReadFile(p)
			for _, f := range strings.Fields(string(b)) {
				if pid, err := strconv.Atoi(f); err == nil && !seen[pid] {
					seen[pid] = true
					out = append(out, pid)
				}
			}
			return nil
		})
	}
	return out
}

// removeCgroup removes a cgroup folder tree, deepest first.
func removeCgroup(root string) {
	var dirs []string
	_ = filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			dirs = append(dirs, p)
		}
		return nil
	})
	for i := len(dirs) - 1; i >= 0; i-- {
		_ = syscall.Rmdir(dirs[i])
	}
}

// nodeShimPIDs are containerd shims started by a node's containerd (its
// socket in the recorded node folder).
func nodeShimPIDs() []int {
	dir := recordedNodeDir()
	if dir == "" {
		return nil
	}
	var out []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil {
			continue
		}
		args := strings.Split(string(b), "\x00")
		if len(args) > 0 && strings.HasPrefix(filepath.Base(args[0]), "containerd-shim") && strings.Contains(string(b), dir+"/containerd/") {
			out = append(out, pid)
		}
	}
	return out
}

func waitGone(pids []int, timeout time.Duration) {
	deadline := time.Now().Add(timeout)
	for _, pid := range pids {
		for time.Now().Before(deadline) {
			if _, ok := procStartTime(pid); !ok {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}

// nodeMounts are mount points below the recorded node folder (containers'
// root filesystems, the kubelet's volumes, sandboxes' /dev/shm) or a cni-*
// network namespace, deepest first.
func nodeMounts() []string {
	dir := recordedNodeDir()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) < 5 {
			continue
		}
		mp := unescapeMount(f[4])
		if (dir != "" && strings.HasPrefix(mp, dir+"/")) || strings.HasPrefix(mp, "/run/netns/cni-") || strings.HasPrefix(mp, "/var/run/netns/cni-") {
			out = append(out, mp)
		}
	}
	slices.Reverse(out)
	return out
}

func unescapeMount(s string) string {
	r := strings.NewReplacer(`\040`, " ", `\011`, "\t", `\012`, "\n", `\134`, `\`)
	return r.Replace(s)
}

func netnsNames() map[string]bool {
	m := map[string]bool{}
	ents, _ := os.ReadDir("/run/netns")
	for _, e := range ents {
		m[e.Name()] = true
	}
	return m
}

func bridges() []string {
	ifs, _ := net.Interfaces()
	var out []string
	for _, i := range ifs {
		if strings.HasPrefix(i.Name, bridgePrefix) {
			out = append(out, i.Name)
		}
	}
	return out
}

var nodeTables = []string{"filter", "nat", "mangle"}

// iptablesCommands are the iptables variants here (nft, and legacy when
// installed: the kubelet and kube-proxy pick one themselves).
func iptablesCommands() []string {
	var out []string
	for _, c := range []string{"iptables", "ip6tables", "iptables-legacy", "ip6tables-legacy"} {
		if _, err := exec.LookPath(c + "-save"); err == nil {
			out = append(out, c)
		}
	}
	return out
}

// nodeChain is a chain the kubelet, kube-proxy or the CNI plugins make.
func nodeChain(c string) bool { return strings.HasPrefix(c, "KUBE-") || strings.HasPrefix(c, "CNI-") }

// nodeRules lists the TABLE/CHAIN chains and TABLE rules of iptables-save
// that a node makes.
func nodeRules(ipt string) []string {
	var out []string
	for _, t := range nodeTables {
		b, err := exec.Command(ipt+"-save", "-t", t).Output()
		if err != nil {
			continue
		}
		for _, l := range strings.Split(string(b), "\n") {
			switch {
			case strings.HasPrefix(l, ":"):
				if c := strings.Fields(l[1:]); len(c) > 0 && nodeChain(c[0]) {
					out = append(out, t+"/"+c[0])
				}
			case strings.HasPrefix(l, "-A "):
				if f := strings.Fields(l); len(f) > 1 && (nodeChain(f[1]) || jumpsToNodeChain(f) || strings.Contains(l, bridgePrefix)) {
					out = append(out, t+": "+l)
				}
			}
		}
	}
	return out
}

func jumpsToNodeChain(f []string) bool {
	for i := 0; i+1 < len(f); i++ {
		if (f[i] == "-j" || f[i] == "-g") && nodeChain(f[i+1]) {
			return true
		}
	}
	return false
}

// sweepChains deletes the rules of built-in chains that jump to a node's
// chains, then flushes and deletes those chains.
func sweepChains(ipt string) error {
	var errs []error
	for _, t := range nodeTables {
		b, err := exec.Command(ipt+"-save", "-t", t).Output()
		if err != nil {
			continue
		}
		var chains []string
		for _, l := range strings.Split(string(b), "\n") {
			f := strings.Fields(l)
			switch {
			case strings.HasPrefix(l, ":") && len(f) > 0 && nodeChain(f[0][1:]):
				chains = append(chains, f[0][1:])
			case len(f) > 1 && f[0] == "-A" && !nodeChain(f[1]) && (jumpsToNodeChain(f) || strings.Contains(l, bridgePrefix)):
				// iptables-save quotes comments; iptables -D wants them
				// unquoted, one argument each.
				args := append([]string{"-t", t, "-D"}, splitRule(l[len("-A "):])...)
				if out, err := exec.Command(ipt, args...).CombinedOutput(); err != nil {
					errs = append(errs, fmt.Errorf("%s %s: %w: %s", ipt, strings.Join(args, " "), err, out))
				}
			}
		}
		for _, c := range chains {
			_ = exec.Command(ipt, "-t", t, "-F", c).Run()
		}
		for _, c := range chains {
			if out, err := exec.Command(ipt, "-t", t, "-X", c).CombinedOutput(); err != nil {
				errs = append(errs, fmt.Errorf("%s -t %s -X %s: %w: %s", ipt, t, c, err, out))
			}
		}
	}
	return errors.Join(errs...)
}

// splitRule splits an iptables-save rule into arguments, honouring double
// quotes.
func splitRule(s string) []string {
	var out []string
	var cur strings.Builder
	inQ, has := false, false
	for i := 0; i < len(s); i++ {
		ch := s[i]
		switch {
		case ch == '\\' && inQ && i+1 < len(s):
			i++
			cur.WriteByte(s[i])
		case ch == '"':
			inQ, has = !inQ, true
		case ch == ' ' && !inQ:
			if cur.Len() > 0 || has {
				out = append(out, cur.String())
				cur.Reset()
				has = false
			}
		default:
			cur.WriteByte(ch)
		}
	}
	if cur.Len() > 0 || has {
		out = append(out, cur.String())
	}
	return out
}

// freePodCIDR picks a /24 in 10.213.0.0/16 that no route of this machine
// touches, and the bridge name for it.
func freePodCIDR() (netip.Prefix, string, error) {
	out, err := exec.Command("ip", "-4", "route", "show", "table", "all").Output()
	if err != nil {
		return netip.Prefix{}, "", fmt.Errorf("ip route: %w", err)
	}
	var used []netip.Prefix
	for _, l := range strings.Split(string(out), "\n") {
		f := strings.Fields(l)
		if len(f) == 0 {
			continue
		}
		dst := f[0]
		if dst == "default" || dst == "local" || dst == "broadcast" {
			if len(f) > 1 && dst != "default" {
				dst = f[1]
			} else {
				continue
			}
		}
		if !strings.Contains(dst, "/") {
			dst += "/32"
		}
		if p, err := netip.ParsePrefix(dst); err == nil {
			used = append(used, p)
		}
	}
	start, _ := rand.Int(rand.Reader, big.NewInt(250))
	for i := range 250 {
		n := (int(start.Int64())+i)%250 + 1
		p := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 213, byte(n), 0}), 24)
		if !slices.ContainsFunc(used, p.Overlaps) {
			return p, bridgePrefix + strconv.Itoa(n), nil
		}
	}
	return netip.Prefix{}, "", errors.New("no free /24 in 10.213.0.0/16 for the pod network")
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// flockContext takes an exclusive lock on f, waiting until ctx ends.
func flockContext(ctx context.Context, f *os.File, log io.Writer) error {
	said := false
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			return fmt.Errorf("locking %s: %w", f.Name(), err)
		}
		if !said {
			fmt.Fprintf(log, "another node runs on this machine (%s is locked); waiting for it to stop\n", f.Name())
			said = true
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for another node on this machine to stop (%s): %w", f.Name(), ctx.Err())
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// writeKubeletClientPKI writes a CA the kubelet trusts for its own API and
// a client certificate from it for the API server (logs, exec). Valid for
// ten years: a `make run` node may run as long as its user likes.
func writeKubeletClientPKI(dir string) error {
	const validFor = 10 * 365 * 24 * time.Hour
	ca, err := pki.NewCA(pkix.Name{CommonName: "egressproxy-node-kubelet-client-ca"}, validFor)
	if err != nil {
		return err
	}
	client, err := ca.Issue(pki.Leaf{
		Subject: pkix.Name{CommonName: "kube-apiserver-kubelet-client", Organization: []string{"system:masters"}},
		Client:  true, ValidFor: validFor,
	})
	if err != nil {
		return err
	}
	for f, b := range map[string][]byte{
		"kubelet-client-ca.crt":        ca.CertPEM,
		"apiserver-kubelet-client.crt": client.CertPEM,
		"apiserver-kubelet-client.key": client.KeyPEM,
	} {
		if err := os.WriteFile(filepath.Join(dir, f), b, 0o600); err != nil {
			return err
		}
	}
	return nil
}

// LockNode waits for this machine's node lock, which a running node
// holds, and returns its release. A test that looks for what a node it
// did not start itself (make run's) left behind takes it first, so that
// no other node runs while it looks (see Leftovers).
func LockNode(ctx context.Context) (release func(), err error) {
	f, err := os.OpenFile(nodeLock, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, err
	}
	if err := flockContext(ctx, f, io.Discard); err != nil {
		_ = f.Close()
		return nil, err
	}
	return func() { _ = f.Close() }, nil
}
