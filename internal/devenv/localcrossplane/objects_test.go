package localcrossplane

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

func TestPodsProviderConfig(t *testing.T) {
	for _, tc := range []struct {
		legacy           bool
		image            string
		apiVersion, kind string
		wantKubernetes   map[string]any
	}{
		{false, "squid:local", "m.egressproxy.io/v1alpha1", "ClusterProviderConfig",
			map[string]any{"credentials": map[string]any{"source": "InjectedIdentity"}, "namespace": "egress-proxies", "image": "squid:local"}},
		{true, "", "egressproxy.io/v1alpha1", "ProviderConfig",
			map[string]any{"credentials": map[string]any{"source": "InjectedIdentity"}, "namespace": "egress-proxies"}},
	} {
		objs, err := DecodeYAML(PodsProviderConfig(tc.legacy, "egress-proxies", tc.image))
		if err != nil || len(objs) != 1 {
			t.Fatalf("legacy=%v: %d objects, %v; want one", tc.legacy, len(objs), err)
		}
		o := objs[0]
		if o.GetAPIVersion() != tc.apiVersion || o.GetKind() != tc.kind || o.GetName() != "pods" {
			t.Errorf("legacy=%v: %s %s %s; want %s %s pods", tc.legacy, o.GetAPIVersion(), o.GetKind(), o.GetName(), tc.apiVersion, tc.kind)
		}
		got, _, _ := unstructured.NestedMap(o.Object, "spec", "kubernetes")
		if d := cmp.Diff(tc.wantKubernetes, got); d != "" {
			t.Errorf("legacy=%v: spec.kubernetes (-want +got):\n%s", tc.legacy, d)
		}
	}
}

func TestCondition(t *testing.T) {
	objs, err := DecodeYAML(`
apiVersion: v1
kind: Thing
metadata: {name: a}
status:
  conditions:
  - {type: Synced, status: "True", reason: ReconcileSuccess}
  - {type: Ready, status: "False", reason: Creating, message: waiting for the VM}
---
`)
	if err != nil || len(objs) != 1 {
		t.Fatalf("DecodeYAML: %d objects, %v; want one (the empty document left out)", len(objs), err)
	}
	for typ, want := range map[string][2]string{
		"Ready":   {"False", "Creating: waiting for the VM"},
		"Synced":  {"True", "ReconcileSuccess: "},
		"Healthy": {"", ""},
	} {
		if st, m := Condition(objs[0], typ); st != want[0] || m != want[1] {
			t.Errorf("Condition(%s) = %q, %q; want %q, %q", typ, st, m, want[0], want[1])
		}
	}
}

func TestFunctionIP(t *testing.T) {
	seen := map[string]int{}
	for _, pid := range []int{1, 2, 100, 4242, 99999, 4194304} {
		ip := FunctionIP(pid)
		if other, ok := seen[ip]; ok {
			t.Errorf("FunctionIP(%d) = FunctionIP(%d) = %s", pid, other, ip)
		}
		seen[ip] = pid
		if ip[:4] != "127." || ip[:6] == "127.0." {
			t.Errorf("FunctionIP(%d) = %s; want 127.M.N.9 outside 127.0.0.0/16", pid, ip)
		}
	}
}
