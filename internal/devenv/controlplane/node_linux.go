//go:build linux

package controlplane

import (
	"context"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/egressproxy/provider-egressproxy/internal/devenv/forwarding"
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
	// heldLock, when set, is the machine's node lock held already (by a
	// test that keeps it across nodes, so that no other node runs between
	// them): the node uses it and leaves it held.
	heldLock *os.File
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
	// serviceCIDR is the API server's --service-cluster-ip-range, free on
	// this machine like PodCIDR.
	serviceCIDR netip.Prefix
	registryCAs map[string][]byte
	procs       []*nodeProc
	sysctls     map[string]string
	forward     *forwarding.Hold
	pki         string
	ports       struct{ kubelet, kubeletHealthz, proxyHealthz, proxyMetrics int }
}

type nodeProc struct {
	name string
	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

const (
	// nodeLock serialises nodes on this machine: kube-proxy's iptables
	// chains are machine-wide, and so are the node's cgroup and the names
	// of its bridges.
	nodeLock = "/run/egressproxy-node.lock"
	// nodeDirFile records the folder of the node running (or killed):
	// its mounts and shims are what a sweep looks for.
	nodeDirFile = "/run/egressproxy-node.dir"
	// sysctlsFile records the machine's values of the kernel settings the
	// node changes ("key value" lines), written before anything changes
	// them: stop puts them back and removes it, a sweep puts back a killed
	// node's.
	sysctlsFile = "/run/egressproxy-node.sysctls"
	// containerLogDir is where a kubelet links its containers' logs (a
	// path it fixes); when the node's kubelet makes it, madeDirsFile
	// records it, so that stop and the sweep remove it once empty.
	// madeLogDirFile is where an earlier version recorded that alone
	// (readMadeDirs still reads it).
	containerLogDir = "/var/log/containers"
	madeLogDirFile  = "/run/egressproxy-node.made-log-dir"
	// bridgePrefix names the pod bridges (epxnode<N>); a sweep removes
	// those left by a killed node.
	bridgePrefix = "epxnode"
	// nodeCgroup is the kubelet's cgroupRoot: pods and containers live in
	// /egressproxy-node/kubepods/..., apart from another kubelet's
	// /kubepods, and a sweep kills and removes only what is below it.
	nodeCgroup = "egressproxy-node"
	// pauseImage is the sandbox image made from hack/pause.
	pauseImage = "localhost/egressproxy/pause:1"
	// nodeName is the Node's name.
	nodeName = "egressproxy-node"
)

// kernelTunables are the sysctls the kubelet sets at start (it can only
// set them or refuse to start): the node puts them back once the kubelet
// is up, so a test machine keeps its own panic and overcommit settings.
var kernelTunables = []string{"vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops", "kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes"}

// forwardingSysctls are what the CNI bridge plugin turns on machine-wide
// for a gateway bridge (isGateway), for the families of its addresses:
// IPv4 only here. Pods need it while the node runs: the node holds it
// (package forwarding, shared with the project's other parts that need
// it at the same time), and an earlier version's record of it is still
// put back by the sweep.
var forwardingSysctls = []string{"net/ipv4/ip_forward"}

// sysctlsSet are the values the kubelet sets kernelTunables to
// (KernelTunableModify in its container manager) and the CNI bridge
// plugin forwardingSysctls to. A recorded value is put back only over
// these: a setting holding anything else was changed since by someone
// else, and stays as it is.
var sysctlsSet = map[string]string{
	"vm/overcommit_memory":      "1",
	"vm/panic_on_oom":           "0",
	"kernel/panic":              "10",
	"kernel/panic_on_oops":      "1",
	"kernel/keys/root_maxkeys":  "1000000",
	"kernel/keys/root_maxbytes": "25000000",
	"net/ipv4/ip_forward":       "1",
}

// sysctlToPutBack says whether the recorded value of key goes back over
// the current one: only when they differ and the current one is what the
// kubelet or the CNI plugin sets (sysctlsSet).
func sysctlToPutBack(key, recorded, current string) bool {
	set, ok := sysctlsSet[key]
	return ok && current != recorded && current == set
}

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
	if o.heldLock != nil {
		n.lock, n.holdLock = o.heldLock, true
	} else {
		f, err := os.OpenFile(nodeLock, os.O_CREATE|os.O_RDWR, 0o600)
		if err != nil {
			return nil, err
		}
		n.lock = f
		if err := flockContext(ctx, f, c.log.writer("[node] ")); err != nil {
			return nil, err
		}
	}
	// kube-proxy's chain names are fixed, and it removes another
	// kube-proxy's rules when it starts and on --cleanup, and the kubelet
	// removes every socket of the device plugin folder it fixes: beside
	// another Kubernetes the node would break it. Looked for before the
	// sweep, which removes kube-proxy's chains, and again after it, when
	// whatever is left is another's.
	if sign := foreignKubernetes(false); sign != "" {
		return nil, foreignKubernetesError(sign)
	}
	// Whatever of the node's names is left now is a killed node's: this
	// machine runs one node at a time.
	if err := sweepNodes(c.log.writer("[node] ")); err != nil {
		return nil, fmt.Errorf("removing what an earlier node left behind: %w", err)
	}
	if sign := foreignKubernetes(true); sign != "" {
		return nil, foreignKubernetesError(sign)
	}
	if err := recordKeptChains(); err != nil {
		return nil, err
	}
	if o.locked != nil {
		o.locked()
	}
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
	pfx, br, svc, err := freeCIDRs()
	if err != nil {
		return nil, err
	}
	n.PodCIDR, n.Bridge, n.serviceCIDR = pfx, br, svc
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
	args.Set("service-cluster-ip-range", n.serviceCIDR.String())
	return n, nil
}

// start starts containerd, imports the images, then the kubelet,
// kube-scheduler and kube-proxy, and waits until the Node is Ready.
func (n *Node) start(ctx context.Context, o *NodeOptions) error {
	note := n.c.log.writer("[node] ")
	t0 := time.Now()
	// Before the kubelet and the first pod: what they change is then put
	// back even after a kill.
	if err := n.recordSysctls(); err != nil {
		return err
	}
	fwd, err := forwarding.Take("node")
	if err != nil {
		return err
	}
	n.forward = fwd
	// Before containerd, the shims, CNI and the kubelet: the folders they
	// make outside the node's folder are then removed even after a kill.
	if err := recordMadeDirs(); err != nil {
		return err
	}
	if err := n.bridgeUp(); err != nil {
		return err
	}
	if err := makeNodeCgroups(); err != nil {
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

	// The kubelet removes every socket in its device plugin folder at
	// start: only when nothing is there (prepareNode looked already; this
	// is just before), and then what is there once it runs is its own.
	if sign := foreignDevicePlugins(); sign != "" {
		return foreignKubernetesError(sign)
	}
	if err := os.WriteFile(devicePluginsFile, nil, 0o600); err != nil {
		return err
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
	// The kubelet sets its settings once, at start; forwarding stays on
	// for the pods until stop.
	if err := n.restoreSysctls(kernelTunables...); err != nil {
		return err
	}
	n.ReadyIn = time.Since(t0)
	fmt.Fprintf(note, "node %s Ready in %.2fs (pods in %s on %s)\n", n.Name, time.Since(t0).Seconds(), n.PodCIDR, n.Bridge)
	return nil
}

// foreignKubernetesError is prepareNode's and start's refusal to run
// beside another Kubernetes.
func foreignKubernetesError(sign string) error {
	return fmt.Errorf("another Kubernetes runs or ran on this machine (%s); the node's kube-proxy would take over its iptables chains, whose names kube-proxy fixes, and the node's kubelet would remove its device plugins' sockets: stop that one first (and remove what it left), or run without a node (NODE=0 for make run)", sign)
}

func (n *Node) releaseLock() {
	if n.lock != nil {
		_ = n.lock.Close()
	}
}

// recordSysctls reads the machine's kernelTunables and records them in
// sysctlsFile.
func (n *Node) recordSysctls() error {
	n.sysctls = map[string]string{}
	for _, k := range kernelTunables {
		if b, err := os.ReadFile("/proc/sys/" + k); err == nil {
			n.sysctls[k] = strings.TrimSpace(string(b))
		}
	}
	return writeSysctls(n.sysctls)
}

// writeSysctls replaces sysctlsFile with m in one rename: a kill leaves
// the old record or the new one, never half of one.
func writeSysctls(m map[string]string) error {
	tmp := sysctlsFile + ".tmp"
	if err := os.WriteFile(tmp, []byte(sysctlsText(m)), 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, sysctlsFile)
}

// sysctlsText is m as "key value" lines, which parseSysctls reads.
func sysctlsText(m map[string]string) string {
	var b strings.Builder
	for _, k := range slices.Sorted(maps.Keys(m)) {
		fmt.Fprintf(&b, "%s %s\n", k, m[k])
	}
	return b.String()
}

// restoreSysctls puts back the recorded values of keys (of all when none
// is named) where the kubelet's or the CNI plugin's value is still in
// place (putBackSysctl), and leaves only the others in sysctlsFile, which
// it removes once empty.
func (n *Node) restoreSysctls(keys ...string) error {
	if len(keys) == 0 {
		keys = slices.Collect(maps.Keys(n.sysctls))
	}
	var errs []error
	for _, k := range keys {
		if v, ok := n.sysctls[k]; ok {
			if err := putBackSysctl(k, v); err != nil {
				errs = append(errs, err)
				continue
			}
			delete(n.sysctls, k)
		}
	}
	if len(n.sysctls) == 0 {
		if err := os.Remove(sysctlsFile); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	} else if err := writeSysctls(n.sysctls); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// putBackSysctl writes the recorded value v to /proc/sys/k when
// sysctlToPutBack says so; a setting changed since by someone else is
// left as it is.
func putBackSysctl(k, v string) error {
	b, err := os.ReadFile("/proc/sys/" + k)
	if err != nil {
		return err
	}
	if !sysctlToPutBack(k, v, strings.TrimSpace(string(b))) {
		return nil
	}
	if err := os.WriteFile("/proc/sys/"+k, []byte(v+"\n"), 0o644); err != nil { //nolint:gosec // a kernel setting, as it was.
		return fmt.Errorf("putting back %s = %s: %w", k, v, err)
	}
	return nil
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
		if err == nil && node.Spec.PodCIDR == "" {
			// What kube-controller-manager's node IPAM writes where a
			// cluster allocates node CIDRs (kubeadm, kind): the node's
			// pod network, which PodProxies read and deny.
			node.Spec.PodCIDR, node.Spec.PodCIDRs = n.PodCIDR.String(), []string{n.PodCIDR.String()}
			if node, err = cs.CoreV1().Nodes().Update(ctx, node, metav1.UpdateOptions{}); err != nil && !apierrors.IsConflict(err) {
				return false, err
			}
		}
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
// processes, and sweeps: mounts, the bridge, iptables chains and cgroups
// the node made. What is still there after that is an error.
func (n *Node) stop() error {
	var errs []error
	// The kubelet first: it would restart what is removed below.
	n.signal("kube-scheduler", "kube-proxy", "kubelet")
	if n.running("containerd") {
		if err := n.removePods(); err != nil {
			errs = append(errs, err)
		}
	}
	n.signal("containerd")
	// No pod is left to need forwarding.
	if n.sysctls != nil {
		if err := n.restoreSysctls(); err != nil {
			errs = append(errs, err)
		}
	}
	if err := n.forward.Release(false); err != nil {
		errs = append(errs, err)
	}
	n.forward = nil
	if err := removeLogLinks(n.Dir); err != nil {
		errs = append(errs, err)
	}
	// The sweep removes kube-proxy's chains, not kube-proxy --cleanup: that
	// also flushes every IPVS service and deletes any kube-proxy nftables
	// table on the machine.
	if err := n.sweep(); err != nil {
		errs = append(errs, err)
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
