package localcrossplane

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	goruntime "runtime"
	"strings"
	"sync"
	"syscall"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/egressproxy/provider-egressproxy/internal/devenv/ociimage"
)

// ProcessRuntime plays the kubelet for the pods Crossplane's package
// manager makes for providers and functions (the Deployments of their
// revisions), where no node runs them: for each pod it pulls the pod's
// image from the registry (the one embedded in the package), takes the
// entrypoint binary out of it, and runs it as a process with the
// container's args and env (field references resolved, Secret and
// ConfigMap volumes written to a folder that replaces the mount path in env values) and a
// kubeconfig naming a file that holds a TokenRequest token of the pod's
// ServiceAccount, renewed before it expires as a kubelet renews a
// projected token: exactly the identity and arguments Crossplane gave it. The only
// additions are the listen addresses (pods share this machine's network
// here): the provider's health endpoint on a free loopback port and its
// metrics off; the function on the loopback address its Service name
// resolves to for Crossplane core (CoreOptions.Hosts). The pod's status
// says Ready only while the process serves its health endpoint (the
// provider's /readyz, the function's gRPC port).
//
// It takes the pods of Namespace that no node was assigned, and with
// SchedulerName set only those naming that scheduler (a
// DeploymentRuntimeConfig's schedulerName keeps a cluster's real
// kube-scheduler, and so its kubelet, away from them).
type ProcessRuntime struct {
	// Kube, Clientset and Config reach the cluster as its admin.
	Kube      client.Client
	Clientset *kubernetes.Clientset
	Config    *rest.Config
	// Registry pulls the pods' images.
	Registry ociimage.Registry
	// Dir gets a folder per pod: its binary, volumes, kubeconfig, log.
	Dir string
	// FunctionAddrs maps a Function's name to the loopback IP its process
	// listens on (port 9443).
	FunctionAddrs map[string]string
	// SchedulerName, when set, is the only scheduler name whose pods are
	// run.
	SchedulerName string
	// Log receives one line per thing done (a process started, stopped,
	// restarted, a token renewed).
	Log func(string)
	// TokenExpiry is how long each ServiceAccount token asked for is
	// valid (default an hour; the API server takes no less than 10
	// minutes). TokenRenew is how long a token is used before the next
	// one replaces it in its file (default 80 % of TokenExpiry, when a
	// kubelet renews a projected token). client-go re-reads a token file
	// at least every minute, so a process left up for days keeps
	// authenticating.
	TokenExpiry, TokenRenew time.Duration

	mu    sync.Mutex
	procs map[types.UID]*podProc
	exits map[string]int    // by pod name: how often its process exited while the pod was there
	logs  map[string]string // by pod name: its process's log file
}

type podProc struct {
	// stopToken ends the renewal of the process's token.
	stopToken context.CancelFunc
	pod       string
	image     string
	cmd       *exec.Cmd
	exited    chan struct{}
	health    func() bool
	ready     bool
	logf      string
	args      []string
}

// Run syncs the pods every 300 ms until ctx ends, then stops every
// process it started.
func (r *ProcessRuntime) Run(ctx context.Context) {
	r.mu.Lock()
	r.procs, r.exits, r.logs = map[types.UID]*podProc{}, map[string]int{}, map[string]string{}
	r.mu.Unlock()
	for ctx.Err() == nil {
		r.sync(ctx)
		select {
		case <-ctx.Done():
		case <-time.After(300 * time.Millisecond):
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, p := range r.procs {
		p.stop()
	}
}

func (p *podProc) stop() {
	p.stopToken()
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(10 * time.Second):
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.exited
	}
}

func (r *ProcessRuntime) sync(ctx context.Context) {
	pods := &corev1.PodList{}
	if err := r.Kube.List(ctx, pods, client.InNamespace(Namespace)); err != nil {
		return
	}
	seen := map[types.UID]bool{}
	for i := range pods.Items {
		p := &pods.Items[i]
		if p.Spec.NodeName != "" || (r.SchedulerName != "" && p.Spec.SchedulerName != r.SchedulerName) {
			continue
		}
		seen[p.UID] = true
		r.mu.Lock()
		pp, ok := r.procs[p.UID]
		r.mu.Unlock()
		if p.DeletionTimestamp != nil {
			if ok {
				r.logf(fmt.Sprintf("pod %s deleted: stopping its process", p.Name))
				pp.stop()
				r.mu.Lock()
				delete(r.procs, p.UID)
				r.mu.Unlock()
				// The garbage collector waits for nothing: the pod goes
				// when its Deployment does; a graceful delete needs the
				// kubelet's final word.
			}
			_ = r.Kube.Delete(ctx, p, client.GracePeriodSeconds(0))
			continue
		}
		if !ok {
			pp, err := r.start(ctx, p)
			if err != nil {
				r.logf(fmt.Sprintf("pod %s: %v", p.Name, err))
				continue
			}
			r.mu.Lock()
			r.procs[p.UID] = pp
			r.logs[p.Name] = pp.logf
			r.mu.Unlock()
			continue
		}
		ready := pp.health()
		select {
		case <-pp.exited:
			// restartPolicy Always: start it again at the next sync, as a
			// kubelet would (after its back-off).
			ready = false
			pp.stopToken()
			r.logf(fmt.Sprintf("pod %s: its process exited (%v); restarting it", p.Name, pp.cmd.ProcessState))
			r.mu.Lock()
			delete(r.procs, p.UID)
			r.mu.Unlock()
			r.mu.Lock()
			r.exits[p.Name]++
			r.mu.Unlock()
		default:
		}
		if ready != pp.ready || !podReady(p, ready) {
			if err := r.setStatus(ctx, p, ready); err == nil {
				pp.ready = ready
			}
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for uid, pp := range r.procs {
		if !seen[uid] {
			r.logf(fmt.Sprintf("pod %s gone: stopping its process", pp.pod))
			pp.stop()
			delete(r.procs, uid)
		}
	}
}

func podReady(p *corev1.Pod, want bool) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return (c.Status == corev1.ConditionTrue) == want
		}
	}
	return false
}

func (r *ProcessRuntime) logf(s string) {
	if r.Log != nil {
		r.Log(s)
	}
}

// LogTails is the last n lines of the log of every pod's process started
// (running or not), by pod name.
func (r *ProcessRuntime) LogTails(n int) map[string]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string]string{}
	for pod, f := range r.logs {
		out[pod] = TailFile(f, n)
	}
	return out
}

func (r *ProcessRuntime) setStatus(ctx context.Context, p *corev1.Pod, ready bool) error {
	st := corev1.ConditionFalse
	if ready {
		st = corev1.ConditionTrue
	}
	now := metav1.Now()
	p.Status.Phase = corev1.PodRunning
	p.Status.PodIP, p.Status.HostIP = "127.0.0.1", "127.0.0.1"
	p.Status.PodIPs = []corev1.PodIP{{IP: "127.0.0.1"}}
	p.Status.StartTime = &now
	p.Status.Conditions = []corev1.PodCondition{
		{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: now},
		{Type: corev1.PodInitialized, Status: corev1.ConditionTrue, LastTransitionTime: now},
		{Type: corev1.ContainersReady, Status: st, LastTransitionTime: now},
		{Type: corev1.PodReady, Status: st, LastTransitionTime: now},
	}
	var cs []corev1.ContainerStatus
	for _, c := range p.Spec.Containers {
		cs = append(cs, corev1.ContainerStatus{Name: c.Name, Image: c.Image, Ready: ready, Started: &ready,
			State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}}})
	}
	p.Status.ContainerStatuses = cs
	return r.Kube.Status().Update(ctx, p)
}

var envRef = regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)

func (r *ProcessRuntime) start(ctx context.Context, p *corev1.Pod) (*podProc, error) {
	if len(p.Spec.Containers) == 0 {
		return nil, fmt.Errorf("no containers")
	}
	c := p.Spec.Containers[0]
	dir := filepath.Join(r.Dir, p.Name)
	if err := os.MkdirAll(filepath.Join(dir, "vol"), 0o700); err != nil {
		return nil, err
	}

	// The image, from the registry, for this machine's architecture.
	img, err := r.Registry.Pull(ctx, c.Image, ociimage.Platform{Architecture: goruntime.GOARCH})
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	argv := append(append([]string{}, cf.Config.Entrypoint...), cf.Config.Cmd...)
	if len(c.Command) > 0 {
		argv = append(append([]string{}, c.Command...), c.Args...)
	} else if len(c.Args) > 0 {
		argv = append(append([]string{}, cf.Config.Entrypoint...), c.Args...)
	}
	if len(argv) == 0 {
		return nil, fmt.Errorf("image %s has no entrypoint", c.Image)
	}
	bin, err := ociimage.ReadFile(img, argv[0])
	if err != nil {
		return nil, fmt.Errorf("image %s: %w", c.Image, err)
	}
	exe := filepath.Join(dir, path.Base(argv[0]))
	if err := os.WriteFile(exe, bin, 0o755); err != nil { //nolint:gosec // an executable.
		return nil, err
	}
	// Paths inside the image the env names (the CA bundle) and the mounted
	// volumes are files in dir.
	mounts := map[string]string{}
	if ca, err := ociimage.ReadFile(img, "/etc/ssl/certs/ca-certificates.crt"); err == nil {
		f := filepath.Join(dir, "ca-certificates.crt")
		if err := os.WriteFile(f, ca, 0o600); err != nil {
			return nil, err
		}
		mounts["/etc/ssl/certs/ca-certificates.crt"] = f
	}
	for _, vm := range c.VolumeMounts {
		local := filepath.Join(dir, "vol", vm.Name)
		if err := os.MkdirAll(local, 0o700); err != nil {
			return nil, err
		}
		for _, v := range p.Spec.Volumes {
			if v.Name != vm.Name {
				continue
			}
			var data map[string][]byte
			var items []corev1.KeyToPath
			var what string
			switch {
			case v.Secret != nil:
				// Crossplane creates the TLS Secrets shortly after the pod.
				s := &corev1.Secret{}
				if err := r.Kube.Get(ctx, types.NamespacedName{Namespace: p.Namespace, Name: v.Secret.SecretName}, s); err != nil {
					return nil, fmt.Errorf("volume %s: %w", v.Name, err)
				}
				data, items, what = s.Data, v.Secret.Items, "Secret "+s.Name
			case v.ConfigMap != nil:
				// A DeploymentRuntimeConfig's volume, such as a CA bundle.
				cm := &corev1.ConfigMap{}
				if err := r.Kube.Get(ctx, types.NamespacedName{Namespace: p.Namespace, Name: v.ConfigMap.Name}, cm); err != nil {
					return nil, fmt.Errorf("volume %s: %w", v.Name, err)
				}
				data = map[string][]byte{}
				for k, x := range cm.Data {
					data[k] = []byte(x)
				}
				items, what = v.ConfigMap.Items, "ConfigMap "+cm.Name
			default:
				continue
			}
			if len(items) == 0 {
				for k := range data {
					items = append(items, corev1.KeyToPath{Key: k, Path: k})
				}
			}
			for _, it := range items {
				if len(data[it.Key]) == 0 {
					return nil, fmt.Errorf("volume %s: %s has no %s yet", v.Name, what, it.Key)
				}
				if err := os.WriteFile(filepath.Join(local, it.Path), data[it.Key], 0o600); err != nil {
					return nil, err
				}
			}
		}
		mounts[vm.MountPath] = local
	}
	localize := func(v string) string {
		for m, l := range mounts {
			if v == m || strings.HasPrefix(v, strings.TrimSuffix(m, "/")+"/") {
				return l + strings.TrimPrefix(v, m)
			}
		}
		return v
	}

	env := map[string]string{}
	var order []string
	set := func(k, v string) {
		if _, ok := env[k]; !ok {
			order = append(order, k)
		}
		env[k] = v
	}
	for _, e := range cf.Config.Env {
		k, v, _ := strings.Cut(e, "=")
		set(k, localize(v))
	}
	for _, e := range c.Env {
		v := e.Value
		if f := e.ValueFrom; f != nil {
			if f.FieldRef == nil {
				return nil, fmt.Errorf("env %s: only fieldRef is resolved here", e.Name)
			}
			v, err = fieldValue(p, f.FieldRef.FieldPath)
			if err != nil {
				return nil, fmt.Errorf("env %s: %w", e.Name, err)
			}
		}
		v = envRef.ReplaceAllStringFunc(v, func(m string) string {
			if x, ok := env[envRef.FindStringSubmatch(m)[1]]; ok {
				return x
			}
			return m
		})
		set(e.Name, localize(v))
	}

	// The pod's identity: a token of its ServiceAccount, in a file the
	// kubeconfig names, renewed while the process runs.
	tokPath := filepath.Join(dir, "token")
	if _, err := r.writeToken(ctx, p, tokPath); err != nil {
		return nil, err
	}
	kcPath := filepath.Join(dir, "kubeconfig")
	if err := r.writeKubeconfig(kcPath, tokPath); err != nil {
		return nil, err
	}
	set("KUBECONFIG", kcPath)

	pp := &podProc{pod: p.Name, image: c.Image, exited: make(chan struct{}), logf: filepath.Join(dir, "log")}
	if fnIP, ok := r.FunctionAddrs[functionOf(p)]; ok {
		argv = append(argv, "--address="+fnIP+":9443")
		pp.health = func() bool { return dials(fnIP + ":9443") }
	} else {
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		addr := fmt.Sprintf("127.0.0.1:%d", port)
		argv = append(argv, "--metrics-bind-address=0", "--health-probe-bind-address="+addr)
		pp.health = func() bool {
			// A probe with a deadline, as a kubelet's: a provider that
			// accepts and never answers is not ready, and never stalls us.
			resp, err := probeClient.Get("http://" + addr + "/readyz") //nolint:noctx // a loopback probe.
			if err != nil {
				return false
			}
			_ = resp.Body.Close()
			return resp.StatusCode == http.StatusOK
		}
	}
	pp.args = argv[1:]
	lf, err := os.Create(pp.logf)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(exe, argv[1:]...) //nolint:gosec // the binary of the pod's image.
	cmd.Dir = dir
	cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=" + dir}
	for _, k := range order {
		cmd.Env = append(cmd.Env, k+"="+env[k])
	}
	cmd.Stdout, cmd.Stderr = lf, lf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		_ = lf.Close()
		return nil, err
	}
	pp.cmd = cmd
	go func() { _ = cmd.Wait(); _ = lf.Close(); close(pp.exited) }()
	var tokCtx context.Context
	tokCtx, pp.stopToken = context.WithCancel(ctx)
	go r.renewToken(tokCtx, p, tokPath)
	r.logf(fmt.Sprintf("pod %s: running %s from %s as ServiceAccount %s with args %q", p.Name, path.Base(argv[0]), c.Image, p.Spec.ServiceAccountName, argv[1:]))
	return pp, nil
}

func (r *ProcessRuntime) tokenTimes() (expiry, renew time.Duration) {
	expiry, renew = r.TokenExpiry, r.TokenRenew
	if expiry == 0 {
		expiry = time.Hour
	}
	if renew == 0 {
		renew = expiry * 4 / 5
	}
	return expiry, renew
}

// writeKubeconfig writes a kubeconfig for the cluster that authenticates
// with the token in tokenFile, read again as it changes.
func (r *ProcessRuntime) writeKubeconfig(file, tokenFile string) error {
	kc := clientcmdapi.NewConfig()
	kc.Clusters["c"] = &clientcmdapi.Cluster{Server: r.Config.Host, CertificateAuthorityData: r.Config.CAData}
	kc.AuthInfos["sa"] = &clientcmdapi.AuthInfo{TokenFile: tokenFile}
	kc.Contexts["c"] = &clientcmdapi.Context{Cluster: "c", AuthInfo: "sa"}
	kc.CurrentContext = "c"
	return clientcmd.WriteToFile(*kc, file)
}

// writeToken asks for a token of p's ServiceAccount, bound to p, and
// writes it to file through a rename, so that a reader never sees half of
// one. It returns when the token expires.
func (r *ProcessRuntime) writeToken(ctx context.Context, p *corev1.Pod, file string) (time.Time, error) {
	expiry, _ := r.tokenTimes()
	tok, err := r.Clientset.CoreV1().ServiceAccounts(p.Namespace).CreateToken(ctx, p.Spec.ServiceAccountName, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{
			ExpirationSeconds: ptr(int64(expiry.Seconds())),
			BoundObjectRef:    &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: p.Name, UID: p.UID},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		return time.Time{}, fmt.Errorf("TokenRequest for ServiceAccount %s: %w", p.Spec.ServiceAccountName, err)
	}
	tmp := file + ".new"
	if err := os.WriteFile(tmp, []byte(tok.Status.Token), 0o600); err != nil {
		return time.Time{}, err
	}
	if err := os.Rename(tmp, file); err != nil {
		return time.Time{}, err
	}
	return tok.Status.ExpirationTimestamp.Time, nil
}

// renewToken replaces the token in file every TokenRenew until ctx ends.
// A renewal that fails is tried again every 10 s (sooner with a shorter
// TokenRenew) while the token in the file is still good.
func (r *ProcessRuntime) renewToken(ctx context.Context, p *corev1.Pod, file string) {
	_, renew := r.tokenTimes()
	wait := renew
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		exp, err := r.writeToken(ctx, p, file)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			wait = min(10*time.Second, renew)
			r.logf(fmt.Sprintf("pod %s: renewing its ServiceAccount token (again in %s): %v", p.Name, wait, err))
			continue
		}
		wait = renew
		r.logf(fmt.Sprintf("pod %s: ServiceAccount token renewed, valid until %s", p.Name, exp.Format(time.RFC3339)))
	}
}

// functionOf is the Function a pod runs ("" for a provider's pod).
func functionOf(p *corev1.Pod) string {
	return p.Labels["pkg.crossplane.io/function"]
}

// fieldValue resolves the downward-API field paths Crossplane uses.
func fieldValue(p *corev1.Pod, fp string) (string, error) {
	switch {
	case fp == "metadata.namespace":
		return p.Namespace, nil
	case fp == "metadata.name":
		return p.Name, nil
	case strings.HasPrefix(fp, "metadata.labels['") && strings.HasSuffix(fp, "']"):
		return p.Labels[strings.TrimSuffix(strings.TrimPrefix(fp, "metadata.labels['"), "']")], nil
	case fp == "spec.serviceAccountName":
		return p.Spec.ServiceAccountName, nil
	}
	return "", fmt.Errorf("field path %q is not resolved here", fp)
}

// Logs is the output of the process running the pods whose name starts
// with prefix.
func (r *ProcessRuntime) Logs(prefix string) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var b strings.Builder
	for _, p := range r.procs {
		if strings.HasPrefix(p.pod, prefix) {
			l, _ := os.ReadFile(p.logf)
			b.Write(l)
		}
	}
	return b.String()
}

// Exited is how often processes of pods named prefix... exited on their
// own (a crash, as a kubelet would count restarts).
func (r *ProcessRuntime) Exited(prefix string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for p, c := range r.exits {
		if strings.HasPrefix(p, prefix) {
			n += c
		}
	}
	return n
}

// Running lists "pod image args" of the processes running.
func (r *ProcessRuntime) Running() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, p := range r.procs {
		out = append(out, fmt.Sprintf("%s %s %q", p.pod, p.image, p.args))
	}
	return out
}

var probeClient = &http.Client{Timeout: 2 * time.Second}

func dials(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return false
	}
	_ = c.Close()
	return true
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer func() { _ = l.Close() }()
	return l.Addr().(*net.TCPAddr).Port, nil //nolint:forcetypeassert // a TCP listener.
}

func ptr[T any](v T) *T { return &v }
