// Package kubelettest is a kubelet stand-in for a control plane without
// nodes (internal/devenv/controlplane): it "runs" the pods of PodProxies on this
// machine and reports them Ready through the pods' status subresource, as
// a kubelet would. The tests of the kubernetes backend and of the PodProxy
// controller use it, and so does hack/benchpodproxy.
//
// Pods really run on the local node (internal/devenv/controlplane's Options.Node:
// kubelet, containerd, kube-proxy), and the PodProxy end-to-end test runs
// there (TestPodProxyRealNodeIntegration). The stand-in stays where a
// real node cannot serve: the scale benchmark (hack/benchpodproxy: a
// thousand real pods do not fit 2 cores), and the tests that need
// PodProxies only as a step (compositions, install, the driver
// conformance and the fast stand-in PodProxy test).
//
// Each pod gets a loopback address of its own (127.N.0.1, 127.N.0.2, ...,
// never 127.0.0.x; N from the process ID, so that test binaries running at
// the same time rarely share addresses, and an address where something
// already answers on the pod's port is skipped) and, depending on the Mode:
//
//   - Squid: the real Squid runs the squid.conf the provider wrote into the
//     pod's Secret, with exactly two substitutions: the Secret's mount path
//     (/etc/squid-egress/) becomes the pod's folder on this machine (the
//     auth_param line's htpasswd path and https_port's certificate and key
//     are the only ones using it), and "http_port <port>" (or https_port)
//     becomes "http_port <pod address>:<port>", since all pods share this
//     machine's network. Squid is started with
//     `squid -N -n <name> -f <folder>/squid.conf`; -n gives each its own
//     shared-memory names. Every other line is byte for byte the
//     provider's.
//   - Listen: a TCP listener on the pod's address and port that answers as
//     the proxy's Squid would answer the readiness probe (squid.AnswerProbes,
//     with the identity of the proxy in the pod's egressproxy.io/uid label):
//     enough for the driver's check, and cheap enough for a thousand pods.
//   - NoListener: nothing listens; the pod is only reported Ready.
//
// Then the pod's status becomes phase Running with a Ready condition and
// the address as pod IP, in one status patch. A deleted pod's Squid or
// listener is stopped.
package kubelettest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/egressproxy/provider-egressproxy/internal/backend/kubernetes"
	"github.com/egressproxy/provider-egressproxy/internal/squid"
	"github.com/egressproxy/provider-egressproxy/internal/squid/squidtest"
)

// Mode is what the stand-in runs for a pod.
type Mode int

// The modes.
const (
	// Squid runs the real Squid with the provider's squid.conf.
	Squid Mode = iota
	// Listen runs a TCP listener that answers the readiness probe as the
	// proxy's Squid would.
	Listen
	// NoListener runs nothing.
	NoListener
)

func (m Mode) String() string {
	switch m {
	case Squid:
		return "a real Squid per pod, running the provider's squid.conf"
	case Listen:
		return "a TCP listener per pod answering the readiness probe as its Squid would, no Squid"
	default:
		return "nothing listening; pods are only reported Ready"
	}
}

// Options configure a Kubelet.
type Options struct {
	// Mode is what runs for each pod.
	Mode Mode
	// Delay is how long a pod takes from being seen to being Ready (an
	// image pull and a start, say), in Run.
	Delay time.Duration
	// SquidPath is the squid binary; default: squid in PATH, else
	// /usr/sbin/squid.
	SquidPath string
	// Dir gets a folder per pod for Squid's files; default a temporary
	// folder removed by Stop.
	Dir string
	// Workers bound how many pods are started at once in Run; default 32.
	Workers int
	// OnReady, when set, is called after a pod's status says Ready, with
	// the time the status patch returned.
	OnReady func(pod *corev1.Pod, ip string, at time.Time)
	// Log receives one line per event; nil discards them.
	Log io.Writer
}

// Kubelet is the stand-in.
type Kubelet struct {
	o       Options
	c       client.Client
	cfg     *rest.Config
	dir     string
	ownDir  bool
	squid   string
	logMu   sync.Mutex
	mu      sync.Mutex
	next    uint32
	running map[types.UID]*container
	seen    map[types.UID]bool
	stopped bool
}

type container struct {
	ip   string
	stop func()
}

// New returns a stand-in talking to the API server of cfg.
func New(cfg *rest.Config, o Options) (*Kubelet, error) {
	cfg = rest.CopyConfig(cfg)
	cfg.QPS, cfg.Burst = 1000, 2000
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		return nil, err
	}
	c, err := client.New(cfg, client.Options{Scheme: s})
	if err != nil {
		return nil, err
	}
	k := &Kubelet{o: o, c: c, cfg: cfg, running: map[types.UID]*container{}, seen: map[types.UID]bool{}, next: uint32(1+os.Getpid()%254)<<16 + 1}
	if k.o.Workers <= 0 {
		k.o.Workers = 32
	}
	if o.Mode == Squid {
		if k.squid, err = SquidPath(o.SquidPath); err != nil {
			return nil, err
		}
	}
	k.dir = o.Dir
	if k.dir == "" {
		if k.dir, err = os.MkdirTemp("", "kubelettest-"); err != nil {
			return nil, err
		}
		k.ownDir = true
	}
	// Squid drops from root to its own user, which must read the files.
	if err := os.Chmod(k.dir, 0o755); err != nil {
		return nil, err
	}
	return k, nil
}

// SquidPath finds squid: path when set, else squid in PATH, else
// /usr/sbin/squid.
func SquidPath(path string) (string, error) {
	if path != "" {
		return path, nil
	}
	if p, err := exec.LookPath("squid"); err == nil {
		return p, nil
	}
	if _, err := os.Stat("/usr/sbin/squid"); err == nil {
		return "/usr/sbin/squid", nil
	}
	return "", errors.New("squid not found in PATH or at /usr/sbin/squid: run hack/install-squid.sh")
}

func (k *Kubelet) logf(format string, args ...any) {
	if k.o.Log == nil {
		return
	}
	k.logMu.Lock()
	defer k.logMu.Unlock()
	fmt.Fprintf(k.o.Log, "kubelettest: "+format+"\n", args...)
}

// Run plays the kubelet for every pod with the managed-by label until ctx
// ends: each pod that is not Ready yet is started after Options.Delay; a
// deleted pod is stopped. It returns once its watch is established; the
// work goes on in the background.
func (k *Kubelet) Run(ctx context.Context) error {
	ca, err := cache.New(k.cfg, cache.Options{
		Scheme: k.c.Scheme(),
		ByObject: map[client.Object]cache.ByObject{
			&corev1.Pod{}: {Label: labels.SelectorFromSet(labels.Set{kubernetes.LabelManagedBy: kubernetes.ManagedBy})},
		},
	})
	if err != nil {
		return err
	}
	inf, err := ca.GetInformer(ctx, &corev1.Pod{})
	if err != nil {
		return err
	}
	work := make(chan *corev1.Pod, 1<<16)
	consider := func(obj any) {
		p, ok := obj.(*corev1.Pod)
		if !ok || p.DeletionTimestamp != nil || ready(p) {
			return
		}
		k.mu.Lock()
		seen := k.seen[p.UID]
		k.seen[p.UID] = true
		k.mu.Unlock()
		if seen {
			return
		}
		p = p.DeepCopy()
		if k.o.Delay <= 0 {
			work <- p
			return
		}
		time.AfterFunc(k.o.Delay, func() { work <- p })
	}
	if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    consider,
		UpdateFunc: func(_, n any) { consider(n) },
		DeleteFunc: func(obj any) {
			if d, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			if p, ok := obj.(*corev1.Pod); ok {
				k.StopPod(p.UID)
			}
		},
	}); err != nil {
		return err
	}
	go func() { _ = ca.Start(ctx) }()
	if !ca.WaitForCacheSync(ctx) {
		return errors.New("kubelettest: the pod cache did not sync")
	}
	for range k.o.Workers {
		go func() {
			for {
				select {
				case <-ctx.Done():
					return
				case p := <-work:
					if err := k.start(ctx, p); err != nil && ctx.Err() == nil {
						k.logf("pod %s/%s: %v", p.Namespace, p.Name, err)
					}
				}
			}
		}()
	}
	return nil
}

// StartPod starts one pod now, as Run would: its Squid (or listener), then
// its Ready status. A pod that is already running is left alone.
func (k *Kubelet) StartPod(ctx context.Context, namespace, name string) error {
	p := &corev1.Pod{}
	if err := k.c.Get(ctx, types.NamespacedName{Namespace: namespace, Name: name}, p); err != nil {
		return err
	}
	return k.start(ctx, p)
}

// Address returns the address of a running pod, or "".
func (k *Kubelet) Address(uid types.UID) string {
	k.mu.Lock()
	defer k.mu.Unlock()
	if c := k.running[uid]; c != nil {
		return c.ip
	}
	return ""
}

// StopPod stops what runs for the pod (it does not touch the pod).
func (k *Kubelet) StopPod(uid types.UID) {
	k.mu.Lock()
	c := k.running[uid]
	delete(k.running, uid)
	k.mu.Unlock()
	if c != nil {
		c.stop()
		k.logf("stopped pod %s (%s)", uid, c.ip)
	}
}

// Running is how many pods run.
func (k *Kubelet) Running() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return len(k.running)
}

// Stop stops every pod's Squid or listener and removes the folder it made.
func (k *Kubelet) Stop() {
	k.mu.Lock()
	k.stopped = true
	all := k.running
	k.running = map[types.UID]*container{}
	k.mu.Unlock()
	for _, c := range all {
		c.stop()
	}
	if k.ownDir {
		_ = os.RemoveAll(k.dir)
	}
}

func (k *Kubelet) start(ctx context.Context, p *corev1.Pod) error {
	k.mu.Lock()
	if k.stopped {
		k.mu.Unlock()
		return errors.New("stopped")
	}
	if _, ok := k.running[p.UID]; ok {
		k.mu.Unlock()
		return nil
	}
	ip := k.allocate()
	// Another process's pod (a test binary running alongside) may hold
	// the address: its Squid would answer for this pod.
	for port := proxyPort(p); port != 0 && answers(ip, port); {
		ip = k.allocate()
	}
	c := &container{ip: ip, stop: func() {}}
	k.running[p.UID] = c
	k.mu.Unlock()

	stop, err := k.run(ctx, p, ip)
	if err != nil {
		k.mu.Lock()
		delete(k.running, p.UID)
		k.mu.Unlock()
		return err
	}
	k.mu.Lock()
	if k.running[p.UID] != c { // deleted meanwhile
		k.mu.Unlock()
		stop()
		return nil
	}
	c.stop = stop
	k.mu.Unlock()

	if err := k.setReady(ctx, p, ip); err != nil {
		if kerrors.IsNotFound(err) {
			k.StopPod(p.UID)
			return nil
		}
		return err
	}
	k.logf("pod %s/%s ready at %s", p.Namespace, p.Name, ip)
	return nil
}

// answers tells whether something accepts connections at ip:port. On
// loopback a refusal is immediate.
func answers(ip string, port int32) bool {
	c, err := net.DialTimeout("tcp", net.JoinHostPort(ip, strconv.Itoa(int(port))), 200*time.Millisecond)
	if err != nil {
		return false
	}
	_ = c.Close()
	return true
}

// allocate hands out 127.N.0.1, 127.N.0.2, ..., skipping .0 and .255.
// Called with mu held.
func (k *Kubelet) allocate() string {
	for {
		n := k.next
		k.next++
		if b := n & 0xff; b != 0 && b != 0xff {
			return fmt.Sprintf("127.%d.%d.%d", n>>16&0xff, n>>8&0xff, n&0xff)
		}
	}
}

// run starts what the mode runs for p at ip and returns how to stop it.
func (k *Kubelet) run(ctx context.Context, p *corev1.Pod, ip string) (func(), error) {
	port := proxyPort(p)
	if port == 0 {
		return nil, errors.New("the pod has no container port named " + kubernetes.PortName)
	}
	addr := net.JoinHostPort(ip, strconv.Itoa(int(port)))
	switch k.o.Mode {
	case NoListener:
		return func() {}, nil
	case Listen:
		l, err := net.Listen("tcp4", addr)
		if err != nil {
			return nil, err
		}
		go squid.AnswerProbes(l, squid.Identity(p.Labels[kubernetes.LabelUID]))
		return func() { _ = l.Close() }, nil
	default:
		return k.runSquid(ctx, p, ip, port)
	}
}

// proxyPort is the pod's container port named "proxy".
func proxyPort(p *corev1.Pod) int32 {
	for _, c := range p.Spec.Containers {
		for _, cp := range c.Ports {
			if cp.Name == kubernetes.PortName {
				return cp.ContainerPort
			}
		}
	}
	return 0
}

// runSquid writes the pod's Secret to a folder (waiting, as a kubelet
// would, until the Secret exists with the configuration the pod was made
// for), starts Squid and waits until it accepts connections.
func (k *Kubelet) runSquid(ctx context.Context, p *corev1.Pod, ip string, port int32) (func(), error) {
	files, err := k.podFiles(ctx, p)
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(k.dir, string(p.UID))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	_ = os.Chmod(dir, 0o755)
	conf := Substitute(files.SquidConf, dir, ip)
	write := func(name, content string, mode os.FileMode) error {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(content), mode); err != nil {
			return err
		}
		return os.Chmod(path, mode)
	}
	if err := write(kubernetes.KeySquidConf, conf, 0o644); err != nil {
		return nil, err
	}
	if files.Htpasswd != "" {
		if err := write(kubernetes.KeyHtpasswd, files.Htpasswd, 0o644); err != nil {
			return nil, err
		}
	}
	if files.TLSCert != "" {
		if err := write(kubernetes.KeyTLSCert, files.TLSCert, 0o644); err != nil {
			return nil, err
		}
		if err := write(kubernetes.KeyTLSKey, files.TLSKey, 0o644); err != nil {
			return nil, err
		}
	}
	// Squid opens /dev/stdout by name after dropping privileges: its
	// output is a file its user may open (squidtest.Start).
	return squidtest.Start(ctx, k.squid, dir, string(p.UID), filepath.Join(dir, kubernetes.KeySquidConf), net.JoinHostPort(ip, strconv.Itoa(int(port))))
}

// Substitute is the provider's squid.conf as this machine runs it (see the
// package comment): the Secret's mount path becomes dir, and the listening
// port gets the pod's address.
func Substitute(conf, dir, ip string) string {
	lines := strings.Split(conf, "\n")
	for i, l := range lines {
		if port, ok := strings.CutPrefix(l, "http_port "); ok && !strings.Contains(port, ":") {
			lines[i] = "http_port " + net.JoinHostPort(ip, strings.TrimSpace(port))
		}
		if port, ok := strings.CutPrefix(l, "http_port 127.0.0.1:"); ok {
			// The pod's loopback listener: its own address here.
			lines[i] = "http_port " + net.JoinHostPort(ip, strings.TrimSpace(port))
		}
		if rest, ok := strings.CutPrefix(l, "https_port "); ok && !strings.Contains(rest, ":") {
			port, opts, _ := strings.Cut(rest, " ")
			lines[i] = "https_port " + net.JoinHostPort(ip, port) + " " + opts
		}
		lines[i] = strings.ReplaceAll(lines[i], kubernetes.ConfigMountPath+"/", dir+"/")
	}
	return strings.Join(lines, "\n")
}

// podFiles reads the pod's configuration Secret, waiting until it holds the
// files whose hash the pod's template carries (the Secret's copy of it).
func (k *Kubelet) podFiles(ctx context.Context, p *corev1.Pod) (squid.Files, error) {
	secret := ""
	for _, v := range p.Spec.Volumes {
		if v.Secret != nil && v.Name == "config" {
			secret = v.Secret.SecretName
		}
	}
	if secret == "" {
		return squid.Files{}, errors.New("the pod mounts no config Secret")
	}
	want := p.Annotations[kubernetes.AnnotationConfigHash]
	deadline := time.Now().Add(30 * time.Second)
	for {
		s := &corev1.Secret{}
		err := k.c.Get(ctx, types.NamespacedName{Namespace: p.Namespace, Name: secret}, s)
		if err == nil {
			f := squid.Files{SquidConf: string(s.Data[kubernetes.KeySquidConf]), Htpasswd: string(s.Data[kubernetes.KeyHtpasswd]),
				TLSCert: string(s.Data[kubernetes.KeyTLSCert]), TLSKey: string(s.Data[kubernetes.KeyTLSKey])}
			if want == "" || string(s.Data[kubernetes.KeyConfigHash]) == want {
				return f, nil
			}
		} else if !kerrors.IsNotFound(err) {
			return squid.Files{}, err
		}
		if time.Now().After(deadline) {
			return squid.Files{}, fmt.Errorf("Secret %s/%s never held the configuration %s", p.Namespace, secret, want) //nolint:staticcheck // a name.
		}
		select {
		case <-ctx.Done():
			return squid.Files{}, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// setReady reports the pod Running and Ready at ip, as a kubelet would.
func (k *Kubelet) setReady(ctx context.Context, p *corev1.Pod, ip string) error {
	now := metav1.Now()
	cs := []corev1.ContainerStatus{}
	for _, c := range p.Spec.Containers {
		cs = append(cs, corev1.ContainerStatus{
			Name: c.Name, Image: c.Image, ImageID: c.Image, ContainerID: "kubelettest://" + string(p.UID),
			Ready: true, Started: ptrTo(true),
			State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}},
		})
	}
	cond := func(t corev1.PodConditionType) corev1.PodCondition {
		return corev1.PodCondition{Type: t, Status: corev1.ConditionTrue, LastTransitionTime: now}
	}
	p = p.DeepCopy()
	p.Status = corev1.PodStatus{
		Phase:             corev1.PodRunning,
		HostIP:            "127.0.0.1",
		HostIPs:           []corev1.HostIP{{IP: "127.0.0.1"}},
		PodIP:             ip,
		PodIPs:            []corev1.PodIP{{IP: ip}},
		StartTime:         &now,
		Conditions:        []corev1.PodCondition{cond(corev1.PodScheduled), cond(corev1.PodInitialized), cond(corev1.ContainersReady), cond(corev1.PodReady)},
		ContainerStatuses: cs,
		QOSClass:          p.Status.QOSClass,
	}
	if err := k.c.Status().Update(ctx, p); err != nil {
		if !kerrors.IsConflict(err) {
			return err
		}
		// A status written meanwhile (a condition from the scheduler that
		// is not there): read again and write ours.
		fresh := &corev1.Pod{}
		if err := k.c.Get(ctx, client.ObjectKeyFromObject(p), fresh); err != nil {
			return err
		}
		fresh.Status = p.Status
		if err := k.c.Status().Update(ctx, fresh); err != nil {
			return err
		}
		p = fresh
	}
	if k.o.OnReady != nil {
		k.o.OnReady(p, ip, time.Now())
	}
	return nil
}

func ready(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
			return true
		}
	}
	return false
}

func ptrTo[T any](v T) *T { return &v }
