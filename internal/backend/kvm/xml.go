package kvm

import (
	"encoding/json"
	"encoding/xml"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	"libvirt.org/go/libvirtxml"

	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

// Ownership metadata: one element in the provider's own namespace, written
// in the same DomainDefineXML call that defines the domain, so a domain is
// never without its mark.
const (
	metadataURI    = "https://egressproxy.io/kvm/v1alpha1"
	metadataPrefix = "egressproxy"
)

// instanceMeta is what the metadata element holds. Nothing secret: the
// spec hash is keyed by the controller.
type instanceMeta struct {
	XMLName        xml.Name `xml:"instance"`
	Managed        bool     `xml:"managed"`
	UID            string   `xml:"uid"`
	InstallationID string   `xml:"installation"`
	CreatedAt      string   `xml:"createdAt"`
	SpecHash       string   `xml:"specHash,omitempty"`
	Port           int32    `xml:"port,omitempty"`
	MachineType    string   `xml:"machineType,omitempty"`
	Image          string   `xml:"image,omitempty"`
}

// element renders the metadata as it goes under <metadata> (prefixed) or
// into DomainSetMetadata (prefix added by libvirt from the key).
func (m instanceMeta) element(prefixed bool) string {
	var b strings.Builder
	name := "instance"
	if prefixed {
		name = metadataPrefix + ":instance"
		fmt.Fprintf(&b, "<%s xmlns:%s=%q>", name, metadataPrefix, metadataURI)
	} else {
		fmt.Fprintf(&b, "<%s>", name)
	}
	field := func(tag, v string) {
		if v == "" {
			return
		}
		fmt.Fprintf(&b, "<%s>%s</%s>", tag, esc(v), tag)
	}
	field("managed", strconv.FormatBool(m.Managed))
	field("uid", m.UID)
	field("installation", m.InstallationID)
	field("createdAt", m.CreatedAt)
	field("specHash", m.SpecHash)
	if m.Port > 0 {
		field("port", strconv.Itoa(int(m.Port)))
	}
	field("machineType", m.MachineType)
	field("image", m.Image)
	fmt.Fprintf(&b, "</%s>", name)
	return b.String()
}

// parseMeta reads the element DomainGetMetadata returns (libvirt drops the
// prefix and namespace declaration; match on local names only).
func parseMeta(s string) (instanceMeta, error) {
	var m instanceMeta
	if err := xml.Unmarshal([]byte(s), &m); err != nil {
		return instanceMeta{}, proxy.Permanentf("the domain's %s metadata does not parse: %v", metadataPrefix, err)
	}
	return m, nil
}

func (m instanceMeta) mark() proxy.Mark {
	if !m.Managed {
		return proxy.Mark{}
	}
	return proxy.Mark{UID: m.UID, InstallationID: m.InstallationID}
}

func (m instanceMeta) createdAt() time.Time {
	t, err := time.Parse(time.RFC3339, m.CreatedAt)
	if err != nil {
		return time.Time{} // unknown: GC treats it as old
	}
	return t
}

func esc(s string) string {
	var b strings.Builder
	_ = xml.EscapeText(&b, []byte(s))
	return b.String()
}

// domainSpec is everything the domain XML is built from.
type domainSpec struct {
	Name       string
	Type       string // kvm or qemu
	VCPUs      int32
	MemoryMiB  int32
	Firmware   string // bios or uefi
	Overlay    string // path
	Seed       string // path
	Bridge     string
	Network    string
	Meta       instanceMeta
	GuestAgent bool
}

// domainXML renders the domain with libvirtxml, so every value (names,
// paths, bridge and network names) is escaped as XML, never spliced in.
// Disks are file-type (not volume-type) so AppArmor's virt-aa-helper
// labels them; the seed sits on virtio-scsi, which Debian's cloud kernel
// has (it has no AHCI).
func domainXML(s domainSpec) (string, error) {
	typ := s.Type
	if typ == "" {
		typ = "kvm"
	}
	d := libvirtxml.Domain{
		Type:     typ,
		Name:     s.Name,
		Memory:   &libvirtxml.DomainMemory{Value: uint(max(s.MemoryMiB, 0)), Unit: "MiB"},
		VCPU:     &libvirtxml.DomainVCPU{Value: uint(max(s.VCPUs, 0))},
		Metadata: &libvirtxml.DomainMetadata{XML: s.Meta.element(true)},
		OS: &libvirtxml.DomainOS{
			Type:        &libvirtxml.DomainOSType{Arch: "x86_64", Machine: "pc", Type: "hvm"},
			BootDevices: []libvirtxml.DomainBootDevice{{Dev: "hd"}},
		},
		Features:   &libvirtxml.DomainFeatureList{ACPI: &libvirtxml.DomainFeature{}, APIC: &libvirtxml.DomainFeatureAPIC{}},
		Clock:      &libvirtxml.DomainClock{Offset: "utc"},
		OnPoweroff: "destroy",
		OnReboot:   "restart",
		OnCrash:    "destroy",
		Devices: &libvirtxml.DomainDeviceList{
			Disks: []libvirtxml.DomainDisk{
				{
					Device: "disk",
					Driver: &libvirtxml.DomainDiskDriver{Name: "qemu", Type: "qcow2"},
					Source: &libvirtxml.DomainDiskSource{File: &libvirtxml.DomainDiskSourceFile{File: s.Overlay}},
					Target: &libvirtxml.DomainDiskTarget{Dev: "vda", Bus: "virtio"},
				},
				{
					Device:   "cdrom",
					Driver:   &libvirtxml.DomainDiskDriver{Name: "qemu", Type: "raw"},
					Source:   &libvirtxml.DomainDiskSource{File: &libvirtxml.DomainDiskSourceFile{File: s.Seed}},
					Target:   &libvirtxml.DomainDiskTarget{Dev: "sda", Bus: "scsi"},
					ReadOnly: &libvirtxml.DomainDiskReadOnly{},
				},
			},
			Controllers: []libvirtxml.DomainController{{Type: "scsi", Model: "virtio-scsi"}},
			Interfaces:  []libvirtxml.DomainInterface{domainInterface(s)},
			Channels: []libvirtxml.DomainChannel{{
				Source: &libvirtxml.DomainChardevSource{UNIX: &libvirtxml.DomainChardevSourceUNIX{}},
				Target: &libvirtxml.DomainChannelTarget{VirtIO: &libvirtxml.DomainChannelTargetVirtIO{Name: "org.qemu.guest_agent.0"}},
			}},
			Serials:  []libvirtxml.DomainSerial{{Source: &libvirtxml.DomainChardevSource{Pty: &libvirtxml.DomainChardevSourcePty{}}}},
			Consoles: []libvirtxml.DomainConsole{{Source: &libvirtxml.DomainChardevSource{Pty: &libvirtxml.DomainChardevSourcePty{}}}},
			// Entropy for first-boot key generation; TCG guests have little.
			RNGs:       []libvirtxml.DomainRNG{{Model: "virtio", Backend: &libvirtxml.DomainRNGBackend{Random: &libvirtxml.DomainRNGBackendRandom{Device: "/dev/urandom"}}}},
			MemBalloon: &libvirtxml.DomainMemBalloon{Model: "virtio"},
		},
	}
	if s.Firmware == "uefi" {
		// firmware='efi' alone picks the secure-boot OVMF; ask for the
		// plain one.
		d.OS.Type.Machine = "q35"
		d.OS.Firmware = "efi"
		d.OS.FirmwareInfo = &libvirtxml.DomainOSFirmwareInfo{Features: []libvirtxml.DomainOSFirmwareFeature{
			{Enabled: "no", Name: "secure-boot"}, {Enabled: "no", Name: "enrolled-keys"},
		}}
	}
	if typ == "kvm" {
		d.CPU = &libvirtxml.DomainCPU{Mode: "host-passthrough"}
	}
	x, err := d.Marshal()
	if err != nil {
		return "", proxy.Classify(proxy.ClassPermanent, fmt.Errorf("cannot render the domain XML of %s: %w", s.Name, err))
	}
	return x, nil
}

func domainInterface(s domainSpec) libvirtxml.DomainInterface {
	i := libvirtxml.DomainInterface{Model: &libvirtxml.DomainInterfaceModel{Type: "virtio"}}
	if s.Network != "" {
		i.Source = &libvirtxml.DomainInterfaceSource{Network: &libvirtxml.DomainInterfaceSourceNetwork{Network: s.Network}}
	} else {
		i.Source = &libvirtxml.DomainInterfaceSource{Bridge: &libvirtxml.DomainInterfaceSourceBridge{Bridge: s.Bridge}}
	}
	return i
}

// volumeXML renders a volume; backing is the base image's path and format
// for an overlay.
func volumeXML(name string, capacityBytes uint64, format, backingPath, backingFormat string) (string, error) {
	v := libvirtxml.StorageVolume{
		Name:     name,
		Capacity: &libvirtxml.StorageVolumeSize{Unit: "bytes", Value: capacityBytes},
		Target:   &libvirtxml.StorageVolumeTarget{Format: &libvirtxml.StorageVolumeTargetFormat{Type: format}},
	}
	if backingPath != "" {
		v.BackingStore = &libvirtxml.StorageVolumeBackingStore{Path: backingPath, Format: &libvirtxml.StorageVolumeTargetFormat{Type: backingFormat}}
	}
	x, err := v.Marshal()
	if err != nil {
		return "", proxy.Classify(proxy.ClassPermanent, fmt.Errorf("cannot render the volume XML of %s: %w", name, err))
	}
	return x, nil
}

// volDesc is the part of a volume's XML the overlay reuse check reads.
type volDesc struct {
	Capacity uint64 `xml:"capacity"`
	// Physical is the size of a file-backed volume's file.
	Physical uint64 `xml:"physical"`
	Target   struct {
		Format struct {
			Type string `xml:"type,attr"`
		} `xml:"format"`
		// Timestamps, of file-backed pools: seconds since the epoch,
		// with a fraction.
		Timestamps struct {
			Mtime string `xml:"mtime"`
		} `xml:"timestamps"`
	} `xml:"target"`
	BackingStore struct {
		Path string `xml:"path"`
	} `xml:"backingStore"`
}

// modified is when the volume was last written (a seed: when it was
// uploaded); zero when the pool does not say.
func (v volDesc) modified() time.Time {
	sec, frac, _ := strings.Cut(v.Target.Timestamps.Mtime, ".")
	n, err := strconv.ParseInt(sec, 10, 64)
	if err != nil || n <= 0 {
		return time.Time{}
	}
	ns, _ := strconv.ParseInt((frac + "000000000")[:9], 10, 64)
	return time.Unix(n, ns)
}

func parseVolDesc(s string) (volDesc, error) {
	var v volDesc
	err := xml.Unmarshal([]byte(s), &v)
	return v, err
}

var (
	nameTag   = regexp.MustCompile(`<name>([^<]*)</name>`)
	agentExec = regexp.MustCompile(`"execute"\s*:\s*"([a-z-]+)"`)
)

// domainNameOf and volumeNameOf pull the name out of an XML document for
// spans and logs, which never carry the document itself.
func domainNameOf(x string) string {
	if m := nameTag.FindStringSubmatch(x); m != nil {
		return m[1]
	}
	return ""
}

func volumeNameOf(x string) string { return domainNameOf(x) }

// agentCommandName is the "execute" of a guest-agent command.
func agentCommandName(cmd string) string {
	if m := agentExec.FindStringSubmatch(cmd); m != nil {
		return m[1]
	}
	return "unknown"
}

// agentCommand renders a guest-agent command.
func agentCommand(execute string, args any) string {
	b, _ := json.Marshal(struct {
		Execute   string `json:"execute"`
		Arguments any    `json:"arguments,omitempty"`
	}{execute, args}) //nolint:errchkjson // plain values always marshal.
	return string(b)
}
