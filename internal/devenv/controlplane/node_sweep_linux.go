//go:build linux

package controlplane

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/egressproxy/provider-egressproxy/internal/devenv/forwarding"
)

// sweep removes what this node made that a clean stop would have removed
// already, and reports what it had to remove as an error when the node
// ran (a clean stop leaves nothing: the test checks).
func (n *Node) sweep() error {
	if err := sweepNodes(n.c.log.writer("[node] ")); err != nil {
		return err
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

// sweepNodes removes what a node of this package left on this machine,
// found by the names the node gives everything it makes: processes in its
// cgroups (nodeCgroup) and containerd shims of its folder, mounts below
// its folder (containers' root filesystems, volumes, the pods' network
// namespaces), the pod bridges (bridgePrefix), kube-proxy's iptables
// chains and the rules jumping to them (only when a node ran: kube-proxy's
// names are fixed, see proxyChains), its cgroups and the kubelet's links
// to its logs (see nodeLogLinks), its kubelet's socket and checkpoint in
// the kubelet's device plugin folder (see ownDevicePluginFiles), libcni's
// cache of its network's results, and the folders outside its own that
// it made (madeDirsFile) once they are empty; and it puts back the kernel
// settings recorded in sysctlsFile where the kubelet's or the CNI
// plugin's value is still in place. Call it holding the node lock.
func sweepNodes(log io.Writer) error {
	var errs []error
	// Containers (and pause) live in the node's cgroup; shims are
	// containerd's children, started with its socket path on their command
	// line.
	for _, pid := range append(nodeCgroupPIDs(), nodeShimPIDs()...) {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	waitGone(append(nodeCgroupPIDs(), nodeShimPIDs()...), 10*time.Second)
	for _, p := range nodeShimSockets() {
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}

	for _, m := range nodeMounts() {
		if err := syscall.Unmount(m, syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) && !errors.Is(err, syscall.ENOENT) {
			errs = append(errs, fmt.Errorf("unmount %s: %w", m, err))
		}
	}
	for _, br := range bridges() {
		if out, err := exec.Command("ip", "link", "delete", br).CombinedOutput(); err != nil {
			errs = append(errs, fmt.Errorf("ip link delete %s: %w: %s", br, err, out))
		}
	}
	if recordedNodeDir() != "" {
		// The same look for a running kube-proxy as before a node starts
		// (prepareNode), at stop too.
		if sign := runningKubeProxy(); sign != "" {
			// Started since the node was killed: the chains are its now.
			errs = append(errs, fmt.Errorf("kube-proxy's chains are left as they are: another kube-proxy runs on this machine (%s)", sign))
		} else {
			kept := keptChains()
			for _, ipt := range iptablesCommands() {
				if err := sweepChains(ipt, kept); err != nil {
					errs = append(errs, err)
				}
			}
		}
	}
	// A cgroup whose last process was just killed may stay busy until
	// that process is reaped.
	_ = poll(context.Background(), 50*time.Millisecond, 10*time.Second, func() (bool, error) {
		for _, cg := range nodeCgroups() {
			removeCgroup(cg)
		}
		return len(nodeCgroups()) == 0, nil
	}, func() error { return nil })
	if err := removeLogLinks(recordedNodeDir()); err != nil {
		errs = append(errs, err)
	}
	// The kubelet is gone: its socket and checkpoint are left over.
	if err := removeDevicePluginFiles(); err != nil {
		errs = append(errs, err)
	}
	for _, p := range nodeCNIResults() {
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	// Once their contents of the node's are gone.
	if err := sweepMadeDirs(); err != nil {
		errs = append(errs, err)
	}
	// Last: forwarding off only once no pod of the node is left, and
	// only when no running part of the project holds it (a killed node's
	// hold counts for nothing).
	if err := restoreRecordedSysctls(); err != nil {
		errs = append(errs, err)
	}
	if err := forwarding.Sweep(); err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		fmt.Fprintf(log, "sweep: %v\n", errors.Join(errs...))
	}
	return errors.Join(errs...)
}

// Leftovers lists what a node of this package leaves on this machine when
// it is not stopped cleanly: processes in its cgroups, containerd shims of
// a node, mounts below a node folder, pod bridges, kube-proxy's iptables
// chains (but those another component had before the node started), the
// node's cgroups, the kubelet's links to its logs, kernel settings not put
// back, the kubelet's device plugin socket and checkpoint, libcni's cached
// results of its network, empty folders it made outside its own. Empty
// after a clean stop.
func Leftovers() []string {
	var out []string
	if p := nodeCgroupPIDs(); len(p) > 0 {
		out = append(out, fmt.Sprintf("processes in the node's cgroups %v", p))
	}
	if p := nodeShimPIDs(); len(p) > 0 {
		out = append(out, fmt.Sprintf("containerd shims %v", p))
	}
	if p := nodeShimSockets(); len(p) > 0 {
		out = append(out, fmt.Sprintf("shim sockets %v", p))
	}
	if m := nodeMounts(); len(m) > 0 {
		out = append(out, fmt.Sprintf("mounts %v", m))
	}
	if b := bridges(); len(b) > 0 {
		out = append(out, fmt.Sprintf("bridges %v", b))
	}
	kept := keptChains()
	for _, ipt := range iptablesCommands() {
		if r := nodeRules(ipt, kept); len(r) > 0 {
			out = append(out, fmt.Sprintf("%s rules %v", ipt, r))
		}
	}
	if cg := nodeCgroups(); len(cg) > 0 {
		out = append(out, fmt.Sprintf("cgroups %v", cg))
	}
	if l := nodeLogLinks(recordedNodeDir()); len(l) > 0 {
		out = append(out, fmt.Sprintf("log links %v", l))
	}
	if own, _ := nodeDevicePluginFiles(); len(own) > 0 {
		out = append(out, fmt.Sprintf("the kubelet's device plugin files %v", own))
	}
	if fileExists(devicePluginsFile) {
		out = append(out, "the record of the kubelet's device plugin files "+devicePluginsFile)
	}
	if p := nodeCNIResults(); len(p) > 0 {
		out = append(out, fmt.Sprintf("CNI results %v", p))
	}
	if d := emptyMadeDirs(); len(d) > 0 {
		out = append(out, fmt.Sprintf("empty folders the node made %v", d))
	}
	if b, err := os.ReadFile(sysctlsFile); err == nil {
		out = append(out, fmt.Sprintf("kernel settings to put back (%s) %q", sysctlsFile, strings.TrimSpace(string(b))))
	}
	return out
}

// restoreRecordedSysctls puts back the kernel settings a node recorded in
// sysctlsFile (only those a node changes: kernelTunables, and the
// forwardingSysctls of an earlier version's record, and only where the
// kubelet's or the CNI plugin's value is still in place: putBackSysctl)
// and removes the record (and a half-written one).
func restoreRecordedSysctls() error {
	_ = os.Remove(sysctlsFile + ".tmp")
	b, err := os.ReadFile(sysctlsFile)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var errs []error
	for k, v := range parseSysctls(b) {
		if slices.Contains(forwardingSysctls, k) {
			// Through the holds: a running part may need it now.
			if err := forwarding.PutBack(v); err != nil {
				errs = append(errs, err)
			}
			continue
		}
		if err := putBackSysctl(k, v); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	return os.Remove(sysctlsFile)
}

// parseSysctls reads the lines writeSysctls writes, keeping only the
// settings a node records: the file is read as root.
func parseSysctls(b []byte) map[string]string {
	out := map[string]string{}
	for _, l := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(l), " ")
		if ok && (slices.Contains(kernelTunables, k) || slices.Contains(forwardingSysctls, k)) {
			out[k] = v
		}
	}
	return out
}

// nodeLogLinks are the links in containerLogDir a node's kubelet made:
// those into dir (a node's folder), and those left dangling into any
// node's pod logs in a control plane's temporary folder (a node killed
// and its folder removed since). Never a link that points elsewhere.
func nodeLogLinks(dir string) []string {
	ents, _ := os.ReadDir(containerLogDir)
	var out []string
	for _, e := range ents {
		if e.Type()&os.ModeSymlink == 0 {
			continue
		}
		p := filepath.Join(containerLogDir, e.Name())
		target, err := os.Readlink(p)
		if err != nil {
			continue
		}
		if !filepath.IsAbs(target) {
			target = filepath.Join(containerLogDir, target)
		}
		target = filepath.Clean(target)
		switch {
		case dir != "" && strings.HasPrefix(target, dir+"/"):
			out = append(out, p)
		case isNodePodLog(target) && !fileExists(target):
			out = append(out, p)
		}
	}
	return out
}

// isNodePodLog is whether path is below the pod-logs folder of a node in
// a control plane's temporary folder (<TMPDIR>/<tempPrefix>*/node/kubelet/pod-logs).
func isNodePodLog(path string) bool {
	i := strings.Index(path, "/"+tempPrefix)
	if i < 0 {
		return false
	}
	_, rest, ok := strings.Cut(path[i+1:], "/")
	return ok && strings.HasPrefix(rest, "node/kubelet/pod-logs/")
}

// removeLogLinks removes nodeLogLinks(dir). containerLogDir itself goes
// with the other folders the node made (sweepMadeDirs), once empty.
func removeLogLinks(dir string) error {
	var errs []error
	for _, l := range nodeLogLinks(dir) {
		if err := os.Remove(l); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
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

// shimSocketDir is where containerd 1.6 puts its shims' sockets, whatever
// its state folder: each named by a hash of containerd's socket, the
// namespace and the task, so the node's never collide with another
// containerd's. A shim killed (not stopped) leaves its socket behind.
const shimSocketDir = "/run/containerd/s"

// nodeShimSockets are the sockets there of the recorded node's tasks (its
// containerd's state folder still lists them after a kill).
func nodeShimSockets() []string {
	dir := recordedNodeDir()
	if dir == "" {
		return nil
	}
	sock := filepath.Join(dir, "containerd", "containerd.sock")
	tasks, _ := filepath.Glob(filepath.Join(dir, "containerd", "state", "io.containerd.runtime.v2.task", "*", "*"))
	var out []string
	for _, t := range tasks {
		sum := sha256.Sum256([]byte(filepath.Join(sock, filepath.Base(filepath.Dir(t)), filepath.Base(t))))
		if p := filepath.Join(shimSocketDir, hex.EncodeToString(sum[:])); fileExists(p) {
			out = append(out, p)
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
// root filesystems, the kubelet's volumes, sandboxes' /dev/shm, the pods'
// network namespaces), deepest first.
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
		if dir != "" && strings.HasPrefix(mp, dir+"/") {
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
