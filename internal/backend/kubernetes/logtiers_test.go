package kubernetes

import (
	"context"
	"testing"

	"github.com/go-logr/logr/funcr"

	"github.com/egressproxy/provider-egressproxy/internal/devenv/testenv"
	"github.com/egressproxy/provider-egressproxy/internal/proxy/proxytest"
	"github.com/egressproxy/provider-egressproxy/internal/telemetry"
)

// TestLogTiers: a create and a List on a fake API server, logged at the
// highest verbosity: the outcome at V(1), the resolved create with the
// Deployment's shape and the names listed at V(2), and neither the
// password, the cloud-init nor the htpasswd (in the proxy's Secret) in
// any line.
func TestLogTiers(t *testing.T) {
	d, _, _ := countingDriver(t)
	var logs testenv.Buffer
	log := funcr.New(func(prefix, args string) { logs.Line(prefix + " " + args) }, funcr.Options{Verbosity: 10})
	d.log = &log
	req, secrets := proxytest.WithSentinels(testRequest())
	ctx := context.Background()
	if _, err := d.Create(ctx, req); err != nil {
		t.Fatalf("Create: %v", err)
	}
	if _, err := d.List(ctx, req.Mark.InstallationID); err != nil {
		t.Fatalf("List: %v", err)
	}
	proxytest.CheckLogTiers(t, logs.String(), secrets, map[int][]string{
		telemetry.VCalls:  {"created Deployment"},
		telemetry.VDetail: {"kubernetes create", "kubernetes Deployments listed: names"},
	})
	if t.Failed() {
		t.Logf("log:\n%s", logs.String())
	}
}
