package kvm

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"path"
	"strings"
	"time"

	"github.com/digitalocean/go-libvirt"

	"github.com/egressproxy/provider-egressproxy/internal/cloudinit"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
	"github.com/egressproxy/provider-egressproxy/internal/squid"
)

// stageDir is where Update stages files in the guest, as the first boot's
// cloud-config does.
const stageDir = "/var/lib/egressproxy"

// Update implements proxy.Driver. The proxy block is applied in place
// through the guest agent: squid.conf, htpasswd and the TLS certificate
// and key are written (those of a feature turned off removed), Squid is
// reloaded, and the new spec hash goes into the domain's metadata.
// Placement and cloud-init are immutable at admission.
func (d *Driver) Update(ctx context.Context, ref proxy.Ref, req proxy.Request) (proxy.Instance, error) {
	return proxy.Run(ctx, proxy.OpUpdate, d.wrap, func(ctx context.Context) (proxy.Instance, error) { return d.update(ctx, ref, req) })
}

func (d *Driver) update(ctx context.Context, ref proxy.Ref, req proxy.Request) (proxy.Instance, error) {
	h, name, err := d.resolve(ref)
	if gone := (errHostGone{}); errors.As(err, &gone) {
		return proxy.Instance{}, proxy.Permanentf("%v", gone)
	}
	if err != nil {
		return proxy.Instance{}, err
	}
	hv, err := d.hypervisors(ctx)
	if err != nil {
		return proxy.Instance{}, err
	}
	files, err := squid.Render(req.Proxy, cloudinit.SquidOptions(req.Mark.UID, hv...))
	if err != nil {
		return proxy.Instance{}, err
	}
	unlock, err := d.b.names.lock(ctx, Target{Host: h}.endpoint()+"/"+name)
	if err != nil {
		return proxy.Instance{}, err
	}
	defer unlock()
	api, dom, meta, err := d.lookupMeta(ctx, h, name)
	if isCode(err, libvirt.ErrNoDomain) {
		if pe := d.b.pendingFor(Target{Host: h}.endpoint() + "/" + name); pe != nil {
			if m := pe.plan.req.Mark; m != req.Mark {
				return proxy.Instance{}, proxy.Permanentf("instance %s on host %s is being created for another resource (UID %s, installation %q); refusing to change it",
					name, h.Name, m.UID, m.InstallationID)
			}
			return proxy.Instance{}, proxy.Transientf("instance %s on host %s is still being created; it is updated once it runs", name, h.Name)
		}
	}
	if err != nil {
		return proxy.Instance{}, err
	}
	if m := meta.mark(); m == (proxy.Mark{}) || m != req.Mark {
		return proxy.Instance{}, proxy.Permanentf("domain %s on host %s is not this resource's (mark %+v); refusing to change it", name, h.Name, m)
	}
	want := proxy.Hash(req)
	if meta.SpecHash != want {
		state, _, err := api.DomainGetState(ctx, dom)
		if err != nil {
			return proxy.Instance{}, err
		}
		if state != libvirt.DomainRunning {
			return proxy.Instance{}, proxy.Transientf("domain %s is not running; its proxy settings are applied once it runs", name)
		}
		if err := applyFiles(ctx, api, dom, files, cloudinit.ReportOf(req.Proxy, false)); err != nil {
			return proxy.Instance{}, err
		}
		meta.SpecHash, meta.Port = want, req.Proxy.Port
		if err := api.DomainSetMetadata(ctx, dom, meta.element(false), metadataPrefix, metadataURI); err != nil {
			return proxy.Instance{}, err
		}
		d.log(ctx).V(1).Info("kvm proxy settings applied", "host", h.Name, "name", name)
	}
	return d.read(ctx, api, h, dom, meta, req.Proxy.ProxyCA(), req.TenantGuest || ref.TenantGuest)
}

// applyFiles writes Squid's files and the guest's own egress check
// (report, nil when off) through the guest agent and reloads Squid. The
// agent not answering yet is Transient.
//
// The agent writes a file in place when it exists (a process of the guest
// holding it open reads what is written) and creates a new one 0666; a
// guest first booted by an earlier rendering may have the staging folder
// 0755. So before writing, a first script makes the folder root's alone
// and removes the files about to be written: each is then a new file that
// only root can reach, made root's 0600 before anything installs it.
func applyFiles(ctx context.Context, api Libvirt, dom libvirt.Domain, f squid.Files, report *cloudinit.EgressReport) error {
	var staged, contents []string
	stage := func(p, content string) {
		staged, contents = append(staged, p), append(contents, content)
	}
	// The guest's own addresses first: they may have changed since its
	// boot, and squid.conf does not load without them. A guest first
	// booted by an earlier version gets systemd's refresh at start too.
	var script []string
	for _, gf := range cloudinit.OwnAddressesFiles() {
		p := cloudinit.StagedPath(gf)
		stage(p, gf.Content)
		script = append(script, "mkdir -p "+path.Dir(gf.Path), "install -m "+gf.Mode+" -o root -g root "+p+" "+gf.Path, "rm -f "+p)
	}
	script = append(script, cloudinit.SystemdReload, cloudinit.RefreshOwnAddresses,
		"install -m 0644 -o root -g root "+stageDir+"/squid.conf "+cloudinit.SquidConfPath)
	stage(stageDir+"/squid.conf", f.SquidConf)
	if f.Htpasswd != "" {
		stage(stageDir+"/htpasswd", f.Htpasswd)
		script = append(script, "install -m 0640 -o root -g \"$(egp_squid_group)\" "+stageDir+"/htpasswd "+cloudinit.HtpasswdPath)
	}
	if f.TLSCert != "" {
		stage(stageDir+"/tls.crt", f.TLSCert)
		stage(stageDir+"/tls.key", f.TLSKey)
		// The staged key goes at once: installed is the one copy.
		script = append(script, "install -m 0644 -o root -g root "+stageDir+"/tls.crt "+cloudinit.TLSCertPath,
			"install -m 0640 -o root -g \"$(egp_squid_group)\" "+stageDir+"/tls.key "+cloudinit.TLSKeyPath, "rm -f "+stageDir+"/tls.key")
	}
	if rm := cloudinit.RemoveUnnamed(f); rm != "" {
		// Turned off: no copy of the credential stays on the guest.
		script = append(script, rm)
	}
	script = append(script, "egp_reload squid")
	// The check follows the settings: its request names the echo URL and
	// its script Squid's port, and a check turned off leaves nothing.
	if report == nil {
		script = append(script, "{ "+cloudinit.EgressCheckStop+"; }")
	}
	for _, gf := range cloudinit.EgressCheckFiles(report) {
		p := cloudinit.StagedPath(gf)
		stage(p, gf.Content)
		script = append(script, "mkdir -p "+path.Dir(gf.Path), "install -m "+gf.Mode+" -o root -g root "+p+" "+gf.Path, "rm -f "+p)
	}
	if report != nil {
		script = append(script, "{ "+cloudinit.EgressCheckStart+"; }")
	}

	names := strings.Join(staged, " ")
	if err := agentRun(ctx, api, dom, "mkdir -p "+stageDir+" && chown root:root "+stageDir+" && chmod 0700 "+stageDir+" && rm -f "+names); err != nil {
		return err
	}
	for i, p := range staged {
		if err := agentWrite(ctx, api, dom, p, contents[i]); err != nil {
			return err
		}
	}
	script = append([]string{"chown root:root " + names, "chmod 0600 " + names}, script...)
	// The guest families cloud-init provisions differ in Squid's group and
	// service manager: the same functions answer for each.
	return agentRun(ctx, api, dom, cloudinit.GuestFunctions+"; "+strings.Join(script, " && "))
}

type agentReturn[T any] struct {
	Return T `json:"return"`
}

func agentWrite(ctx context.Context, api Libvirt, dom libvirt.Domain, path, content string) error {
	out, err := api.QEMUDomainAgentCommand(ctx, dom, agentCommand("guest-file-open", map[string]string{"path": path, "mode": "w"}))
	if err != nil {
		return agentErr(err)
	}
	var h agentReturn[int64]
	if err := json.Unmarshal([]byte(out), &h); err != nil {
		return proxy.Transientf("guest agent: guest-file-open answered something unexpected")
	}
	_, werr := api.QEMUDomainAgentCommand(ctx, dom, agentCommand("guest-file-write", map[string]any{"handle": h.Return, "buf-b64": base64.StdEncoding.EncodeToString([]byte(content))}))
	_, cerr := api.QEMUDomainAgentCommand(ctx, dom, agentCommand("guest-file-close", map[string]any{"handle": h.Return}))
	if werr != nil {
		return agentErr(werr)
	}
	if cerr != nil {
		return agentErr(cerr)
	}
	return nil
}

// agentRun runs a shell script as root in the guest and waits (briefly)
// for it to end successfully.
func agentRun(ctx context.Context, api Libvirt, dom libvirt.Domain, script string) error {
	out, err := api.QEMUDomainAgentCommand(ctx, dom, agentCommand("guest-exec", map[string]any{"path": "/bin/sh", "arg": []string{"-ec", script}, "capture-output": true}))
	if err != nil {
		return agentErr(err)
	}
	var pid agentReturn[struct {
		PID int64 `json:"pid"`
	}]
	if err := json.Unmarshal([]byte(out), &pid); err != nil {
		return proxy.Transientf("guest agent: guest-exec answered something unexpected")
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		out, err := api.QEMUDomainAgentCommand(ctx, dom, agentCommand("guest-exec-status", map[string]any{"pid": pid.Return.PID}))
		if err != nil {
			return agentErr(err)
		}
		var st agentReturn[struct {
			Exited   bool `json:"exited"`
			ExitCode int  `json:"exitcode"`
		}]
		if err := json.Unmarshal([]byte(out), &st); err != nil {
			return proxy.Transientf("guest agent: guest-exec-status answered something unexpected")
		}
		if st.Return.Exited {
			if st.Return.ExitCode != 0 {
				return proxy.Transientf("applying the proxy settings in the guest failed (exit code %d)", st.Return.ExitCode)
			}
			return nil
		}
		if time.Now().After(deadline) {
			return proxy.Transientf("applying the proxy settings in the guest did not finish within 20s")
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// agentErr makes every guest-agent failure Transient: the agent not being
// up yet is the usual cause.
func agentErr(err error) error {
	var pe *proxy.Error
	if errors.As(err, &pe) {
		return err
	}
	return &proxy.Error{Class: proxy.ClassTransient, Reason: "GuestAgent", Err: err}
}
