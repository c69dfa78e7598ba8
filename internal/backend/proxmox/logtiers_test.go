package proxmox_test

import (
	"context"
	"strings"
	"testing"

	"github.com/go-logr/logr/funcr"

	"github.com/egressproxy/provider-egressproxy/internal/backend/proxmox"
	"github.com/egressproxy/provider-egressproxy/internal/devenv/testenv"
	"github.com/egressproxy/provider-egressproxy/internal/proxy/proxytest"
	"github.com/egressproxy/provider-egressproxy/internal/telemetry"
)

// TestLogTiers: a create driven to Running and a List, logged at the
// highest verbosity: every tier has its lines (V(1) the calls and
// outcomes, V(2) the resolved create, the clone and config requests, the
// addresses and the names listed, V(3) the wire), and neither the API
// token's secret, the password, the cloud-init nor the htpasswd is in any
// line (the seed ISO holds them: its upload is only counted).
func TestLogTiers(t *testing.T) {
	var logs testenv.Buffer
	log := funcr.New(func(prefix, args string) { logs.Line(prefix + " " + args) }, funcr.Options{Verbosity: 10})
	f := newFixture(t, func(o *fixtureOptions) { o.driver = func(d *proxmox.Options) { d.Log = &log } })
	ctx := context.Background()
	req, secrets := proxytest.WithSentinels(f.request("pt-tiers", "0c8f6a1e-7777-4e2a-9c3f-00000000000b"))
	_, secret, _ := strings.Cut(f.fake.Token(), "=")
	secrets["API token secret"] = secret
	inst, err := f.rec.Create(ctx, req)
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	if err := f.settle(ctx, inst.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := f.drv.List(ctx, testInstallation); err != nil {
		t.Fatalf("List: %v", err)
	}
	proxytest.CheckLogTiers(t, logs.String(), secrets, map[int][]string{
		telemetry.VCalls:  {"proxmox api call", "proxmox clone started", "proxmox vm configured"},
		telemetry.VDetail: {"proxmox create", "proxmox clone request", "proxmox vm config request", "proxmox addresses found", "proxmox vms listed: names"},
		telemetry.VWire:   {"proxmox wire request", "proxmox wire response"},
	})
	for _, w := range []string{`"Authorization"="[redacted]"`, "multipart/form-data, not shown", `"ide2"="local:iso/`} {
		if !strings.Contains(logs.String(), w) {
			t.Errorf("the log lacks %s", w)
		}
	}
	if t.Failed() {
		t.Logf("log:\n%s", logs.String())
	}
}
