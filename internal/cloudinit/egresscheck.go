package cloudinit

import (
	"path"
	"strings"
)

// GuestFile is a file the provider puts on a guest, with its mode (owner
// root).
type GuestFile struct {
	Path, Mode string
	// Content is secret where it is the check's request.
	Content string
}

// The services of the guest's own egress check: systemd's units, and
// OpenRC's (Alpine), which is staged beside the script and installed on
// OpenRC guests only.
const (
	reportServicePath = "/etc/systemd/system/egressproxy-egress-check.service"
	reportTimerPath   = "/etc/systemd/system/egressproxy-egress-check.timer"
	openRCStagedPath  = "/usr/local/lib/egressproxy/egress-check.openrc"
	openRCServicePath = "/etc/init.d/" + openRCService
	openRCService     = "egressproxy-egress-check"
	// openRCRunlevelLink is how OpenRC records a service in the default
	// runlevel: rc-update add on one that is there fails on some versions.
	openRCRunlevelLink = "/etc/runlevels/default/" + openRCService
)

// EgressCheckFiles are the files of the guest's own egress check r (its
// request, root only, its script and its services); none for nil.
// Every script that configures a guest writes them the same way: the first
// boot's cloud-init, a KVM update's guest agent, GCP's startup script.
func EgressCheckFiles(r *EgressReport) []GuestFile {
	if r == nil {
		return nil
	}
	return []GuestFile{
		{Path: reportRequestPath, Mode: "0600", Content: r.Request},
		{Path: reportScriptPath, Mode: "0755", Content: reportScript(r.Port, r.GuestAttribute)},
		{Path: reportServicePath, Mode: "0644", Content: reportService},
		{Path: reportTimerPath, Mode: "0644", Content: reportTimer},
		{Path: openRCStagedPath, Mode: "0644", Content: openRCScript},
	}
}

// openRCScript is the check's OpenRC service: the script repeating itself
// hourly from boot, as systemd's timer runs it.
const openRCScript = `#!/sbin/openrc-run
# Written by provider-egressproxy: the egress check from inside the
# instance, at boot and hourly (docs/allow-listing.md).
description="provider-egressproxy: the egress check from inside the instance"
command=` + reportScriptPath + `
command_args="--every 3600"
command_background=true
pidfile=/run/` + openRCService + `.pid
# A check in flight ends within its 15 s timeout before the stop is seen.
retry="SIGTERM/20/SIGKILL/5"

depend() {
	need net
	after squid
}
`

// EgressCheckStart is the shell that runs the guest's check at once and
// hourly, once EgressCheckFiles are in place: with systemd's timer, or
// OpenRC's service, or (neither) once in the background. The last report
// goes first: it was made with the settings before, and the backend would
// read it as the guest's word on the new ones. In the background: the
// first check may wait for Squid. The check is a bash script, and Alpine
// has no bash until it is installed.
var EgressCheckStart = "rm -f " + ReportPath + "; " +
	"{ command -v bash >/dev/null || egp_install bash; }; " +
	"if command -v systemctl >/dev/null; then systemctl daemon-reload && systemctl enable --now egressproxy-egress-check.timer && " +
	"systemctl start --no-block egressproxy-egress-check.service; " +
	"elif command -v rc-service >/dev/null; then install -m 0755 -o root -g root " + openRCStagedPath + " " + openRCServicePath + " && " +
	"{ [ -e " + openRCRunlevelLink + " ] || rc-update add " + openRCService + " default; } && rc-service " + openRCService + " restart; " +
	"else (" + reportScriptPath + " >/dev/null 2>&1 &); fi"

// EgressCheckStop is the shell that stops the guest's check and removes
// its files and its last report: a check turned off leaves neither its
// credential nor a word the backend would still read. It never fails.
//
// Every command may fail (systemctl on units that were never there) under
// sh -e, as cloud-init's runcmd runs: each is followed by || true.
var EgressCheckStop = "if command -v systemctl >/dev/null; then systemctl disable --now egressproxy-egress-check.timer >/dev/null 2>&1 || true; " +
	"systemctl stop egressproxy-egress-check.service >/dev/null 2>&1 || true; fi; " +
	"if command -v rc-service >/dev/null && [ -e " + openRCServicePath + " ]; then rc-service " + openRCService + " stop >/dev/null 2>&1 || true; " +
	"rc-update del " + openRCService + " default >/dev/null 2>&1 || true; fi; " +
	"rm -f " + strings.Join(egressCheckPaths(), " ") + "; " +
	"if command -v systemctl >/dev/null; then systemctl daemon-reload >/dev/null 2>&1 || true; fi"

// egressCheckPaths are every file of the guest's check, its report
// included.
func egressCheckPaths() []string {
	return []string{reportRequestPath, reportScriptPath, reportServicePath, reportTimerPath, openRCStagedPath, openRCServicePath, ReportPath}
}

// StagedPath is where a script that installs f stages it first: in the
// root-only staging folder, named after f.
func StagedPath(f GuestFile) string { return stageDir + "/" + path.Base(f.Path) + ".staged" }
