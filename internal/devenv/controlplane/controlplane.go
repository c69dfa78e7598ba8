// Package controlplane starts and stops a local Kubernetes control plane for
// tests and for `make run`: etcd and kube-apiserver through controller-runtime's
// envtest, and optionally kube-controller-manager (garbage collector,
// namespace, deployment and replicaset controllers), all as local processes
// built by hack/controlplane-bins.sh.
//
// Orphans: every process started here gets a parent-death signal (SIGKILL)
// tied to one OS thread that lives until Stop, so a test binary killed by a
// timeout takes its control plane with it. envtest starts etcd and
// kube-apiserver itself and sets only Setpgid on them; they get the signal
// through a wrapper script that execs them via util-linux's setpriv
// --pdeathsig. Without setpriv (logged as a warning) a killed parent leaves
// those two running.
package controlplane

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// Options configures Start.
type Options struct {
	// CRDDirectories are folders of CRD manifests (.yaml, .yml, .json; not
	// recursive), installed and waited for (Established) before Start
	// returns. A missing folder is an error.
	CRDDirectories []string

	// ControllerManager also runs kube-controller-manager with the
	// garbagecollector, namespace, deployment and replicaset controllers:
	// ownerReference cascades happen, deleted namespaces go away, and
	// Deployments get ReplicaSets and (Pending, node-less) Pods. It is
	// started after the CRDs are installed, so the garbage collector knows
	// them at once; CRDs created later are picked up by its 30 s discovery
	// resync.
	ControllerManager bool

	// BinDir holds etcd, kube-apiserver and kube-controller-manager.
	// Default: $EGRESSPROXY_CONTROLPLANE_BIN, or else the folder printed by
	// hack/controlplane-bins.sh (which builds only what is missing).
	BinDir string

	// Dir gets the data, certificates, PID files, kubeconfig and the default
	// log. Default: a temporary folder removed by Stop. A given Dir is kept;
	// the data of an earlier run in it is removed by Start.
	Dir string

	// Log receives the output of the control-plane processes, each line
	// prefixed with the process name. Default: the file controlplane.log in
	// Dir.
	Log io.Writer

	// Node also runs a node on this machine (Linux, as root): containerd,
	// a kubelet registered with the API server, kube-scheduler and
	// kube-proxy, with a bridge pod network; see Node. It implies
	// ControllerManager (with the EndpointSlice controller too, for
	// kube-proxy, and the node lifecycle controller). One node runs on a machine at a time: a second Start
	// with a node waits for the first to stop.
	Node *NodeOptions
}

// ControlPlane is a running local control plane.
type ControlPlane struct {
	// Config is an admin (system:masters) client configuration.
	Config *rest.Config
	// Kubeconfig is the admin kubeconfig, as written to KubeconfigPath.
	Kubeconfig []byte
	// KubeconfigPath is the admin kubeconfig file, usable by kubectl and by
	// the provider (KUBECONFIG=...).
	KubeconfigPath string
	// Dir is the folder holding everything the control plane writes.
	Dir string
	// LogPath is the file receiving the processes' output; empty when
	// Options.Log was given.
	LogPath string
	// BinDir is the folder the binaries were taken from.
	BinDir string
	// Node is the node, when Options.Node asked for one.
	Node *Node

	env       *envtest.Environment
	thread    *osThread
	log       *logMux
	logFile   *os.File
	removeDir bool

	mu    sync.Mutex
	procs map[string]proc

	kcm     *exec.Cmd
	kcmDone chan struct{}
	kcmErr  error

	stopOnce sync.Once
	stopErr  error
}

type proc struct {
	pid   int
	start uint64
}

const (
	startTimeout = 60 * time.Second
	stopTimeout  = 15 * time.Second
)

// kcmControllers are the kube-controller-manager controllers run with
// Options.ControllerManager, by their 1.35 names (the old aliases
// garbagecollector, namespace, deployment and replicaset work as well).
var kcmControllers = []string{"garbage-collector-controller", "namespace-controller", "deployment-controller", "replicaset-controller"}

// Start starts etcd and kube-apiserver (and kube-controller-manager when
// asked), installs the CRDs and writes the kubeconfig. ctx bounds the start
// only, not the life of the control plane: call Stop. On error everything
// already started has been stopped.
func Start(ctx context.Context, o Options) (_ *ControlPlane, retErr error) {
	c := &ControlPlane{procs: map[string]proc{}}
	defer func() {
		if retErr != nil {
			if tail := c.LogTail(30); tail != "" {
				retErr = fmt.Errorf("%w\nlast lines of the control-plane log:\n%s", retErr, tail)
			}
			if err := c.Stop(); err != nil {
				retErr = fmt.Errorf("%w (and stopping what had started: %w)", retErr, err)
			}
		}
	}()

	if err := c.prepareDir(o.Dir); err != nil {
		return nil, err
	}
	out := o.Log
	if out == nil {
		c.LogPath = filepath.Join(c.Dir, "controlplane.log")
		f, err := os.OpenFile(c.LogPath, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
		if err != nil {
			return nil, err
		}
		c.logFile, out = f, f
	}
	c.log = &logMux{w: out}

	c.BinDir = o.BinDir
	if c.BinDir == "" {
		d, err := BinDir(ctx, c.log.writer("[controlplane-bins] "))
		if err != nil {
			return nil, err
		}
		c.BinDir = d
	}
	if o.Node != nil {
		o.ControllerManager = true
	}
	need := []string{"etcd", "kube-apiserver"}
	if o.ControllerManager {
		need = append(need, "kube-controller-manager")
	}
	if err := checkBinaries(c.BinDir, need...); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}

	prefix := pdeathsigExec()
	if prefix == nil {
		fmt.Fprintln(c.log.writer("[controlplane] "), "warning: setpriv --pdeathsig is not available; etcd and kube-apiserver will outlive a killed parent")
	}
	etcdPath, err := c.wrapper("etcd", prefix)
	if err != nil {
		return nil, err
	}
	apiPath, err := c.wrapper("kube-apiserver", prefix)
	if err != nil {
		return nil, err
	}

	noExisting := false
	c.env = &envtest.Environment{
		ControlPlane: envtest.ControlPlane{
			Etcd: &envtest.Etcd{
				Path:    etcdPath,
				DataDir: filepath.Join(c.Dir, "etcd"),
				Out:     c.log.writer("[etcd] "),
				Err:     c.log.writer("[etcd] "),
			},
			APIServer: &envtest.APIServer{
				Path:    apiPath,
				CertDir: filepath.Join(c.Dir, "apiserver"),
				Out:     c.log.writer("[kube-apiserver] "),
				Err:     c.log.writer("[kube-apiserver] "),
			},
			// Never run; keeps envtest from looking for kubectl elsewhere.
			KubectlPath: filepath.Join(c.BinDir, "kubectl"),
		},
		CRDDirectoryPaths:        o.CRDDirectories,
		ErrorIfCRDPathMissing:    true,
		BinaryAssetsDirectory:    c.BinDir,
		UseExistingCluster:       &noExisting,
		ControlPlaneStartTimeout: startTimeout,
		ControlPlaneStopTimeout:  stopTimeout,
	}
	for _, d := range []string{c.env.ControlPlane.Etcd.DataDir, c.env.ControlPlane.APIServer.CertDir} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, err
		}
	}
	if o.Node != nil {
		// Before the API server starts: the node sets some of its flags.
		if c.Node, err = c.prepareNode(ctx, o.Node, c.env.ControlPlane.APIServer); err != nil {
			return nil, fmt.Errorf("node: %w", err)
		}
	}

	c.thread = newOSThread()
	t0 := time.Now()
	c.thread.do(func() { c.Config, err = c.env.Start() })
	c.recordPIDs("etcd", "kube-apiserver")
	if err != nil {
		return nil, fmt.Errorf("starting the control plane (output in %s): %w", c.logWhere(), err)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}

	c.Kubeconfig = c.env.KubeConfig
	c.KubeconfigPath = filepath.Join(c.Dir, "kubeconfig")
	if err := os.WriteFile(c.KubeconfigPath, c.Kubeconfig, 0o600); err != nil {
		return nil, err
	}

	note := c.log.writer("[controlplane] ")
	fmt.Fprintf(note, "etcd, kube-apiserver and %d CRD(s) up in %.2fs\n", len(c.env.CRDs), time.Since(t0).Seconds())
	if o.ControllerManager {
		t1 := time.Now()
		if err := c.startControllerManager(ctx, o.Node != nil); err != nil {
			return nil, err
		}
		fmt.Fprintf(note, "kube-controller-manager ready in %.2fs\n", time.Since(t1).Seconds())
	}
	if c.Node != nil {
		if err := c.Node.start(ctx, o.Node); err != nil {
			return nil, fmt.Errorf("node: %w", err)
		}
	}
	return c, nil
}

func (c *ControlPlane) prepareDir(dir string) error {
	if dir == "" {
		pruneStale()
		d, err := os.MkdirTemp("", tempPrefix)
		if err != nil {
			return err
		}
		c.Dir, c.removeDir = d, true
		return writeOwnerPID(d)
	}
	d, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	c.Dir = d
	// What follows removes folders of fixed names in d (and the node's):
	// only in a folder of its own.
	if ents, err := os.ReadDir(d); err == nil && len(ents) > 0 && !ownerRecorded(d) {
		return fmt.Errorf("the control plane's folder %s is not empty and holds no control plane's data (no pids/owner.pid): name a new or empty folder", d)
	}
	for _, sub := range []string{"etcd", "apiserver", "pids", "bin"} {
		if err := os.RemoveAll(filepath.Join(d, sub)); err != nil {
			return err
		}
	}
	if err := os.MkdirAll(d, 0o755); err != nil {
		return err
	}
	return writeOwnerPID(d)
}

const tempPrefix = "egressproxy-controlplane-"

// ownerRecorded says dir holds a control plane's data (writeOwnerPID).
func ownerRecorded(dir string) bool {
	_, err := os.Stat(filepath.Join(dir, "pids", "owner.pid"))
	return err == nil
}

// writeOwnerPID records the process owning the folder, for pruneStale.
func writeOwnerPID(dir string) error {
	if err := os.MkdirAll(filepath.Join(dir, "pids"), 0o755); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "pids", "owner.pid"), []byte(strconv.Itoa(os.Getpid())+"\n"), 0o644)
}

// pruneStale removes the temporary folders of earlier control planes whose
// owner was killed before Stop: their processes died with it (parent-death
// signal), but the folder, with etcd's preallocated 64 MB WAL, stayed. A
// folder is left alone while any process named in its PID files (owner
// included) runs, and for 5 minutes after it was created. A killed node's
// folder (see Node) is left alone too while the node's record
// (nodeRecordFile) points into it or anything is mounted below it: its
// containers may still run, their root filesystems and volumes (bind
// mounts of other folders) are mounted there, and its containerd's state
// names the shims' sockets the next node's sweep removes. That sweep
// unmounts them and records its own folder instead; the next pruneStale
// removes the folder.
func pruneStale() {
	pruneStaleIn(os.TempDir(), nodeRecordFile, "/proc/self/mountinfo")
}

// nodeRecordFile is where a node records its folder: nodeDirFile, named
// here too since this file builds on every system (none has it but
// Linux).
const nodeRecordFile = "/run/egressproxy-node.dir"

func pruneStaleIn(tmp, nodeRecord, mountinfo string) {
	dirs, _ := filepath.Glob(filepath.Join(tmp, tempPrefix+"*"))
	var node string
	if b, err := os.ReadFile(nodeRecord); err == nil {
		node = filepath.Clean(strings.TrimSpace(string(b)))
	}
	mounts := mountPoints(mountinfo)
	for _, d := range dirs {
		fi, err := os.Stat(d)
		if err != nil || !fi.IsDir() || time.Since(fi.ModTime()) < 5*time.Minute {
			continue
		}
		// Mount points are listed with symbolic links resolved.
		real, err := filepath.EvalSymlinks(d)
		if err != nil {
			continue
		}
		if anyRunning(d) || node != "." && (within(node, d) || within(node, real)) || slices.ContainsFunc(mounts, func(m string) bool { return within(m, real) }) {
			continue
		}
		_ = os.RemoveAll(d)
	}
}

// within says whether path is dir or below it.
func within(path, dir string) bool {
	return path == dir || strings.HasPrefix(path, dir+"/")
}

// mountPoints are the mount points mountinfo (/proc/self/mountinfo)
// lists, or none when it cannot be read.
func mountPoints(mountinfo string) []string {
	b, err := os.ReadFile(mountinfo)
	if err != nil {
		return nil
	}
	unescape := strings.NewReplacer(`\040`, " ", `\011`, "\t", `\012`, "\n", `\134`, `\`)
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 5 {
			out = append(out, unescape.Replace(f[4]))
		}
	}
	return out
}

func anyRunning(dir string) bool {
	files, _ := filepath.Glob(filepath.Join(dir, "pids", "*.pid"))
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && pid > 0 {
			if _, alive := procStartTime(pid); alive {
				return true
			}
		}
	}
	return false
}

// wrapper writes a script that records its PID (the exec keeps it) and execs
// the binary, through setpriv --pdeathsig when available. envtest runs it
// with --help first to probe flags; that run records nothing.
// gogc is the GOGC of etcd and kube-apiserver.
const gogc = 400

func (c *ControlPlane) wrapper(name string, prefix []string) (string, error) {
	binDir, pidDir := filepath.Join(c.Dir, "bin"), filepath.Join(c.Dir, "pids")
	for _, d := range []string{binDir, pidDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return "", err
		}
	}
	var argv []string
	for _, a := range append(prefix, filepath.Join(c.BinDir, name)) {
		argv = append(argv, shellQuote(a))
	}
	script := "#!/bin/sh\n" +
		"# written by internal/controlplane\n" +
		// A local control plane serves one user on a small machine: it
		// spends memory to save the CPU its garbage collection would take
		// (about a third of kube-apiserver's CPU under load at the default).
		"export GOGC=" + strconv.Itoa(gogc) + "\n" +
		`[ "$1" = --help ] || echo $$ > ` + shellQuote(filepath.Join(pidDir, name+".pid")) + "\n" +
		"exec " + strings.Join(argv, " ") + ` "$@"` + "\n"
	p := filepath.Join(binDir, name)
	return p, os.WriteFile(p, []byte(script), 0o755)
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// recordPIDs remembers the processes named in the PID files, with their
// start times, so Stop can make sure they are gone.
func (c *ControlPlane) recordPIDs(names ...string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, n := range names {
		b, err := os.ReadFile(filepath.Join(c.Dir, "pids", n+".pid"))
		if err != nil {
			continue
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil || pid <= 0 {
			continue
		}
		if st, ok := procStartTime(pid); ok {
			c.procs[n] = proc{pid: pid, start: st}
		}
	}
}

// PIDs returns the process IDs of the control-plane processes, by name
// (etcd, kube-apiserver, kube-controller-manager). They are also in
// Dir/pids/NAME.pid.
func (c *ControlPlane) PIDs() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	m := map[string]int{}
	for n, p := range c.procs {
		m[n] = p.pid
	}
	return m
}

// StartControllerManager starts kube-controller-manager, as
// Options.ControllerManager does, on a control plane started without it:
// for a test whose CRDs are made after the start (the garbage collector
// finds those only on its 30 s discovery resync). Stop stops it.
func (c *ControlPlane) StartControllerManager(ctx context.Context) error {
	if c.kcm != nil {
		return errors.New("kube-controller-manager runs already")
	}
	return c.startControllerManager(ctx, c.Node != nil)
}

func (c *ControlPlane) startControllerManager(ctx context.Context, node bool) error {
	controllers := kcmControllers
	if node {
		// kube-proxy routes ClusterIP Services to EndpointSlices; the
		// node lifecycle controller lifts the not-ready taint the kubelet
		// registers its Node with, once the Node is Ready.
		controllers = append(slices.Clone(controllers), "endpointslice-controller", "node-lifecycle-controller")
	}
	args := []string{
		"--kubeconfig=" + c.KubeconfigPath,
		"--controllers=" + strings.Join(controllers, ","),
		"--leader-elect=false",
		"--secure-port=0", // no serving at all: no port to collide on
		"--use-service-account-credentials=false",
	}
	synced := &markerWriter{marker: []byte(gcSyncedMarker), seen: make(chan struct{})}
	cmd := exec.Command(filepath.Join(c.BinDir, "kube-controller-manager"), args...)
	cmd.Dir = c.Dir
	cmd.Stdout = c.log.writer("[kube-controller-manager] ")
	cmd.Stderr = io.MultiWriter(c.log.writer("[kube-controller-manager] "), synced)
	cmd.SysProcAttr = sysProcAttr()
	var err error
	c.thread.do(func() { err = cmd.Start() })
	if err != nil {
		return fmt.Errorf("starting kube-controller-manager: %w", err)
	}
	c.kcm, c.kcmDone = cmd, make(chan struct{})
	go func() {
		c.kcmErr = cmd.Wait()
		close(c.kcmDone)
	}()
	st, _ := procStartTime(cmd.Process.Pid)
	c.mu.Lock()
	c.procs["kube-controller-manager"] = proc{pid: cmd.Process.Pid, start: st}
	c.mu.Unlock()
	_ = os.WriteFile(filepath.Join(c.Dir, "pids", "kube-controller-manager.pid"), []byte(strconv.Itoa(cmd.Process.Pid)+"\n"), 0o644)

	// With --secure-port=0 there is no health endpoint: its log says when
	// the garbage collector has synced (about 0.2 s after start here).
	// Without that line (another version may word it otherwise) Start goes
	// on after kcmReadyTimeout; a controller manager that exits fails it.
	select {
	case <-synced.seen:
	case <-c.kcmDone:
		return fmt.Errorf("kube-controller-manager exited at start: %w", c.kcmErr)
	case <-time.After(kcmReadyTimeout):
		fmt.Fprintf(c.log.writer("[controlplane] "), "warning: no %q from kube-controller-manager within %s; going on\n", gcSyncedMarker, kcmReadyTimeout)
	case <-ctx.Done():
		return ctx.Err()
	}
	return nil
}

const (
	gcSyncedMarker  = "all resource monitors have synced"
	kcmReadyTimeout = 15 * time.Second
)

// markerWriter closes seen the first time marker goes through it.
type markerWriter struct {
	marker []byte
	seen   chan struct{}
	carry  []byte
	done   bool
}

func (m *markerWriter) Write(b []byte) (int, error) {
	if m.done {
		return len(b), nil
	}
	buf := append(m.carry, b...)
	if bytes.Contains(buf, m.marker) {
		m.done, m.carry = true, nil
		close(m.seen)
		return len(b), nil
	}
	if keep := len(m.marker) - 1; len(buf) > keep {
		buf = buf[len(buf)-keep:]
	}
	m.carry = append([]byte(nil), buf...)
	return len(b), nil
}

// Stop stops everything Start started (kube-controller-manager, then
// kube-apiserver, then etcd: SIGTERM, SIGKILL after 15 s), waits until each
// process is gone, and removes Dir if Start created it. It may be called
// more than once.
func (c *ControlPlane) Stop() error {
	c.stopOnce.Do(func() { c.stopErr = c.stop() })
	return c.stopErr
}

func (c *ControlPlane) stop() error {
	var errs []error
	if c.Node != nil {
		// First: its pods' teardown needs containerd, and nothing of the
		// control plane.
		if err := c.Node.stop(); err != nil {
			errs = append(errs, fmt.Errorf("node: %w", err))
		}
	}
	if c.kcm != nil {
		_ = c.kcm.Process.Signal(syscall.SIGTERM)
		select {
		case <-c.kcmDone:
		case <-time.After(stopTimeout):
			_ = c.kcm.Process.Kill()
			<-c.kcmDone
			errs = append(errs, errors.New("kube-controller-manager did not stop on SIGTERM; killed"))
		}
	}
	if c.env != nil && c.thread != nil {
		var err error
		c.thread.do(func() { err = c.env.Stop() })
		if err != nil {
			errs = append(errs, fmt.Errorf("stopping etcd and kube-apiserver: %w", err))
		}
	}
	// envtest kills a process that ignores SIGTERM but does not wait for it,
	// and forgets processes of a start that failed half-way: make sure
	// nothing recorded remains.
	if c.Dir != "" {
		c.recordPIDs("etcd", "kube-apiserver")
	}
	c.mu.Lock()
	procs := c.procs
	c.mu.Unlock()
	for name, p := range procs {
		if err := killAndWait(p, 10*time.Second); err != nil {
			errs = append(errs, fmt.Errorf("%s (pid %d): %w", name, p.pid, err))
		}
	}
	if c.thread != nil {
		c.thread.close()
	}
	if c.logFile != nil {
		_ = c.logFile.Close()
	}
	if c.removeDir {
		if err := os.RemoveAll(c.Dir); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// killAndWait SIGKILLs p if it still runs and waits until it is gone (or a
// zombie waiting for its parent's Wait).
func killAndWait(p proc, timeout time.Duration) error {
	if st, ok := procStartTime(p.pid); !ok || st != p.start {
		return nil
	}
	_ = syscall.Kill(p.pid, syscall.SIGKILL)
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if st, ok := procStartTime(p.pid); !ok || st != p.start {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return errors.New("still running after SIGKILL")
}

func (c *ControlPlane) logWhere() string {
	if c.LogPath != "" {
		return c.LogPath
	}
	return "Options.Log"
}

// LogTail returns up to the last n lines of the log file, when Start wrote
// its own (Options.Log unset) and it still exists.
func (c *ControlPlane) LogTail(n int) string {
	if c.LogPath == "" {
		return ""
	}
	b, err := os.ReadFile(c.LogPath)
	if err != nil {
		return ""
	}
	lines := strings.SplitAfter(string(b), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "")
}

// osThread runs functions on one locked OS thread. The parent-death signal
// of a child fires when the thread that forked it exits, not the process;
// starting every child from this thread, which lives until Stop, keeps the
// Go runtime's thread management from killing them early.
type osThread struct {
	work chan func()
}

func newOSThread() *osThread {
	t := &osThread{work: make(chan func())}
	go func() {
		// Never unlocked: when this goroutine returns (after Stop) the
		// thread exits, which signals anything it started still running.
		runtime.LockOSThread()
		for f := range t.work {
			f()
		}
	}()
	return t
}

func (t *osThread) do(f func()) {
	done := make(chan struct{})
	t.work <- func() { defer close(done); f() }
	<-done
}

func (t *osThread) close() { close(t.work) }

// logMux serialises the output of several processes into one writer, a
// whole line at a time, each line prefixed with its process name.
type logMux struct {
	mu sync.Mutex
	w  io.Writer
}

func (m *logMux) writer(prefix string) io.Writer { return &prefixWriter{m: m, prefix: []byte(prefix)} }

type prefixWriter struct {
	m      *logMux
	prefix []byte
	buf    []byte
}

func (p *prefixWriter) Write(b []byte) (int, error) {
	p.buf = append(p.buf, b...)
	for {
		i := bytes.IndexByte(p.buf, '\n')
		if i < 0 && len(p.buf) < 64<<10 {
			break
		}
		line := p.buf
		if i >= 0 {
			line = p.buf[:i+1]
		}
		p.m.mu.Lock()
		_, _ = p.m.w.Write(append(append([]byte{}, p.prefix...), line...))
		if i < 0 {
			_, _ = p.m.w.Write([]byte{'\n'})
		}
		p.m.mu.Unlock()
		p.buf = p.buf[len(line):]
	}
	if len(p.buf) == 0 {
		p.buf = nil
	}
	return len(b), nil
}

const (
	// EnvBinDir names the environment variable that, when set, names the
	// folder holding etcd, kube-apiserver and kube-controller-manager, and
	// replaces running hack/controlplane-bins.sh.
	EnvBinDir = "EGRESSPROXY_CONTROLPLANE_BIN"

	modulePath = "github.com/egressproxy/provider-egressproxy"
	binsScript = "hack/controlplane-bins.sh"
)

// BinDir returns the folder holding the control-plane binaries: the value of
// EGRESSPROXY_CONTROLPLANE_BIN if set, otherwise the folder printed by
// hack/controlplane-bins.sh, which builds the binaries from the Go module
// proxy only when they are missing (about 6 minutes cold, instant when
// cached). The script's progress goes to log (may be nil).
func BinDir(ctx context.Context, log io.Writer) (string, error) {
	if d := os.Getenv(EnvBinDir); d != "" {
		return d, nil
	}
	return runBinsScript(ctx, log, binsScript)
}

// runBinsScript runs one of the hack/*-bins.sh scripts and returns the
// folder it prints last.
func runBinsScript(ctx context.Context, log io.Writer, script string) (string, error) {
	root, err := RepoRoot()
	if err != nil {
		return "", err
	}
	var stdout bytes.Buffer
	tail := &tailBuffer{max: 4096}
	var stderr io.Writer = tail
	if log != nil {
		stderr = io.MultiWriter(log, tail)
	}
	cmd := exec.CommandContext(ctx, "bash", filepath.Join(root, script))
	cmd.Dir = root
	cmd.Stdout = &stdout
	cmd.Stderr = stderr
	// Own process group, so cancelling kills the go builds it runs too; the
	// parent-death signal only reaches bash itself.
	cmd.SysProcAttr = sysProcAttr()
	cmd.Cancel = func() error { return killGroup(cmd.Process.Pid) }
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("%s failed: %w; last output:\n%s", script, err, tail.String())
	}
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	dir := strings.TrimSpace(lines[len(lines)-1])
	if dir == "" {
		return "", fmt.Errorf("%s printed no folder; last output:\n%s", script, tail.String())
	}
	return dir, nil
}

// RepoRoot finds the root of this repository: from this source file's
// location when the build kept it, otherwise by walking up from the working
// directory to the go.mod of this module.
func RepoRoot() (string, error) {
	if _, file, _, ok := runtime.Caller(0); ok && filepath.IsAbs(file) {
		root := filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
		if isRepoRoot(root) {
			return root, nil
		}
	}
	wd, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for d := wd; ; d = filepath.Dir(d) {
		if isRepoRoot(d) {
			return d, nil
		}
		if filepath.Dir(d) == d {
			break
		}
	}
	return "", fmt.Errorf("cannot find the %s repository (with %s) above %s; set %s to a folder holding etcd, kube-apiserver and kube-controller-manager",
		modulePath, binsScript, wd, EnvBinDir)
}

func isRepoRoot(d string) bool {
	mod, err := os.ReadFile(filepath.Join(d, "go.mod"))
	if err != nil {
		return false
	}
	first, _, _ := strings.Cut(string(mod), "\n")
	if strings.TrimSpace(first) != "module "+modulePath {
		return false
	}
	_, err = os.Stat(filepath.Join(d, binsScript))
	return err == nil
}

func checkBinaries(dir string, names ...string) error {
	var missing []string
	for _, n := range names {
		fi, err := os.Stat(filepath.Join(dir, n))
		if err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
			missing = append(missing, n)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("control-plane binaries missing from %s: %s (run %s, or point %s at a folder holding them)",
			dir, strings.Join(missing, ", "), binsScript, EnvBinDir)
	}
	return nil
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	max int
	b   []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.b = append(t.b, p...)
	if len(t.b) > t.max {
		t.b = append(t.b[:0], t.b[len(t.b)-t.max:]...)
	}
	return len(p), nil
}

func (t *tailBuffer) String() string { return string(t.b) }

func killGroup(pid int) error {
	err := syscall.Kill(-pid, syscall.SIGKILL)
	if errors.Is(err, syscall.ESRCH) {
		return os.ErrProcessDone
	}
	return err
}

// FreePort is a TCP port free on 127.0.0.1 at the time of the call, for a
// process that is told the port it listens on.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil //nolint:forcetypeassert // a TCP listener.
}
