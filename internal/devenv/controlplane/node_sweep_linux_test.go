//go:build linux

package controlplane

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestParseSysctls(t *testing.T) {
	cases := map[string]struct {
		file string
		want map[string]string
	}{
		"AsWritten": {
			file: sysctlsText(map[string]string{"kernel/panic": "0", "net/ipv4/ip_forward": "0", "vm/overcommit_memory": "0"}),
			want: map[string]string{"kernel/panic": "0", "net/ipv4/ip_forward": "0", "vm/overcommit_memory": "0"},
		},
		"OnlyWhatANodeChanges": {
			file: "kernel/panic 10\nkernel/modprobe /tmp/x\n../../etc/passwd x\nnet/ipv4/ip_forward\n\n",
			want: map[string]string{"kernel/panic": "10"},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, parseSysctls([]byte(tc.file))); diff != "" {
				t.Errorf("parseSysctls(%q): -want +got:\n%s", tc.file, diff)
			}
		})
	}
}

func TestIsNodePodLog(t *testing.T) {
	cases := map[string]struct {
		path string
		want bool
	}{
		"NodePodLog":        {path: "/tmp/egressproxy-controlplane-3681939833/node/kubelet/pod-logs/ns_p_uid/c/0.log", want: true},
		"OtherTMPDIR":       {path: "/var/tmp/x/egressproxy-controlplane-1/node/kubelet/pod-logs/ns_p_uid/c/0.log", want: true},
		"AnotherKubelet":    {path: "/var/log/pods/ns_p_uid/c/0.log"},
		"ControlPlaneFiles": {path: "/tmp/egressproxy-controlplane-1/etcd/member/wal"},
		"LookAlikeName":     {path: "/tmp/my-egressproxy-controlplane-1/node/kubelet/pod-logs/x/c/0.log"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if got := isNodePodLog(tc.path); got != tc.want {
				t.Errorf("isNodePodLog(%q) = %v, want %v", tc.path, got, tc.want)
			}
		})
	}
}
