package gcp_test

import (
	"testing"

	"github.com/egressproxy/provider-egressproxy/internal/backend/gcp"
	"github.com/egressproxy/provider-egressproxy/internal/cloudinit"
	"github.com/egressproxy/provider-egressproxy/internal/cloudinit/guesttest"
)

// TestStartupScriptListsTheGuestsAddresses: at a boot after the first
// (an update restarts the VM), the startup script lists the addresses the
// guest has then before it installs squid.conf and restarts Squid, and a
// guest first booted by an earlier version, without the list, gets it.
func TestStartupScriptListsTheGuestsAddresses(t *testing.T) {
	f := newFixture(t)
	_, body := created(t, f, request("pt-own-dst", "0c8f6a1e-4444-4e2a-9c3f-000000000021"))
	g := guesttest.New(t)
	g.Boot(metadataItem(body, gcp.MetadataUserData))
	g.WriteFile(cloudinit.OwnAddressesPath, "")
	g.Tool("ip", `echo "1: lo    inet 127.0.0.1/8 scope host lo"; echo "2: ens4    inet 10.128.0.9/32 scope global dynamic ens4"`)
	restart(t, g, body)
	want := "acl own_dst dst 10.128.0.9\nacl own_dst dst 127.0.0.1\nacl own_dst dst ::1\n"
	if got, _ := g.ReadFile(cloudinit.OwnAddressesPath); got != want {
		t.Errorf("%s after a boot:\n%s\nwant:\n%s", cloudinit.OwnAddressesPath, got, want)
	}
}
