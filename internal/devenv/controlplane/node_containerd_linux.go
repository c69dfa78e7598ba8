//go:build linux

package controlplane

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/egressproxy/provider-egressproxy/internal/devenv/ociimage"
)

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
  # The pods' network namespaces below the state folder, not as
  # /run/netns/cni-*, where another containerd keeps its own.
  netns_mounts_under_state_dir = true
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
