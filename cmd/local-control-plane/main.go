// Command local-control-plane runs a local Kubernetes control plane (etcd,
// kube-apiserver and kube-controller-manager as local processes, see
// internal/devenv/controlplane) with CRDs installed, and optionally a command
// against it. It is what `make run` runs:
//
//	local-control-plane --crds package/crds --kubeconfig-out PATH -- COMMAND [ARG...]
//
// It installs the CRDs of every --crds folder, creates the namespace
// crossplane-system, writes the admin kubeconfig to --kubeconfig-out, prints
// "export KUBECONFIG=PATH", and runs COMMAND with KUBECONFIG set, its
// stdout and stderr passed through (no stdin; it runs in its own process
// group). On SIGINT or SIGTERM, or when COMMAND exits, it stops COMMAND's
// process group (SIGTERM, SIGKILL after --grace; a second signal kills at
// once) and then the control plane, and exits with COMMAND's exit code
// (128+N when a signal N ended it). Without COMMAND it runs the control
// plane until SIGINT or SIGTERM.
//
// With --node (as root) it also runs a node on this machine, so that pods
// really run (see internal/devenv/controlplane's Node and docs/development.md):
//
//	sudo local-control-plane --node --node-image "$(hack/squid-image.sh | head -n1)"
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/egressproxy/provider-egressproxy/internal/devenv/controlplane"
)

// The command is started from the main goroutine, kept on the main thread:
// its parent-death signal fires when the thread that started it exits.
func init() { runtime.LockOSThread() }

const crossplaneNamespace = "crossplane-system"

type listFlag []string

func (l *listFlag) String() string { return strings.Join(*l, ",") }
func (l *listFlag) Set(v string) error {
	*l = append(*l, v)
	return nil
}

func main() { os.Exit(run()) }

func say(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "local-control-plane: "+format+"\n", args...)
}

func run() int {
	// envtest logs through controller-runtime; its lines go to the
	// control-plane log, not here.
	ctrllog.SetLogger(logr.Discard())
	fs := flag.NewFlagSet("local-control-plane", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: local-control-plane [flags] [-- COMMAND [ARG...]]")
		fs.PrintDefaults()
	}
	var crds listFlag
	fs.Var(&crds, "crds", "folder of CRD manifests to install before anything runs (repeatable)")
	kubeconfigOut := fs.String("kubeconfig-out", "", "where to write the admin kubeconfig (default: DIR/kubeconfig)")
	dir := fs.String("dir", "", "folder for the control plane's data, PID files and log: new, empty or one a control plane used before (default: a temporary folder removed at exit)")
	binDir := fs.String("bin-dir", "", "folder holding etcd, kube-apiserver and kube-controller-manager (default: $"+controlplane.EnvBinDir+", else built by hack/controlplane-bins.sh)")
	logPath := fs.String("log", "", "file for the control-plane processes' output (default: DIR/controlplane.log)")
	noKCM := fs.Bool("no-controller-manager", false, "run only etcd and kube-apiserver (no garbage collection, namespace deletion or Deployments)")
	node := fs.Bool("node", false, "also run a node on this machine (root, Linux): containerd, a kubelet, kube-scheduler and kube-proxy with a bridge pod network; implies the controller manager")
	var nodeImages listFlag
	fs.Var(&nodeImages, "node-image", "image tarball (docker save or OCI archive) to import into the node's containerd, such as hack/squid-image.sh's (repeatable; implies --node)")
	grace := fs.Duration("grace", 10*time.Second, "how long COMMAND gets to exit after SIGTERM before it is killed")
	withCrossplane := fs.Bool("crossplane", false, "what make run brings up: build what is missing, then the control plane (and, as root, a node), a local registry with the packages built from this tree, Crossplane core with its package manager, the provider, function and Configuration installed with crossplane xpkg install, a ClusterProviderConfig for the local cluster and an upstream web server; then print the next commands. Takes no COMMAND")
	xpkgRepo := fs.String("xpkg-repo", "127.0.0.1:5000/egressproxy", "with --crossplane: the registry and organisation the packages are built for and pushed to, served by make run on that loopback address (an IP: Crossplane refuses localhost:PORT as not fully qualified)")
	providerRuntime := fs.String("provider-runtime", "", "with --crossplane: how the provider's and the function's pods run: pod (real pods on the node, their images pulled from the registry; the default with --node) or process (their image's binary as a process here, under the pod's ServiceAccount, its token renewed; the default without a node)")
	startedAt := fs.Float64("started-at", 0, "with --crossplane: when make run began (Unix seconds), for the times printed")
	if err := fs.Parse(os.Args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	command := fs.Args()

	// The first SIGINT, SIGTERM or SIGHUP (the terminal closed) cancels
	// shutdown (aborting a start under way); later ones go to again (kill
	// the command at once).
	signals := make(chan os.Signal, 2)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	shutdown, requestShutdown := context.WithCancel(context.Background())
	defer requestShutdown()
	again := make(chan os.Signal, 1)
	go func() {
		s := <-signals
		say("%s: stopping", s)
		requestShutdown()
		for s := range signals {
			select {
			case again <- s:
			default:
			}
		}
	}()

	o := controlplane.Options{CRDDirectories: crds, ControllerManager: !*noKCM, BinDir: *binDir, Dir: *dir}
	if *node || len(nodeImages) > 0 {
		o.Node = &controlplane.NodeOptions{Images: nodeImages}
	}
	if *logPath != "" {
		f, err := os.OpenFile(*logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			say("%v", err)
			return 1
		}
		defer f.Close()
		o.Log = f
	}

	if *withCrossplane {
		if len(command) > 0 {
			say("--crossplane takes no COMMAND (the provider runs as Crossplane installs it)")
			return 2
		}
		t0 := time.Now()
		if *startedAt > 0 {
			t0 = time.Unix(0, int64(*startedAt*1e9))
		}
		return runCrossplane(shutdown, o, *node || len(nodeImages) > 0, *kubeconfigOut, *xpkgRepo, *providerRuntime, t0)
	}

	start := time.Now()
	say("starting the control plane (CRDs from %s)", orNone(crds))
	cp, err := controlplane.Start(shutdown, o)
	if err != nil {
		say("control plane did not start: %v", err)
		return 1
	}
	code := serve(shutdown, again, cp, command, *kubeconfigOut, *grace, start)
	stopStart := time.Now()
	if err := cp.Stop(); err != nil {
		say("stopping the control plane: %v", err)
		if code == 0 {
			code = 1
		}
	}
	say("control plane stopped in %.1fs", time.Since(stopStart).Seconds())
	return code
}

// serve prepares the cluster, then runs the command (or waits) until it
// exits or shutdown is cancelled; it returns the exit code.
func serve(shutdown context.Context, again <-chan os.Signal, cp *controlplane.ControlPlane, command []string,
	kubeconfigOut string, grace time.Duration, start time.Time) int {
	kubeconfig, err := prepare(shutdown, cp, kubeconfigOut)
	if err != nil {
		say("%v", err)
		return 1
	}
	if shutdown.Err() != nil { // a signal arrived during the start
		return 1
	}
	what := "etcd, kube-apiserver, kube-controller-manager"
	if _, ok := cp.PIDs()["kube-controller-manager"]; !ok {
		what = "etcd, kube-apiserver"
	}
	say("control plane up in %.1fs (%s; namespace %s; data in %s; log %s)",
		time.Since(start).Seconds(), what, crossplaneNamespace, cp.Dir, orNone([]string{cp.LogPath}))
	if n := cp.Node; n != nil {
		say("node %s Ready: pods in %s on bridge %s; containerd at %s", n.Name, n.PodCIDR, n.Bridge, n.ContainerdSocket)
		say("debug its pods with: %s --runtime-endpoint unix://%s ps", filepath.Join(n.BinDir, "crictl"), n.ContainerdSocket)
	}
	fmt.Fprintf(os.Stderr, "\n    export KUBECONFIG=%s\n\n", kubeconfig)

	if len(command) == 0 {
		say("no command given: running until Ctrl-C")
		<-shutdown.Done()
		return 0
	}

	cmd := exec.Command(command[0], command[1:]...)
	cmd.Env = append(withoutVar(os.Environ(), "KUBECONFIG"), "KUBECONFIG="+kubeconfig)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	// Own process group: a Ctrl-C reaches it only through us, in order, and
	// stopping it stops what it started. SIGTERM if we die first.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	say("running %s", strings.Join(command, " "))
	if err := cmd.Start(); err != nil {
		say("%v", err)
		return 127
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	pgid := cmd.Process.Pid

	var waitErr error
	select {
	case waitErr = <-done:
	case <-shutdown.Done():
		say("stopping the command (SIGTERM, SIGKILL after %s or at a second Ctrl-C)", grace)
		_ = syscall.Kill(-pgid, syscall.SIGTERM)
		select {
		case waitErr = <-done:
		case <-time.After(grace):
			say("command still running after %s: killing it", grace)
			_ = syscall.Kill(-pgid, syscall.SIGKILL)
			waitErr = <-done
		case s := <-again:
			say("%s again: killing the command", s)
			_ = syscall.Kill(-pgid, syscall.SIGKILL)
			waitErr = <-done
		}
	}
	// Whatever the command left in its process group goes too.
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
	code := exitCode(waitErr)
	say("command exited with code %d", code)
	return code
}

// prepare creates the namespace crossplane-system and writes the admin
// kubeconfig to kubeconfigOut (when given); it returns the kubeconfig's
// path. Under sudo, the kubeconfig and the folders made for it belong to
// the user who ran sudo, whose shell uses it; nothing else changes owner.
func prepare(ctx context.Context, cp *controlplane.ControlPlane, kubeconfigOut string) (string, error) {
	cs, err := kubernetes.NewForConfig(cp.Config)
	if err != nil {
		return "", err
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: crossplaneNamespace}}
	if _, err := cs.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return "", fmt.Errorf("creating namespace %s: %w", crossplaneNamespace, err)
	}
	kubeconfig := cp.KubeconfigPath
	if kubeconfigOut != "" {
		u := sudoInvoker()
		if kubeconfig, err = filepath.Abs(kubeconfigOut); err == nil {
			if err = u.mkdirAll(filepath.Dir(kubeconfig)); err == nil {
				err = u.writeFile(kubeconfig, cp.Kubeconfig)
			}
		}
		if err != nil {
			return "", fmt.Errorf("writing the kubeconfig: %w", err)
		}
	}
	return kubeconfig, nil
}

func exitCode(err error) int {
	if err == nil {
		return 0
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return 128 + int(ws.Signal())
		}
		return ee.ExitCode()
	}
	return 1
}

func withoutVar(env []string, name string) []string {
	out := env[:0:0]
	for _, kv := range env {
		if !strings.HasPrefix(kv, name+"=") {
			out = append(out, kv)
		}
	}
	return out
}

func orNone(l []string) string {
	var s []string
	for _, v := range l {
		if v != "" {
			s = append(s, v)
		}
	}
	if len(s) == 0 {
		return "none"
	}
	return strings.Join(s, ", ")
}
