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

// The systemd units of the guest's own egress check.
const (
	reportServicePath = "/etc/systemd/system/egressproxy-egress-check.service"
	reportTimerPath   = "/etc/systemd/system/egressproxy-egress-check.timer"
)

// EgressCheckFiles are the files of the guest's own egress check r (its
// request, root only, its script and its systemd units); none for nil.
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
	}
}

// EgressCheckStart is the shell that runs the guest's check at once and
// hourly, once EgressCheckFiles are in place. The last report goes first:
// it was made with the settings before, and the backend would read it as
// the guest's word on the new ones. In the background: the first check
// may wait for Squid.
var EgressCheckStart = "rm -f " + ReportPath + "; " +
	"if command -v systemctl >/dev/null; then systemctl daemon-reload && systemctl enable --now egressproxy-egress-check.timer && " +
	"systemctl start --no-block egressproxy-egress-check.service; " +
	"else (" + reportScriptPath + " >/dev/null 2>&1 &); fi"

// EgressCheckStop is the shell that stops the guest's check and removes
// its files and its last report: a check turned off leaves neither its
// credential nor a word the backend would still read. It never fails.
//
// Every command may fail (systemctl on units that were never there) under
// sh -e, as cloud-init's runcmd runs: each is followed by || true.
var EgressCheckStop = "if command -v systemctl >/dev/null; then systemctl disable --now egressproxy-egress-check.timer >/dev/null 2>&1 || true; " +
	"systemctl stop egressproxy-egress-check.service >/dev/null 2>&1 || true; fi; " +
	"rm -f " + strings.Join(egressCheckPaths(), " ") + "; " +
	"if command -v systemctl >/dev/null; then systemctl daemon-reload >/dev/null 2>&1 || true; fi"

// egressCheckPaths are every file of the guest's check, its report
// included.
func egressCheckPaths() []string {
	return []string{reportRequestPath, reportScriptPath, reportServicePath, reportTimerPath, ReportPath}
}

// StagedPath is where a script that installs f stages it first: in the
// root-only staging folder, named after f.
func StagedPath(f GuestFile) string { return stageDir + "/" + path.Base(f.Path) + ".staged" }
