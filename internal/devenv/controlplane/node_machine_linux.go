//go:build linux

package controlplane

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"time"
)

// What the node's processes write outside the node's folder, at paths
// they fix whatever their configuration says:
//
//   - the kubelet: its device plugin registration socket and checkpoint in
//     devicePluginDir (kubelet 1.35 uses that path whatever --root-dir says,
//     and at start removes every socket in it), and the links to its
//     containers' logs in containerLogDir;
//   - the containerd shims: their sockets in shimSocketDir (containerd 1.6
//     fixes /run/containerd/s; a ctr client's IO fifos go to
//     /run/containerd/fifo);
//   - libcni in containerd's CRI plugin: its cache of results in
//     cniResultsDir (containerd 1.6 has no setting for libcni's cache
//     folder, and libcni reads no environment variable for it).
//
// The folders among machineDirs that are missing when the node starts are
// recorded in madeDirsFile; stop and the sweep remove the node's files in
// them and then each recorded folder once it is empty, and keep a folder in
// the record until it is gone (one holding another's files stays, and
// stays recorded).
const (
	// devicePluginDir is the kubelet's device plugin folder (the
	// deviceplugin/v1beta1 API's DevicePluginPath).
	devicePluginDir = "/var/lib/kubelet/device-plugins"
	// kubeletSocket and kubeletCheckpoint are what a kubelet makes there:
	// its registration socket and its device manager's checkpoint.
	kubeletSocket     = "kubelet.sock"
	kubeletCheckpoint = "kubelet_internal_checkpoint"
	// devicePluginsFile records that devicePluginDir held nothing when the
	// node's kubelet started, so that the kubelet.sock and checkpoint in it
	// are that kubelet's: stop and the sweep remove them, then the record.
	devicePluginsFile = "/run/egressproxy-node.device-plugins"
	// cniResultsDir is libcni's cache of the results of the node's network
	// (files "egressproxy-<container>-<interface>": the CNI network's name
	// is the project's, see startContainerd).
	cniResultsDir = "/var/lib/cni/results"
	// containerdFIFODir is where containerd's client library puts task IO
	// fifos by default.
	containerdFIFODir = "/run/containerd/fifo"
	// madeDirsFile lists the folders of machineDirs the node made (they
	// were missing before it started), one a line.
	madeDirsFile = "/run/egressproxy-node.made-dirs"
)

// machineDirs are the folders outside the node's folder that the node's
// processes may create, parents before their children.
var machineDirs = []string{
	filepath.Dir(devicePluginDir), devicePluginDir,
	containerLogDir,
	filepath.Dir(cniResultsDir), cniResultsDir,
	filepath.Dir(shimSocketDir), shimSocketDir, containerdFIFODir,
}

// missingDirs are those of dirs for which exists is false.
func missingDirs(dirs []string, exists func(string) bool) []string {
	var out []string
	for _, d := range dirs {
		if !exists(d) {
			out = append(out, d)
		}
	}
	return out
}

// readMadeDirs reads madeDirsFile, and the record of containerLogDir an
// earlier version of the node wrote (madeLogDirFile). Only machineDirs
// count: the file is read as root.
func readMadeDirs() []string {
	b, _ := os.ReadFile(madeDirsFile)
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if l = strings.TrimSpace(l); slices.Contains(machineDirs, l) && !slices.Contains(out, l) {
			out = append(out, l)
		}
	}
	if fileExists(madeLogDirFile) && !slices.Contains(out, containerLogDir) {
		out = append(out, containerLogDir)
	}
	return out
}

// writeMadeDirs replaces madeDirsFile with dirs in one rename (and
// removes it when there are none), then the older record of
// containerLogDir, now in it.
func writeMadeDirs(dirs []string) error {
	if len(dirs) == 0 {
		if err := os.Remove(madeDirsFile); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	} else {
		tmp := madeDirsFile + ".tmp"
		if err := os.WriteFile(tmp, []byte(strings.Join(dirs, "\n")+"\n"), 0o600); err != nil {
			return err
		}
		if err := os.Rename(tmp, madeDirsFile); err != nil {
			return err
		}
	}
	if err := os.Remove(madeLogDirFile); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// recordMadeDirs adds the machineDirs missing now to madeDirsFile (which
// still holds those an earlier node made and could not remove yet). It
// runs before any of the node's processes starts.
func recordMadeDirs() error {
	dirs := readMadeDirs()
	for _, d := range missingDirs(machineDirs, fileExists) {
		if !slices.Contains(dirs, d) {
			dirs = append(dirs, d)
		}
	}
	return writeMadeDirs(dirs)
}

// removeMadeDirs removes the folders of dirs, deepest first, with rmdir
// (so only an empty one goes), and returns those still there: a folder
// that holds something (another's files, or the node's it failed to
// remove) stays recorded and is not an error; one already gone is dropped.
func removeMadeDirs(dirs []string, rmdir func(string) error) (left []string, err error) {
	sorted := slices.Clone(dirs)
	slices.SortStableFunc(sorted, func(a, b string) int {
		return strings.Count(b, "/") - strings.Count(a, "/")
	})
	var errs []error
	for _, d := range sorted {
		switch err := rmdir(d); {
		case err == nil, errors.Is(err, os.ErrNotExist):
		case errors.Is(err, syscall.ENOTEMPTY), errors.Is(err, syscall.EEXIST):
			left = append(left, d)
		default:
			left = append(left, d)
			errs = append(errs, fmt.Errorf("removing %s, which the node made: %w", d, err))
		}
	}
	// In the record's order again.
	left = slices.DeleteFunc(slices.Clone(dirs), func(d string) bool { return !slices.Contains(left, d) })
	return left, errors.Join(errs...)
}

// sweepMadeDirs removes the recorded folders that are empty now and keeps
// the others in the record.
func sweepMadeDirs() error {
	dirs := readMadeDirs()
	if len(dirs) == 0 && !fileExists(madeDirsFile) {
		return nil
	}
	left, err := removeMadeDirs(dirs, syscall.Rmdir)
	return errors.Join(err, writeMadeDirs(left))
}

// emptyMadeDirs are the recorded folders that are empty (a clean stop
// removes them).
func emptyMadeDirs() []string {
	var out []string
	for _, d := range readMadeDirs() {
		if ents, err := os.ReadDir(d); err == nil && len(ents) == 0 {
			out = append(out, d)
		}
	}
	return out
}

// cniResult matches the names of libcni's cached results of the node's
// network: "egressproxy-<64 hex container ID>-<interface>".
var cniResult = regexp.MustCompile(`^egressproxy-[0-9a-f]{64}-[A-Za-z0-9_.-]+$`)

// nodeCNIResults are libcni's cached results of the node's network (a
// pod torn down through CNI removes its own; a killed node's stay).
func nodeCNIResults() []string {
	ents, _ := os.ReadDir(cniResultsDir)
	var out []string
	for _, e := range ents {
		if e.Type().IsRegular() && cniResult.MatchString(e.Name()) {
			out = append(out, filepath.Join(cniResultsDir, e.Name()))
		}
	}
	return out
}

// devicePluginEntry is one entry of devicePluginDir as the decisions below
// see it.
type devicePluginEntry struct {
	name string
	// socket: a Unix socket; listening: one that accepts connections.
	socket, listening bool
}

// ownDevicePluginFiles are the names among ents that a node's kubelet
// made, given whether devicePluginsFile records that the folder was empty
// when it started (marked), and whether the kubelet's root
// (/var/lib/kubelet) holds nothing but the device plugin folder
// (onlyDevicePlugins):
//
//   - marked: the kubelet's socket, unless something listens on it (a
//     kubelet started since the node's died has bound it anew), and its
//     checkpoint;
//   - not marked (a node of a version that kept no record): the socket
//     alone, when it is the folder's only entry, nobody listens on it and
//     the kubelet's root holds nothing else. A kubelet of another
//     Kubernetes using that root keeps its state there (pods/, plugins/,
//     pki/, ...) and listens on its socket while it runs; a stale socket
//     in an otherwise empty tree is what a stopped kubelet with a root of
//     its own elsewhere leaves, and the next kubelet to start there
//     removes it as well.
func ownDevicePluginFiles(ents []devicePluginEntry, marked, onlyDevicePlugins bool) []string {
	var out []string
	if marked {
		for _, e := range ents {
			if e.name == kubeletSocket && e.socket && !e.listening || e.name == kubeletCheckpoint && !e.socket {
				out = append(out, e.name)
			}
		}
		return out
	}
	if onlyDevicePlugins && len(ents) == 1 && ents[0].name == kubeletSocket && ents[0].socket && !ents[0].listening {
		out = append(out, kubeletSocket)
	}
	return out
}

// foreignDevicePluginFiles are the names among ents that are not in own.
func foreignDevicePluginFiles(ents []devicePluginEntry, own []string) []string {
	var out []string
	for _, e := range ents {
		if !slices.Contains(own, e.name) {
			out = append(out, e.name)
		}
	}
	return out
}

// readDevicePluginDir lists devicePluginDir.
func readDevicePluginDir() []devicePluginEntry {
	ents, _ := os.ReadDir(devicePluginDir)
	var out []devicePluginEntry
	for _, e := range ents {
		p := filepath.Join(devicePluginDir, e.Name())
		entry := devicePluginEntry{name: e.Name()}
		if fi, err := os.Lstat(p); err == nil && fi.Mode()&os.ModeSocket != 0 {
			entry.socket = true
			if c, err := net.DialTimeout("unix", p, time.Second); err == nil {
				_ = c.Close()
				entry.listening = true
			}
		}
		out = append(out, entry)
	}
	return out
}

// onlyDevicePluginsInKubeletRoot says whether /var/lib/kubelet holds
// nothing but the device plugin folder.
func onlyDevicePluginsInKubeletRoot() bool {
	ents, err := os.ReadDir(filepath.Dir(devicePluginDir))
	return err == nil && len(ents) == 1 && ents[0].Name() == filepath.Base(devicePluginDir)
}

// nodeDevicePluginFiles are the paths in devicePluginDir a node's kubelet
// made (ownDevicePluginFiles), and the others, by name.
func nodeDevicePluginFiles() (own []string, foreign []string) {
	ents := readDevicePluginDir()
	names := ownDevicePluginFiles(ents, fileExists(devicePluginsFile), onlyDevicePluginsInKubeletRoot())
	for _, n := range names {
		own = append(own, filepath.Join(devicePluginDir, n))
	}
	return own, foreignDevicePluginFiles(ents, names)
}

// foreignDevicePlugins names what another Kubernetes keeps in
// devicePluginDir (what a node's kubelet did not make), or is "": the
// node's kubelet would remove its sockets when it starts.
func foreignDevicePlugins() string {
	if _, foreign := nodeDevicePluginFiles(); len(foreign) > 0 {
		return fmt.Sprintf("%s holds %s, which the node did not make (a kubelet removes every socket there when it starts, whatever its --root-dir)", devicePluginDir, strings.Join(foreign, ", "))
	}
	return ""
}

// removeDevicePluginFiles removes the files a node's kubelet made in
// devicePluginDir, then devicePluginsFile. A leftover of a node that kept
// no record (ownDevicePluginFiles' second case) goes with its folders,
// which that node's kubelet made: devicePluginDir and /var/lib/kubelet,
// each only when empty.
func removeDevicePluginFiles() error {
	own, _ := nodeDevicePluginFiles()
	legacy := len(own) > 0 && !fileExists(devicePluginsFile)
	var errs []error
	for _, p := range own {
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	if legacy {
		if _, err := removeMadeDirs([]string{filepath.Dir(devicePluginDir), devicePluginDir}, syscall.Rmdir); err != nil {
			return err
		}
	}
	if err := os.Remove(devicePluginsFile); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// foreignKubernetes names a sign of another Kubernetes on this machine
// whose state a node would break, or is "": a kube-proxy running (its
// process, or a distribution's running one inside, or its nftables
// table), kube-proxy's chains when no node of this package ran since they
// could be a killed node's (after the sweep, swept: any), and files in
// the kubelet's device plugin folder a node did not make. Called holding
// the node lock, before the sweep (which removes kube-proxy's chains) and
// after it.
func foreignKubernetes(swept bool) string {
	if sign := runningKubeProxy(); sign != "" {
		return sign
	}
	if swept || recordedNodeDir() == "" {
		if sign := foreignProxyChains(); sign != "" {
			return sign
		}
	}
	return foreignDevicePlugins()
}
