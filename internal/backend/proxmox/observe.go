package proxmox

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/egressproxy/provider-egressproxy/internal/netguard"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
	"github.com/egressproxy/provider-egressproxy/internal/squid"
	"github.com/egressproxy/provider-egressproxy/internal/telemetry"
)

// Get implements proxy.Driver. At steady state it makes two requests: the
// cluster's resources (node, status, lock, name, tags: the mark and the
// spec hash) and the guest agent's interfaces (the address); then it
// probes the proxy's port.
func (d *Driver) Get(ctx context.Context, ref proxy.Ref) (proxy.Instance, error) {
	d.warn(ctx)
	return proxy.Run(ctx, proxy.OpGet, d.wrap, func(ctx context.Context) (proxy.Instance, error) { return d.get(ctx, ref) })
}

// pendingSpec is the SpecHash of a VM whose provisioning is not complete:
// it matches no request, so the controller calls Update, which takes the
// next step.
const pendingSpec = "incomplete"

var nameRe = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$`)

// vmIndex is the guests of a /cluster/resources answer.
type vmIndex struct {
	byID map[int]Resource
	list []Resource
	// taken are the VMIDs of every guest, containers included: VMIDs are
	// unique across both.
	taken map[int]bool
	nodes map[string]string // node -> status, when the answer had nodes
}

func indexVMs(res []Resource) vmIndex {
	idx := vmIndex{byID: map[int]Resource{}, taken: map[int]bool{}, nodes: map[string]string{}}
	for _, r := range res {
		switch r.Type {
		case "qemu":
			idx.byID[r.VMID] = r
			idx.list = append(idx.list, r)
			idx.taken[r.VMID] = true
		case "lxc", "openvz":
			idx.taken[r.VMID] = true
		case "node":
			idx.nodes[r.Node] = r.Status
		}
	}
	return idx
}

// found is the VM a reference resolved to.
type found struct {
	res Resource
	// name is the proxy's name: the VM's, or for a nameless VM in the
	// middle of its clone the one it will get.
	name string
	// clone is this process's record of the clone, when it started it.
	clone *pendingClone
	// knownIP is the address the guest agent reported at the VM's last
	// steady Get (batch.go): describe does not ask the agent again.
	knownIP string
	// proxyCA is the proxy's CA when it listens with TLS (Ref.ProxyCA):
	// the probe verifies against it.
	proxyCA string
	// listed is when the listing res comes from was asked for (zero when
	// unknown): with res.Uptime, it dates the VM's last start.
	listed time.Time
	// tenantGuest is Ref.TenantGuest: the guest agent's address is the
	// tenant's word (reportedGuard).
	tenantGuest bool
}

// locate resolves ref against the cluster's guests: by the VMID and name
// of its ID, else by name. A VM in the middle of its clone has no name
// yet; it is attributed by the clones this process started, else (after
// a restart) by the ID or the resource's probe window.
func (d *Driver) locate(idx vmIndex, ref proxy.Ref) (found, bool, error) {
	f, ok, err := d.locateVM(idx, ref)
	f.proxyCA, f.tenantGuest = ref.ProxyCA, ref.TenantGuest
	return f, ok, err
}

func (d *Driver) locateVM(idx vmIndex, ref proxy.Ref) (found, bool, error) {
	if ref.ID != "" {
		vmid, name, err := parseID(ref.ID)
		if err != nil {
			return found{}, false, err
		}
		e, ok := idx.byID[vmid]
		switch {
		case !ok || bool(e.Template):
			return found{}, false, nil
		case e.Name == name:
			return found{res: e, name: name}, true, nil
		case e.Name == "":
			if c, known := d.shared.clone(d.cfg.URL, vmid); known {
				return found{res: e, name: c.name, clone: &c}, c.name == name, nil
			}
			return found{res: e, name: name}, true, nil
		}
		return found{}, false, nil // the VMID now holds another VM
	}
	if !nameRe.MatchString(ref.Name) {
		return found{}, false, proxy.Permanentf("reference has no ID and an invalid name %q", ref.Name)
	}
	var named []Resource
	for _, e := range idx.list {
		if e.Name == ref.Name && !bool(e.Template) {
			named = append(named, e)
		}
	}
	switch len(named) {
	case 1:
		return found{res: named[0], name: ref.Name}, true, nil
	case 0:
	default:
		ids := make([]string, 0, len(named))
		for _, e := range named {
			ids = append(ids, strconv.Itoa(e.VMID))
		}
		return found{}, false, proxy.Permanentf("%d VMs are named %q (VMIDs %s): remove all but the provider's", len(named), ref.Name, strings.Join(ids, ", "))
	}
	if id, c, ok := d.shared.cloneByName(d.cfg.URL, ref.Name); ok {
		if e, exists := idx.byID[id]; exists && e.Name == "" {
			return found{res: e, name: ref.Name, clone: &c}, true, nil
		}
	}
	if ref.Mark.UID == "" {
		return found{}, false, nil
	}
	for _, id := range probeWindow(ref.Mark.UID, d.cfg.VMIDMin, d.cfg.VMIDMax) {
		e, ok := idx.byID[id]
		if !ok || e.Name != "" {
			continue
		}
		if _, known := d.shared.clone(d.cfg.URL, id); known {
			continue // another resource's clone, started here
		}
		return found{res: e, name: ref.Name}, true, nil
	}
	return found{}, false, nil
}

func (d *Driver) get(ctx context.Context, ref proxy.Ref) (proxy.Instance, error) {
	if ref.ID != "" {
		if _, _, err := parseID(ref.ID); err != nil {
			return proxy.Instance{}, err
		}
	}
	if inst, handled, err := d.getSteady(ctx, ref); handled {
		return inst, err
	}
	// A resource being deleted may have to look for its seed on every
	// node: the listing then includes the nodes and their status.
	typ := "vm"
	if ref.Deleting {
		typ = ""
	}
	taken := time.Now()
	res, err := d.api.Resources(ctx, typ)
	if err != nil {
		return proxy.Instance{}, err
	}
	d.shared.forgetClones(d.cfg.URL, res)
	idx := indexVMs(res)
	f, ok, err := d.locate(idx, ref)
	if err != nil {
		return proxy.Instance{}, err
	}
	if !ok && ref.Deleting {
		return d.leftovers(ctx, idx, ref)
	}
	f.listed = taken
	if ok && ref.ID != "" {
		// A direct read: a snapshot must be newer to answer the next Get.
		k := vmKey{d.cfg.URL, f.res.VMID}
		d.shared.snapshots().Observed(k.String())
		inst, err := d.describe(ctx, f, ref.Placement, ref.Mark, ref.Operation, nil)
		if !ref.Live && !ref.Deleting {
			d.noteSteady(k, f.res, inst, err, taken)
		}
		return inst, err
	}
	if !ok {
		if err := d.failedClone(ctx, ref); err != nil {
			return proxy.Instance{}, err
		}
		return proxy.Instance{}, proxy.NotFoundf("no VM named %q", ref.Name)
	}
	// A clone in flight that this process did not start (it restarted)
	// shows no mark yet. It sits where this resource's VM would, so it is
	// reported as this resource's; the mark is checked once the clone ends.
	return d.describe(ctx, f, ref.Placement, ref.Mark, ref.Operation, nil)
}

// describe reports a located VM. assumed is the mark to report for a
// nameless clone nobody here started; operation is the caller's last
// UPID (a clone's gives the creation time); cfg, when the caller has read
// it, saves a request.
func (d *Driver) describe(ctx context.Context, f found, placement proxy.Placement, assumed proxy.Mark, operation string, cfg VMConfig) (proxy.Instance, error) {
	e := f.res
	placement.Location = e.Node
	inst := proxy.Instance{
		ID:        formatID(e.VMID, f.name),
		Name:      f.name,
		Placement: placement,
		Details:   map[string]string{"vmid": strconv.Itoa(e.VMID), "node": e.Node},
	}
	if e.Status == "unknown" {
		return inst, proxy.Transientf("node %s is not answering, so the state of VM %d (%s) is unknown", e.Node, e.VMID, f.name)
	}
	if e.Name == "" {
		inst.State, inst.SpecHash = proxy.StateProvisioning, pendingSpec
		inst.Progress = fmt.Sprintf("cloning: VM %d has no name until its clone task ends (locked: %s)", e.VMID, d.word(e.Lock, locks))
		if f.clone != nil {
			inst.Mark, inst.CreatedAt, inst.Operation = f.clone.mark, f.clone.createdAt, f.clone.upid
		} else {
			inst.Mark = assumed
			if u, ok := ParseUPID(operation); ok && u.Type == "qmclone" {
				inst.CreatedAt, inst.Operation = time.Unix(u.StartTime, 0).UTC(), operation
			}
		}
		return inst, nil
	}
	t := parseTags(e.Tags)
	var desc *description
	readConfig := func() error {
		if cfg == nil {
			c, err := d.api.VMConfig(ctx, e.Node, e.VMID)
			if err != nil {
				if isNotExist(err) {
					// Destroyed between the two requests.
					return proxy.NotFoundf("VM %d (%s) is gone", e.VMID, f.name)
				}
				return err
			}
			cfg = c
		}
		dd := parseDescription(cfg["description"])
		desc = &dd
		return nil
	}
	if t.managed {
		inst.Mark = t.mark
	} else {
		if err := readConfig(); err != nil {
			return inst, err
		}
		inst.Mark = desc.mark
	}
	marked := inst.Mark.UID != ""
	if marked {
		inst.SpecHash = t.spec
		if t.spec == "" {
			inst.SpecHash = pendingSpec
		}
	}
	// Creation time and port never change for one VM, mark and spec:
	// read them once per process.
	key := factKey{url: d.cfg.URL, vmid: e.VMID, uid: inst.Mark.UID, spec: t.spec}
	fc, cached := d.shared.fact(key)
	if !cached && marked {
		if desc == nil {
			if err := readConfig(); err != nil {
				return inst, err
			}
		}
		fc = facts{createdAt: desc.createdAt, port: desc.port}
		if fc.createdAt.IsZero() {
			fc.createdAt = metaCTime(cfg["meta"])
		}
		d.shared.setFact(key, fc)
	}
	inst.CreatedAt = fc.createdAt

	switch e.Lock {
	case "":
	case "clone", "create":
		inst.State = proxy.StateProvisioning
		inst.Progress = fmt.Sprintf("cloning: VM %d is locked (%s); if no clone task is running on node %s, the lock is stale: clear it with `qm unlock %d`", e.VMID, d.word(e.Lock, locks), e.Node, e.VMID)
		return inst, nil
	case "suspended":
		inst.State = proxy.StateStopped
		inst.Progress = hibernatedMessage(e, "it serves nothing until it is resumed")
		return inst, nil
	default:
		inst.Progress = fmt.Sprintf("VM %d is locked (%s)", e.VMID, d.word(e.Lock, locks))
	}
	if marked && t.spec == "" {
		inst.State = proxy.StateProvisioning
		inst.Progress = joinProgress(inst.Progress, "provisioning: the VM is cloned; configuration, seed and first start follow")
		return inst, nil
	}
	switch e.Status {
	case "running":
		if !f.listed.IsZero() {
			// Uptime counts from the VM's start; an update's reboot
			// (shutdown and start) starts it again.
			inst.StartedAt = f.listed.Add(-time.Duration(e.Uptime) * time.Second).UTC()
		}
		port := fc.port
		if port == 0 {
			port = 3128
		}
		return d.address(ctx, e, inst, port, f.knownIP, f.proxyCA, d.reportedGuard(f.tenantGuest))
	default: // stopped, and states this driver does not know
		inst.State = proxy.StateStopped
		return inst, nil
	}
}

// address asks the guest agent for the VM's address and probes the
// proxy's port. When the agent does not answer, the VM's QEMU state says
// whether it is still booting (Provisioning) or not running (Stopped):
// that third request is made only off the steady state.
//
// knownIP, when set, is the address the agent reported at a steady Get
// (batch.go); it is used instead of asking the agent.
func (d *Driver) address(ctx context.Context, e Resource, inst proxy.Instance, port int, knownIP, ca string, guard *netguard.Guard) (proxy.Instance, error) {
	if knownIP != "" {
		return d.reachableOrReported(ctx, e, inst, knownIP, port, ca, guard), nil
	}
	ifs, err := d.api.AgentInterfaces(ctx, e.Node, e.VMID)
	if err != nil {
		text := apiText(err)
		switch {
		case text == "":
			return inst, err
		case strings.Contains(text, textVMNotRunning) && !strings.Contains(text, textAgentNotRunning):
			inst.State = proxy.StateStopped
			return inst, nil
		}
		st, err2 := d.api.VMStatus(ctx, e.Node, e.VMID)
		if err2 != nil {
			return inst, err2
		}
		switch st.QMPStatus {
		case "running", "prelaunch":
			inst.State = proxy.StateProvisioning
			msg := "waiting for the guest agent to report an address (" + text + ")"
			if d.quiet() {
				msg = "waiting for the guest agent to report an address"
			}
			if strings.Contains(text, textNoAgent) {
				msg = fmt.Sprintf("the guest agent option of VM %d is off, so its address cannot be learnt: turn it on (qm set %d --agent 1)", e.VMID, e.VMID)
			}
			inst.Progress = joinProgress(inst.Progress, msg)
		default:
			inst.State = proxy.StateStopped
			inst.Progress = joinProgress(inst.Progress, fmt.Sprintf("VM %d is %s", e.VMID, d.word(st.QMPStatus, qmpStatuses)))
		}
		return inst, nil
	}
	ip := pickAddress(ifs)
	if l := d.logger(ctx).V(telemetry.VDetail); l.Enabled() {
		var found []string
		for _, i := range ifs {
			for _, a := range i.IPAddresses {
				found = append(found, i.Name+"="+a.Address)
			}
		}
		l.Info("proxmox addresses found", "name", inst.Name, "vmid", e.VMID, "node", e.Node, "addresses", found, "ip", ip)
	}
	if ip == "" {
		inst.State = proxy.StateProvisioning
		inst.Progress = joinProgress(inst.Progress, "the guest agent reports no usable address yet")
		return inst, nil
	}
	return d.reachableOrReported(ctx, e, inst, ip, port, ca, guard), nil
}

// reportedGuard is the guard of the address a VM's guest agent reports:
// the config's, or TenantGuard's for a guest a tenant writes on the
// platform's config (Ref.TenantGuest).
func (d *Driver) reportedGuard(tenantGuest bool) *netguard.Guard {
	if d.cfg.Guard == nil && tenantGuest {
		return d.cfg.TenantGuard
	}
	return d.cfg.Guard
}

// reachable reports inst Running at ip and probes the proxy's port (with
// TLS, verified against ca, when ca is set) through guard.
func (d *Driver) reachable(ctx context.Context, inst proxy.Instance, ip string, port int, ca string, guard *netguard.Guard) proxy.Instance {
	inst.State, inst.IP = proxy.StateRunning, ip
	// Keyed by the API too: one process serves several clusters, whose
	// VMIDs overlap.
	addr := net.JoinHostPort(ip, strconv.Itoa(port))
	// The prober is every config's, and configs of one cluster may see
	// each other's VMs.
	pr := d.prober.Check(ctx, guard.Reported(), d.provider+"/"+d.cfg.URL+"/"+inst.ID, addr, squid.Expected(inst.Mark), ca)
	inst.ProxyReachable = pr.Serving
	if pr.Serving {
		inst.ProxyAddress = addr
		squid.NoteAnswer(&inst, pr)
	}
	switch {
	case pr.Refused:
		inst.Progress = joinProgress(inst.Progress, pr.Message)
	case pr.Pending:
		inst.Progress = joinProgress(inst.Progress, fmt.Sprintf("waiting for Squid to answer on port %d", port))
	case !pr.Serving:
		inst.Progress = joinProgress(inst.Progress, "waiting for Squid to answer: "+pr.Message)
	}
	return inst
}

// pickAddress is the first usable IPv4 address in the agent's order, on an
// interface other than lo; an IPv6 global address when there is none.
func pickAddress(ifs []Interface) string {
	var v6 string
	for _, i := range ifs {
		if i.Name == "lo" {
			continue
		}
		for _, a := range i.IPAddresses {
			ip, err := netip.ParseAddr(a.Address)
			if err != nil || ip.IsUnspecified() || ip.IsLinkLocalUnicast() || ip.IsMulticast() {
				continue
			}
			if ip.Is4() {
				return ip.String()
			}
			if v6 == "" && ip.IsGlobalUnicast() {
				v6 = ip.String()
			}
		}
	}
	return v6
}

func joinProgress(a, b string) string {
	if a == "" {
		return b
	}
	return a + "; " + b
}

func metaCTime(meta string) time.Time {
	for _, part := range strings.Split(meta, ",") {
		if v, ok := strings.CutPrefix(part, "ctime="); ok {
			if n, err := strconv.ParseInt(v, 10, 64); err == nil {
				return time.Unix(n, 0).UTC()
			}
		}
	}
	return time.Time{}
}

func hibernatedMessage(e Resource, consequence string) string {
	return fmt.Sprintf("VM %d is hibernated (lock: suspended), so %s. Resume it (qm resume %d, or Start in the web UI), "+
		"or discard its saved state (qm unlock %d, then remove its vmstate volume)", e.VMID, consequence, e.VMID, e.VMID)
}

func (d *Driver) lockedMessage(e Resource, what string) string {
	lock := d.word(e.Lock, locks)
	return fmt.Sprintf("VM %d is locked (%s), so it cannot be %s now; this is retried. If no %s task is running on node %s, "+
		"the lock is stale: clear it with `qm unlock %d`", e.VMID, lock, what, lock, e.Node, e.VMID)
}

// locks, qmpStatuses and nodeStatuses are the words Proxmox answers in
// those fields; a tenant's API is quoted only in them (word).
var (
	locks        = []string{"backup", "clone", "create", "migrate", "rollback", "snapshot", "snapshot-delete", "suspending", "suspended", "copy", "disk", "fstrim", "mounted"}
	qmpStatuses  = []string{"running", "paused", "prelaunch", "stopped", "suspended", "shutdown", "inmigrate", "postmigrate", "finish-migrate", "internal-error", "io-error", "guest-panicked", "watchdog", "debug", "restore-vm", "save-vm", "colo"}
	nodeStatuses = []string{"online", "offline", "unknown"}
)

// word is s, a word the API answered, as a message shows it: itself for
// the platform's API or when it is one of known; for a tenant's API
// another word is not quoted.
func (d *Driver) word(s string, known []string) string {
	if !d.quiet() || slices.Contains(known, s) {
		return s
	}
	return "a state the provider does not know"
}

// failedClone reports a clone that failed and left nothing behind (its VM
// config is removed), from the UPID the last Create returned: for
// RetryFailedTaskAfter after the failure the error is reported, then Get
// says NotFound so that Create clones again.
func (d *Driver) failedClone(ctx context.Context, ref proxy.Ref) error {
	u, ok := ParseUPID(ref.Operation)
	if !ok || u.Type != "qmclone" {
		return nil
	}
	src, err := strconv.Atoi(u.ID)
	if err != nil {
		return nil
	}
	tasks, err := d.api.Tasks(ctx, u.Node, src)
	if err != nil {
		return err
	}
	for _, t := range tasks {
		if t.UPID == ref.Operation && t.Failed() && d.recent(t) {
			return d.taskError(ctx, t, fmt.Sprintf("cloning template VMID %d for %s", src, ref.Name))
		}
	}
	return nil
}

// recent reports whether a task ended within RetryFailedTaskAfter.
func (d *Driver) recent(t Task) bool {
	return d.now().Sub(time.Unix(t.EndTime, 0)) < d.retry
}

// recentFailure returns the error of the newest task of type typ when it
// failed recently: the step it did is not redone before
// RetryFailedTaskAfter.
func (d *Driver) recentFailure(ctx context.Context, tasks []Task, typ, what string) error {
	sort.SliceStable(tasks, func(i, j int) bool { return tasks[i].StartTime > tasks[j].StartTime })
	for _, t := range tasks {
		if t.Type != typ {
			continue
		}
		if t.Failed() && d.recent(t) {
			return d.taskError(ctx, t, what)
		}
		return nil
	}
	return nil
}

// taskError is a Transient error with the task's exit status and the last
// lines of its log.
func (d *Driver) taskError(ctx context.Context, t Task, what string) error {
	if d.quiet() {
		// Its exit status and log are the API's words.
		retry := time.Unix(t.EndTime, 0).Add(d.retry).Sub(d.now()).Round(time.Second)
		return proxy.Transientf("%s failed: its task on node %s ended with an error (read its status and log in Proxmox: they are not shown to tenants); it is tried again in %s", what, t.Node, max(retry, 0))
	}
	tail := ""
	if lines, err := d.api.TaskLog(ctx, t.Node, t.UPID); err == nil {
		var keep []string
		for _, l := range lines {
			if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "TASK ERROR") {
				keep = append(keep, l)
			}
		}
		if len(keep) > 5 {
			keep = keep[len(keep)-5:]
		}
		if len(keep) > 0 {
			tail = "; last lines of its log: " + strings.Join(keep, " | ")
		}
	}
	retry := time.Unix(t.EndTime, 0).Add(d.retry).Sub(d.now()).Round(time.Second)
	return proxy.Transientf("%s failed: task %s ended with %q%s; it is tried again in %s", what, t.UPID, t.Status, tail, max(retry, 0))
}

func firstRunning(tasks []Task) *Task {
	for i := range tasks {
		if tasks[i].Running() {
			return &tasks[i]
		}
	}
	return nil
}
