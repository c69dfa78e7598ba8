package kvm

import (
	"encoding/json"
	"encoding/xml"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

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

// domainXML renders the domain. Disks are file-type (not volume-type) so
// AppArmor's virt-aa-helper labels them; the seed sits on virtio-scsi,
// which Debian's cloud kernel has (it has no AHCI).
func domainXML(s domainSpec) string {
	var b strings.Builder
	typ := s.Type
	if typ == "" {
		typ = "kvm"
	}
	fmt.Fprintf(&b, "<domain type=%q>\n", typ)
	fmt.Fprintf(&b, "  <name>%s</name>\n", esc(s.Name))
	fmt.Fprintf(&b, "  <memory unit='MiB'>%d</memory>\n  <vcpu>%d</vcpu>\n", s.MemoryMiB, s.VCPUs)
	fmt.Fprintf(&b, "  <metadata>%s</metadata>\n", s.Meta.element(true))
	if s.Firmware == "uefi" {
		// firmware='efi' alone picks the secure-boot OVMF; ask for the
		// plain one.
		b.WriteString("  <os firmware='efi'>\n    <type arch='x86_64' machine='q35'>hvm</type>\n" +
			"    <firmware><feature enabled='no' name='secure-boot'/><feature enabled='no' name='enrolled-keys'/></firmware>\n")
	} else {
		b.WriteString("  <os>\n    <type arch='x86_64' machine='pc'>hvm</type>\n")
	}
	b.WriteString("    <boot dev='hd'/>\n  </os>\n  <features><acpi/><apic/></features>\n")
	if typ == "kvm" {
		b.WriteString("  <cpu mode='host-passthrough'/>\n")
	}
	b.WriteString("  <clock offset='utc'/>\n  <on_poweroff>destroy</on_poweroff>\n  <on_reboot>restart</on_reboot>\n  <on_crash>destroy</on_crash>\n")
	b.WriteString("  <devices>\n")
	fmt.Fprintf(&b, "    <disk type='file' device='disk'><driver name='qemu' type='qcow2'/><source file=%q/><target dev='vda' bus='virtio'/></disk>\n", s.Overlay)
	b.WriteString("    <controller type='scsi' model='virtio-scsi'/>\n")
	fmt.Fprintf(&b, "    <disk type='file' device='cdrom'><driver name='qemu' type='raw'/><source file=%q/><target dev='sda' bus='scsi'/><readonly/></disk>\n", s.Seed)
	if s.Network != "" {
		fmt.Fprintf(&b, "    <interface type='network'><source network=%q/><model type='virtio'/></interface>\n", s.Network)
	} else {
		fmt.Fprintf(&b, "    <interface type='bridge'><source bridge=%q/><model type='virtio'/></interface>\n", s.Bridge)
	}
	b.WriteString("    <channel type='unix'><target type='virtio' name='org.qemu.guest_agent.0'/></channel>\n")
	b.WriteString("    <serial type='pty'/>\n    <console type='pty'/>\n")
	// Entropy for first-boot key generation; TCG guests have little.
	b.WriteString("    <rng model='virtio'><backend model='random'>/dev/urandom</backend></rng>\n")
	b.WriteString("    <memballoon model='virtio'/>\n  </devices>\n</domain>\n")
	return b.String()
}

// volumeXML renders a volume; backing is the base image's path and format
// for an overlay.
func volumeXML(name string, capacityBytes uint64, format, backingPath, backingFormat string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "<volume><name>%s</name><capacity unit='bytes'>%d</capacity><target><format type=%q/></target>", esc(name), capacityBytes, format)
	if backingPath != "" {
		fmt.Fprintf(&b, "<backingStore><path>%s</path><format type=%q/></backingStore>", esc(backingPath), backingFormat)
	}
	b.WriteString("</volume>")
	return b.String()
}

// volDesc is the part of a volume's XML the overlay reuse check reads.
type volDesc struct {
	Capacity uint64 `xml:"capacity"`
	Target   struct {
		Format struct {
			Type string `xml:"type,attr"`
		} `xml:"format"`
	} `xml:"target"`
	BackingStore struct {
		Path string `xml:"path"`
	} `xml:"backingStore"`
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
