//go:build linux

package controlplane

import (
	"os"
	"syscall"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

func TestKubeProxyProcess(t *testing.T) {
	cases := map[string]struct {
		comm, argv0 string
		want        bool
	}{
		"KubeProxy":          {comm: "kube-proxy\n", argv0: "/usr/local/bin/kube-proxy", want: true},
		"K3sServer":          {comm: "k3s-server\n", argv0: "/usr/local/bin/k3s", want: true},
		"K3sAgent":           {comm: "k3s-agent\n", argv0: "/usr/local/bin/k3s agent", want: true},
		"K3sRewrittenArgv":   {comm: "whatever\n", argv0: "/usr/local/bin/k3s server", want: true},
		"MicroK8sKubelite":   {comm: "kubelite\n", argv0: "/snap/microk8s/current/kubelite", want: true},
		"RKE2":               {comm: "rke2\n", argv0: "/usr/local/bin/rke2", want: true},
		"K0s":                {comm: "k0s\n", argv0: "/usr/local/bin/k0s", want: true},
		"Kubelet":            {comm: "kubelet\n", argv0: "/usr/bin/kubelet"},
		"Containerd":         {comm: "containerd\n", argv0: "containerd"},
		"LookAlikePrefix":    {comm: "kube-proxy-x\n", argv0: "/bin/kube-proxy-x"},
		"NameInAnArgument":   {comm: "bash\n", argv0: "bash"},
		"NoCommandLine":      {comm: "kthreadd\n"},
		"K3sInAFolderName":   {comm: "sleep\n", argv0: "/opt/k3s/sleep"},
		"ControlPlaneBinary": {comm: "controlplane.te\n", argv0: "/tmp/go-build1/b001/controlplane.test"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if got := kubeProxyProcess(tc.comm, tc.argv0); got != tc.want {
				t.Errorf("kubeProxyProcess(%q, %q) = %v, want %v", tc.comm, tc.argv0, got, tc.want)
			}
		})
	}
}

func TestDevicePluginFiles(t *testing.T) {
	sock := devicePluginEntry{name: kubeletSocket, socket: true}
	listening := devicePluginEntry{name: kubeletSocket, socket: true, listening: true}
	checkpoint := devicePluginEntry{name: kubeletCheckpoint}
	plugin := devicePluginEntry{name: "nvidia-gpu.sock", socket: true, listening: true}
	cases := map[string]struct {
		ents                   []devicePluginEntry
		marked, onlyDevPlugins bool
		wantOwn, wantForeign   []string
	}{
		"Empty":                          {},
		"MarkedSocketAndCheckpoint":      {ents: []devicePluginEntry{sock, checkpoint}, marked: true, wantOwn: []string{kubeletSocket, kubeletCheckpoint}},
		"MarkedSocketListenedOnSince":    {ents: []devicePluginEntry{listening, checkpoint}, marked: true, wantOwn: []string{kubeletCheckpoint}, wantForeign: []string{kubeletSocket}},
		"MarkedBesideAnotherPlugin":      {ents: []devicePluginEntry{sock, plugin}, marked: true, wantOwn: []string{kubeletSocket}, wantForeign: []string{plugin.name}},
		"MarkedCheckpointThatIsASocket":  {ents: []devicePluginEntry{{name: kubeletCheckpoint, socket: true}}, marked: true, wantForeign: []string{kubeletCheckpoint}},
		"MarkedSocketThatIsAFile":        {ents: []devicePluginEntry{{name: kubeletSocket}}, marked: true, wantForeign: []string{kubeletSocket}},
		"LegacyStaleSocketAlone":         {ents: []devicePluginEntry{sock}, onlyDevPlugins: true, wantOwn: []string{kubeletSocket}},
		"LegacyInAnotherKubeletsRoot":    {ents: []devicePluginEntry{sock}, wantForeign: []string{kubeletSocket}},
		"LegacyListenedOn":               {ents: []devicePluginEntry{listening}, onlyDevPlugins: true, wantForeign: []string{kubeletSocket}},
		"LegacyWithACheckpoint":          {ents: []devicePluginEntry{sock, checkpoint}, onlyDevPlugins: true, wantForeign: []string{kubeletSocket, kubeletCheckpoint}},
		"LegacyWithAnotherPluginsSocket": {ents: []devicePluginEntry{sock, plugin}, onlyDevPlugins: true, wantForeign: []string{kubeletSocket, plugin.name}},
		"AnotherKubeletRunning":          {ents: []devicePluginEntry{listening, checkpoint, plugin}, wantForeign: []string{kubeletSocket, kubeletCheckpoint, plugin.name}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			own := ownDevicePluginFiles(tc.ents, tc.marked, tc.onlyDevPlugins)
			if diff := cmp.Diff(tc.wantOwn, own, cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("own files: -want +got:\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantForeign, foreignDevicePluginFiles(tc.ents, own), cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("foreign files: -want +got:\n%s", diff)
			}
		})
	}
}

func TestRemoveMadeDirs(t *testing.T) {
	notEmpty := &os.PathError{Op: "rmdir", Err: syscall.ENOTEMPTY}
	cases := map[string]struct {
		dirs      []string
		rmdir     map[string]error
		wantLeft  []string
		wantOrder []string
		wantErr   bool
	}{
		"AllEmpty": {
			dirs:      []string{"/var/lib/kubelet", "/var/lib/kubelet/device-plugins", "/var/log/containers"},
			wantOrder: []string{"/var/lib/kubelet/device-plugins", "/var/lib/kubelet", "/var/log/containers"},
		},
		"AnothersFilesKeepTheFolderRecorded": {
			dirs:      []string{"/var/lib/kubelet", "/var/lib/kubelet/device-plugins"},
			rmdir:     map[string]error{"/var/lib/kubelet/device-plugins": notEmpty, "/var/lib/kubelet": notEmpty},
			wantLeft:  []string{"/var/lib/kubelet", "/var/lib/kubelet/device-plugins"},
			wantOrder: []string{"/var/lib/kubelet/device-plugins", "/var/lib/kubelet"},
		},
		"GoneAlready": {
			dirs:      []string{"/run/containerd", "/run/containerd/s"},
			rmdir:     map[string]error{"/run/containerd/s": &os.PathError{Op: "rmdir", Err: syscall.ENOENT}},
			wantOrder: []string{"/run/containerd/s", "/run/containerd"},
		},
		"OtherErrorsAreErrorsAndStayRecorded": {
			dirs:      []string{"/var/lib/cni/results"},
			rmdir:     map[string]error{"/var/lib/cni/results": &os.PathError{Op: "rmdir", Err: syscall.EBUSY}},
			wantLeft:  []string{"/var/lib/cni/results"},
			wantOrder: []string{"/var/lib/cni/results"},
			wantErr:   true,
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			var order []string
			left, err := removeMadeDirs(tc.dirs, func(d string) error {
				order = append(order, d)
				return tc.rmdir[d]
			})
			if (err != nil) != tc.wantErr {
				t.Errorf("err = %v, want an error: %v", err, tc.wantErr)
			}
			if diff := cmp.Diff(tc.wantLeft, left, cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("left: -want +got:\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantOrder, order); diff != "" {
				t.Errorf("rmdir order (deepest first): -want +got:\n%s", diff)
			}
		})
	}
}

func TestMissingDirs(t *testing.T) {
	there := map[string]bool{"/var/lib/kubelet": true, "/run/containerd": true, "/run/containerd/s": true}
	got := missingDirs(machineDirs, func(d string) bool { return there[d] })
	want := []string{devicePluginDir, containerLogDir, "/var/lib/cni", cniResultsDir, containerdFIFODir}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("missingDirs: -want +got:\n%s", diff)
	}
}

func TestCNIResult(t *testing.T) {
	id := "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	for name, want := range map[string]bool{
		"egressproxy-" + id + "-eth0": true,
		"egressproxy-" + id + "-lo":   true,
		"cbr0-" + id + "-eth0":        false,
		"egressproxy-short-eth0":      false,
		"egressproxy-" + id:           false,
	} {
		if got := cniResult.MatchString(name); got != want {
			t.Errorf("cniResult matches %q: %v, want %v", name, got, want)
		}
	}
}

func TestSysctlToPutBack(t *testing.T) {
	cases := map[string]struct {
		key, recorded, current string
		want                   bool
	}{
		"KubeletsValueStillThere":   {key: "kernel/panic_on_oops", recorded: "0", current: "1", want: true},
		"OvercommitStillKubelets":   {key: "vm/overcommit_memory", recorded: "0", current: "1", want: true},
		"ChangedSinceBySomeoneElse": {key: "vm/overcommit_memory", recorded: "0", current: "2"},
		"AsRecorded":                {key: "kernel/panic", recorded: "10", current: "10"},
		"PanicChangedSince":         {key: "kernel/panic", recorded: "0", current: "30"},
		"ForwardingStillOn":         {key: "net/ipv4/ip_forward", recorded: "0", current: "1", want: true},
		"ForwardingTurnedOffSince":  {key: "net/ipv4/ip_forward", recorded: "0", current: "0"},
		"NotASettingOfTheNode":      {key: "kernel/modprobe", recorded: "/tmp/x", current: "1"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if got := sysctlToPutBack(tc.key, tc.recorded, tc.current); got != tc.want {
				t.Errorf("sysctlToPutBack(%q, %q, %q) = %v, want %v", tc.key, tc.recorded, tc.current, got, tc.want)
			}
		})
	}
	for _, k := range append(kernelTunables, forwardingSysctls...) {
		if _, ok := sysctlsSet[k]; !ok {
			t.Errorf("no value the kubelet or the CNI plugin sets for %s: it would never be put back", k)
		}
	}
}

func TestPlantedJump(t *testing.T) {
	cases := map[string]struct {
		args []string
		want bool
	}{
		"Planted":            {args: []string{"INPUT", "-m", "comment", "--comment", lookalikeComment, "-j", "KUBE-FIREWALL"}, want: true},
		"OlderRecord":        {args: []string{"INPUT", "-j", "KUBE-FIREWALL"}},
		"AnotherComment":     {args: []string{"INPUT", "-m", "comment", "--comment", "kubernetes firewall", "-j", "KUBE-FIREWALL"}},
		"CommentWithoutFlag": {args: []string{"INPUT", lookalikeComment, "-j", "KUBE-FIREWALL"}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if _, got := plantedJump(tc.args); got != tc.want {
				t.Errorf("plantedJump(%q) = %v, want %v", tc.args, got, tc.want)
			}
		})
	}
}
