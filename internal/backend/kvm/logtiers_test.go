package kvm

import (
	"context"
	"testing"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"

	"github.com/egressproxy/provider-egressproxy/internal/devenv/testenv"
	"github.com/egressproxy/provider-egressproxy/internal/proxy/proxytest"
	"github.com/egressproxy/provider-egressproxy/internal/telemetry"
)

// TestLogTiers: a create (its download and finish in the background), a
// Get once booted and a List, logged at the highest verbosity by the
// reconcile's logger: every tier has its lines (V(1) the libvirt calls
// and outcomes, V(2) the resolved create, the volume and domain XML, the
// metadata element, the addresses and the names listed; KVM has no wire
// tier), and neither the SSH key, known_hosts, the password, the
// cloud-init nor the htpasswd is in any line (the seed's upload is not
// logged).
func TestLogTiers(t *testing.T) {
	e := newTestEnv(t)
	e.b.logOpt = nil
	var logs testenv.Buffer
	ctx := logr.NewContext(context.Background(), funcr.New(func(prefix, args string) { logs.Line(prefix + " " + args) }, funcr.Options{Verbosity: 10}))
	req, secrets := proxytest.WithSentinels(e.request("egp-tiers", "uid-tiers"))
	secrets["SSH key"] = "S3NT1NEL-key-material-9f8e7d6c5b4a"
	secrets["known_hosts"] = "S3NT1NEL-known-hosts-1a2b3c4d5e6f"
	inst, err := e.d.Create(ctx, req)
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	if err := e.settle(ctx, inst.ID); err != nil {
		t.Fatal(err)
	}
	if got, err := e.d.Get(ctx, ref(inst)); err != nil || got.IP == "" {
		t.Fatalf("Get = %+v, %v; want an address", got, err)
	}
	if _, err := e.d.List(ctx, testInstallation); err != nil {
		t.Fatalf("List: %v", err)
	}
	proxytest.CheckLogTiers(t, logs.String(), secrets, map[int][]string{
		telemetry.VCalls: {"libvirt call", "libvirt host connected", "kvm image download finished", "kvm domain defined and started",
			"kvm domain fetched", "kvm domains listed"},
		telemetry.VDetail: {"kvm create", "kvm volume XML", "kvm domain XML", "kvm domain metadata", "kvm addresses found", "kvm domains listed: names"},
	})
	if t.Failed() {
		t.Logf("log:\n%s", logs.String())
	}
}
