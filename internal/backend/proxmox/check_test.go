package proxmox_test

import (
	"context"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/egressproxy/provider-egressproxy/internal/backend/proxmox"
	"github.com/egressproxy/provider-egressproxy/internal/backend/proxmox/pvetest"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

// TestCheckPerNode: one target per configured node, healthy with its
// details, or with the reason the predecessor reported (an offline node,
// a missing storage or template, refused credentials, no time left).
func TestCheckPerNode(t *testing.T) {
	ctx := context.Background()
	t.Run("healthy", func(t *testing.T) {
		f := newFixture(t)
		h := f.drv.Check(ctx)
		if !h.Healthy() || len(h.Targets) != 2 {
			t.Fatalf("Check = %+v; want pve1 and pve2 healthy", h)
		}
		want := map[string]string{
			"isoStorage": "local", "tokenID": "egress@pve!provider", "pveVersion": "pve-manager/9.0.10/5e0f4b8e",
			"kernel": "6.14.8-2-pve", "isoStorageAvailGiB": "100", "templates": "debian-12=9000@pve1",
		}
		for _, tg := range h.Targets {
			if diff := cmp.Diff(want, tg.Details); diff != "" {
				t.Errorf("details of %s (-want +got):\n%s", tg.Target, diff)
			}
			if tg.Address != f.fake.URL {
				t.Errorf("address of %s = %q; want the API URL", tg.Target, tg.Address)
			}
		}
	})
	cases := []struct {
		name   string
		opts   []fixtureOption
		setup  func(f *fixture)
		reason map[string]string // node -> reason ("" healthy)
		says   string
	}{
		{name: "offline node", opts: []fixtureOption{withConfig(func(c *proxmox.Config) { c.Nodes = []string{"pve1", "pve3"} })},
			reason: map[string]string{"pve1": "", "pve3": proxmox.ReasonNodeOffline}, says: "offline"},
		{name: "missing storage", opts: []fixtureOption{withConfig(func(c *proxmox.Config) { c.ISOStorage = "nope" })},
			reason: map[string]string{"pve1": proxmox.ReasonStorageNotFound, "pve2": proxmox.ReasonStorageNotFound}, says: "storage 'nope' does not exist"},
		{name: "storage without ISOs", opts: []fixtureOption{withConfig(func(c *proxmox.Config) { c.ISOStorage = "local-lvm" })},
			reason: map[string]string{"pve1": proxmox.ReasonStorageNotFound, "pve2": proxmox.ReasonStorageNotFound}, says: "does not hold ISO images"},
		{name: "missing template", opts: []fixtureOption{withConfig(func(c *proxmox.Config) { c.Templates = map[string]int{"gone": 9999} })},
			reason: map[string]string{"pve1": proxmox.ReasonTemplateNotFound, "pve2": proxmox.ReasonTemplateNotFound}, says: "VMID 9999"},
		{name: "refused token", setup: func(f *fixture) { f.fake.SetToken("egress@pve!other=1") },
			reason: map[string]string{"pve1": proxy.ReasonUnauthorized, "pve2": proxy.ReasonUnauthorized}, says: "401"},
		{name: "forbidden", setup: func(f *fixture) {
			f.fake.Inject(pvetest.Fault{Times: -1, Status: 403, Message: "Permission check failed (/nodes/pve2, Sys.Audit)",
				Match: func(r pvetest.Request) bool { return r.Path == "/nodes/pve2/status" }})
		}, reason: map[string]string{"pve1": "", "pve2": proxy.ReasonForbidden}, says: "Sys.Audit"},
		{name: "busy", setup: func(f *fixture) { f.fake.SetBusy(true) },
			reason: map[string]string{"pve1": proxy.ReasonUnreachable, "pve2": proxy.ReasonUnreachable}, says: "596"},
		{name: "unreachable API", setup: func(f *fixture) { f.fake.Close() },
			reason: map[string]string{"pve1": proxy.ReasonUnreachable, "pve2": proxy.ReasonUnreachable}, says: "connect"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := newFixture(t, c.opts...)
			if c.setup != nil {
				c.setup(f)
			}
			got := map[string]string{}
			for _, tg := range f.drv.Check(ctx).Targets {
				got[tg.Target] = tg.Reason
				if tg.Reason != "" && !strings.Contains(tg.Message, c.says) {
					t.Errorf("%s: %s %q; want it to say %q", tg.Target, tg.Reason, tg.Message, c.says)
				}
				if tg.Healthy != (tg.Reason == "") {
					t.Errorf("%s: healthy %v with reason %q", tg.Target, tg.Healthy, tg.Reason)
				}
			}
			if diff := cmp.Diff(c.reason, got); diff != "" {
				t.Errorf("reasons by node (-want +got):\n%s", diff)
			}
		})
	}
	t.Run("no time left", func(t *testing.T) {
		f := newFixture(t)
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		for _, tg := range f.drv.Check(cctx).Targets {
			if tg.Reason != proxy.ReasonTimeout {
				t.Errorf("%s: %s; want %s", tg.Target, tg.Reason, proxy.ReasonTimeout)
			}
		}
	})
}
