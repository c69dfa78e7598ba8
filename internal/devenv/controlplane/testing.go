package controlplane

import (
	"context"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/runtime/schema"
)

// WidgetCRD is a CRD for tests of CRD installation: widgets.test.egressproxy.io,
// a namespaced Widget v1 of any content (WidgetsResource).
const WidgetCRD = `apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.test.egressproxy.io
spec:
  group: test.egressproxy.io
  names: {kind: Widget, listKind: WidgetList, plural: widgets, singular: widget}
  scope: Namespaced
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        x-kubernetes-preserve-unknown-fields: true
`

// WidgetsResource is the resource WidgetCRD serves.
var WidgetsResource = schema.GroupVersionResource{Group: "test.egressproxy.io", Version: "v1", Resource: "widgets"}

// WriteCRDs writes doc to a file in a new folder, for
// Options.CRDDirectories, and returns the folder.
func WriteCRDs(t testing.TB, doc string) string {
	t.Helper()
	d := t.TempDir()
	if err := os.WriteFile(filepath.Join(d, "crd.yaml"), []byte(doc), 0o644); err != nil { //nolint:gosec // a CRD manifest, not secret.
		t.Fatal(err)
	}
	return d
}

// ForTest starts a control plane for t and stops it when t ends
// (t.Cleanup). It fails t, never skips it, when the binaries cannot be had
// or the control plane does not start. When t has failed, the tail of the
// control-plane log is logged before it is removed.
func ForTest(t testing.TB, o Options) *ControlPlane {
	t.Helper()
	// A cold build of the binaries, and with a node a wait for another
	// package's node test to finish, come out of this budget.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	if o.BinDir == "" {
		d, err := BinDir(ctx, os.Stderr) // a cold build takes minutes: show its progress
		if err != nil {
			t.Fatalf("controlplane: cannot get the control-plane binaries (etcd, kube-apiserver, kube-controller-manager): %v\n"+
				"Build them with hack/controlplane-bins.sh (about 6 minutes cold), or set %s to a folder holding them.", err, EnvBinDir)
		}
		o.BinDir = d
	}
	start := time.Now()
	c, err := Start(ctx, o)
	if err != nil {
		t.Fatalf("controlplane: start: %v", err)
	}
	t.Logf("controlplane: up in %.1fs (kubeconfig %s)", time.Since(start).Seconds(), c.KubeconfigPath)
	t.Cleanup(func() {
		if t.Failed() {
			if tail := c.LogTail(80); tail != "" {
				t.Logf("controlplane: last lines of %s:\n%s", c.LogPath, tail)
			}
		}
		start := time.Now()
		if err := c.Stop(); err != nil {
			t.Errorf("controlplane: stop: %v", err)
		}
		t.Logf("controlplane: stopped in %.1fs", time.Since(start).Seconds())
	})
	return c
}

// RequireNode fails t under CI (CI set and not false/0) or with
// EGRESSPROXY_REQUIRE_NODE=1 when this machine cannot run a node (not
// Linux, not root), and skips it, saying why, otherwise. Start reports
// anything else that stops a node from running.
func RequireNode(t testing.TB) {
	t.Helper()
	why := ""
	switch {
	case runtime.GOOS != "linux":
		why = "a node runs on Linux only"
	case os.Geteuid() != 0:
		why = "a node needs root (containerd, network namespaces, iptables, cgroups)"
	}
	if why == "" {
		return
	}
	if ci := os.Getenv("CI"); (ci != "" && ci != "false" && ci != "0") || os.Getenv("EGRESSPROXY_REQUIRE_NODE") == "1" {
		t.Fatalf("%s (CI or EGRESSPROXY_REQUIRE_NODE=1 is set, so this test does not skip)", why)
	}
	t.Skip(why)
}
