package proxmox

import (
	"context"
	"fmt"
	"net/netip"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/egressproxy/provider-egressproxy/internal/cloudinit"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
	"github.com/egressproxy/provider-egressproxy/internal/squid"
	"github.com/egressproxy/provider-egressproxy/internal/telemetry"
)

// Create implements proxy.Driver: it finds the resource's VM (by name, by
// the clones this process started, by its probe window) and takes the next
// step of its provisioning, or allocates a VMID and starts the clone. It
// never waits for a task.
func (d *Driver) Create(ctx context.Context, req proxy.Request) (proxy.Instance, error) {
	d.warn(ctx)
	return proxy.Run(ctx, proxy.OpCreate, d.wrap, func(ctx context.Context) (proxy.Instance, error) { return d.create(ctx, req) })
}

func (d *Driver) checkRequest(req proxy.Request) error {
	if !nameRe.MatchString(req.Name) {
		return proxy.Permanentf("invalid instance name %q", req.Name)
	}
	return checkMark(req.Mark)
}

func (d *Driver) create(ctx context.Context, req proxy.Request) (proxy.Instance, error) {
	if err := d.checkRequest(req); err != nil {
		return proxy.Instance{}, err
	}
	node, tmplID, mt, err := d.placement(req.Placement)
	if err != nil {
		return proxy.Instance{}, err
	}
	d.logger(ctx).V(telemetry.VDetail).Info("proxmox create", "name", req.Name, "node", node, "template", req.Placement.Image, "templateVMID", tmplID,
		"machineType", req.Placement.MachineType, "cores", mt.Cores, "memoryMiB", mt.MemoryMiB, "diskGiB", d.cfg.DiskGiB, "isoStorage", d.cfg.ISOStorage,
		"bridge", d.cfg.Bridge, "vlanTag", d.cfg.VLANTag, "port", req.Proxy.Port, "allowedClientCIDRs", req.Proxy.AllowedClientCIDRs,
		"allowedPorts", req.Proxy.AllowedPorts, "auth", req.Proxy.Auth.Username != "", "cloudInitBytes", len(req.CloudInit))
	listed := time.Now()
	res, err := d.api.Resources(ctx, "vm")
	if err != nil {
		return proxy.Instance{}, err
	}
	d.shared.forgetClones(d.cfg.URL, res)
	idx := indexVMs(res)
	if f, ok, err := d.locate(idx, proxy.Ref{Name: req.Name, Mark: req.Mark, Placement: req.Placement, ProxyCA: req.Proxy.ProxyCA(), TenantGuest: req.TenantGuest}); err != nil {
		return proxy.Instance{}, err
	} else if ok {
		f.listed = listed
		return d.adopt(ctx, f, req)
	}

	// No VM of this name: allocate a VMID from the probe window. A VMID in
	// the window that carries this resource's UID under another name is a
	// renamed VM of ours: never make a second one.
	free := 0
	for _, id := range probeWindow(req.Mark.UID, d.cfg.VMIDMin, d.cfg.VMIDMax) {
		if !idx.taken[id] {
			if free == 0 {
				free = id
			}
			continue
		}
		if t := parseTags(idx.byID[id].Tags); t.managed && t.mark.UID == req.Mark.UID {
			return proxy.Instance{}, proxy.Permanentf("VM %d carries this resource's mark but is named %q, not %q: rename it back (qm set %d --name %s) or remove it",
				id, idx.byID[id].Name, req.Name, id, req.Name)
		}
	}
	if free == 0 {
		return proxy.Instance{}, proxy.Quotaf("no free VMID among the %d this proxy may use in proxmox.vmidRange %d-%d: widen the range or remove VMs from it",
			maxProbes, d.cfg.VMIDMin, d.cfg.VMIDMax)
	}
	tmpl, ok := idx.byID[tmplID]
	switch {
	case !ok:
		return proxy.Instance{}, proxy.Permanentf("template %q (VMID %d) does not exist", req.Placement.Image, tmplID)
	case !bool(tmpl.Template):
		return proxy.Instance{}, proxy.Permanentf("VM %d (template %q) is not a template: convert it (qm template %d) or fix proxmox.templates", tmplID, req.Placement.Image, tmplID)
	case tmpl.Status == "unknown":
		return proxy.Instance{}, proxy.Transientf("node %s, which holds template %q (VMID %d), is not answering", tmpl.Node, req.Placement.Image, tmplID)
	}
	tcfg, err := d.api.VMConfig(ctx, tmpl.Node, tmplID)
	if err != nil {
		return proxy.Instance{}, err
	}
	if err := d.checkTemplate(tcfg, req.Placement.Image, tmplID); err != nil {
		return proxy.Instance{}, err
	}
	now := d.now().UTC().Truncate(time.Second)
	p := CloneParams{
		NewID:       free,
		Name:        req.Name,
		Description: description{name: req.Name, mark: req.Mark, createdAt: now, port: int(req.Proxy.Port)}.String(),
		// A full clone does not depend on the template's disks, so the
		// template can be updated or removed while proxies run.
		Full: true,
	}
	if node != tmpl.Node {
		p.Target = node
	}
	d.logger(ctx).V(telemetry.VDetail).Info("proxmox clone request", "name", req.Name, "node", tmpl.Node, "templateVMID", tmplID,
		"newid", p.NewID, "target", p.Target, "full", p.Full, "description", p.Description)
	upid, err := d.api.Clone(ctx, tmpl.Node, tmplID, p)
	if isExists(err) {
		return proxy.Instance{}, proxy.Transientf("VMID %d was taken by someone else while the clone was being started; the next attempt picks another", free)
	}
	if err != nil {
		return proxy.Instance{}, err
	}
	d.shared.setClone(d.cfg.URL, free, pendingClone{name: req.Name, mark: req.Mark, createdAt: now, upid: upid, node: node})
	d.logger(ctx).V(1).Info("proxmox clone started", "name", req.Name, "vmid", free, "node", node, "template", tmplID, "upid", upid)
	return proxy.Instance{
		ID:        formatID(free, req.Name),
		Name:      req.Name,
		Mark:      req.Mark,
		State:     proxy.StateProvisioning,
		Placement: proxy.Placement{Location: node, MachineType: req.Placement.MachineType, Image: req.Placement.Image},
		CreatedAt: now,
		Progress:  fmt.Sprintf("cloning template %s (VMID %d) to VMID %d", req.Placement.Image, tmplID, free),
		Operation: upid,
		Details:   map[string]string{"vmid": strconv.Itoa(free), "node": node},
	}, nil
}

// checkTemplate refuses, before any clone, a template whose clones could
// not become proxies.
func (d *Driver) checkTemplate(cfg VMConfig, image string, vmid int) error {
	for k, v := range cfg {
		if driveKey.MatchString(k) && strings.Contains(v, "cloudinit") {
			return proxy.Permanentf("template %q (VMID %d) has a Proxmox cloud-init drive (%s): remove it (qm set %d --delete %s); the provider brings its own NoCloud seed",
				image, vmid, k, vmid, k)
		}
	}
	if cfg["net0"] == "" && d.cfg.Bridge == "" {
		return proxy.Permanentf("template %q (VMID %d) has no net0 and proxmox.bridge is not set: its clones would have no network", image, vmid)
	}
	if d.cfg.DiskGiB > 0 {
		if _, _, ok := bootDisk(cfg); !ok {
			return proxy.Permanentf("template %q (VMID %d) has no boot disk with a size, so proxmox.diskGiB cannot be applied", image, vmid)
		}
	}
	return nil
}

var (
	driveKey = regexp.MustCompile(`^(ide|sata|scsi|virtio)\d+$`)
	sizeRe   = regexp.MustCompile(`(?:^|,)size=(\d+(?:\.\d+)?)([KMGT]?)(?:,|$)`)
)

// bootDisk returns the key and size of the VM's boot disk: the first disk
// of its boot order, else its bootdisk, else the first disk.
func bootDisk(cfg VMConfig) (string, int64, bool) {
	var order []string
	if o, ok := strings.CutPrefix(cfg["boot"], "order="); ok {
		order = strings.Split(o, ";")
	}
	if b := cfg["bootdisk"]; b != "" {
		order = append(order, b)
	}
	order = append(order, "scsi0", "virtio0", "sata0", "ide0")
	for _, k := range order {
		v, ok := cfg[k]
		if !ok || !driveKey.MatchString(k) || strings.Contains(v, "media=cdrom") {
			continue
		}
		m := sizeRe.FindStringSubmatch(v)
		if m == nil {
			return k, 0, false
		}
		f, _ := strconv.ParseFloat(m[1], 64)
		mult := map[string]float64{"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}[m[2]]
		return k, int64(f * mult), true
	}
	return "", 0, false
}

// adopt continues the provisioning of a VM found under the request's name,
// once it is proven to be the resource's.
func (d *Driver) adopt(ctx context.Context, f found, req proxy.Request) (proxy.Instance, error) {
	e := f.res
	if e.Name == "" {
		switch {
		case f.clone == nil:
			return proxy.Instance{}, proxy.Transientf("VM %d, where this proxy's VM would be, is being cloned and shows whose it is only once the clone ends; waiting", e.VMID)
		case f.clone.mark != req.Mark:
			return proxy.Instance{}, proxy.Permanentf("VM %d is being cloned as %q for another resource (%s); refusing to adopt it", e.VMID, req.Name, describeMark(f.clone.mark))
		}
		return d.describe(ctx, f, req.Placement, req.Mark, "", nil)
	}
	t := parseTags(e.Tags)
	mark := t.mark
	var cfg VMConfig
	if !t.managed {
		c, err := d.api.VMConfig(ctx, e.Node, e.VMID)
		if err != nil {
			return proxy.Instance{}, err
		}
		cfg = c
		mark = parseDescription(cfg["description"]).mark
	}
	if mark != req.Mark {
		return proxy.Instance{}, proxy.Permanentf("VM %d is named %q but carries %s, not this resource's mark; refusing to adopt it: remove or rename it, or import it with managementPolicies [Observe]",
			e.VMID, e.Name, describeMark(mark))
	}
	return d.converge(ctx, f, cfg, req)
}

// converge takes the next step towards req for the resource's VM and
// returns what the VM is now. Steps are chosen from the VM alone:
//
//   - a lock: wait (a clone), or Transient with what the admin must do;
//   - a task running on the VM: wait for it;
//   - no spec tag: provision (configure + seed, resize, start, complete);
//   - another spec tag: apply the new settings (seed, reboot, complete).
func (d *Driver) converge(ctx context.Context, f found, cfg VMConfig, req proxy.Request) (proxy.Instance, error) {
	e := f.res
	if e.Status == "unknown" {
		return proxy.Instance{}, proxy.Transientf("node %s is not answering, so VM %d (%s) cannot be changed now", e.Node, e.VMID, f.name)
	}
	switch e.Lock {
	case "":
	case "clone", "create":
		return d.describe(ctx, f, req.Placement, req.Mark, "", cfg)
	case "suspended":
		return proxy.Instance{}, proxy.Transientf("%s", hibernatedMessage(e, "its provisioning cannot continue"))
	default:
		return proxy.Instance{}, proxy.Transientf("%s", d.lockedMessage(e, "configured"))
	}
	if cfg == nil {
		c, err := d.api.VMConfig(ctx, e.Node, e.VMID)
		if err != nil {
			return proxy.Instance{}, err
		}
		cfg = c
	}
	// The config is fresher than the listing.
	t := parseTags(cfg["tags"])
	if !t.managed {
		t.mark = req.Mark
	}
	e.Tags = cfg["tags"]
	f.res = e
	want := proxy.Hash(req)
	if t.spec == want {
		return d.describe(ctx, f, req.Placement, req.Mark, "", cfg)
	}
	tasks, err := d.api.Tasks(ctx, e.Node, e.VMID)
	if err != nil {
		return proxy.Instance{}, err
	}
	if r := firstRunning(tasks); r != nil {
		inst, err := d.describe(ctx, f, req.Placement, req.Mark, "", cfg)
		inst.Progress = joinProgress(inst.Progress, fmt.Sprintf("waiting for the %s task to finish", r.Type))
		inst.Operation = r.UPID
		return inst, err
	}
	desc := parseDescription(cfg["description"])
	if t.spec == "" {
		return d.provision(ctx, f, cfg, t, desc, tasks, req)
	}
	return d.apply(ctx, f, cfg, t, desc, tasks, req)
}

// step is an Instance for a provisioning step that started a task.
func (d *Driver) step(f found, req proxy.Request, progress, upid string) proxy.Instance {
	return proxy.Instance{
		ID:        formatID(f.res.VMID, f.name),
		Name:      f.name,
		Mark:      req.Mark,
		State:     proxy.StateProvisioning,
		Placement: proxy.Placement{Location: f.res.Node, MachineType: req.Placement.MachineType, Image: req.Placement.Image},
		Progress:  progress,
		Operation: upid,
		// No spec is complete yet; Get reports pendingSpec for it.
		Details: map[string]string{"vmid": strconv.Itoa(f.res.VMID), "node": f.res.Node},
	}
}

func (d *Driver) provision(ctx context.Context, f found, cfg VMConfig, t tags, desc description, tasks []Task, req proxy.Request) (proxy.Instance, error) {
	e := f.res
	mt, ok := d.cfg.MachineTypes[req.Placement.MachineType]
	if !ok {
		return proxy.Instance{}, proxy.Permanentf("machine type %q is not a key of proxmox.machineTypes", req.Placement.MachineType)
	}
	seedVol := d.isoVolID(req.Name, req.Mark.UID)
	withCreated := func(inst proxy.Instance) proxy.Instance {
		inst.CreatedAt = desc.createdAt
		if inst.CreatedAt.IsZero() {
			inst.CreatedAt = metaCTime(cfg["meta"])
		}
		return inst
	}

	// 1. Seed and configuration, in one step: the seed is uploaded (a
	// task; the file is checked before the first start) and the config
	// written in one PUT, guarded by the digest of what was read.
	if !d.configured(cfg, t, seedVol, mt) {
		upid, err := d.uploadSeed(ctx, e.Node, req, e.VMID)
		if err != nil {
			return proxy.Instance{}, err
		}
		desc.applying, desc.applyingSince = proxy.Hash(req), uploadStart(upid)
		set, err := d.configParams(cfg, t, desc, req, mt, e.Node, seedVol)
		if err != nil {
			return proxy.Instance{}, err
		}
		d.logger(ctx).V(telemetry.VDetail).Info("proxmox vm config request", "name", f.name, "vmid", e.VMID, "node", e.Node, "params", set)
		if err := d.api.SetVMConfig(ctx, e.Node, e.VMID, ConfigUpdate{Set: set, Digest: cfg["digest"]}); err != nil {
			return proxy.Instance{}, err
		}
		d.logger(ctx).V(1).Info("proxmox vm configured", "name", f.name, "vmid", e.VMID, "node", e.Node, "cores", mt.Cores, "memoryMiB", mt.MemoryMiB)
		return withCreated(d.step(f, req, "configured the VM and uploaded its seed ISO", upid)), nil
	}

	// 2. Grow the boot disk.
	if key, size, ok := bootDisk(cfg); d.cfg.DiskGiB > 0 && ok && size < int64(d.cfg.DiskGiB)<<30 {
		if err := d.recentFailure(ctx, tasks, "qmresize", fmt.Sprintf("growing %s of VM %d", key, e.VMID)); err != nil {
			return proxy.Instance{}, err
		}
		upid, err := d.api.Resize(ctx, e.Node, e.VMID, key, fmt.Sprintf("%dG", d.cfg.DiskGiB))
		if err != nil {
			return proxy.Instance{}, err
		}
		return withCreated(d.step(f, req, fmt.Sprintf("growing %s to %d GiB", key, d.cfg.DiskGiB), upid)), nil
	}

	// 3. First start, once the seed is on the storage the VM reads it
	// from (an upload that failed, or a VM moved since, uploads again).
	if e.Status != "running" {
		if err := d.recentFailure(ctx, tasks, "qmstart", fmt.Sprintf("starting VM %d", e.VMID)); err != nil {
			return proxy.Instance{}, err
		}
		vols, err := d.api.ISOs(ctx, e.Node, d.cfg.ISOStorage)
		if err != nil {
			return proxy.Instance{}, err
		}
		// The seed must be the current settings' (applying names what it
		// was built from; a VM of an earlier version records none), and
		// on storage since its upload started.
		want := proxy.Hash(req)
		i := slices.IndexFunc(vols, func(v Volume) bool { return v.VolID == seedVol })
		landed := i >= 0 && (desc.applying == "" || (desc.applying == want && vols[i].CTime >= desc.applyingSince))
		if !landed {
			if desc.applying == want && d.now().Unix()-desc.applyingSince <= int64(d.retry/time.Second) {
				return withCreated(d.step(f, req, "waiting for the seed ISO upload to storage "+d.cfg.ISOStorage+" of node "+e.Node, "")), nil
			}
			upid, err := d.uploadSeed(ctx, e.Node, req, e.VMID)
			if err != nil {
				return proxy.Instance{}, err
			}
			progress := "the seed ISO is not on storage " + d.cfg.ISOStorage + " of node " + e.Node + " yet: uploading it"
			if i >= 0 && desc.applying != want {
				progress = "the proxy settings changed since the seed ISO was uploaded: uploading it again"
			}
			desc.seedNode, desc.seedVolID = e.Node, seedVol
			desc.applying, desc.applyingSince = want, uploadStart(upid)
			// The guest listens where this seed says (complete keeps it
			// when the settings change again before the tag).
			desc.port = int(req.Proxy.Port)
			if err := d.api.SetVMConfig(ctx, e.Node, e.VMID, ConfigUpdate{Set: map[string]string{"description": desc.String()}, Digest: cfg["digest"]}); err != nil {
				return proxy.Instance{}, err
			}
			return withCreated(d.step(f, req, progress, upid)), nil
		}
		upid, err := d.api.Start(ctx, e.Node, e.VMID)
		if err != nil {
			return proxy.Instance{}, err
		}
		return withCreated(d.step(f, req, "starting the VM", upid)), nil
	}

	// 4. Running: provisioning is complete, with the settings the guest
	// booted with; settings changed since are then applied as an update.
	spec := proxy.Hash(req)
	if desc.applying != "" {
		spec = desc.applying
	}
	return d.complete(ctx, f, cfg, t, desc, req, spec, "proxmox vm provisioned")
}

// uploadStart is the start time of upload task upid, on the server's clock.
func uploadStart(upid string) int64 {
	u, _ := ParseUPID(upid)
	return u.StartTime
}

// complete records that the VM runs with spec: the spec-hash tag (and,
// when spec is req's, its port; no update in progress, in the description).
func (d *Driver) complete(ctx context.Context, f found, cfg VMConfig, t tags, desc description, req proxy.Request, spec, msg string) (proxy.Instance, error) {
	e := f.res
	t.mark = req.Mark
	t.spec = spec
	if spec == proxy.Hash(req) {
		desc.port = int(req.Proxy.Port)
	}
	desc.applying, desc.applyingSince, desc.rebootedBefore = "", 0, nil
	set := map[string]string{"tags": t.String(), "description": desc.String()}
	if err := d.api.SetVMConfig(ctx, e.Node, e.VMID, ConfigUpdate{Set: set, Digest: cfg["digest"]}); err != nil {
		return proxy.Instance{}, err
	}
	cfg = VMConfig(cloneMap(cfg))
	for k, v := range set {
		cfg[k] = v
	}
	e.Tags = set["tags"]
	f.res = e
	created := desc.createdAt
	if created.IsZero() {
		created = metaCTime(cfg["meta"])
	}
	d.shared.setFact(factKey{url: d.cfg.URL, vmid: e.VMID, uid: req.Mark.UID, spec: t.spec}, facts{createdAt: created, port: desc.port})
	d.logger(ctx).V(1).Info(msg, "name", f.name, "vmid", e.VMID, "node", e.Node, "specHash", t.spec)
	return d.describe(ctx, f, req.Placement, req.Mark, "", cfg)
}

func cloneMap(m map[string]string) map[string]string {
	out := make(map[string]string, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// apply brings a complete VM to changed proxy settings. cloud-init runs
// once per instance ID, so the seed is rebuilt with a new one (it names
// the spec hash) and the VM rebooted: cloud-init then writes the new
// squid.conf and restarts Squid. The update in progress is recorded in the
// description (with the upload's start time, on the server's clock), so
// that a restart in the middle neither loses it nor reboots twice.
func (d *Driver) apply(ctx context.Context, f found, cfg VMConfig, t tags, desc description, tasks []Task, req proxy.Request) (proxy.Instance, error) {
	e := f.res
	want := proxy.Hash(req)
	seedVol := d.isoVolID(req.Name, req.Mark.UID)
	current := func(progress, upid string) (proxy.Instance, error) {
		inst, err := d.describe(ctx, f, req.Placement, req.Mark, "", cfg)
		inst.Progress = joinProgress(inst.Progress, progress)
		// The VM still runs the old spec; the new one is not written yet.
		inst.Operation, inst.SpecHash = upid, ""
		return inst, err
	}
	if desc.applying != want {
		upid, err := d.uploadSeed(ctx, e.Node, req, e.VMID)
		if err != nil {
			return proxy.Instance{}, err
		}
		u, _ := ParseUPID(upid)
		desc.applying, desc.applyingSince, desc.rebootedBefore = want, u.StartTime, nil
		for _, t := range tasks {
			// Start times are in seconds: an earlier update's reboot in
			// this second is not this one's.
			if t.Type == "qmreboot" && t.StartTime >= u.StartTime {
				desc.rebootedBefore = append(desc.rebootedBefore, t.UPID)
			}
		}
		desc.seedNode, desc.seedVolID = e.Node, seedVol
		set := map[string]string{"description": desc.String(), "ide2": seedVol + ",media=cdrom"}
		d.logger(ctx).V(telemetry.VDetail).Info("proxmox vm config request", "name", f.name, "vmid", e.VMID, "node", e.Node, "params", set)
		if err := d.api.SetVMConfig(ctx, e.Node, e.VMID, ConfigUpdate{Set: set, Digest: cfg["digest"]}); err != nil {
			return proxy.Instance{}, err
		}
		return current("applying new proxy settings: new seed uploaded, a reboot follows", upid)
	}
	if e.Status != "running" {
		// A stopped VM reads the new seed when it next boots: complete once
		// it is there, as an upload can fail after its task started.
		if ok, err := d.seedLanded(ctx, e.Node, e.VMID, seedVol, desc, cfg); !ok || err != nil {
			if err != nil {
				return proxy.Instance{}, err
			}
			return current("applying new proxy settings: waiting for the seed upload", "")
		}
		return d.complete(ctx, f, cfg, t, desc, req, proxy.Hash(req), "proxmox vm updated")
	}
	var reboot *Task
	for i := range tasks {
		if tasks[i].Type == "qmreboot" && tasks[i].StartTime >= desc.applyingSince && !slices.Contains(desc.rebootedBefore, tasks[i].UPID) &&
			(reboot == nil || tasks[i].StartTime > reboot.StartTime) {
			reboot = &tasks[i]
		}
	}
	switch {
	case reboot != nil && !reboot.Failed():
		return d.complete(ctx, f, cfg, t, desc, req, proxy.Hash(req), "proxmox vm updated")
	case reboot != nil && d.recent(*reboot):
		return proxy.Instance{}, d.taskError(ctx, *reboot, fmt.Sprintf("rebooting VM %d to apply new proxy settings", e.VMID))
	}
	// The reboot must find the new seed.
	if ok, err := d.seedLanded(ctx, e.Node, e.VMID, seedVol, desc, cfg); !ok || err != nil {
		if err != nil {
			return proxy.Instance{}, err
		}
		return current("applying new proxy settings: waiting for the seed upload", "")
	}
	upid, err := d.api.Reboot(ctx, e.Node, e.VMID)
	if err != nil {
		return proxy.Instance{}, err
	}
	return current("applying new proxy settings: rebooting", upid)
}

// seedLanded reports whether the seed of the update desc records is on
// node's ISO storage (VM vmid's). One that did not land within
// RetryFailedTaskAfter is forgotten (the description written with cfg's
// digest), so the next call uploads it again.
func (d *Driver) seedLanded(ctx context.Context, node string, vmid int, seedVol string, desc description, cfg VMConfig) (bool, error) {
	vols, err := d.api.ISOs(ctx, node, d.cfg.ISOStorage)
	if err != nil {
		return false, err
	}
	if slices.ContainsFunc(vols, func(v Volume) bool { return v.VolID == seedVol && v.CTime >= desc.applyingSince }) {
		return true, nil
	}
	if d.now().Unix()-desc.applyingSince > int64(d.retry/time.Second) {
		desc.applying, desc.applyingSince, desc.rebootedBefore = "", 0, nil
		if err := d.api.SetVMConfig(ctx, node, vmid, ConfigUpdate{Set: map[string]string{"description": desc.String()}, Digest: cfg["digest"]}); err != nil {
			return false, err
		}
	}
	return false, nil
}

// configured reports whether the configure step is done.
func (d *Driver) configured(cfg VMConfig, t tags, seedVol string, mt MachineType) bool {
	if !t.managed || !strings.HasPrefix(cfg["ide2"]+",", seedVol+",") {
		return false
	}
	if cfg["cores"] != strconv.Itoa(mt.Cores) || strings.SplitN(cfg["memory"], ",", 2)[0] != strconv.Itoa(mt.MemoryMiB) {
		return false
	}
	if a := cfg["agent"]; !(a == "1" || strings.HasPrefix(a, "1,") || strings.Contains(a, "enabled=1")) {
		return false
	}
	want, err := d.net0(cfg["net0"])
	return err == nil && (want == "" || want == cfg["net0"])
}

// configParams is the configure step's PUT.
func (d *Driver) configParams(cfg VMConfig, t tags, desc description, req proxy.Request, mt MachineType, node, seedVol string) (map[string]string, error) {
	t.mark, t.spec = req.Mark, ""
	desc.name, desc.mark = req.Name, req.Mark
	if desc.createdAt.IsZero() {
		desc.createdAt = metaCTime(cfg["meta"])
	}
	desc.port = int(req.Proxy.Port)
	desc.seedNode, desc.seedVolID = node, seedVol
	set := map[string]string{
		"cores":       strconv.Itoa(mt.Cores),
		"memory":      strconv.Itoa(mt.MemoryMiB),
		"agent":       "1",
		"onboot":      "1",
		"ide2":        seedVol + ",media=cdrom",
		"tags":        t.String(),
		"description": desc.String(),
	}
	net0, err := d.net0(cfg["net0"])
	if err != nil {
		return nil, err
	}
	if net0 != "" && net0 != cfg["net0"] {
		set["net0"] = net0
	}
	return set, nil
}

// net0 is the VM's net0 with the config's bridge and VLAN tag, keeping its
// model and MAC; "" when the config sets neither.
func (d *Driver) net0(cur string) (string, error) {
	if d.cfg.Bridge == "" && d.cfg.VLANTag == 0 {
		return "", nil
	}
	parts := []string{"virtio"}
	if cur != "" {
		parts = strings.Split(cur, ",")
	} else if d.cfg.Bridge == "" {
		return "", proxy.Permanentf("the VM has no net0 and proxmox.bridge is not set")
	}
	out := []string{parts[0]}
	for _, p := range parts[1:] {
		k, _, _ := strings.Cut(p, "=")
		if k == "bridge" || k == "tag" {
			continue
		}
		out = append(out, p)
	}
	bridge := d.cfg.Bridge
	if bridge == "" {
		for _, p := range parts[1:] {
			if v, ok := strings.CutPrefix(p, "bridge="); ok {
				bridge = v
			}
		}
	}
	if bridge != "" {
		out = append(out, "bridge="+bridge)
	}
	if d.cfg.VLANTag != 0 {
		out = append(out, "tag="+strconv.Itoa(d.cfg.VLANTag))
	}
	return strings.Join(out, ","), nil
}

// uploadSeed builds the seed ISO for req and uploads it over any earlier
// one (never trusting a copy from an attempt that may have been cut off).
func (d *Driver) uploadSeed(ctx context.Context, node string, req proxy.Request, vmid int) (string, error) {
	iso, err := d.seed(ctx, req, vmid)
	if err != nil {
		return "", err
	}
	return d.api.Upload(ctx, node, d.cfg.ISOStorage, seedFile(req.Name, req.Mark.UID), iso)
}

// seed is the NoCloud seed: Squid's files rendered from the proxy block,
// installed by the user-data (merged with the user's cloudInit), with the
// guest agent unless turned off. cloud-init runs a seed once per instance
// ID, and never one whose ID it ran before (its semaphores are on the
// disk): the ID names the spec hash and the time of the seed, so a spec
// changed back to an earlier one runs too. The guest's Squid denies the
// cluster's hypervisors (hypervisors).
func (d *Driver) seed(ctx context.Context, req proxy.Request, vmid int) ([]byte, error) {
	hv, err := d.hypervisors(ctx)
	if err != nil {
		return nil, err
	}
	files, err := squid.Render(req.Proxy, cloudinit.SquidOptions(req.Mark.UID, hv...))
	if err != nil {
		return nil, proxy.Classify(proxy.ClassPermanent, err)
	}
	ud, err := cloudinit.UserData(cloudinit.Options{Squid: files, InstallGuestAgent: d.cfg.InstallGuestAgent, UserData: req.CloudInit, Hostname: req.Name,
		EgressReport: cloudinit.ReportOf(req.Proxy, false)})
	if err != nil {
		return nil, proxy.Classify(proxy.ClassPermanent, err)
	}
	md := cloudinit.MetaData(fmt.Sprintf("egressproxy-%d-%s-%x", vmid, proxy.Hash(req), d.now().UnixNano()), req.Name)
	iso, err := cloudinit.SeedISO(ud, md, "")
	if err != nil {
		return nil, err
	}
	return iso, nil
}

// hypervisors are the addresses a guest's Squid denies: the API's host
// and every online node's own addresses, as the nodes' network
// configuration states them (their API on 8006, sshd, the bridge the
// guests use), which trust the guests' network. An offline node cannot
// say; it is denied from the next create or update after it is back.
func (d *Driver) hypervisors(ctx context.Context) ([]string, error) {
	host := d.cfg.URL
	if u, err := url.Parse(d.cfg.URL); err == nil && u.Host != "" {
		host = u.Host
	}
	out, err := cloudinit.HostAddresses(ctx, d.resolver, "proxmox.url", host)
	if err != nil {
		return nil, err
	}
	nodes, err := d.api.Resources(ctx, "node")
	if err != nil {
		return nil, d.wrap(err, "list the cluster's nodes, whose addresses the proxy's Squid denies")
	}
	for _, n := range nodes {
		if n.Type != "node" || n.Status != "online" {
			continue
		}
		ifaces, err := d.api.NodeNetwork(ctx, n.Node)
		if err != nil {
			return nil, d.wrap(err, fmt.Sprintf("read node %s's network, whose addresses the proxy's Squid denies", n.Node))
		}
		for _, i := range ifaces {
			for _, a := range []string{i.Address, i.Address6, i.CIDR, i.CIDR6} {
				a, _, _ = strings.Cut(a, "/")
				if ip, err := netip.ParseAddr(a); err == nil {
					out = append(out, ip.WithZone("").String())
				}
			}
		}
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}
