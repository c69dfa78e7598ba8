// Package cloudinit is how Squid gets into a VM: the cloud-init user-data
// that installs and configures it (merged with the user's own cloudInit),
// the NoCloud meta-data, and the seed ISO that carries both to KVM and
// Proxmox guests. Compute Engine takes the same user-data as metadata.
package cloudinit

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"mime/multipart"
	"net"
	"net/netip"
	"net/textproto"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"

	"sigs.k8s.io/yaml"

	"github.com/egressproxy/provider-egressproxy/internal/netguard"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
	"github.com/egressproxy/provider-egressproxy/internal/squid"
)

// Paths of Squid's files on a Debian or Ubuntu guest.
const (
	SquidConfPath = "/etc/squid/squid.conf"
	HtpasswdPath  = "/etc/squid/egressproxy.htpasswd" //nolint:gosec // A path, not a credential.
	// TLSCertPath and TLSKeyPath hold the proxy's certificate chain and
	// key when it listens with TLS; the key is readable by root and
	// Squid's group only.
	TLSCertPath = squid.DefaultTLSCertPath
	TLSKeyPath  = squid.DefaultTLSKeyPath
	// OwnAddressesPath is the guest's own addresses as squid.conf's
	// own_dst ACL, which squid.conf includes and denies as destinations:
	// RefreshOwnAddresses writes it before every start of Squid.
	OwnAddressesPath = "/etc/squid/egressproxy-own-addresses.conf"
)

// RefreshOwnAddresses is the shell command that lists the guest's own
// addresses (loopback at least) and its default gateways in
// OwnAddressesPath, replacing the list whole: a gateway is the host on a
// NAT network or the router of the network the guest stands in, which
// trust their guests. It fails, leaving the list as it was, when ip
// cannot list addresses or IPv4 routes (missing, not on the PATH): a list
// of loopback alone would leave the guest's addresses open; a guest
// without IPv6 lists no IPv6 route. A guest's addresses change after its
// first boot (a new lease, a NIC or SLAAC address added), so every script
// that installs squid.conf or (re)starts Squid runs it first, and systemd
// before every start (OwnAddressesFiles). One command, so that it fails
// as a whole in an && list too; its temporary file is the shell's own,
// since a GCP guest's startup script may run it beside the first boot's
// cloud-init.
var RefreshOwnAddresses = "{ { { ip -o addr show && ip route show default && { ip -6 route show default 2>/dev/null || true; }; } > " + OwnAddressesPath + ".$$.ip || { rm -f " + OwnAddressesPath + ".$$.ip; false; }; } && " +
	"{ echo 127.0.0.1; echo ::1; awk '" + ownAddressesAwk + "' " + OwnAddressesPath + ".$$.ip; } | " +
	"sort -u | awk '{ print \"acl own_dst dst \" $1 }' > " + OwnAddressesPath + ".$$ && rm -f " + OwnAddressesPath + ".$$.ip && chmod 0644 " + OwnAddressesPath + ".$$ && " +
	"mv -f " + OwnAddressesPath + ".$$ " + OwnAddressesPath + "; }"

// ownAddressesAwk prints the addresses of `ip -o addr show` and the
// gateways (via, possibly of another family: "via inet6 fe80::1") of
// `ip route show default`, multipath nexthops among them; only what reads
// as an address, since Squid does not start on a list it cannot parse.
const ownAddressesAwk = `$3 == "inet" || $3 == "inet6" { split($4, a, "/"); print a[1] } ` +
	`$1 == "default" || $1 == "nexthop" { for (i = 2; i < NF; i++) if ($i == "via") { v = $(i+1); ` +
	`if (v == "inet" || v == "inet6") v = $(i+2); if (v ~ /^[0-9A-Fa-f:.]+$/ && v ~ /[.:]/) print v } }`

// Where systemd runs RefreshOwnAddresses before every start of Squid (a
// reboot's among them).
const (
	ownAddressesScriptPath = "/usr/local/lib/egressproxy/own-addresses"
	ownAddressesDropInPath = "/etc/systemd/system/squid.service.d/egressproxy-own-addresses.conf"
)

// OwnAddressesFiles are the script that runs RefreshOwnAddresses and the
// drop-in that has systemd run it before every start of Squid, after the
// distribution's own steps. Every script that configures a guest writes
// them, then reloads systemd.
func OwnAddressesFiles() []GuestFile {
	return []GuestFile{
		{Path: ownAddressesScriptPath, Mode: "0755", Content: "#!/bin/sh\n# Written by provider-egressproxy: the guest's own addresses and its\n# gateways, which squid.conf denies as destinations.\nset -e\n" + RefreshOwnAddresses + "\n"},
		{Path: ownAddressesDropInPath, Mode: "0644", Content: "# Written by provider-egressproxy: the guest's own addresses, listed\n# before every start of Squid (squid.conf includes them).\n[Service]\nExecStartPre=" + ownAddressesScriptPath + "\n"},
	}
}

// SystemdReload is the shell command that has systemd read the units
// again, where there is systemd; it never fails.
const SystemdReload = "{ if command -v systemctl >/dev/null; then systemctl daemon-reload || true; fi; }"

// HtpasswdFiles are the guest's copies of the htpasswd: installed, and
// staged by cloud-init or the guest agent.
func HtpasswdFiles() []string { return []string{HtpasswdPath, stageDir + "/htpasswd"} }

// TLSFiles are the guest's copies of the TLS certificate and key:
// installed, and staged.
func TLSFiles() []string {
	return []string{TLSCertPath, TLSKeyPath, stageDir + "/tls.crt", stageDir + "/tls.key"}
}

// BootFinishedPath is where cloud-init notes that it has run on this
// instance: a script that may run beside a first boot's cloud-init (GCP's
// startup script) leaves what cloud-init installs from until it is there.
const BootFinishedPath = "/var/lib/cloud/instance/boot-finished"

// StagedCredentials are the staged copies of the credentials (htpasswd,
// TLS key) that the first boot's cloud-init leaves in the staging folder.
func StagedCredentials() []string { return []string{stageDir + "/htpasswd", stageDir + "/tls.key"} }

// RemoveUnnamed is the shell command that removes the credential files of
// the features f has off (auth, TLS), "" when it has both on: a guest
// configured with f runs it, so turning a feature off leaves no copy of
// its credential behind. It names paths only, never content.
func RemoveUnnamed(f squid.Files) string {
	var rm []string
	if f.Htpasswd == "" {
		rm = append(rm, HtpasswdFiles()...)
	}
	if f.TLSCert == "" {
		rm = append(rm, TLSFiles()...)
	}
	if len(rm) == 0 {
		return ""
	}
	return "rm -f " + strings.Join(rm, " ")
}

// SquidOptions are the squid.Options for a Debian or Ubuntu guest running
// the distribution's squid package under systemd: logs in /var/log/squid
// (logrotate reopens them through /run/squid.pid), the htpasswd next to
// the config. uid is the managed resource's: Squid names itself after it
// (squid.Identity), and it seeds the htpasswd salt so a render is
// reproducible. hypervisor are the addresses of the machine the guest
// runs on (HostAddresses): denied, and never opened by
// allowedDestinationCIDRs, since its sshd, libvirtd or API often trust
// the guests' network.
func SquidOptions(uid string, hypervisor ...string) squid.Options {
	return squid.Options{
		HtpasswdPath:   HtpasswdPath,
		TLSCertPath:    TLSCertPath,
		TLSKeyPath:     TLSKeyPath,
		AuthHelperPath: squid.DefaultAuthHelperPath,
		PIDFile:        "/run/squid.pid",
		AccessLog:      "stdio:/var/log/squid/access.log",
		CacheLogPath:   "/var/log/squid/cache.log",
		HtpasswdSalt:   uid,
		UID:            uid,

		OwnAddressesFile:       OwnAddressesPath,
		DeniedDestinationCIDRs: hypervisor,
	}
}

// HostAddresses are the addresses of host, a config's hypervisor (a name
// or an address, with or without a port), for SquidOptions: a name is
// resolved with r. A name that resolves to nothing is an error naming
// field, Transient: without its addresses the guest's Squid would not
// deny it. The error gives the resolver's verdict, never its server.
func HostAddresses(ctx context.Context, r netguard.Resolver, field, host string) ([]string, error) {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	if a, err := netip.ParseAddr(host); err == nil {
		return []string{a.WithZone("").String()}, nil
	}
	addrs, err := r.LookupNetIP(ctx, "ip", host)
	const why = "the proxy's Squid must deny the hypervisor's addresses so that the guest cannot reach it"
	if err != nil {
		// In netguard's words: the lookup's own name the provider's DNS
		// server (in a pod, the cluster DNS Service).
		return nil, proxy.Transientf("%s: %v; %s", field, &netguard.UnresolvedError{Host: strconv.Quote(host), Err: err}, why)
	}
	if len(addrs) == 0 {
		return nil, proxy.Transientf("%s: %q resolves to no address; %s", field, host, why)
	}
	out := make([]string, len(addrs))
	for i, a := range addrs {
		out[i] = a.WithZone("").String()
	}
	return out, nil
}

// Options are what the user-data is made of.
type Options struct {
	// Squid are the rendered files (rendered with SquidOptions).
	Squid squid.Files
	// InstallGuestAgent installs and starts qemu-guest-agent, through which
	// KVM and Proxmox learn the guest's address.
	InstallGuestAgent bool
	// UserData is the user's own cloudInit (#cloud-config, a #! script, or
	// another cloud-init part type). Secret: never logged or quoted.
	UserData string
	// Hostname of the guest.
	Hostname string
	// EgressReport, when set, has the guest check its egress address
	// itself, through its own Squid, and keep the answer where the backend
	// reads it (see EgressReport).
	EgressReport *EgressReport
}

// EgressReport is the egress check a guest runs itself (egressIPSource
// Reported, docs/allow-listing.md): squid.ReportScript with Request
// against its own Squid on loopback, at boot (retried every 5 s until the
// echo answers, for up to 5 minutes) and hourly (a systemd timer), its
// line written to ReportPath, which the guest agent reads (KVM, Proxmox),
// and, with GuestAttribute, put to the guest attribute
// GuestAttributeKey (GCP).
type EgressReport struct {
	// Request is squid.ReportRequest of the check: secret (it holds the
	// check's credential), root-only in the guest.
	Request string
	// Port is Squid's.
	Port int32
	// GuestAttribute also puts the line to the instance's guest attribute.
	GuestAttribute bool
}

// ReportOf is the guest's own egress check for s, with the guest
// attribute (GCP) or without; nil when s names no check or an https echo
// URL, which the guest's bash cannot fetch.
func ReportOf(s proxy.Settings, attribute bool) *EgressReport {
	if s.EgressCheck == nil {
		return nil
	}
	r, err := squid.ReportRequest(*s.EgressCheck)
	if err != nil {
		return nil
	}
	return &EgressReport{Request: r, Port: squid.ReportPort(s), GuestAttribute: attribute}
}

// Where a guest keeps its egress check.
const (
	// ReportPath is the latest line of the guest's own egress check.
	ReportPath = stageDir + "/egress-check.report"
	// reportRequestPath holds the check's request (root only).
	reportRequestPath = stageDir + "/egress-check.request"
	// reportScriptPath runs the check.
	reportScriptPath = "/usr/local/lib/egressproxy/egress-check"
	// GuestAttributeKey is the guest attribute (namespace/key) of a GCP
	// guest's egress check.
	GuestAttributeKey = "egressproxy/egress-check"
	// GuestAttributeURL is where a GCP guest puts (and deletes) it.
	GuestAttributeURL = "http://metadata.google.internal/computeMetadata/v1/instance/guest-attributes/" + GuestAttributeKey
)

// reportScript is the guest's check: squid.ReportScript until the echo
// answers (5 minutes at most: Squid may still be starting), its line kept
// in ReportPath and, with attribute, put to the guest attribute. Run
// once by systemd's timer; with --every SECONDS it repeats itself, for
// OpenRC, which has no timers.
func reportScript(port int32, attribute bool) string {
	var b strings.Builder
	b.WriteString("#!/bin/bash\n# Written by provider-egressproxy: the egress check from inside the\n# instance, through its own Squid (docs/allow-listing.md).\ncheck() {\n")
	b.WriteString(squid.ReportScript)
	// Turned off meanwhile (EgressCheckStop): it ends, and nothing is left
	// to be read.
	fmt.Fprintf(&b, "}\nonce() {\nfor i in $(seq 60); do\n  [ -f %[1]s ] || exit 0\n  line=$(check %[1]s %[2]d 127.0.0.1) && break\n  sleep 5 & wait $!\ndone\n", reportRequestPath, port)
	fmt.Fprintf(&b, "[ -f %s ] || exit 0\n", reportRequestPath)
	fmt.Fprintf(&b, "printf '%%s\\n' \"$line\" > %[1]s.new && chmod 0644 %[1]s.new && mv -f %[1]s.new %[1]s\n", ReportPath)
	if attribute {
		fmt.Fprintf(&b, "curl -sf -m 10 -X PUT -H 'Metadata-Flavor: Google' --data-binary \"$line\" %s >/dev/null || true\n", GuestAttributeURL)
	}
	// The sleep in the background, so that a stop ends it at once.
	b.WriteString("}\nif [ \"${1:-}\" = --every ]; then\n  trap 'kill ${!:-} 2>/dev/null; exit 0' TERM\n  while :; do once; sleep \"$2\" & wait $!; done\nfi\nonce\n")
	return b.String()
}

const reportService = `[Unit]
Description=provider-egressproxy: the egress check from inside the instance
After=squid.service network-online.target

[Service]
Type=oneshot
ExecStart=` + reportScriptPath + `
`

const reportTimer = `[Unit]
Description=provider-egressproxy: the egress check, hourly

[Timer]
OnBootSec=30s
OnUnitActiveSec=1h

[Install]
WantedBy=timers.target
`

// UserData returns MIME multipart user-data: the user's part first, then
// the generated part, so that cloud-init merges the provider's Squid setup
// last, over the user's (lists appended, so a user's write_files or runcmd
// never drops Squid's, and Squid's values replace the user's on the same
// keys). The boundary is derived from the content and is never a string
// the content holds, so no content can end its part early and add parts
// of its own. A user cloud-config that would have the provider's part
// dropped or its files replaced is refused, naming the field.
func UserData(o Options) (string, error) {
	if o.Squid.SquidConf == "" {
		return "", proxy.Permanentf("cloudinit: no squid.conf to install")
	}
	gen := generated(o)
	type part struct{ contentType, filename, body string }
	var parts []part
	if strings.TrimSpace(o.UserData) != "" {
		ct, err := partType(o.UserData)
		if err != nil {
			return "", err
		}
		if ct == "text/cloud-config" {
			if err := checkUserCloudConfig(o.UserData); err != nil {
				return "", err
			}
		}
		parts = append(parts, part{ct, "user.cfg", o.UserData})
	}
	parts = append(parts, part{"text/cloud-config", "egressproxy.cfg", gen})

	b := boundary(o.UserData, gen)
	var buf bytes.Buffer
	fmt.Fprintf(&buf, "Content-Type: multipart/mixed; boundary=\"%s\"\nMIME-Version: 1.0\n\n", b)
	w := multipart.NewWriter(&buf)
	if err := w.SetBoundary(b); err != nil {
		return "", err
	}
	for _, p := range parts {
		if err := writePart(w, p.contentType, p.filename, p.body); err != nil {
			return "", err
		}
	}
	if err := w.Close(); err != nil {
		return "", err
	}
	return buf.String(), nil
}

// boundary returns a MIME boundary that none of contents holds: a digest
// of the contents (so the user-data is the same for the same input), and
// another digest in the unlikely case the first one occurs.
func boundary(contents ...string) string {
	h := sha256.New()
	for _, c := range contents {
		fmt.Fprintf(h, "%d:%s", len(c), c)
	}
	sum := h.Sum(nil)
	for {
		b := "egressproxy-" + hex.EncodeToString(sum[:16])
		clash := false
		for _, c := range contents {
			if strings.Contains(c, b) {
				clash = true
				break
			}
		}
		if !clash {
			return b
		}
		next := sha256.Sum256(sum)
		sum = next[:]
	}
}

// checkUserCloudConfig refuses a user cloud-config that would make
// cloud-init drop or replace the provider's part: keys that change how
// parts merge, the keys the provider's part extends written as anything
// but a list (cloud-init would keep the user's value and drop the
// provider's), and files written where Squid's configuration lives. It
// never quotes the content: cloudInit is secret.
func checkUserCloudConfig(s string) error {
	var cfg map[string]any
	if err := yaml.Unmarshal([]byte(s), &cfg); err != nil {
		return proxy.Permanentf("spec.forProvider.cloudInit: the #cloud-config is not a YAML mapping")
	}
	for _, k := range []string{"merge_how", "merge_type"} {
		if _, ok := cfg[k]; ok {
			return proxy.Permanentf("spec.forProvider.cloudInit: %s is not allowed: the provider decides how its part merges with yours", k)
		}
	}
	for _, k := range []string{"write_files", "runcmd", "bootcmd"} {
		if v, ok := cfg[k]; ok {
			if _, list := v.([]any); !list {
				return proxy.Permanentf("spec.forProvider.cloudInit: %s must be a list", k)
			}
		}
	}
	if files, ok := cfg["write_files"].([]any); ok {
		for i, f := range files {
			m, _ := f.(map[string]any)
			path, _ := m["path"].(string)
			clean := filepath.Clean("/" + path)
			for _, dir := range []string{"/etc/squid", stageDir} {
				if clean == dir || strings.HasPrefix(clean, dir+"/") {
					return proxy.Permanentf("spec.forProvider.cloudInit: write_files[%d] writes under %s, which holds the provider's Squid configuration", i, dir)
				}
			}
		}
	}
	return nil
}

// accepted names the forms of a user's cloudInit the provider takes.
const accepted = `accepted are a #cloud-config (checked), a #! script, a #cloud-boothook, and a "## template: jinja" template of a #! script`

// jinjaHeader is cloud-init's own test for a jinja template (its
// JINJA_PREFIX, case-insensitive, spaces optional).
var jinjaHeader = regexp.MustCompile(`(?i)^##\s*template:\s*jinja\s*$`)

// partType maps a user's cloudInit to its MIME type, as cloud-init itself
// does for single-part user-data, and refuses every form whose content
// cloud-init would run without the provider being able to check it
// first: the cloud-config checks (checkUserCloudConfig) keep Squid's files
// and the merge rules out of reach, and a form that hides a cloud-config
// from them (a jinja template rendered at boot, an #include fetched at
// boot, gzip, a MIME multipart of its own, a part handler that handles the
// provider's part, an archive or a JSON patch) would undo that. Scripts
// run as root whatever they say; allowUserCloudInit: false refuses those.
func partType(s string) (string, error) {
	if strings.HasPrefix(s, "\x1f\x8b") {
		return "", proxy.Permanentf("spec.forProvider.cloudInit: gzip-compressed user-data cannot be checked before cloud-init runs it: give it uncompressed; %s", accepted)
	}
	lines := strings.SplitN(strings.TrimLeft(s, " \t\r\n"), "\n", 2)
	first := strings.TrimSpace(lines[0])
	refuse := func(what string) (string, error) {
		// The content itself is secret: name only the form.
		return "", proxy.Permanentf("spec.forProvider.cloudInit: %s; %s", what, accepted)
	}
	switch {
	case first == "#cloud-config":
		return "text/cloud-config", nil
	case strings.HasPrefix(first, "#!"):
		return "text/x-shellscript", nil
	case first == "#cloud-boothook":
		return "text/cloud-boothook", nil
	case jinjaHeader.MatchString(first):
		// cloud-init renders the template, then handles what it rendered by
		// its first line: a script is a script; a cloud-config would reach
		// cloud-init unchecked (the template decides its keys at boot).
		body := ""
		if len(lines) == 2 {
			body = strings.TrimLeft(lines[1], " \t\r\n")
		}
		if strings.HasPrefix(body, "#!") {
			return "text/jinja2", nil
		}
		return refuse("a jinja template of anything but a #! script cannot be checked before cloud-init renders it (write the #cloud-config itself, without the template header)")
	case strings.HasPrefix(first, "#include"):
		return refuse("#include is fetched by the VM at boot and cannot be checked: put the content itself in cloudInit")
	case strings.HasPrefix(first, "#part-handler"):
		return refuse("a #part-handler would handle the parts after it, the provider's among them")
	case strings.HasPrefix(first, "#cloud-config-archive"), strings.HasPrefix(first, "#cloud-config-jsonp"):
		return refuse("#cloud-config-archive and #cloud-config-jsonp carry parts the cloud-config checks cannot see")
	case strings.HasPrefix(strings.ToLower(first), "content-type:"), strings.HasPrefix(strings.ToLower(first), "mime-version:"):
		return refuse("MIME user-data cannot be checked part by part: the provider writes the multipart; give one part")
	case strings.HasPrefix(first, "#cloud-config"):
		return refuse("the first line must be exactly #cloud-config")
	}
	return "", proxy.Permanentf("spec.forProvider.cloudInit must start with #cloud-config, #!, #cloud-boothook or \"## template: jinja\" (of a #! script)")
}

func writePart(w *multipart.Writer, contentType, filename, body string) error {
	h := textproto.MIMEHeader{}
	h.Set("Content-Type", contentType+`; charset="us-ascii"`)
	h.Set("MIME-Version", "1.0")
	h.Set("Content-Transfer-Encoding", "7bit")
	h.Set("Content-Disposition", `attachment; filename="`+filename+`"`)
	pw, err := w.CreatePart(h)
	if err != nil {
		return err
	}
	if !strings.HasSuffix(body, "\n") {
		body += "\n"
	}
	_, err = pw.Write([]byte(body))
	return err
}

// generated is the cloud-config that stages Squid's config and htpasswd
// (write_files runs early, before any package is installed), installs
// Squid and the guest agent unless the image has them (a guest without a
// package mirror still works with a prepared image), then installs the
// staged files over the package's defaults and restarts Squid.
func generated(o Options) string {
	var b strings.Builder
	b.WriteString("#cloud-config\n")
	// Merged last, into the user's part: lists appended (the user's
	// entries first), the provider's values replacing the user's on the
	// same keys.
	b.WriteString("merge_how:\n  - name: list\n    settings: [append]\n  - name: dict\n    settings: [replace, recurse_list]\n")
	if o.Hostname != "" {
		// Quoted: YAML would read a name such as "yes" or "017" as
		// another type, and cloud-init would set no hostname.
		fmt.Fprintf(&b, "hostname: %s\n", strconv.Quote(o.Hostname))
	}
	b.WriteString("write_files:\n")
	writeFile(&b, stageDir+"/squid.conf", o.Squid.SquidConf)
	if o.Squid.Htpasswd != "" {
		writeFile(&b, stageDir+"/htpasswd", o.Squid.Htpasswd)
	}
	if o.Squid.TLSCert != "" {
		writeFile(&b, stageDir+"/tls.crt", o.Squid.TLSCert)
		writeFile(&b, stageDir+"/tls.key", o.Squid.TLSKey)
	}
	for _, f := range append(OwnAddressesFiles(), EgressCheckFiles(o.EgressReport)...) {
		writeFileMode(&b, f.Path, f.Mode, f.Content)
	}
	b.WriteString("runcmd:\n")
	// The staging folder root's alone: files the guest agent writes there
	// later (a KVM update, which locks it again first) are created 0666.
	script := []string{GuestFunctions, "chmod 0700 " + stageDir}
	if o.InstallGuestAgent {
		script = append(script, "command -v qemu-ga >/dev/null || egp_install qemu-guest-agent",
			"egp_enable qemu-guest-agent || true")
	}
	script = append(script,
		"command -v squid >/dev/null || egp_install squid",
		// Before squid.conf, which does not load without it.
		RefreshOwnAddresses,
		"install -m 0644 -o root -g root "+stageDir+"/squid.conf "+SquidConfPath)
	if o.Squid.Htpasswd != "" {
		script = append(script, "egp_auth_helper", "install -m 0640 -o root -g \"$(egp_squid_group)\" "+stageDir+"/htpasswd "+HtpasswdPath)
	}
	if o.Squid.TLSCert != "" {
		script = append(script, "install -m 0644 -o root -g root "+stageDir+"/tls.crt "+TLSCertPath,
			"install -m 0640 -o root -g \"$(egp_squid_group)\" "+stageDir+"/tls.key "+TLSKeyPath)
	}
	if rm := RemoveUnnamed(o.Squid); rm != "" {
		// A seed run again (Proxmox) with a feature turned off.
		script = append(script, rm)
	}
	script = append(script, SystemdReload, "egp_enable squid", "egp_restart squid")
	if o.EgressReport != nil {
		script = append(script, EgressCheckStart)
	} else {
		// A seed run again (Proxmox) with the check turned off.
		script = append(script, EgressCheckStop)
	}
	fmt.Fprintf(&b, "  - [sh, -ec, %q]\n", "export DEBIAN_FRONTEND=noninteractive; "+strings.Join(script, "; "))
	return b.String()
}

// GuestFunctions are the shell functions the generated runcmd script (and
// every other script the provider has a guest run: a KVM update's, the
// GCP startup script) uses to install packages and manage services on
// the guest families cloud
// images come in: Debian and Ubuntu (apt), Fedora, RHEL and its rebuilds
// (dnf, or yum on older ones), openSUSE and SLES (zypper), Alpine (apk,
// with OpenRC rather than systemd). The squid.conf the provider writes
// names Debian's basic_ncsa_auth path; egp_auth_helper links the
// family's own helper there. Squid runs as proxy on Debian and as squid
// elsewhere: egp_squid_group says which, for the htpasswd file's group.
const GuestFunctions = `egp_install() { ` +
	`if command -v apt-get >/dev/null; then apt-get update && apt-get install -y --no-install-recommends "$@"; ` +
	`elif command -v dnf >/dev/null; then dnf install -y "$@"; ` +
	`elif command -v yum >/dev/null; then yum install -y "$@"; ` +
	`elif command -v zypper >/dev/null; then zypper --non-interactive install "$@"; ` +
	`elif command -v apk >/dev/null; then apk add --no-cache "$@"; ` +
	`else echo "egressproxy: no apt-get, dnf, yum, zypper or apk to install $*" >&2; return 1; fi; }; ` +
	`egp_enable() { if command -v systemctl >/dev/null; then systemctl enable --now "$1"; else rc-update add "$1" default && rc-service "$1" start; fi; }; ` +
	`egp_restart() { if command -v systemctl >/dev/null; then systemctl restart "$1"; else rc-service "$1" restart; fi; }; ` +
	`egp_reload() { if command -v systemctl >/dev/null; then systemctl reload-or-restart "$1"; else rc-service "$1" reload || rc-service "$1" restart; fi; }; ` +
	`egp_squid_group() { if getent group proxy >/dev/null; then echo proxy; else echo squid; fi; }; ` +
	`egp_auth_helper() { [ -x ` + squid.DefaultAuthHelperPath + ` ] && return 0; ` +
	`for d in /usr/lib64/squid /usr/libexec/squid; do if [ -x "$d/basic_ncsa_auth" ]; then mkdir -p "$(dirname ` + squid.DefaultAuthHelperPath + `)" && ln -sf "$d/basic_ncsa_auth" ` + squid.DefaultAuthHelperPath + `; return 0; fi; done; ` +
	`echo "egressproxy: no basic_ncsa_auth found" >&2; return 1; }`

// stageDir holds the files until Squid is installed; root only.
const stageDir = "/var/lib/egressproxy"

func writeFile(b *strings.Builder, path, content string) {
	writeFileMode(b, path, "0600", content)
}

func writeFileMode(b *strings.Builder, path, mode, content string) {
	fmt.Fprintf(b, "  - path: %s\n    owner: root:root\n    permissions: '%s'\n    encoding: b64\n    content: %s\n",
		path, mode, base64.StdEncoding.EncodeToString([]byte(content)))
}

// MetaData is the NoCloud meta-data: the instance ID (a new one makes
// cloud-init run again) and the hostname, both quoted as strings (see
// UserData's hostname); MetaValue reads them back.
func MetaData(instanceID, hostname string) string {
	return fmt.Sprintf("instance-id: %s\nlocal-hostname: %s\n", strconv.Quote(instanceID), strconv.Quote(hostname))
}

// MetaValue is the value of a meta-data line's key as MetaData wrote
// it: unquoted, or as earlier versions wrote it, bare.
func MetaValue(v string) string {
	v = strings.TrimSpace(v)
	if u, err := strconv.Unquote(v); err == nil {
		return u
	}
	return v
}

// SquidConfOf is the squid.conf the user-data UserData made installs, ""
// when it has none: what the guest's Squid then runs. The backends' fakes
// answer readiness probes with its identity (squid.IdentityOf).
func SquidConfOf(userData string) string { return stagedFile(userData, "squid.conf") }

// EgressRequestOf is the egress check's request the user-data UserData
// made writes, "" when it has none (the fakes' guests run the check).
func EgressRequestOf(userData string) string {
	return stagedFile(userData, strings.TrimPrefix(reportRequestPath, stageDir+"/"))
}

// HtpasswdOf is the htpasswd the user-data UserData made installs, ""
// when it has none (the fakes run real Squid from it).
func HtpasswdOf(userData string) string { return stagedFile(userData, "htpasswd") }

// TLSOf is the certificate chain and key the user-data UserData made
// installs, "" when the proxy listens without TLS (the fakes run real
// Squid from them).
func TLSOf(userData string) (cert, key string) {
	return stagedFile(userData, "tls.crt"), stagedFile(userData, "tls.key")
}

// stagedFile is the content of the file the generated part writes to
// stageDir/name, "" when it writes none.
func stagedFile(userData, name string) string {
	lines := strings.Split(userData, "\n")
	for i, l := range lines {
		if strings.TrimSpace(l) != "- path: "+stageDir+"/"+name {
			continue
		}
		for _, c := range lines[i+1:] {
			c = strings.TrimSpace(c)
			if strings.HasPrefix(c, "- ") {
				return ""
			}
			if v, ok := strings.CutPrefix(c, "content: "); ok {
				b, err := base64.StdEncoding.DecodeString(v)
				if err != nil {
					return ""
				}
				return string(b)
			}
		}
	}
	return ""
}
