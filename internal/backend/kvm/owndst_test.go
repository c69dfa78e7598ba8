package kvm

import (
	"os"
	"strings"
	"testing"

	"github.com/egressproxy/provider-egressproxy/internal/cloudinit"
	"github.com/egressproxy/provider-egressproxy/internal/cloudinit/guesttest"
)

// TestUpdateListsTheGuestsAddressesAgain: a guest whose address changed
// after its first boot (a new lease) and whose proxy is updated to open
// its own subnet denies its current address, not the first boot's. A
// guest first booted by an earlier version (no list, no systemd refresh)
// gets both from the update: squid.conf, which includes the list, is
// never installed without it.
func TestUpdateListsTheGuestsAddressesAgain(t *testing.T) {
	for name, earlier := range map[string]bool{"AddressChanged": false, "BootedByAnEarlierVersion": true} {
		t.Run(name, func(t *testing.T) {
			e := newTestEnv(t)
			req := e.request("web", "uid-1")
			inst := createAndBootReq(t, e, req)
			g := guesttest.New(t)
			g.Boot(e.seedUserData(seedName("web")))
			if earlier {
				for _, p := range append([]string{cloudinit.OwnAddressesPath}, paths(cloudinit.OwnAddressesFiles())...) {
					if err := os.Remove(g.Path(p)); err != nil {
						t.Fatal(err)
					}
				}
			}
			g.Tool("ip", `echo "1: lo    inet 127.0.0.1/8 scope host lo"; echo "2: ens4    inet 10.0.0.77/24 brd 10.0.0.255 scope global dynamic ens4"`)

			req.Proxy.AllowedDestinationCIDRs = []string{"10.0.0.0/24"}
			r := ref(inst)
			r.Mark = req.Mark
			update(t, e, g, r, req)

			want := "acl own_dst dst 10.0.0.77\nacl own_dst dst 127.0.0.1\nacl own_dst dst ::1\n"
			if got, _ := g.ReadFile(cloudinit.OwnAddressesPath); got != want {
				t.Errorf("%s after the update:\n%s\nwant:\n%s", cloudinit.OwnAddressesPath, got, want)
			}
			if conf, _ := g.ReadFile(cloudinit.SquidConfPath); !strings.Contains(conf, "include "+cloudinit.OwnAddressesPath) {
				t.Errorf("the updated squid.conf does not include the guest's addresses:\n%s", conf)
			}
			for _, gf := range cloudinit.OwnAddressesFiles() {
				if got, _ := g.ReadFile(gf.Path); got != gf.Content {
					t.Errorf("%s after the update:\n%s\nwant:\n%s", gf.Path, got, gf.Content)
				}
				if _, staged := g.ReadFile(cloudinit.StagedPath(gf)); staged {
					t.Errorf("%s stays staged", gf.Path)
				}
			}
		})
	}
}

func paths(files []cloudinit.GuestFile) []string {
	out := make([]string, len(files))
	for i, f := range files {
		out[i] = f.Path
	}
	return out
}
