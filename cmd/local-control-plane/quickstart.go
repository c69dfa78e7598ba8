package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	goruntime "runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/egressproxy/provider-egressproxy/internal/devenv/controlplane"
	"github.com/egressproxy/provider-egressproxy/internal/devenv/localcrossplane"
	"github.com/egressproxy/provider-egressproxy/internal/devenv/netnshost"
)

// The names the quickstart's objects and the Configuration's Compositions
// use.
const (
	providerPackage = "provider-egressproxy"
	functionPackage = "function-egressproxy"
	configPackage   = "configuration-egressproxy"
	// squidImage is the Squid image the provider runs by default, pushed
	// next to the packages (hack/xpkg.sh writes it).
	squidImage = "squid-egressproxy"
	// providerObject is the Provider's name: the one Crossplane's
	// dependency resolver gives the Configuration's dependency (the
	// repository path as a DNS label), so that it finds it installed and
	// makes no second Provider of the package.
	providerObject = "egressproxy-provider-egressproxy"
	// functionObject is the Function's name, the resolver's as well, which
	// the Compositions call (make xpkg writes it into them).
	functionObject = "egressproxy-function-egressproxy"
	proxyNamespace = "egress-proxies"
	// processScheduler is the scheduler name the DeploymentRuntimeConfigs
	// give the provider's and the function's pods while they run as
	// processes (ProcessRuntime, without a node): no kube-scheduler
	// places them.
	processScheduler = "egressproxy-process-runtime"
	// The two ways the provider's and the function's pods run
	// (--provider-runtime).
	runtimePod     = "pod"
	runtimeProcess = "process"
	// upstreamBody starts the page the quickstart's upstream serves.
	upstreamBody = "hello from the make run upstream"
)

// quickstart is what `make run` brings up around the control plane.
type quickstart struct {
	root     string // the repository
	cacheDir string // the repository's .cache (kubeconfig, tools, packages)
	repo     string // XPKG_REPO: registry host and organisation
	runtime  string // how the provider and function run: runtimePod or runtimeProcess
	progress *progress

	cp       *controlplane.ControlPlane
	kube     client.Client
	cs       *kubernetes.Clientset
	cli      string // the Crossplane CLI
	coreBins string // Crossplane core and its CRDs
	squidRef string // the provider's default Squid image, pushed to the local registry (by digest)
	version  string
	pkgs     map[string]string // package name -> .xpkg file
	// pkgsCached says the packages were built before from the same tree.
	pkgsCached bool

	registry *localcrossplane.Registry
	caFile   string
	fnIP     string // the loopback address the function listens on
	core     *localcrossplane.Core
	procs    *localcrossplane.ProcessRuntime // runtimeProcess only
	stopRT   context.CancelFunc
	rtDone   chan struct{}
	upstream *netnshost.Host
	pageURL  string
	stopOnce sync.Once
}

// progress numbers the stages of `make run` and times them from the start
// (the Makefile passes when make began).
type progress struct {
	start time.Time
	n     int
	total int
}

func (p *progress) stage(what string) func(format string, args ...any) {
	p.n++
	n, t0 := p.n, time.Now()
	fmt.Fprintf(os.Stderr, "make run [%d/%d] %s ...\n", n, p.total, what)
	return func(format string, args ...any) {
		fmt.Fprintf(os.Stderr, "make run [%d/%d] %s: %s (%.1fs; %.1fs since make run began)\n",
			n, p.total, what, fmt.Sprintf(format, args...), time.Since(t0).Seconds(), time.Since(p.start).Seconds())
	}
}

// indented passes the lines written to it that contain match (all of
// them when match is empty) to stderr, indented: a script's progress, or
// the lines of a log worth showing.
type indented struct {
	match string
	mu    sync.Mutex
	buf   []byte
}

func (w *indented) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = append(w.buf, p...)
	for {
		i := strings.IndexByte(string(w.buf), '\n')
		if i < 0 {
			return len(p), nil
		}
		if l := string(w.buf[:i]); strings.Contains(l, w.match) {
			fmt.Fprintf(os.Stderr, "      %s\n", l)
		}
		w.buf = w.buf[i+1:]
	}
}

// script runs hack/NAME with args and env, its progress (stderr) shown
// indented, and returns its stdout's lines.
func (q *quickstart) script(ctx context.Context, env []string, name string, args ...string) ([]string, error) {
	cmd := exec.CommandContext(ctx, "bash", append([]string{filepath.Join(q.root, "hack", name)}, args...)...) //nolint:gosec // our scripts.
	cmd.Dir = q.root
	cmd.Env = append(os.Environ(), env...)
	cmd.Stderr = &indented{}
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("hack/%s: %w", name, err)
	}
	return strings.Split(strings.TrimSpace(string(out)), "\n"), nil
}

// tools builds (only when missing) and finds every binary and image: the
// control plane's, the node's, the Squid image (which hack/xpkg.sh makes
// the provider's default), Crossplane core and CLI. It returns the
// control-plane and node binary folders.
func (q *quickstart) tools(ctx context.Context, node bool) (cpBins, nodeBins string, err error) {
	done := q.progress.stage("tools: control plane and kubectl, node, Squid image, Crossplane core and CLI (built from the Go module proxy into ~/.cache/provider-egressproxy when missing; about 15 minutes cold on 2 idle cores, instant warm)")
	// Steps, each timed, so a cold run shows how far it is.
	steps := 2
	if node {
		steps = 4
	}
	n := 0
	// step runs one hack/ script, timed, and returns the lines it printed.
	step := func(what, script string, args ...string) ([]string, error) {
		n++
		t := time.Now()
		fmt.Fprintf(os.Stderr, "      tools %d/%d: %s\n", n, steps, what)
		l, err := q.script(ctx, nil, script, args...)
		if err != nil {
			return nil, err
		}
		if d := time.Since(t); d > time.Second {
			fmt.Fprintf(os.Stderr, "      tools %d/%d: %s done in %.0fs\n", n, steps, what, d.Seconds())
		}
		return l, nil
	}
	var l []string
	if l, err = step("etcd, kube-apiserver, kube-controller-manager, kubectl (about 10 minutes cold)", "controlplane-bins.sh"); err != nil {
		return
	}
	cpBins = l[len(l)-1]
	if node {
		if l, err = step("kubelet, kube-proxy, kube-scheduler, crictl; containerd, runc, CNI plugins from apt (about 6 minutes cold)", "node-bins.sh"); err != nil {
			return
		}
		nodeBins = l[len(l)-1]
		if l, err = step("the Squid image, with mmdebstrap (about 2 minutes cold)", "squid-image.sh"); err != nil {
			return
		}
		if len(l) < 2 {
			return "", "", fmt.Errorf("hack/squid-image.sh printed %q; want the tarball and the image name first", l)
		}
	}
	if _, err = step("Crossplane core v2.4.0 and the Crossplane CLI v2.5.0 (a few minutes cold each)", "crossplane-bins.sh", "all"); err != nil {
		return
	}
	if l, err = q.script(ctx, nil, "crossplane-bins.sh"); err != nil {
		return
	}
	q.coreBins = l[len(l)-1]
	if l, err = q.script(ctx, nil, "crossplane-bins.sh", "cli"); err != nil {
		return
	}
	q.cli = l[len(l)-1]
	// kubectl, crossplane and crictl in one folder for the PATH the next
	// commands need.
	bin := filepath.Join(q.cacheDir, "bin")
	if err = os.MkdirAll(bin, 0o755); err != nil {
		return
	}
	links := map[string]string{"kubectl": filepath.Join(cpBins, "kubectl"), "crossplane": q.cli}
	if node {
		links["crictl"] = filepath.Join(nodeBins, "crictl")
	}
	for name, target := range links {
		if err = sudoInvoker().placeTool(target, filepath.Join(bin, name)); err != nil {
			return
		}
	}
	done("ready; kubectl and crossplane linked in %s", bin)
	return cpBins, nodeBins, nil
}

// packageInputs are the files the packages are made of: what their
// cache key hashes.
var packageInputs = []string{"apis/", "cmd/provider/", "internal/", "function/", "package/", "examples/",
	"hack/xpkg.sh", "hack/check-crds.sh", "hack/runtimeimage/", "hack/version.sh", "hack/squid-image.sh", "hack/squidimage/", "go.mod", "go.sum"}

// packages builds the provider, function and Configuration packages with
// hack/xpkg.sh (`crossplane xpkg build`) for this machine's architecture,
// naming the local registry in the Configuration's dependsOn. They are
// kept in .cache/xpkg by a hash of what they are built from, so a warm
// start with an unchanged tree builds nothing.
func (q *quickstart) packages(ctx context.Context) error {
	v, err := q.script(ctx, nil, "version.sh")
	if err != nil {
		return err
	}
	q.version = v[len(v)-1]
	key, err := q.inputsHash()
	if err != nil {
		return err
	}
	arch := goruntime.GOARCH
	dir := filepath.Join(q.cacheDir, "xpkg", key)
	q.pkgs = map[string]string{
		providerPackage: filepath.Join(dir, fmt.Sprintf("%s-%s-%s.xpkg", providerPackage, q.version, arch)),
		functionPackage: filepath.Join(dir, fmt.Sprintf("%s-%s-%s.xpkg", functionPackage, q.version, arch)),
		configPackage:   filepath.Join(dir, fmt.Sprintf("%s-%s.xpkg", configPackage, q.version)),
		squidImage:      filepath.Join(dir, fmt.Sprintf("%s-%s.oci.tar", squidImage, q.version)),
	}
	have := true
	for _, f := range q.pkgs {
		if _, err := os.Stat(f); err != nil {
			have = false
		}
	}
	if have {
		q.pkgsCached = true
		return nil
	}
	tmp := dir + ".tmp"
	_ = os.RemoveAll(tmp)
	if _, err := q.script(ctx, []string{"VERSION=" + q.version, "XPKG_REPO=" + q.repo, "PLATFORMS=linux/" + arch}, "xpkg.sh", tmp); err != nil {
		return err
	}
	// Older builds go: one set is kept.
	old, _ := filepath.Glob(filepath.Join(q.cacheDir, "xpkg", "*"))
	for _, o := range old {
		if o != tmp {
			_ = os.RemoveAll(o)
		}
	}
	return os.Rename(tmp, dir)
}

// inputsHash hashes the names and contents of the package inputs git
// knows or would add (tests left out: they are not in a package), and the
// registry the Configuration names.
func (q *quickstart) inputsHash() (string, error) {
	cmd := exec.Command("git", append([]string{"ls-files", "-co", "--exclude-standard", "--"}, packageInputs...)...) //nolint:gosec // fixed arguments.
	cmd.Dir = q.root
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("git ls-files: %w", err)
	}
	files := strings.Split(strings.TrimSpace(string(out)), "\n")
	sort.Strings(files)
	h := sha256.New()
	fmt.Fprintf(h, "%s\n%s\n", q.repo, goruntime.GOARCH)
	for _, f := range files {
		if f == "" || strings.HasSuffix(f, "_test.go") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(q.root, f)) //nolint:gosec // files of the repository.
		if err != nil {
			if errors.Is(err, os.ErrNotExist) { // deleted, not yet staged
				continue
			}
			return "", err
		}
		fmt.Fprintf(h, "%s %d\n", f, len(b))
		h.Write(b)
	}
	return hex.EncodeToString(h.Sum(nil))[:16], nil
}

// startRegistry serves the registry XPKG_REPO names (a loopback address),
// before the node starts: its containerd trusts the registry's CA from
// the start.
func (q *quickstart) startRegistry() error {
	host := strings.SplitN(q.repo, "/", 2)[0]
	_, port, err := net.SplitHostPort(host)
	if err != nil {
		return fmt.Errorf("XPKG_REPO=%s: want localhost:PORT/ORGANISATION for make run's registry", q.repo)
	}
	if h, _, _ := net.SplitHostPort(host); h != "localhost" && h != "127.0.0.1" {
		return fmt.Errorf("XPKG_REPO=%s: make run serves its registry on loopback; want localhost:PORT/ORGANISATION", q.repo)
	}
	q.registry, err = localcrossplane.StartRegistry("127.0.0.1:" + port)
	if err != nil {
		return fmt.Errorf("the local registry on 127.0.0.1:%s (XPKG_REPO=%s; choose another port with RUN_XPKG_REPO=127.0.0.1:PORT/egressproxy): %w", port, q.repo, err)
	}
	return nil
}

// writeCA writes the registry's CA where core and the CLI read it.
func (q *quickstart) writeCA() error {
	q.caFile = filepath.Join(q.cp.Dir, "registry-ca.pem")
	return os.WriteFile(q.caFile, q.registry.CAPEM, 0o600)
}

// push pushes the packages to the registry with `crossplane xpkg push`,
// all three at once: they are independent, and on the way to ready; and
// the Squid image the provider runs by default, which the node's
// containerd then pulls from the registry by digest, as a cluster pulls a
// release's.
func (q *quickstart) push(ctx context.Context) error {
	names := []string{providerPackage, functionPackage, configPackage}
	errs := make([]error, len(names)+1)
	var wg sync.WaitGroup
	wg.Go(func() {
		ref, err := q.registry.Client.PushLayout(ctx, q.pkgs[squidImage], q.ref(squidImage))
		q.squidRef, errs[len(names)] = ref, err
	})
	for i, name := range names {
		wg.Go(func() {
			cmd := exec.CommandContext(ctx, q.cli, "xpkg", "push", "-f", q.pkgs[name], q.ref(name)) //nolint:gosec // the CLI we built.
			cmd.Env = append(os.Environ(), "SSL_CERT_FILE="+q.caFile)
			if out, err := cmd.CombinedOutput(); err != nil {
				errs[i] = fmt.Errorf("crossplane xpkg push %s: %w\n%s", q.ref(name), err, out)
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

func (q *quickstart) ref(name string) string { return q.repo + "/" + name + ":" + q.version }

// startCrossplane runs Crossplane core and its RBAC manager, and the
// process runtime for the packages' pods when they run as processes.
func (q *quickstart) startCrossplane(ctx context.Context) error {
	if _, err := q.cs.CoreV1().ServiceAccounts(crossplaneNamespace).Create(ctx,
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "crossplane"}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	fnIP := localcrossplane.FunctionIP(os.Getpid())
	q.fnIP = fnIP
	dir := filepath.Join(q.cp.Dir, "crossplane")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	var err error
	q.core, err = localcrossplane.StartCore(ctx, localcrossplane.CoreOptions{
		BinDir: q.coreBins, Kubeconfig: q.cp.KubeconfigPath, Dir: dir, CAFile: q.caFile,
		Hosts: map[string]string{functionObject + "." + crossplaneNamespace: fnIP},
		// Every kind, as Crossplane's Helm chart activates by default.
		Activations: []string{"*"},
	})
	if err != nil {
		return err
	}
	if q.runtime == runtimePod {
		// What kube-controller-manager's root-ca-cert-publisher writes in
		// every namespace (not run here): the CA of the pods' token volume.
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: crossplaneNamespace, Name: "kube-root-ca.crt"},
			Data: map[string]string{"ca.crt": string(q.cp.Config.CAData)}}
		if _, err := q.cs.CoreV1().ConfigMaps(crossplaneNamespace).Create(ctx, cm, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return err
		}
		return nil
	}
	logf, err := os.OpenFile(filepath.Join(dir, "process-runtime.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600) //nolint:gosec // ours.
	if err != nil {
		return err
	}
	var mu sync.Mutex
	q.procs = &localcrossplane.ProcessRuntime{Kube: q.kube, Clientset: q.cs, Config: q.cp.Config, Registry: q.registry.Client,
		Dir: filepath.Join(dir, "pods"), FunctionAddrs: map[string]string{functionObject: fnIP}, SchedulerName: processScheduler,
		Log: func(s string) {
			mu.Lock()
			defer mu.Unlock()
			fmt.Fprintf(logf, "%s %s\n", time.Now().Format(time.RFC3339), s)
		}}
	rtCtx, cancel := context.WithCancel(context.Background())
	q.stopRT, q.rtDone = cancel, make(chan struct{})
	go func() { q.procs.Run(rtCtx); _ = logf.Close(); close(q.rtDone) }()
	return nil
}

// runtimeConfigs are the DeploymentRuntimeConfigs the packages are
// installed with: the provider's from cluster/rbac/podproxy.yaml (its
// ServiceAccount named for the PodProxy grant), and the function's; their
// pod templates are podTemplate's.
func (q *quickstart) runtimeConfigs(ctx context.Context) error {
	b, err := os.ReadFile(filepath.Join(q.root, "cluster", "rbac", "podproxy.yaml"))
	if err != nil {
		return err
	}
	objs, err := localcrossplane.DecodeYAML(string(b))
	if err != nil {
		return fmt.Errorf("cluster/rbac/podproxy.yaml: %w", err)
	}
	fn := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "pkg.crossplane.io/v1beta1", "kind": "DeploymentRuntimeConfig",
		"metadata": map[string]any{"name": functionPackage}, "spec": map[string]any{},
	}}
	objs = append(objs, fn)
	for _, o := range objs {
		if o.GetKind() == "ImageConfig" {
			// The provider of make run's registry, as make xpkg writes it.
			_ = unstructured.SetNestedSlice(o.Object, []any{map[string]any{"type": "Prefix", "prefix": q.repo + "/" + providerPackage}}, "spec", "matchImages")
		}
		if o.GetKind() == "DeploymentRuntimeConfig" {
			tmpl, err := q.podTemplate(o.GetName() == functionPackage)
			if err != nil {
				return err
			}
			_ = unstructured.SetNestedField(o.Object, map[string]any{"selector": map[string]any{}, "template": tmpl},
				"spec", "deploymentTemplate", "spec")
		}
		if err := q.kube.Create(ctx, o); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("creating %s %s: %w", o.GetKind(), o.GetName(), err)
		}
	}
	return nil
}

// podTemplate is the pod template of the provider's or the function's
// DeploymentRuntimeConfig. As processes: the process runtime's scheduler
// name. As pods on the node, what this control plane needs that a
// cluster would not (docs/development.md, "The provider as a real pod"):
// the host's network, since kube-apiserver listens on loopback only and
// Crossplane core, a process here, dials the function at the loopback
// address its Service name resolves to for core; listeners off the fixed
// ports of the host; and the token volume the ServiceAccount admission
// plugin (off here) would add, a projected token the kubelet renews.
//
// On the host's network a container port is a host port, and the
// scheduler places no two pods asking for one host port on a node: both
// packages' pods would ask for 8080 (Crossplane's metrics port) and 9443
// (the provider's webhook port, the function's gRPC port). Crossplane adds
// a port only when the template names none of that name, so the template
// names them, on free ports (the function's gRPC port stays 9443, on its
// own loopback address).
func (q *quickstart) podTemplate(function bool) (map[string]any, error) {
	if q.runtime == runtimeProcess {
		return map[string]any{"spec": map[string]any{
			"schedulerName": processScheduler,
			"containers":    []any{map[string]any{"name": "package-runtime"}},
		}}, nil
	}
	c := map[string]any{"name": "package-runtime"}
	spec := map[string]any{"hostNetwork": true, "dnsPolicy": "ClusterFirstWithHostNet", "containers": []any{c}}
	// A free port is free until bound: two asked for in a row may be the
	// same one, which the pod's ports (and the host network) refuse.
	taken := map[int]bool{}
	free := func() (int, error) {
		for range 100 {
			p, err := controlplane.FreePort()
			if err != nil || !taken[p] {
				taken[p] = true
				return p, err
			}
		}
		return 0, fmt.Errorf("no free port distinct from %v", taken)
	}
	port := func(name string) (any, error) {
		p, err := free()
		return map[string]any{"name": name, "containerPort": int64(p)}, err
	}
	metrics, err := port("metrics")
	if err != nil {
		return nil, err
	}
	if function {
		c["ports"] = []any{metrics, map[string]any{"name": "grpc", "containerPort": int64(9443)}}
		c["args"] = []any{"--address=" + q.fnIP + ":9443"}
		c["readinessProbe"] = map[string]any{"tcpSocket": map[string]any{"host": q.fnIP, "port": int64(9443)}, "periodSeconds": int64(1), "timeoutSeconds": int64(5)}
		return map[string]any{"spec": spec}, nil
	}
	api, err := url.Parse(q.cp.Config.Host)
	if err != nil {
		return nil, err
	}
	webhook, err := port("webhook")
	if err != nil {
		return nil, err
	}
	c["ports"] = []any{metrics, webhook}
	health, err := free()
	if err != nil {
		return nil, err
	}
	spec["volumes"] = []any{map[string]any{"name": "kube-api-access", "projected": map[string]any{"sources": []any{
		map[string]any{"serviceAccountToken": map[string]any{"path": "token", "expirationSeconds": int64(3607)}},
		map[string]any{"configMap": map[string]any{"name": "kube-root-ca.crt", "items": []any{map[string]any{"key": "ca.crt", "path": "ca.crt"}}}},
		map[string]any{"downwardAPI": map[string]any{"items": []any{map[string]any{"path": "namespace", "fieldRef": map[string]any{"fieldPath": "metadata.namespace"}}}}},
	}}}}
	c["args"] = []any{"--metrics-bind-address=0", fmt.Sprintf("--health-probe-bind-address=127.0.0.1:%d", health)}
	c["env"] = []any{
		map[string]any{"name": "KUBERNETES_SERVICE_HOST", "value": api.Hostname()},
		map[string]any{"name": "KUBERNETES_SERVICE_PORT", "value": api.Port()},
	}
	c["volumeMounts"] = []any{map[string]any{"name": "kube-api-access", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount", "readOnly": true}}
	// A busy machine may answer a probe late; the default second would
	// take a working pod out.
	c["readinessProbe"] = map[string]any{"httpGet": map[string]any{"host": "127.0.0.1", "port": int64(health), "path": "/readyz"}, "periodSeconds": int64(1), "timeoutSeconds": int64(5)}
	return map[string]any{"spec": spec}, nil
}

// pkgInstall is one package for `crossplane xpkg install`.
type pkgInstall struct{ kind, name, obj, runtimeConfig string }

// install installs the three packages with `crossplane xpkg install` in
// dependency order: the provider and the function at once, and once both
// are Healthy the Configuration, whose dependencies Crossplane then
// resolves to the two installed by name. Installed all at once, the
// package manager could record the function in its lock twice (as the
// Configuration's dependency and as itself), and no revision ever became
// Healthy ("cannot initialize dependency graph from the packages in the
// lock: node .../function-egressproxy already exists").
func (q *quickstart) install(ctx context.Context) error {
	if err := q.installAndWait(ctx,
		pkgInstall{"provider", providerPackage, providerObject, "provider-egressproxy"},
		pkgInstall{"function", functionPackage, functionObject, functionPackage},
	); err != nil {
		return err
	}
	return q.installAndWait(ctx, pkgInstall{"configuration", configPackage, configPackage, ""})
}

// installAndWait installs all at once, then waits until every one is
// Healthy. It polls every 250 ms rather than using the CLI's --wait, which
// polls every 2 s.
func (q *quickstart) installAndWait(ctx context.Context, all ...pkgInstall) error {
	errs := make([]error, len(all))
	var wg sync.WaitGroup
	for i, in := range all {
		wg.Add(1)
		go func() {
			defer wg.Done()
			args := []string{"xpkg", "install", in.kind, q.ref(in.name), in.obj}
			if in.runtimeConfig != "" {
				args = append(args, "--runtime-config="+in.runtimeConfig)
			}
			cmd := exec.CommandContext(ctx, q.cli, args...) //nolint:gosec // the CLI we built.
			cmd.Env = append(os.Environ(), "KUBECONFIG="+q.cp.KubeconfigPath)
			if out, err := cmd.CombinedOutput(); err != nil {
				errs[i] = fmt.Errorf("crossplane %s: %w\n%s", strings.Join(args, " "), err, out)
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	deadline := time.Now().Add(5 * time.Minute)
	for {
		var waiting []string
		for _, in := range all {
			kind := map[string]string{"provider": "Provider", "function": "Function", "configuration": "Configuration"}[in.kind]
			o := &unstructured.Unstructured{}
			o.SetAPIVersion("pkg.crossplane.io/v1")
			o.SetKind(kind)
			if err := q.kube.Get(ctx, client.ObjectKey{Name: in.obj}, o); err != nil {
				waiting = append(waiting, fmt.Sprintf("%s %s: %v", kind, in.obj, err))
				continue
			}
			if st, msg := localcrossplane.Condition(o, "Healthy"); st != "True" {
				waiting = append(waiting, fmt.Sprintf("%s %s Healthy=%q %s", kind, in.obj, st, msg))
			}
		}
		if len(waiting) == 0 {
			// Healthy is the Deployment's Available, which one replica
			// has while its pod is not Ready yet (the default
			// maxUnavailable rounds down to none).
			notReady, err := q.packagePodsNotReady(ctx, all)
			if err != nil {
				return err
			}
			if len(notReady) == 0 {
				return nil
			}
			waiting = notReady
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not Healthy with Ready pods after 5 minutes: %s%s", strings.Join(waiting, "; "), q.podsReport(ctx))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// packagePodsNotReady says which of the provider's and the function's
// pods among all are not Running and Ready yet, and which have none. With
// the process runtime, Healthy already waits for the processes' readiness.
func (q *quickstart) packagePodsNotReady(ctx context.Context, all []pkgInstall) ([]string, error) {
	if q.procs != nil {
		return nil, nil
	}
	var out []string
	for _, in := range all {
		if in.kind != "provider" && in.kind != "function" {
			continue
		}
		label := "pkg.crossplane.io/" + in.kind
		pl, err := q.cs.CoreV1().Pods(crossplaneNamespace).List(ctx, metav1.ListOptions{LabelSelector: label})
		if err != nil {
			return nil, err
		}
		ready := 0
		for _, p := range pl.Items {
			if p.DeletionTimestamp != nil {
				continue
			}
			if p.Status.Phase == corev1.PodRunning && podIsReady(&p) {
				ready++
				continue
			}
			out = append(out, fmt.Sprintf("pod %s %s, not Ready", p.Name, p.Status.Phase))
		}
		if ready == 0 && len(out) == 0 {
			out = append(out, "no pod labelled "+label)
		}
	}
	return out, nil
}

func podIsReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// podsReport is, for a failure, the provider's and the function's pods:
// their state and the last lines of their logs (through the kubelet, or
// the process runtime's files).
func (q *quickstart) podsReport(ctx context.Context) string {
	var b strings.Builder
	if q.procs != nil {
		for pod, t := range q.procs.LogTails(15) {
			fmt.Fprintf(&b, "\npod %s (a process here), last lines of its log:\n%s", pod, t)
		}
		return b.String()
	}
	pods, err := q.packagePods(ctx)
	if err != nil {
		return "\n" + err.Error()
	}
	for _, p := range pods {
		fmt.Fprintf(&b, "\npod %s on node %q: %s, conditions %+v, containers %+v", p.Name, p.Spec.NodeName, p.Status.Phase, p.Status.Conditions, p.Status.ContainerStatuses)
		logs, err := q.cs.CoreV1().Pods(p.Namespace).GetLogs(p.Name, &corev1.PodLogOptions{TailLines: new(int64(15))}).DoRaw(ctx)
		if err != nil {
			fmt.Fprintf(&b, "\n  no log: %v", err)
			continue
		}
		fmt.Fprintf(&b, "\n  last lines of its log:\n%s", logs)
	}
	return b.String()
}

// packagePods are the pods of the provider's and the function's
// revisions.
func (q *quickstart) packagePods(ctx context.Context) ([]corev1.Pod, error) {
	var out []corev1.Pod
	for _, label := range []string{"pkg.crossplane.io/provider", "pkg.crossplane.io/function"} {
		pl, err := q.cs.CoreV1().Pods(crossplaneNamespace).List(ctx, metav1.ListOptions{LabelSelector: label})
		if err != nil {
			return nil, err
		}
		out = append(out, pl.Items...)
	}
	return out, nil
}

// running says where the provider's and the function's pods run.
func (q *quickstart) running(ctx context.Context) (string, error) {
	if q.procs != nil {
		return fmt.Sprintf("their pods run as processes from the pushed images' binaries under the ServiceAccounts Crossplane made (--provider-runtime=%s; logs in %s)", q.runtime, q.procs.Dir), nil
	}
	pods, err := q.packagePods(ctx)
	if err != nil {
		return "", err
	}
	var l []string
	for _, p := range pods {
		if p.DeletionTimestamp != nil {
			continue
		}
		img := ""
		if len(p.Status.ContainerStatuses) > 0 {
			img = p.Status.ContainerStatuses[0].Image
		}
		l = append(l, fmt.Sprintf("pod %s %s on node %s (%s)", p.Name, p.Status.Phase, p.Spec.NodeName, img))
	}
	sort.Strings(l)
	return "their pods: " + strings.Join(l, ", ") + "; kubelet-projected ServiceAccount tokens", nil
}

// providerConfigs makes the ClusterProviderConfig the Configuration's
// standard class names (pods: PodProxies on the local node, the Squid
// image built here) and its legacy twin for claims.
func (q *quickstart) providerConfigs(ctx context.Context) (string, error) {
	if _, err := q.cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: proxyNamespace}},
		metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return "", err
	}
	// The upstream's echo endpoint, when it runs: each proxy's egress
	// address is then verified through the proxy (docs/allow-listing.md).
	echo := ""
	if q.pageURL != "" {
		echo = "    egressCheck: {url: \"" + strings.TrimSuffix(q.pageURL, "/") + netnshost.EchoPath + "\"}\n"
	}
	doc := `# Written by make run: PodProxies on the local node, from the provider's
# default Squid image (no image here: ` + q.squidRef + `, built by
# hack/squid-image.sh and pushed next to the packages), in the namespace
# ` + proxyNamespace + `, under the provider's own identity in this cluster (the
# grant of cluster/rbac/podproxy.yaml).
` + localcrossplane.PodsProviderConfig(false, proxyNamespace, "") + echo + `---
# The same for claims (EgressProxyClaim, cluster-scoped kinds).
` + localcrossplane.PodsProviderConfig(true, proxyNamespace, "") + echo
	path := filepath.Join(q.cacheDir, "providerconfigs.yaml")
	if err := os.WriteFile(path, []byte(doc), 0o600); err != nil {
		return "", err
	}
	objs, err := localcrossplane.DecodeYAML(doc)
	if err != nil {
		return "", err
	}
	for _, o := range objs {
		if err := q.kube.Create(ctx, o); err != nil && !apierrors.IsAlreadyExists(err) {
			return "", fmt.Errorf("creating %s %s: %w", o.GetKind(), o.GetName(), err)
		}
	}
	return path, nil
}

// startUpstream serves a page on port 80 of a host of its own: a network
// namespace on this machine at an address in 198.18.0.0/15 (netnshost),
// where a real destination would stand. Not loopback: Squid refuses
// loopback, private and link-local destinations by default, and a pod's
// loopback is its own. Nothing leaves this machine. Like a vendor's API
// that allow-lists its clients' egress addresses, it answers only requests
// from the node's pod network (pod traffic is not masqueraded here, so a
// request through a proxy pod comes from the pod's address); anything else
// gets 403, so a request that bypassed the proxy cannot pass for one that
// went through it.
func (q *quickstart) startUpstream(pods netip.Prefix) error {
	h, err := netnshost.New()
	if err != nil {
		return err
	}
	q.upstream = h
	ap, err := h.Serve(":80", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		from, _ := netip.ParseAddrPort(r.RemoteAddr)
		if !pods.Contains(from.Addr().Unmap()) {
			http.Error(w, fmt.Sprintf("403: this upstream answers only requests from the egress proxies' pod network %s; you came from %s, not through a proxy", pods, from.Addr()), http.StatusForbidden)
			return
		}
		if r.URL.Path == netnshost.EchoPath {
			// The ClusterProviderConfig's echo endpoint (egressCheck).
			netnshost.Echo(w, r)
			return
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprintf(w, "%s: you came through the egress proxy pod %s (a web server in the network namespace %s at %s; it answers only the pod network %s)\n", //nolint:gosec // plain text of addresses.
			upstreamBody, from.Addr(), h.Netns, h.Addr, pods)
	}))
	if err != nil {
		return err
	}
	q.pageURL = "http://" + ap.Addr().String() + "/"
	return nil
}

// stop stops what the quickstart started, last first.
func (q *quickstart) stop() { q.stopOnce.Do(q.stopAll) }

func (q *quickstart) stopAll() {
	if q.upstream != nil {
		if err := q.upstream.Close(); err != nil {
			say("upstream: %v", err)
		}
	}
	if q.stopRT != nil {
		q.stopRT()
		<-q.rtDone
	}
	if q.core != nil {
		q.core.Stop()
	}
	if q.registry != nil {
		_ = q.registry.Close()
	}
}

// pids lists the processes the quickstart runs besides the control plane.
func (q *quickstart) pids() string {
	var s []string
	if q.core != nil {
		s = append(s, fmt.Sprintf("crossplane core %d", q.core.Core.PID()), fmt.Sprintf("crossplane rbac %d", q.core.RBAC.PID()))
	}
	return strings.Join(s, ", ")
}

// nextCommands are the three commands to run next, printed for a user to
// copy and run by the quickstart test.
func (q *quickstart) nextCommands(kubeconfig string) string {
	bin := filepath.Join(q.cacheDir, "bin")
	qs := filepath.Join(q.root, "examples", "quickstart")
	var b strings.Builder
	if u := sudoInvoker(); u != nil {
		// Under sudo the commands are for the user who ran it: the
		// kubeconfig is theirs, the tools in bin run for them.
		name := strconv.Itoa(u.uid)
		if usr, err := user.LookupId(name); err == nil {
			name = usr.Username
		}
		fmt.Fprintf(&b, "In another shell, as %s (who ran sudo; no sudo needed):\n\n", name)
	} else {
		fmt.Fprintf(&b, "In another shell:\n\n")
	}
	fmt.Fprintf(&b, "    export KUBECONFIG=%s PATH=%s:$PATH\n\n", kubeconfig, bin)
	fmt.Fprintf(&b, "    # 1. An EgressProxy claimed by the team-payments namespace (class standard: a PodProxy on the local node)\n")
	fmt.Fprintf(&b, "    kubectl apply -f %s/\n\n", qs)
	fmt.Fprintf(&b, "    # 2. Wait for it to be Ready, then see what it is made of\n")
	fmt.Fprintf(&b, "    kubectl wait egressproxy/payments -n team-payments --for=condition=Ready --timeout=5m && crossplane resource trace egressproxy/payments -n team-payments\n\n")
	fmt.Fprintf(&b, "    # 3. Fetch the upstream page through the proxy URL of the connection Secret\n")
	fmt.Fprintf(&b, "    curl -sS -x \"$(kubectl get secret payments-proxy -n team-payments -o jsonpath='{.data.url}' | base64 -d)\" %s\n", q.pageURL)
	return b.String()
}

// runCrossplane is make run: every stage in order, printed with how long
// it took, then the next commands; it runs until shutdown and stops
// everything it started, last first.
func runCrossplane(shutdown context.Context, o controlplane.Options, node bool, kubeconfigOut, repo, runtime string, t0 time.Time) int {
	root, err := controlplane.RepoRoot()
	if err != nil {
		say("%v", err)
		return 1
	}
	if node && os.Geteuid() != 0 {
		say("the node needs root (containerd, network namespaces, iptables, cgroups): run make run as root, or NODE=0 for none (PodProxies then never run)")
		return 1
	}
	switch {
	case runtime == "" && node:
		runtime = runtimePod
	case runtime == "":
		runtime = runtimeProcess
	case runtime == runtimePod && !node:
		say("--provider-runtime=pod needs the node: the provider and function run as processes without one")
		return 2
	case runtime != runtimePod && runtime != runtimeProcess:
		say("--provider-runtime=%s: want pod or process", runtime)
		return 2
	}
	total := 9
	if !node {
		total = 7
	}
	q := &quickstart{root: root, cacheDir: filepath.Join(root, ".cache"), repo: repo, runtime: runtime,
		progress: &progress{start: t0, total: total}}
	// The kubeconfig's folder before anything else is put in it (.cache
	// by default): under sudo, one made here belongs to the user who ran
	// sudo.
	if kubeconfigOut != "" {
		abs, err := filepath.Abs(kubeconfigOut)
		if err == nil {
			err = sudoInvoker().mkdirAll(filepath.Dir(abs))
		}
		if err != nil {
			say("--kubeconfig-out %s: %v", kubeconfigOut, err)
			return 1
		}
	}
	defer q.stop()
	fail := func(what string, err error) int {
		if shutdown.Err() != nil {
			say("stopped during %s", what)
		} else {
			say("%s: %v", what, err)
		}
		return 1
	}

	cpBins, nodeBins, err := q.tools(shutdown, node)
	if err != nil {
		return fail("tools", err)
	}
	// The registry first: the node's containerd trusts its CA from the
	// start.
	if err := q.startRegistry(); err != nil {
		return fail("registry", err)
	}
	// Crossplane's own CRDs before core init (which otherwise races their
	// establishment); the provider's come with its package.
	o.BinDir, o.ControllerManager = cpBins, true
	o.CRDDirectories = append(o.CRDDirectories, filepath.Join(q.coreBins, "crds"))
	if node {
		var imgs []string
		if o.Node != nil {
			imgs = o.Node.Images
		}
		o.Node = &controlplane.NodeOptions{BinDir: nodeBins, Images: imgs,
			RegistryCAs: map[string][]byte{q.registry.Host: q.registry.CAPEM}}
	}

	// The packages build while the control plane starts.
	pkgsDone := q.progress.stage("packages: provider, function and Configuration for linux/" + goruntime.GOARCH + " (hack/xpkg.sh, crossplane xpkg build; kept in .cache/xpkg while the tree is unchanged), building while the control plane starts")
	pkgErr := make(chan error, 1)
	var pkgTook time.Duration
	go func() { t := time.Now(); err := q.packages(shutdown); pkgTook = time.Since(t); pkgErr <- err }()

	what := "control plane: etcd, kube-apiserver, kube-controller-manager"
	if node {
		what += "; then the node: containerd, kubelet, kube-scheduler, kube-proxy"
	}
	done := q.progress.stage(what)
	// The control plane's log goes to a file; a wait for another node
	// (the machine runs one at a time) is shown.
	if o.Log == nil {
		if err := os.MkdirAll(filepath.Join(q.cacheDir, "run"), 0o755); err != nil {
			return fail("control plane", err)
		}
		lf, err := os.Create(filepath.Join(q.cacheDir, "run", "controlplane.log"))
		if err != nil {
			return fail("control plane", err)
		}
		defer lf.Close()
		o.Log = io.MultiWriter(lf, &indented{match: "another node runs on this machine"})
		say("control-plane log: %s", lf.Name())
	}
	cp, err := controlplane.Start(shutdown, o)
	if err != nil {
		if perr := <-pkgErr; perr != nil {
			say("packages: %v", perr)
		}
		return fail("control plane", err)
	}
	q.cp = cp
	defer func() {
		q.stop()
		t := time.Now()
		if err := cp.Stop(); err != nil {
			say("stopping the control plane: %v", err)
		}
		say("control plane stopped in %.1fs", time.Since(t).Seconds())
	}()
	kubeconfig, err := prepare(shutdown, cp, kubeconfigOut)
	if err != nil {
		if perr := <-pkgErr; perr != nil {
			say("packages: %v", perr)
		}
		return fail("control plane", err)
	}
	pids := cp.PIDs()
	var pl []string
	for n, p := range pids {
		pl = append(pl, fmt.Sprintf("%s %d", n, p))
	}
	sort.Strings(pl)
	done("up; PIDs %s; data and logs in %s", strings.Join(pl, ", "), cp.Dir)
	if n := cp.Node; n != nil {
		q.progress.n++
		fmt.Fprintf(os.Stderr, "make run [%d/%d] node: %s Ready in %.1fs (images imported in %.1fs): pods in %s on bridge %s; containerd at %s\n",
			q.progress.n, q.progress.total, n.Name, n.ReadyIn.Seconds(), n.ImportIn.Seconds(), n.PodCIDR, n.Bridge, n.ContainerdSocket)
	}
	if q.cs, err = kubernetes.NewForConfig(cp.Config); err != nil {
		return fail("control plane", err)
	}
	if q.kube, err = client.New(cp.Config, client.Options{}); err != nil {
		return fail("control plane", err)
	}

	if err := <-pkgErr; err != nil {
		return fail("packages", err)
	}
	how := "built"
	if q.pkgsCached {
		how = "unchanged since the last build, taken from " + filepath.Dir(q.pkgs[configPackage])
	}
	pkgsDone("%s %s in %.1fs", q.version, how, pkgTook.Seconds())

	// The pushes run while Crossplane core starts.
	done = q.progress.stage("registry: an OCI registry on " + strings.SplitN(repo, "/", 2)[0] + " (TLS, CA made for this run), crossplane xpkg push")
	if err := q.writeCA(); err != nil {
		return fail("registry", err)
	}
	pushErr := make(chan error, 1)
	go func() { pushErr <- q.push(shutdown) }()
	coreErr := q.startCrossplane(shutdown)
	if err := <-pushErr; err != nil {
		return fail("registry", err)
	}
	done("%s, %s and %s pushed, and the Squid image %s; CA %s", q.ref(providerPackage), q.ref(functionPackage), q.ref(configPackage), q.squidRef, q.caFile)

	done = q.progress.stage("Crossplane core v2.4.0: package manager and RBAC manager (webhooks off), trusting the registry's CA; started while the packages were pushed")
	if coreErr != nil {
		return fail("Crossplane core", coreErr)
	}
	done("running; PIDs %s (the RBAC manager in network namespace %s); logs in %s", q.pids(), q.core.RBACNetns(), filepath.Dir(q.core.Core.LogPath))

	done = q.progress.stage("packages installed: crossplane xpkg install provider, function, configuration; waiting for Healthy and their pods Ready")
	if err := q.runtimeConfigs(shutdown); err != nil {
		return fail("runtime configs", err)
	}
	if err := q.install(shutdown); err != nil {
		return fail("install", err)
	}
	where, err := q.running(shutdown)
	if err != nil {
		return fail("install", err)
	}
	done("Provider %s, Function %s and Configuration %s Healthy; %s", providerObject, functionObject, configPackage, where)

	if node {
		// Before the ClusterProviderConfig, which names its echo endpoint.
		done = q.progress.stage("upstream web server: a network namespace of its own in 198.18.0.0/15 (nothing leaves this machine)")
		if err := q.startUpstream(cp.Node.PodCIDR); err != nil {
			return fail("upstream", err)
		}
		done("%s (namespace %s)", q.pageURL, q.upstream.Netns)
	}

	done = q.progress.stage("ClusterProviderConfig pods for the local cluster (the standard class of the Configuration)")
	pcPath, err := q.providerConfigs(shutdown)
	if err != nil {
		return fail("ClusterProviderConfig", err)
	}
	done("PodProxies in namespace %s from %s, under the grant of cluster/rbac/podproxy.yaml; written to %s", proxyNamespace, q.squidRef, pcPath)

	fmt.Fprintf(os.Stderr, "\nmake run: ready for kubectl in %.1fs since make run began.\n\n", time.Since(t0).Seconds())
	fmt.Fprint(os.Stderr, q.nextCommands(kubeconfig))
	fmt.Fprintf(os.Stderr, "\nCtrl-C stops everything make run started.\n")

	tick := time.NewTicker(2 * time.Second)
	defer tick.Stop()
	for {
		select {
		case <-shutdown.Done():
			say("stopping: upstream, Crossplane, the registry, then the node (with the provider's and function's pods, or their processes) and the control plane")
			return 0
		case <-tick.C:
			if err := q.core.Running(); err != nil {
				say("%v", err)
				return 1
			}
		}
	}
}
