package kvm

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"libvirt.org/go/libvirtxml"
)

// Values reach the domain and volume XML as data: a path, bridge, network
// or name holding XML's special characters reads back unchanged and adds
// no element (no device, no second disk) to what libvirt is given.
func TestXMLValuesAreData(t *testing.T) {
	const hostile = `x'"&<devices><hostdev mode='subsystem'/></devices>`
	cases := map[string]domainSpec{
		"Bridge":  {Name: "p" + hostile, VCPUs: 1, MemoryMiB: 256, Overlay: "/pool/o" + hostile, Seed: "/pool/s" + hostile, Bridge: "br" + hostile},
		"Network": {Name: "p", Type: "qemu", Firmware: "uefi", VCPUs: 2, MemoryMiB: 512, Overlay: "/o", Seed: "/s", Network: "net" + hostile},
	}
	for name, s := range cases {
		t.Run(name, func(t *testing.T) {
			x, err := domainXML(s)
			if err != nil {
				t.Fatalf("domainXML: %v", err)
			}
			var d libvirtxml.Domain
			if err := d.Unmarshal(x); err != nil {
				t.Fatalf("the rendered domain does not parse: %v\n%s", err, x)
			}
			got := []string{d.Name, d.Devices.Disks[0].Source.File.File, d.Devices.Disks[1].Source.File.File}
			want := []string{s.Name, s.Overlay, s.Seed}
			if s.Network != "" {
				got, want = append(got, d.Devices.Interfaces[0].Source.Network.Network), append(want, s.Network)
			} else {
				got, want = append(got, d.Devices.Interfaces[0].Source.Bridge.Bridge), append(want, s.Bridge)
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("values read back (-want +got):\n%s", diff)
			}
			if n := len(d.Devices.Hostdevs); n != 0 || len(d.Devices.Disks) != 2 || len(d.Devices.Interfaces) != 1 {
				t.Errorf("devices: %d disks, %d interfaces, %d hostdevs; want 2, 1, 0", len(d.Devices.Disks), len(d.Devices.Interfaces), n)
			}
		})
	}
	x, err := volumeXML("v"+hostile, 10, "qcow2", "/base"+hostile, "raw")
	if err != nil {
		t.Fatalf("volumeXML: %v", err)
	}
	var v libvirtxml.StorageVolume
	if err := v.Unmarshal(x); err != nil {
		t.Fatalf("the rendered volume does not parse: %v\n%s", err, x)
	}
	if diff := cmp.Diff([]string{"v" + hostile, "/base" + hostile}, []string{v.Name, v.BackingStore.Path}); diff != "" {
		t.Errorf("volume values read back (-want +got):\n%s", diff)
	}
}
