package gcp

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"maps"
	"net/netip"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/egressproxy/provider-egressproxy/internal/backend/gcp/computeapi"
	"github.com/egressproxy/provider-egressproxy/internal/cloudinit"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

// Labels the driver writes on instances and static addresses. Label
// values are lowercase letters, digits, dashes and underscores, at most 63
// characters: the UID, the installation ID, the hash and the catalogue
// keys all are.
const (
	// LabelUID is the ownership mark's managed-resource UID.
	LabelUID = "egressproxy-uid"
	// LabelInstallation is the ownership mark's installation ID; List
	// filters on it.
	LabelInstallation = "egressproxy-installation"
	// LabelSpec is proxy.Hash of the request the instance was last created
	// or updated from.
	LabelSpec = "egressproxy-spec"
	// LabelPort is the proxy port, so that Get (whose Ref carries no
	// settings) can probe it.
	LabelPort = "egressproxy-port"
	// LabelAddress is the address type: ephemeral, static or internal.
	LabelAddress = "egressproxy-address"
	// LabelImage and LabelMachineType are the catalogue keys used, for
	// status.atProvider.placement.
	LabelImage       = "egressproxy-image"
	LabelMachineType = "egressproxy-machine-type"
	// LabelRetain on a static address keeps it when the proxy is deleted.
	LabelRetain = "egressproxy-retain"
	// LabelDeleting on a static address says the proxy is being deleted,
	// so Get keeps reporting it until the address is released.
	LabelDeleting = "egressproxy-deleting"
)

// Metadata keys of the instance.
const (
	// MetadataUserData is read by cloud-init's GCE datasource.
	MetadataUserData = "user-data"
	// MetadataStartupScript is run by the guest environment at every boot.
	MetadataStartupScript = "startup-script"
	// MetadataSquidConf and MetadataHtpasswd hold the current Squid files;
	// the startup script installs them at every boot, which is how an
	// Update reaches a VM whose cloud-init ran once.
	MetadataSquidConf = "egressproxy-squid-conf"
	MetadataHtpasswd  = "egressproxy-htpasswd" //nolint:gosec // A metadata key, not a credential.
	// MetadataTLSCert and MetadataTLSKey hold the proxy's certificate
	// chain and key when it listens with TLS, installed the same way.
	MetadataTLSCert = "egressproxy-tls-crt"
	MetadataTLSKey  = "egressproxy-tls-key"
)

// Address types of Exposure.AddressType.
const (
	AddressEphemeral = "Ephemeral"
	AddressStatic    = "Static"
	AddressInternal  = "Internal"
)

// accessConfigName is the name GCE gives the one external NAT.
const accessConfigName = "external-nat"

// firewallMarkPrefix starts a managed firewall rule's description; the
// ownership mark follows, since firewall rules carry no labels.
const firewallMarkPrefix = "egress proxy, managed by provider-egressproxy:"

var (
	nameRE  = regexp.MustCompile(`^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$`)
	zoneRE  = regexp.MustCompile(`^[a-z]+-[a-z]+[0-9]+-[a-z]$`)
	labelRE = regexp.MustCompile(`^[a-z0-9_-]{0,63}$`)
	// labelKeyRE: a label key starts with a lowercase letter.
	labelKeyRE = regexp.MustCompile(`^[a-z][a-z0-9_-]{0,62}$`)
)

// regionOf is the region of a zone: europe-west1-b is in europe-west1.
func regionOf(zone string) string {
	if i := strings.LastIndex(zone, "-"); i > 0 {
		return zone[:i]
	}
	return zone
}

// startupScript installs the Squid files kept in metadata and restarts
// Squid, at every boot after the first: the first boot's cloud-init
// installs Squid itself, and until it has, there is nothing to configure.
// A credential missing from metadata is turned off: every copy of it goes.
// The copies cloud-init staged at first boot go in any case: they may hold
// a credential since replaced.
func startupScript() string {
	return fmt.Sprintf(`#!/bin/sh
# Written by provider-egressproxy: installs the current Squid configuration
# from instance metadata at every boot (an update restarts the VM).
command -v squid >/dev/null 2>&1 || exit 0
md=http://metadata.google.internal/computeMetadata/v1/instance/attributes
get() { curl -sf -H 'Metadata-Flavor: Google' "$md/$1"; }
# The metadata server says the key is not there: only that turns a file
# off; a server that does not answer leaves the files as they are.
absent() { [ "$(curl -s -o /dev/null -w '%%{http_code}' -H 'Metadata-Flavor: Google' "$md/$1")" = 404 ]; }
%[11]s
# The guest's own addresses, as they are at this boot: squid.conf denies
# them, and does not load without them.
%[15]s
get %[1]s > %[2]s.new && install -m 0644 -o root -g root %[2]s.new %[2]s
rm -f %[2]s.new
if get %[3]s > %[4]s.new; then install -m 0640 -o root -g "$(egp_squid_group)" %[4]s.new %[4]s; elif absent %[3]s; then rm -f %[9]s; fi
rm -f %[4]s.new
if get %[5]s > %[6]s.new && get %[7]s > %[8]s.new; then install -m 0644 -o root -g root %[6]s.new %[6]s; install -m 0640 -o root -g "$(egp_squid_group)" %[8]s.new %[8]s; elif absent %[5]s || absent %[7]s; then rm -f %[10]s; fi
rm -f %[6]s.new %[8]s.new
egp_restart squid
%[12]s
# The first boot's staged copies, once cloud-init has installed them: what
# metadata holds now is installed.
if [ -f %[14]s ]; then rm -f %[13]s; fi
`, MetadataSquidConf, cloudinit.SquidConfPath, MetadataHtpasswd, cloudinit.HtpasswdPath,
		MetadataTLSCert, cloudinit.TLSCertPath, MetadataTLSKey, cloudinit.TLSKeyPath,
		strings.Join(cloudinit.HtpasswdFiles(), " "), strings.Join(cloudinit.TLSFiles(), " "), cloudinit.GuestFunctions,
		egressCheckScript(), strings.Join(cloudinit.StagedCredentials(), " "), cloudinit.BootFinishedPath, cloudinit.RefreshOwnAddresses)
}

// egressCheckKey is the metadata key that holds the file at guest path p
// of the guest's own egress check (cloudinit.EgressCheckFiles).
func egressCheckKey(p string) string {
	return "egressproxy-" + strings.ReplaceAll(path.Base(p), ".", "-")
}

// egressCheckScript is the startup script's part that installs the
// guest's own egress check from metadata and starts it, or, when metadata
// holds none (turned off), stops it and removes its files: the check
// follows the settings as Squid's files do. A metadata server that does
// not answer leaves it as it is.
func egressCheckScript() string {
	var get, install, staged []string
	files := cloudinit.EgressCheckFiles(&cloudinit.EgressReport{})
	for _, f := range files {
		st := cloudinit.StagedPath(f)
		get = append(get, "get "+egressCheckKey(f.Path)+" > "+st)
		install = append(install, "mkdir -p "+path.Dir(f.Path)+" && install -m "+f.Mode+" -o root -g root "+st+" "+f.Path)
		staged = append(staged, st)
	}
	return "if " + strings.Join(get, " && ") + "; then\n  " + strings.Join(install, "\n  ") +
		"\n  " + dropReport + "\n  " + cloudinit.EgressCheckStart +
		"\nelif absent " + egressCheckKey(files[0].Path) + "; then\n  " + cloudinit.EgressCheckStop + "\n  " + dropReport +
		"\nfi\nrm -f " + strings.Join(staged, " ")
}

// dropReport deletes the guest attribute of the last report at boot, as
// EgressCheckStart and EgressCheckStop remove its file: it was made with
// the settings before. It never fails: with guest attributes turned off
// the metadata server may refuse, and Get reads none then.
var dropReport = "curl -sf -m 10 -X DELETE -H 'Metadata-Flavor: Google' " + cloudinit.GuestAttributeURL + " >/dev/null 2>&1 || true"

// spec is a request resolved against the config: everything an instance
// is built from.
type spec struct {
	zone, region       string
	machineType, image string // URLs
	addressType        string
	req                proxy.Request
	userData           string // secret: never logged
	squidConf          string
	htpasswd           string // a hash, but as secret as the password
	tlsCert            string
	tlsKey             string // secret: never logged
}

// labels are the instance's labels for s.
func (s *spec) labels() map[string]string {
	l := maps.Clone(s.req.Labels)
	if l == nil {
		l = map[string]string{}
	}
	maps.Copy(l, map[string]string{
		LabelUID:          s.req.Mark.UID,
		LabelInstallation: s.req.Mark.InstallationID,
		LabelSpec:         proxy.Hash(s.req),
		LabelPort:         strconv.Itoa(int(s.req.Proxy.Port)),
		LabelAddress:      strings.ToLower(s.addressType),
		LabelImage:        s.req.Placement.Image,
		LabelMachineType:  s.req.Placement.MachineType,
	})
	return l
}

// metadata is the instance's metadata for s.
func (s *spec) metadata() map[string]string {
	m := map[string]string{
		MetadataUserData:      s.userData,
		MetadataStartupScript: startupScript(),
		MetadataSquidConf:     s.squidConf,
	}
	if s.htpasswd != "" {
		m[MetadataHtpasswd] = s.htpasswd
	}
	if s.tlsCert != "" {
		m[MetadataTLSCert], m[MetadataTLSKey] = s.tlsCert, s.tlsKey
	}
	if r := egressReport(s.req); r != nil {
		m[MetadataGuestAttributes] = "TRUE"
		for _, f := range cloudinit.EgressCheckFiles(r) {
			m[egressCheckKey(f.Path)] = f.Content
		}
	}
	return m
}

// ptr is a pointer to v, for the API's optional fields.
func ptr[T any](v T) *T { return &v }

// buildInstance is the instances.insert body. natIP is the reserved
// address of a Static proxy.
func buildInstance(cfg Config, s *spec, natIP string) *computeapi.Instance {
	nic := &computeapi.NetworkInterface{Network: ptr(fmt.Sprintf("projects/%s/global/networks/%s", cfg.Project, cfg.Network))}
	if cfg.Subnetwork != "" {
		nic.Subnetwork = ptr(fmt.Sprintf("projects/%s/regions/%s/subnetworks/%s", cfg.Project, s.region, cfg.Subnetwork))
	}
	switch s.addressType {
	case AddressEphemeral:
		nic.AccessConfigs = []*computeapi.AccessConfig{{Name: ptr(accessConfigName), Type: ptr("ONE_TO_ONE_NAT")}}
	case AddressStatic:
		nic.AccessConfigs = []*computeapi.AccessConfig{{Name: ptr(accessConfigName), Type: ptr("ONE_TO_ONE_NAT"), NatIP: ptr(natIP)}}
	}
	// The proxy's own tag lets its firewall rule target it alone.
	tags := append(slices.Clone(cfg.NetworkTags), ProxyTag(s.req))
	slices.Sort(tags)
	tags = slices.Compact(tags)
	return &computeapi.Instance{
		Name:        ptr(s.req.Name),
		Description: ptr("egress proxy, managed by provider-egressproxy"),
		MachineType: ptr(fmt.Sprintf("zones/%s/machineTypes/%s", s.zone, s.machineType)),
		Disks: []*computeapi.AttachedDisk{{
			Boot:       ptr(true),
			AutoDelete: ptr(true),
			InitializeParams: &computeapi.AttachedDiskInitializeParams{
				SourceImage: ptr(s.image),
				DiskSizeGb:  ptr(int64(cfg.DiskSizeGB)),
			},
		}},
		NetworkInterfaces: []*computeapi.NetworkInterface{nic},
		Metadata:          &computeapi.Metadata{Items: metadataItems(s.metadata())},
		Labels:            s.labels(),
		Tags:              &computeapi.Tags{Items: tags},
	}
}

// curated is what the log shows of an instances.insert body: everything
// but the metadata's values (cloud-init, squid.conf and the htpasswd are
// there), of which only the size is shown.
func curated(in *computeapi.Instance) map[string]any {
	md := map[string]string{}
	for _, it := range in.GetMetadata().GetItems() {
		md[it.GetKey()] = fmt.Sprintf("%d bytes", len(it.GetValue()))
	}
	var nics []string
	for _, n := range in.GetNetworkInterfaces() {
		nic := "network=" + n.GetNetwork()
		if n.GetSubnetwork() != "" {
			nic += " subnetwork=" + n.GetSubnetwork()
		}
		for _, ac := range n.GetAccessConfigs() {
			nic += " accessConfig=" + ac.GetType()
			if ac.GetNatIP() != "" {
				nic += " natIP=" + ac.GetNatIP()
			}
		}
		nics = append(nics, nic)
	}
	var disks []string
	for _, dk := range in.GetDisks() {
		disks = append(disks, fmt.Sprintf("image=%s sizeGb=%d boot=%t", dk.GetInitializeParams().GetSourceImage(), dk.GetInitializeParams().GetDiskSizeGb(), dk.GetBoot()))
	}
	return map[string]any{"name": in.GetName(), "machineType": in.GetMachineType(), "disks": disks, "networkInterfaces": nics,
		"labels": in.GetLabels(), "tags": in.GetTags().GetItems(), "metadata": md}
}

// metadataItems sorts by key, so that a body is reproducible.
func metadataItems(m map[string]string) []*computeapi.Items {
	keys := slices.Sorted(maps.Keys(m))
	out := make([]*computeapi.Items, 0, len(keys))
	for _, k := range keys {
		out = append(out, &computeapi.Items{Key: ptr(k), Value: ptr(m[k])})
	}
	return out
}

// metadataMap reads an instance's metadata.
func metadataMap(md *computeapi.Metadata) map[string]string {
	out := map[string]string{}
	for _, it := range md.GetItems() {
		out[it.GetKey()] = it.GetValue()
	}
	return out
}

// firewallSources are the rule's source ranges: the IPv4 client CIDRs. A
// rule cannot mix families, and the proxy's NIC is IPv4 only.
func firewallSources(cidrs []string) []string {
	var out []string
	for _, c := range cidrs {
		if p, err := netip.ParsePrefix(c); err == nil && p.Addr().Is4() {
			out = append(out, p.Masked().String())
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// TagPrefix starts every network tag the provider makes. No other tag may
// start with it (the config's networkTags are refused at admission when
// they do), and the digest after it comes from the proxy's installation
// and name, so a proxy's tag never matches a tag or firewall rule of
// anyone else's (http-server, say, which the default network's rules
// open to the internet).
const TagPrefix = "egressproxy-"

// ProxyTag is the proxy's own network tag, which its firewall rule
// targets.
func ProxyTag(req proxy.Request) string {
	sum := sha256.Sum256([]byte("network tag\x00" + req.Mark.InstallationID + "\x00" + req.Name))
	return TagPrefix + hex.EncodeToString(sum[:])[:24]
}

// buildFirewall is the proxy's rule: TCP to the proxy port, from the
// allowed client CIDRs only, to target (the proxy's network tag) only.
func buildFirewall(cfg Config, req proxy.Request, target string) *computeapi.Firewall {
	return &computeapi.Firewall{
		Name:         ptr(req.Name),
		Description:  ptr(firewallDescription(req.Mark)),
		Network:      ptr(fmt.Sprintf("projects/%s/global/networks/%s", cfg.Project, cfg.Network)),
		Direction:    ptr("INGRESS"),
		Priority:     ptr(int32(1000)),
		SourceRanges: firewallSources(req.Proxy.AllowedClientCIDRs),
		TargetTags:   []string{target},
		Allowed:      []*computeapi.Allowed{{IPProtocol: ptr("tcp"), Ports: []string{strconv.Itoa(int(req.Proxy.Port))}}},
		Disabled:     ptr(false),
	}
}

func firewallDescription(m proxy.Mark) string {
	return fmt.Sprintf("%s uid=%s installation=%s", firewallMarkPrefix, m.UID, m.InstallationID)
}

// firewallMark reads the mark back from a rule's description; ok is false
// for a rule the driver did not make.
func firewallMark(fw *computeapi.Firewall) (proxy.Mark, bool) {
	rest, ok := strings.CutPrefix(fw.GetDescription(), firewallMarkPrefix)
	if !ok {
		return proxy.Mark{}, false
	}
	var m proxy.Mark
	for _, f := range strings.Fields(rest) {
		if v, ok := strings.CutPrefix(f, "uid="); ok {
			m.UID = v
		}
		if v, ok := strings.CutPrefix(f, "installation="); ok {
			m.InstallationID = v
		}
	}
	return m, m.UID != ""
}

// firewallCurrent reports whether fw already is what want describes.
func firewallCurrent(fw, want *computeapi.Firewall) bool {
	if fw.GetDisabled() || !slices.Equal(slices.Sorted(slices.Values(fw.GetSourceRanges())), want.GetSourceRanges()) ||
		!slices.Equal(fw.GetTargetTags(), want.GetTargetTags()) || len(fw.GetAllowed()) != 1 {
		return false
	}
	a := fw.GetAllowed()[0]
	return a.GetIPProtocol() == "tcp" && slices.Equal(a.GetPorts(), want.GetAllowed()[0].GetPorts())
}

// buildAddress is the reserved external address of a Static proxy.
func buildAddress(req proxy.Request, region string) *computeapi.Address {
	return &computeapi.Address{
		Name:        ptr(req.Name),
		Description: ptr("egress address of an egress proxy, managed by provider-egressproxy"),
		AddressType: ptr("EXTERNAL"),
		Region:      ptr(region),
		Labels:      addressLabels(req.Mark, exposureOf(req).RetainAddress),
	}
}

func addressLabels(m proxy.Mark, retain bool) map[string]string {
	return map[string]string{LabelUID: m.UID, LabelInstallation: m.InstallationID, LabelRetain: strconv.FormatBool(retain)}
}

// markOf reads the ownership mark from labels.
func markOf(labels map[string]string) proxy.Mark {
	return proxy.Mark{UID: labels[LabelUID], InstallationID: labels[LabelInstallation]}
}

// validLabels checks the request's extra labels, which GCE would refuse
// with a 400 after the rest of the work was done.
func validLabels(l map[string]string) error {
	for k, v := range l {
		if !labelKeyRE.MatchString(k) || !labelRE.MatchString(v) {
			return proxy.Permanentf("label %q=%q is not a valid Compute Engine label (lowercase letters, digits, - and _, at most 63)", k, v)
		}
	}
	return nil
}
