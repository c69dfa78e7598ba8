package controlplane

import (
	"context"
	"os"
	"testing"
	"time"
)

// ForTest starts a control plane for t and stops it when t ends
// (t.Cleanup). It fails t, never skips it, when the binaries cannot be had
// or the control plane does not start. When t has failed, the tail of the
// control-plane log is logged before it is removed.
func ForTest(t testing.TB, o Options) *ControlPlane {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
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
