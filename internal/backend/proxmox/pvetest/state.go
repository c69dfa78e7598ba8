package pvetest

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/egressproxy/provider-egressproxy/internal/cloudinit"
	"github.com/egressproxy/provider-egressproxy/internal/squid"
	"github.com/egressproxy/provider-egressproxy/internal/squid/squidtest"
)

// vm is one guest (or template) of the fake cluster.
type vm struct {
	vmid int
	node string
	// conf holds the config keys as the API returns them, as strings;
	// answers convert them to the schema's types.
	conf    map[string]string
	pending map[string]string // the config a running clone will write
	status  string            // running or stopped
	qmp     string            // QEMU's run state while running
	started time.Time
	agentAt time.Time // when the agent answers; zero with agentHeld
	// agentHeld keeps the agent silent until FinishTasks.
	agentHeld         bool
	agentInstalled    bool
	agentPreinstalled bool
	addr              string
	ln                net.Listener
	stopSquid         func() // a real guest Squid (Options.Squid)
	// files are the guest's files the agent reads (agent/file-read): its
	// own egress check's report.
	files map[string]string
	// flock is the task holding the VM's file lock.
	flock *task
	seed  Seed // the seed whose cloud-init the guest ran last
	boots int
	// ran are the instance IDs cloud-init has run on this guest: as
	// cloud-init does, a seed whose ID it has run before runs nothing
	// (its per-instance modules' semaphores are on the disk).
	ran map[string]bool
}

func (v *vm) name() string { return v.conf["name"] }

func (v *vm) template() bool { return v.conf["template"] == "1" }

func (v *vm) agentReady(now time.Time) bool {
	return v.status == "running" && !v.agentHeld && !v.agentAt.IsZero() && !now.Before(v.agentAt) && v.agentInstalled
}

func (v *vm) closeListener() {
	if v.ln != nil {
		_ = v.ln.Close()
		v.ln = nil
	}
	if v.stopSquid != nil {
		v.stopSquid()
		v.stopSquid = nil
	}
}

type storageState struct {
	Storage
	// files by node ("" for a shared storage), then by volume ID.
	files map[string]map[string]*volume
}

type volume struct {
	volid string
	data  []byte
	ctime int64
}

func (st *storageState) on(node string) bool {
	return len(st.Nodes) == 0 || slices.Contains(st.Nodes, node)
}

func (st *storageState) has(content string) bool { return slices.Contains(st.Content, content) }

func (st *storageState) bucket(node string) map[string]*volume {
	key := node
	if st.Shared {
		key = ""
	}
	if st.files[key] == nil {
		st.files[key] = map[string]*volume{}
	}
	return st.files[key]
}

// task is one PVE task (a worker with a UPID).
type task struct {
	upid, node, typ, id, user string
	pid, pstart               int
	start, end                time.Time
	due                       time.Time // zero: held
	held                      bool      // held by HoldDestroy until released
	exit                      string    // "OK" or the error, once ended
	fail                      string    // fail with this at the end
	log                       []string
	done                      func(now time.Time) string // the effect; returns an error text
	vmid                      int                        // the VM whose file lock it holds, 0 for none
}

func (t *task) running() bool { return t.end.IsZero() }

// addrCounter starts at a random place in 127.77.0.0/16, so that fakes in
// different processes (test packages run in parallel) start apart.
var addrCounter = func() *atomic.Uint32 {
	var c atomic.Uint32
	var b [2]byte
	_, _ = rand.Read(b[:])
	c.Store(uint32(b[0])<<8 | uint32(b[1]))
	return &c
}()

// nextAddr hands out addresses in 127.77.0.0/16 (127.77.x.1 to .254) on
// which port is free: unique across every fake of the process, and,
// checked by a bind, not one another process's fake listens on (it would
// answer this guest's probes as another proxy's Squid).
func nextAddr(port int) string {
	var addr string
	for range 1 << 16 {
		n := addrCounter.Add(1)
		if b := n & 0xff; b == 0 || b == 0xff {
			continue
		}
		addr = fmt.Sprintf("127.77.%d.%d", n>>8&0xff, n&0xff)
		ln, err := net.Listen("tcp", net.JoinHostPort(addr, strconv.Itoa(port)))
		if err == nil {
			_ = ln.Close()
			return addr
		}
	}
	return addr
}

func randomMAC() string {
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	return fmt.Sprintf("BC:24:11:%02X:%02X:%02X", b[0], b[1], b[2])
}

func randomUUID() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	h := hex.EncodeToString(b)
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:32]
}

func (s *Server) addTemplate(tp Template) {
	name := tp.Name
	if name == "" {
		name = fmt.Sprintf("template-%d", tp.VMID)
	}
	conf := map[string]string{
		"name":    name,
		"cores":   "1",
		"memory":  "1024",
		"scsihw":  "virtio-scsi-single",
		"scsi0":   fmt.Sprintf("local-lvm:base-%d-disk-0,iothread=1,size=3G", tp.VMID),
		"boot":    "order=scsi0;net0",
		"net0":    "virtio=" + randomMAC() + ",bridge=vmbr0",
		"ostype":  "l26",
		"serial0": "socket",
		"vga":     "serial0",
		"smbios1": "uuid=" + randomUUID(),
		"vmgenid": randomUUID(),
		"meta":    fmt.Sprintf("creation-qemu=9.2.0,ctime=%d", time.Now().Add(-30*24*time.Hour).Unix()),
	}
	if !tp.NotTemplate {
		conf["template"] = "1"
	}
	for k, v := range tp.Config {
		if v == "" {
			delete(conf, k)
			continue
		}
		conf[k] = v
	}
	s.vms[tp.VMID] = &vm{vmid: tp.VMID, node: tp.Node, conf: conf, status: "stopped", agentPreinstalled: tp.AgentPreinstalled}
}

// --- tasks ---

// startTask starts a task that ends after d (Hold: at FinishTasks). The
// effect runs when it ends. A task on a VM whose file lock another task
// holds fails with the lock timeout, as its worker would after 10 s.
func (s *Server) startTask(node, typ, id string, vmid int, d time.Duration, done func(now time.Time) string) *task {
	now := time.Now()
	s.pid++
	t := &task{node: node, typ: typ, id: id, user: s.user(), pid: s.pid, pstart: 0x35f0e1 + s.pid, start: now, done: done, vmid: vmid}
	t.upid = fmt.Sprintf("UPID:%s:%08X:%08X:%08X:%s:%s:%s:", node, t.pid, t.pstart, now.Unix(), typ, id, t.user)
	if d != Hold {
		t.due = now.Add(d)
	}
	if q := s.failTasks[typ]; len(q) > 0 {
		t.fail, t.log, s.failTasks[typ] = q[0].exit, append(t.log, q[0].log...), q[1:]
	}
	if v := s.vms[vmid]; vmid != 0 && v != nil {
		if v.flock != nil && v.flock.running() {
			t.fail = fmt.Sprintf("can't lock file '/var/lock/qemu-server/lock-%d.conf' - got timeout", vmid)
		} else {
			v.flock = t
		}
	}
	s.tasks = append(s.tasks, t)
	return t
}

// tick ends the tasks that are due and opens listeners of guests whose
// agent came up.
func (s *Server) tick() {
	now := time.Now()
	for _, t := range s.tasks {
		if t.running() && !t.held && !t.due.IsZero() && !now.Before(t.due) {
			s.finish(t)
		}
	}
	for _, v := range s.vms {
		s.maybeListen(v, now)
	}
}

func (s *Server) finish(t *task) {
	now := time.Now()
	msg := t.fail
	if msg == "" && t.done != nil {
		msg = t.done(now)
	} else if msg != "" && t.typ == "qmclone" {
		// A failed clone removes what it made.
		if v := s.vms[t.vmid]; v != nil && v.conf["lock"] == "clone" {
			delete(s.vms, t.vmid)
		}
	}
	t.end = now
	if msg == "" {
		t.exit = "OK"
		t.log = append(t.log, "TASK OK")
	} else {
		t.exit = msg
		t.log = append(t.log, "TASK ERROR: "+msg)
	}
}

func (s *Server) maybeListen(v *vm, now time.Time) {
	if !s.opts.Listen || v.ln != nil || v.stopSquid != nil || !v.agentReady(now) || v.qmp != "running" {
		return
	}
	if s.opts.Squid != "" {
		f := squid.Files{SquidConf: cloudinit.SquidConfOf(v.seed.UserData), Htpasswd: cloudinit.HtpasswdOf(v.seed.UserData)}
		f.TLSCert, f.TLSKey = cloudinit.TLSOf(v.seed.UserData)
		stop, err := squidtest.StartGuest(s.opts.Squid, v.addr, s.opts.ProxyPort, f)
		if err != nil {
			// Nothing answers: the guest's Squid did not start.
			return
		}
		v.stopSquid = stop
		if req := cloudinit.EgressRequestOf(v.seed.UserData); req != "" {
			// The guest's own egress check (its cloud-init's timer), in
			// the background: its line becomes the report file.
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			addr, port := v.addr, squidtest.ReportPortOf(f.SquidConf, s.opts.ProxyPort)
			go func() {
				line, _ := squidtest.RunReport(ctx, req, addr, port)
				s.mu.Lock()
				defer s.mu.Unlock()
				if line == "" || errors.Is(context.Cause(ctx), context.Canceled) {
					return
				}
				if v.files == nil {
					v.files = map[string]string{}
				}
				v.files[cloudinit.ReportPath] = line + "\n"
			}()
			v.stopSquid = func() { cancel(); stop() }
		}
		return
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(v.addr, strconv.Itoa(s.opts.ProxyPort)))
	if err != nil {
		return
	}
	v.ln = ln
	go squid.AnswerProbes(&counted{Listener: ln, n: &s.probed}, v.squidIdentity())
}

// counted counts the connections its listener accepts.
type counted struct {
	net.Listener
	n *atomic.Int64
}

func (c *counted) Accept() (net.Conn, error) {
	conn, err := c.Listener.Accept()
	if err == nil {
		c.n.Add(1)
	}
	return conn, err
}

// squidIdentity is what the guest's Squid calls itself: the identity of
// the squid.conf its seed's user-data installs.
func (v *vm) squidIdentity() string {
	return squid.IdentityOf(cloudinit.SquidConfOf(v.seed.UserData))
}

func (s *Server) duration(typ string) time.Duration {
	d := s.opts.Durations
	switch typ {
	case "qmclone":
		return d.Clone
	case "imgcopy":
		return d.Upload
	case "imgdel":
		return d.DeleteVolume
	case "qmresize":
		return d.Resize
	case "qmstart":
		return d.Start
	case "qmstop":
		return d.Stop
	case "qmreboot":
		return d.Reboot
	case "qmdestroy":
		return d.Destroy
	}
	return time.Millisecond
}

// --- routing ---

func (s *Server) route(m *MethodInfo, p map[string]string) answer {
	if node, ok := p["node"]; ok {
		n, known := s.nodes[node]
		if !known {
			return fail(500, "no such cluster node '%s'", node)
		}
		if n.Offline {
			return fail(595, "No route to host")
		}
	}
	var a answer
	var err error
	switch m.Method + " " + m.Path {
	case "GET /version":
		a = ok(map[string]any{"version": s.opts.Version, "release": s.opts.Version[:strings.LastIndex(s.opts.Version, ".")], "repoid": "5e0f4b8e"})
	case "GET /cluster/resources":
		a = ok(s.resources(p["type"]))
	case "GET /nodes/{node}/status":
		a = ok(s.nodeStatus(p["node"]))
	case "GET /nodes/{node}/network":
		a = ok(s.nodeNetwork(p["node"]))
	case "GET /nodes/{node}/storage/{storage}/status":
		a, err = s.storageStatus(p)
	case "GET /nodes/{node}/storage/{storage}/content":
		a, err = s.content(p)
	case "POST /nodes/{node}/storage/{storage}/upload":
		a, err = s.upload(p)
	case "DELETE /nodes/{node}/storage/{storage}/content/{volume}":
		a, err = s.deleteVolume(p)
	case "GET /nodes/{node}/qemu/{vmid}/config":
		a, err = s.getConfig(p)
	case "PUT /nodes/{node}/qemu/{vmid}/config":
		a, err = s.putConfig(p)
	case "POST /nodes/{node}/qemu/{vmid}/clone":
		a, err = s.clone(p)
	case "PUT /nodes/{node}/qemu/{vmid}/resize":
		a, err = s.resize(p)
	case "POST /nodes/{node}/qemu/{vmid}/status/start":
		a, err = s.power(p, "qmstart")
	case "POST /nodes/{node}/qemu/{vmid}/status/stop":
		a, err = s.power(p, "qmstop")
	case "POST /nodes/{node}/qemu/{vmid}/status/reboot":
		a, err = s.power(p, "qmreboot")
	case "DELETE /nodes/{node}/qemu/{vmid}":
		a, err = s.destroy(p)
	case "GET /nodes/{node}/qemu/{vmid}/status/current":
		a, err = s.current(p)
	case "GET /nodes/{node}/qemu/{vmid}/agent/network-get-interfaces":
		a, err = s.agentInterfaces(p)
	case "GET /nodes/{node}/qemu/{vmid}/agent/file-read":
		a, err = s.agentFileRead(p)
	case "GET /nodes/{node}/tasks/{upid}/status":
		a, err = s.taskStatus(p)
	case "GET /nodes/{node}/tasks/{upid}/log":
		a, err = s.taskLog(p)
	case "GET /nodes/{node}/tasks":
		a = ok(s.taskList(p))
	default:
		// A real endpoint the fake does not model: the client should not
		// be calling it.
		s.violations = append(s.violations, fmt.Sprintf("%s %s: endpoint exists in the schema but the fake does not model it", m.Method, m.Path))
		return fail(501, "Method '%s %s' not implemented", m.Method, m.Path)
	}
	if err != nil {
		if ae := (*apiError)(nil); errors.As(err, &ae) {
			return fail(ae.status, "%s", ae.msg)
		}
		return fail(500, "%v", err)
	}
	return a
}

// guest finds a VM on the node the request names, with the real API's
// answer when it is not there.
func (s *Server) guest(p map[string]string) (*vm, error) {
	id, _ := strconv.Atoi(p["vmid"])
	v, ok := s.vms[id]
	if !ok || v.node != p["node"] {
		return nil, errf("Configuration file 'nodes/%s/qemu-server/%d.conf' does not exist", p["node"], id)
	}
	return v, nil
}

// guestWith is guest, refused by the first of checks that fails.
func (s *Server) guestWith(p map[string]string, checks ...func(*vm) error) (*vm, error) {
	v, err := s.guest(p)
	if err != nil {
		return nil, err
	}
	for _, check := range checks {
		if err := check(v); err != nil {
			return nil, err
		}
	}
	return v, nil
}

// checkLock is PVE::AbstractConfig::check_lock.
func checkLock(v *vm) error {
	if l := v.conf["lock"]; l != "" {
		return errf("VM is locked (%s)", l)
	}
	return nil
}

// checkFlock fails a synchronous call while a task holds the VM's file
// lock (the real call waits 10 s first).
func checkFlock(v *vm) error {
	if v.flock != nil && v.flock.running() {
		return errf("can't lock file '/var/lock/qemu-server/lock-%d.conf' - got timeout", v.vmid)
	}
	return nil
}

// --- handlers ---

func (s *Server) resources(typ string) []map[string]any {
	var out []map[string]any
	if typ == "" || typ == "node" {
		for _, name := range slices.Sorted(maps.Keys(s.nodes)) {
			n := s.nodes[name]
			e := map[string]any{"id": "node/" + name, "type": "node", "node": name, "status": "online",
				"maxcpu": 8, "maxmem": int64(32) << 30, "mem": int64(6) << 30, "cpu": 0.03, "uptime": 86400,
				"disk": int64(10) << 30, "maxdisk": int64(100) << 30, "level": "", "cgroup-mode": 2}
			if n.Offline {
				e = map[string]any{"id": "node/" + name, "type": "node", "node": name, "status": "offline"}
			}
			out = append(out, e)
		}
	}
	if typ == "" || typ == "storage" {
		for _, name := range slices.Sorted(maps.Keys(s.nodes)) {
			n := s.nodes[name]
			for _, st := range s.storages {
				if !st.on(name) {
					continue
				}
				e := map[string]any{"id": "storage/" + name + "/" + st.ID, "type": "storage", "node": name, "storage": st.ID,
					"plugintype": st.Type, "content": strings.Join(st.Content, ","), "status": "available",
					"disk": s.used(st, name), "maxdisk": st.TotalGiB << 30}
				if n.Offline || st.Disabled {
					e["status"] = "unknown"
				}
				out = append(out, e)
			}
		}
	}
	if typ == "" || typ == "vm" {
		for _, id := range slices.Sorted(maps.Keys(s.vms)) {
			v := s.vms[id]
			e := map[string]any{"id": fmt.Sprintf("qemu/%d", id), "type": "qemu", "vmid": id, "node": v.node,
				"status": v.status, "template": b2i(v.template()), "maxcpu": atoiDefault(v.conf["cores"], 1),
				"maxmem": int64(atoiDefault(v.conf["memory"], 512)) << 20, "maxdisk": v.diskBytes(),
				"cpu": 0, "mem": 0, "disk": 0, "netin": 0, "netout": 0, "diskread": 0, "diskwrite": 0, "uptime": 0}
			if v.status == "running" {
				e["uptime"] = int(time.Since(v.started).Seconds())
				e["mem"] = int64(300) << 20
			}
			if n := v.name(); n != "" {
				e["name"] = n
			}
			if l := v.conf["lock"]; l != "" {
				e["lock"] = l
			}
			if t := v.conf["tags"]; t != "" {
				e["tags"] = t
			}
			if s.nodes[v.node].Offline {
				e = map[string]any{"id": fmt.Sprintf("qemu/%d", id), "type": "qemu", "vmid": id, "node": v.node, "status": "unknown"}
				if n := v.name(); n != "" {
					e["name"] = n
				}
			}
			out = append(out, e)
		}
		for _, id := range slices.Sorted(maps.Keys(s.cts)) {
			c := s.cts[id]
			out = append(out, map[string]any{"id": fmt.Sprintf("lxc/%d", id), "type": "lxc", "vmid": id, "node": c.node,
				"status": c.status, "name": c.conf["hostname"], "template": 0})
		}
	}
	if out == nil {
		out = []map[string]any{}
	}
	return out
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

func atoiDefault(s string, def int) int {
	if n, err := strconv.Atoi(strings.SplitN(s, ",", 2)[0]); err == nil {
		return n
	}
	return def
}

var sizeRe = regexp.MustCompile(`(?:^|,)size=(\d+(?:\.\d+)?)([KMGT]?)(?:,|$)`)

// diskSize parses the size= of a drive string, in bytes.
func diskSize(drive string) (int64, bool) {
	m := sizeRe.FindStringSubmatch(drive)
	if m == nil {
		return 0, false
	}
	f, _ := strconv.ParseFloat(m[1], 64)
	mult := map[string]float64{"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}[m[2]]
	return int64(f * mult), true
}

func (v *vm) diskBytes() int64 {
	n, _ := diskSize(v.conf["scsi0"])
	return n
}

func (s *Server) used(st *storageState, node string) int64 {
	var n int64
	for _, vol := range st.bucket(node) {
		n += int64(len(vol.data))
	}
	return n
}

func (s *Server) nodeStatus(string) map[string]any {
	return map[string]any{
		"cpu":            0.03,
		"loadavg":        []string{"0.10", "0.12", "0.09"},
		"memory":         map[string]any{"total": int64(32) << 30, "used": int64(6) << 30, "free": int64(26) << 30, "available": int64(25) << 30},
		"rootfs":         map[string]any{"total": int64(100) << 30, "used": int64(10) << 30, "free": int64(90) << 30, "avail": int64(85) << 30},
		"pveversion":     "pve-manager/" + s.opts.Version + "/5e0f4b8e",
		"current-kernel": map[string]any{"sysname": "Linux", "release": "6.14.8-2-pve", "version": "#1 SMP PREEMPT_DYNAMIC PMX 6.14.8-2 (2025-07-22T10:04Z)", "machine": "x86_64"},
		"cpuinfo":        map[string]any{"cores": 8, "cpus": 8, "model": "Intel(R) N100", "sockets": 1},
		"boot-info":      map[string]any{"mode": "efi", "secureboot": 0},
		// Not in the schema's properties, which allows more; the real
		// server sends them.
		"uptime":   86400,
		"kversion": "Linux 6.14.8-2-pve #1 SMP PREEMPT_DYNAMIC PMX 6.14.8-2 (2025-07-22T10:04Z) x86_64",
	}
}

// nodeNetwork is what a node's /etc/network/interfaces states: its
// uplink without an address and the bridge its guests use, holding the
// node's addresses.
func (s *Server) nodeNetwork(node string) []map[string]any {
	bridge := map[string]any{"iface": "vmbr0", "type": "bridge", "active": 1, "autostart": 1, "method": "static", "method6": "manual",
		"bridge_ports": "eno1", "priority": 4}
	var families []string
	for _, a := range s.nodes[node].Addresses {
		ip := netip.MustParseAddr(a)
		if ip.Is4() {
			bridge["address"], bridge["netmask"], bridge["cidr"] = a, "255.255.255.0", a+"/24"
			families = append(families, "inet")
		} else {
			bridge["address6"], bridge["netmask6"], bridge["cidr6"], bridge["method6"] = a, 64, a+"/64", "static"
			families = append(families, "inet6")
		}
	}
	bridge["families"] = families
	return []map[string]any{
		{"iface": "eno1", "type": "eth", "active": 1, "exists": 1, "method": "manual", "method6": "manual", "families": []string{"inet"}, "priority": 3},
		bridge,
	}
}

func (s *Server) storage(p map[string]string) (*storageState, error) {
	for _, st := range s.storages {
		if st.ID == p["storage"] {
			if !st.on(p["node"]) {
				return nil, errf("storage '%s' is not available on node '%s'", st.ID, p["node"])
			}
			return st, nil
		}
	}
	return nil, errf("storage '%s' does not exist", p["storage"])
}

func (s *Server) storageStatus(p map[string]string) (answer, error) {
	st, err := s.storage(p)
	if err != nil {
		return answer{}, err
	}
	used := s.used(st, p["node"])
	total := st.TotalGiB << 30
	return ok(map[string]any{"type": st.Type, "content": strings.Join(st.Content, ","), "shared": b2i(st.Shared),
		"active": b2i(!st.Disabled), "enabled": b2i(!st.Disabled), "total": total, "used": used, "avail": total - used}), nil
}

func (s *Server) content(p map[string]string) (answer, error) {
	st, err := s.storage(p)
	if err != nil {
		return answer{}, err
	}
	if st.Disabled {
		return answer{}, errf("storage '%s' is disabled", st.ID)
	}
	out := []map[string]any{}
	vols := st.bucket(p["node"])
	for _, id := range slices.Sorted(maps.Keys(vols)) {
		vol := vols[id]
		c := "iso"
		if p["content"] != "" && p["content"] != c {
			continue
		}
		out = append(out, map[string]any{"volid": vol.volid, "format": c, "size": len(vol.data), "ctime": vol.ctime})
	}
	return ok(out), nil
}

var uploadNameRe = regexp.MustCompile(`^[-a-zA-Z0-9_.]+\.(iso|img)$`)

func (s *Server) upload(p map[string]string) (answer, error) {
	st, err := s.storage(p)
	if err != nil {
		return answer{}, err
	}
	if p["content"] != "iso" {
		return answer{}, errf("upload content type '%s' not allowed", p["content"])
	}
	if !st.has("iso") {
		return answer{}, errf("storage '%s' does not support content type 'iso'", st.ID)
	}
	name := p["filename"]
	if !uploadNameRe.MatchString(name) {
		return answer{}, errf("wrong file extension")
	}
	data, ok2 := p[fileKey]
	if !ok2 {
		return answer{}, &apiError{status: 400, msg: "Parameter verification failed."}
	}
	if alg := p["checksum-algorithm"]; alg != "" {
		if alg != "sha256" {
			return answer{}, errf("checksum algorithm '%s' not modelled by the fake", alg)
		}
		if sum := sha256hex([]byte(data)); sum != p["checksum"] {
			// The real server verifies in the task: the task fails.
			t := s.startTask(p["node"], "imgcopy", "", 0, s.duration("imgcopy"), nil)
			t.fail = fmt.Sprintf("checksum mismatch: got '%s' != expected '%s'", sum, p["checksum"])
			return ok(t.upid), nil
		}
	}
	volid := st.ID + ":iso/" + name
	node := p["node"]
	t := s.startTask(node, "imgcopy", "", 0, s.duration("imgcopy"), func(now time.Time) string {
		// "we simply overwrite the destination file if it already exists"
		st.bucket(node)[volid] = &volume{volid: volid, data: []byte(data), ctime: now.Unix()}
		return ""
	})
	t.log = append(t.log, fmt.Sprintf("starting file import from: /var/tmp/pveupload-%x", t.pid), fmt.Sprintf("target node: %s", node),
		fmt.Sprintf("target file: /var/lib/vz/template/iso/%s", name), fmt.Sprintf("file size is: %d", len(data)))
	return ok(t.upid), nil
}

func (s *Server) deleteVolume(p map[string]string) (answer, error) {
	volid := p["volume"]
	storeID, _, _ := strings.Cut(volid, ":")
	if p["storage"] != "" && !strings.Contains(volid, ":") {
		storeID = p["storage"]
		volid = storeID + ":" + volid
	}
	st, err := s.storage(map[string]string{"storage": storeID, "node": p["node"]})
	if err != nil {
		return answer{}, err
	}
	node := p["node"]
	t := s.startTask(node, "imgdel", "", 0, s.duration("imgdel"), func(time.Time) string {
		// Removing a file that is not there still ends OK.
		delete(st.bucket(node), volid)
		return ""
	})
	t.log = append(t.log, "Removed volume '"+volid+"'")
	return ok(t.upid), nil
}

func (s *Server) getConfig(p map[string]string) (answer, error) {
	v, err := s.guest(p)
	if err != nil {
		return answer{}, err
	}
	return ok(s.typedConfig(v.conf)), nil
}

// typedConfig converts the string config into the schema's types (cores
// is a number, template a 0/1...), plus its digest.
func (s *Server) typedConfig(conf map[string]string) map[string]any {
	m, _, _ := s.schema.Lookup("GET", "/nodes/x/qemu/100/config")
	out := map[string]any{"digest": configDigest(conf)}
	for k, v := range conf {
		var t *Type
		if m != nil && m.Returns != nil {
			t = propertyFor(m.Returns.Properties, k)
		}
		if t != nil && (t.Type == "integer" || t.Type == "number" || t.Type == "boolean") {
			if f, err := strconv.ParseFloat(v, 64); err == nil {
				out[k] = f
				continue
			}
		}
		out[k] = v
	}
	return out
}

func configDigest(conf map[string]string) string {
	keys := slices.Sorted(maps.Keys(conf))
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, k+"="+conf[k])
	}
	return digestOf(parts...)
}

// settable are the PUT config keys the fake models; anything else the
// schema allows is stored as given.
var readOnlyKeys = map[string]bool{"node": true, "vmid": true, "digest": true, "delete": true, "skiplock": true, "revert": true, "force": true, "background_delay": true}

func (s *Server) putConfig(p map[string]string) (answer, error) {
	v, err := s.guestWith(p, checkFlock, checkLock)
	if err != nil {
		return answer{}, err
	}
	if d := p["digest"]; d != "" && d != configDigest(v.conf) {
		return answer{}, errf("detected modified configuration - file changed by other user? Try again.")
	}
	for k, val := range p {
		if readOnlyKeys[k] {
			continue
		}
		if strings.HasPrefix(k, "ide") || strings.HasPrefix(k, "scsi") || strings.HasPrefix(k, "sata") || strings.HasPrefix(k, "virtio") {
			if err := s.checkVolume(v, val); err != nil {
				return answer{}, err
			}
		}
		v.conf[k] = val
	}
	for _, k := range strings.FieldsFunc(p["delete"], func(r rune) bool { return r == ',' || r == ';' || r == ' ' }) {
		delete(v.conf, k)
	}
	return ok(nil), nil
}

// checkVolume refuses a drive on a storage that does not exist or does not
// hold that content (the existence of the file itself is checked at start,
// as the real server does).
func (s *Server) checkVolume(v *vm, drive string) error {
	file, _, _ := strings.Cut(drive, ",")
	if file == "none" || file == "cdrom" || strings.HasPrefix(file, "/") {
		return nil
	}
	storeID, rest, ok := strings.Cut(file, ":")
	if !ok {
		return errf("unable to parse volume ID '%s'", file)
	}
	st, err := s.storage(map[string]string{"storage": storeID, "node": v.node})
	if err != nil {
		return err
	}
	if strings.HasPrefix(rest, "iso/") && !st.has("iso") {
		return errf("storage '%s' does not support content type 'iso'", storeID)
	}
	return nil
}

func (s *Server) clone(p map[string]string) (answer, error) {
	src, err := s.guest(p)
	if err != nil {
		return answer{}, err
	}
	newid, _ := strconv.Atoi(p["newid"])
	target := p["node"]
	if t := p["target"]; t != "" {
		n, ok2 := s.nodes[t]
		if !ok2 {
			return answer{}, errf("no such cluster node '%s'", t)
		}
		if n.Offline {
			return answer{}, errf("Node '%s' is not online", t)
		}
		if t != src.node && strings.Contains(src.conf["scsi0"], "local-lvm:") {
			return answer{}, errf("can't clone VM to node '%s' (VM uses local storage)", t)
		}
		target = t
	}
	if !src.template() && p["full"] != "1" {
		return answer{}, errf("parameter 'full' - not allowed for VMs that are not templates: use a full clone")
	}
	if _, exists := s.vms[newid]; exists || s.cts[newid] != nil {
		return answer{}, errf("unable to create VM %d: config file already exists", newid)
	}
	name := p["name"]
	if name == "" {
		name = "Copy-of-VM-" + src.name()
	}
	pending := maps.Clone(src.conf)
	delete(pending, "template")
	delete(pending, "lock")
	pending["name"] = name
	if d, ok2 := p["description"]; ok2 {
		pending["description"] = d
	}
	for k, val := range pending {
		if strings.HasPrefix(k, "scsi") && k != "scsihw" || strings.HasPrefix(k, "virtio") || strings.HasPrefix(k, "sata") {
			pending[k] = strings.Replace(val, fmt.Sprintf("base-%d-disk", src.vmid), fmt.Sprintf("vm-%d-disk", newid), 1)
		}
		if strings.HasPrefix(k, "net") {
			// A clone gets new MAC addresses.
			parts := strings.Split(val, ",")
			if model, _, ok3 := strings.Cut(parts[0], "="); ok3 {
				parts[0] = model + "=" + randomMAC()
			}
			pending[k] = strings.Join(parts, ",")
		}
	}
	pending["vmgenid"] = randomUUID()
	pending["smbios1"] = "uuid=" + randomUUID()
	pending["meta"] = fmt.Sprintf("creation-qemu=9.2.0,ctime=%d", time.Now().Unix())
	// The clone reserves its VMID at once, with a nameless config locked
	// "clone"; the real config is written when the copy is done.
	nv := &vm{vmid: newid, node: target, conf: map[string]string{"lock": "clone"}, pending: pending, status: "stopped",
		agentPreinstalled: src.agentPreinstalled}
	s.vms[newid] = nv
	t := s.startTask(p["node"], "qmclone", strconv.Itoa(src.vmid), 0, s.duration("qmclone"), func(time.Time) string {
		if cur := s.vms[newid]; cur == nv {
			nv.conf = nv.pending
			nv.pending = nil
		}
		return ""
	})
	t.vmid = newid // a failed clone removes this VM
	t.log = append(t.log, fmt.Sprintf("create full clone of drive scsi0 (%s)", strings.SplitN(src.conf["scsi0"], ",", 2)[0]),
		"transferred 3.0 GiB of 3.0 GiB (100.00%)")
	return ok(t.upid), nil
}

func (s *Server) resize(p map[string]string) (answer, error) {
	v, err := s.guestWith(p, checkLock)
	if err != nil {
		return answer{}, err
	}
	disk := p["disk"]
	cur, ok2 := v.conf[disk]
	if !ok2 {
		return answer{}, errf("disk '%s' does not exist", disk)
	}
	have, _ := diskSize(cur)
	want, _ := diskSize("size=" + strings.TrimPrefix(p["size"], "+"))
	if strings.HasPrefix(p["size"], "+") {
		want += have
	}
	if want < have {
		return answer{}, errf("shrinking disks is not supported")
	}
	t := s.startTask(v.node, "qmresize", strconv.Itoa(v.vmid), v.vmid, s.duration("qmresize"), func(time.Time) string {
		if c, ok3 := v.conf[disk]; ok3 {
			v.conf[disk] = sizeRe.ReplaceAllString(c, fmt.Sprintf(",size=%dG,", want>>30))
			v.conf[disk] = strings.TrimSuffix(v.conf[disk], ",")
		}
		return ""
	})
	return ok(t.upid), nil
}

func (s *Server) power(p map[string]string, typ string) (answer, error) {
	v, err := s.guest(p)
	if err != nil {
		return answer{}, err
	}
	id := v.vmid
	var done func(now time.Time) string
	switch typ {
	case "qmstart":
		done = func(now time.Time) string { return s.boot(v, now) }
	case "qmstop":
		done = func(time.Time) string {
			if l := v.conf["lock"]; l != "" && l != "suspended" {
				return fmt.Sprintf("VM is locked (%s)", l)
			}
			v.status, v.qmp = "stopped", ""
			v.agentAt, v.agentHeld = time.Time{}, false
			v.closeListener()
			return ""
		}
	case "qmreboot":
		done = func(now time.Time) string {
			if v.status != "running" {
				return fmt.Sprintf("VM %d not running", id)
			}
			if err := checkLock(v); err != nil {
				return err.Error()
			}
			v.status = "stopped"
			v.closeListener()
			return s.boot(v, now)
		}
	}
	t := s.startTask(v.node, typ, strconv.Itoa(id), id, s.duration(typ), done)
	return ok(t.upid), nil
}

// boot starts a guest: it reads its seed (cloud-init), and its agent
// answers after the agent delay if the guest has one.
func (s *Server) boot(v *vm, now time.Time) string {
	if v.status == "running" {
		return fmt.Sprintf("VM %d already running", v.vmid)
	}
	if l := v.conf["lock"]; l != "" && l != "suspended" {
		return fmt.Sprintf("VM is locked (%s)", l)
	}
	seed := Seed{}
	for _, k := range []string{"ide0", "ide1", "ide2", "ide3", "sata0", "scsi1"} {
		drive, ok2 := v.conf[k]
		if !ok2 || !strings.Contains(drive, "media=cdrom") {
			continue
		}
		file, _, _ := strings.Cut(drive, ",")
		storeID, _, _ := strings.Cut(file, ":")
		if file == "none" || file == "cdrom" {
			continue
		}
		var st *storageState
		for _, c := range s.storages {
			if c.ID == storeID {
				st = c
			}
		}
		if st == nil {
			return fmt.Sprintf("storage '%s' does not exist", storeID)
		}
		vol, found := st.bucket(v.node)[file]
		if !found {
			return fmt.Sprintf("volume '%s' does not exist", file)
		}
		if sd, isSeed := readSeed(vol.data); isSeed && strings.EqualFold(sd.Label, "cidata") {
			seed = sd
		}
	}
	delete(v.conf, "lock") // resuming a hibernated VM clears its lock
	delete(v.conf, "vmstate")
	v.status, v.qmp, v.started = "running", "running", now
	if id := seed.InstanceID(); id == "" || !v.ran[id] {
		v.seed = seed
		if v.ran == nil {
			v.ran = map[string]bool{}
		}
		v.ran[id] = true
	}
	v.boots++
	v.agentInstalled = v.agentPreinstalled || strings.Contains(seed.UserData, "qemu-guest-agent")
	if v.addr == "" {
		v.addr = nextAddr(s.opts.ProxyPort)
	}
	switch d := s.opts.Durations.Agent; d {
	case Hold:
		v.agentAt, v.agentHeld = time.Time{}, true
	default:
		v.agentAt, v.agentHeld = now.Add(d), false
	}
	return ""
}

func (s *Server) destroy(p map[string]string) (answer, error) {
	v, err := s.guestWith(p, checkLock)
	if err != nil {
		return answer{}, err
	}
	if v.status == "running" {
		return answer{}, errf("VM %d is running - destroy failed", v.vmid)
	}
	id := v.vmid
	t := s.startTask(v.node, "qmdestroy", strconv.Itoa(id), id, s.duration("qmdestroy"), func(time.Time) string {
		if s.vms[id] == v {
			v.closeListener()
			delete(s.vms, id)
		}
		return ""
	})
	t.log = append(t.log, fmt.Sprintf("Removing image: 100%% complete...done."))
	return ok(t.upid), nil
}

func (s *Server) current(p map[string]string) (answer, error) {
	v, err := s.guest(p)
	if err != nil {
		return answer{}, err
	}
	out := map[string]any{"vmid": v.vmid, "status": v.status, "cpus": atoiDefault(v.conf["cores"], 1),
		"maxmem": int64(atoiDefault(v.conf["memory"], 512)) << 20, "maxdisk": v.diskBytes(), "uptime": 0, "ha": map[string]any{"managed": 0}}
	if n := v.name(); n != "" {
		out["name"] = n
	}
	if v.status == "running" {
		out["qmpstatus"] = v.qmp
		out["uptime"] = int(time.Since(v.started).Seconds())
		out["pid"] = 4242 + v.vmid%1000
	} else {
		out["qmpstatus"] = "stopped"
	}
	if l := v.conf["lock"]; l != "" {
		out["lock"] = l
	}
	if a := v.conf["agent"]; strings.HasPrefix(a, "1") || strings.Contains(a, "enabled=1") {
		out["agent"] = 1
	}
	if t := v.conf["tags"]; t != "" {
		out["tags"] = t
	}
	return ok(out), nil
}

// agentFileRead reads a guest's file through its agent, as PVE does:
// {content, truncated} of at most 16 MiB, or the agent's error.
func (s *Server) agentFileRead(p map[string]string) (answer, error) {
	v, err := s.guest(p)
	if err != nil {
		return answer{}, err
	}
	if v.status != "running" {
		return answer{}, errf("VM %d is not running", v.vmid)
	}
	if a := v.conf["agent"]; !(strings.HasPrefix(a, "1") || strings.Contains(a, "enabled=1")) {
		return answer{}, errf("No QEMU guest agent configured")
	}
	if v.qmp != "running" || !v.agentReady(time.Now()) {
		return answer{}, errf("QEMU guest agent is not running")
	}
	c, found := v.files[p["file"]]
	if !found {
		return answer{}, errf("Agent error: Failed to open file '%s': No such file or directory", p["file"])
	}
	return ok(map[string]any{"content": c}), nil
}

func (s *Server) agentInterfaces(p map[string]string) (answer, error) {
	v, err := s.guest(p)
	if err != nil {
		return answer{}, err
	}
	if v.status != "running" {
		return answer{}, errf("VM %d is not running", v.vmid)
	}
	if a := v.conf["agent"]; !(strings.HasPrefix(a, "1") || strings.Contains(a, "enabled=1")) {
		return answer{}, errf("No QEMU guest agent configured")
	}
	if v.qmp != "running" || !v.agentReady(time.Now()) {
		return answer{}, errf("QEMU guest agent is not running")
	}
	mac := "bc:24:11:00:00:01"
	for _, part := range strings.Split(v.conf["net0"], ",") {
		if k, val, ok2 := strings.Cut(part, "="); ok2 && k != "bridge" && k != "tag" && k != "firewall" && strings.Count(val, ":") == 5 {
			mac = strings.ToLower(val)
		}
	}
	result := []map[string]any{
		{"name": "lo", "hardware-address": "00:00:00:00:00:00", "ip-addresses": []map[string]any{
			{"ip-address": "127.0.0.1", "ip-address-type": "ipv4", "prefix": 8},
			{"ip-address": "::1", "ip-address-type": "ipv6", "prefix": 128}}},
		{"name": "eth0", "hardware-address": mac, "ip-addresses": []map[string]any{
			{"ip-address": v.addr, "ip-address-type": "ipv4", "prefix": 24},
			{"ip-address": "fe80::be24:11ff:fe00:1", "ip-address-type": "ipv6", "prefix": 64}}},
	}
	return ok(map[string]any{"result": result}), nil
}

func (s *Server) findTask(p map[string]string) (*task, error) {
	for _, t := range s.tasks {
		if t.upid == p["upid"] {
			if t.node != p["node"] {
				break
			}
			return t, nil
		}
	}
	return nil, errf("no such task")
}

func (t *task) entry(withStatus bool) map[string]any {
	e := map[string]any{"upid": t.upid, "node": t.node, "pid": t.pid, "pstart": t.pstart, "starttime": t.start.Unix(),
		"type": t.typ, "id": t.id, "user": t.user}
	if withStatus {
		if t.running() {
			e["status"] = "running"
		} else {
			e["status"] = "stopped"
			e["exitstatus"] = t.exit
		}
	} else if !t.running() {
		e["endtime"] = t.end.Unix()
		e["status"] = t.exit
	}
	return e
}

func (s *Server) taskStatus(p map[string]string) (answer, error) {
	t, err := s.findTask(p)
	if err != nil {
		return answer{}, err
	}
	return ok(t.entry(true)), nil
}

func (s *Server) taskLog(p map[string]string) (answer, error) {
	t, err := s.findTask(p)
	if err != nil {
		return answer{}, err
	}
	start, _ := strconv.Atoi(p["start"])
	limit := 50
	if l, err2 := strconv.Atoi(p["limit"]); err2 == nil {
		limit = l
	}
	out := []map[string]any{}
	for i, line := range t.log {
		if i < start || len(out) >= limit {
			continue
		}
		out = append(out, map[string]any{"n": i + 1, "t": line})
	}
	if t.running() && len(out) == 0 {
		out = append(out, map[string]any{"n": 1, "t": "no content"})
	}
	return ok(out), nil
}

func (s *Server) taskList(p map[string]string) []map[string]any {
	out := []map[string]any{}
	source := p["source"]
	if source == "" {
		source = "archive"
	}
	limit := 50
	if l, err := strconv.Atoi(p["limit"]); err == nil {
		limit = l
	}
	// Newest first, as the real list is.
	for i := len(s.tasks) - 1; i >= 0; i-- {
		t := s.tasks[i]
		if t.node != p["node"] {
			continue
		}
		// The real filter compares the task's ID field only (a clone's is
		// its source's VMID).
		if id := p["vmid"]; id != "" && t.id != id {
			continue
		}
		if f := p["typefilter"]; f != "" && t.typ != f {
			continue
		}
		if source == "active" && !t.running() || source == "archive" && t.running() {
			continue
		}
		if p["errors"] == "1" && (t.running() || t.exit == "OK") {
			continue
		}
		out = append(out, t.entry(false))
		if len(out) >= limit {
			break
		}
	}
	return out
}

func sha256hex(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// --- steering ---

// VMSpec describes a VM a test adds by hand (as a human would).
type VMSpec struct {
	// VMID; 0 picks the next free from 500.
	VMID int
	Node string
	Name string
	// Tags and Description as the VM config holds them.
	Tags, Description string
	// Running starts it, agent included.
	Running bool
	// Config adds keys.
	Config map[string]string
}

// AddVM creates a VM outside of any driver and returns its VMID.
func (s *Server) AddVM(spec VMSpec) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	id := spec.VMID
	if id == 0 {
		for id = 500; s.vms[id] != nil; id++ {
		}
	}
	if spec.Node == "" {
		spec.Node = "pve1"
	}
	conf := map[string]string{"name": spec.Name, "cores": "1", "memory": "512", "scsi0": fmt.Sprintf("local-lvm:vm-%d-disk-0,size=3G", id),
		"net0": "virtio=" + randomMAC() + ",bridge=vmbr0", "agent": "1", "meta": fmt.Sprintf("creation-qemu=9.2.0,ctime=%d", time.Now().Unix())}
	if spec.Tags != "" {
		conf["tags"] = spec.Tags
	}
	if spec.Description != "" {
		conf["description"] = spec.Description
	}
	maps.Copy(conf, spec.Config)
	v := &vm{vmid: id, node: spec.Node, conf: conf, status: "stopped", agentPreinstalled: true}
	s.vms[id] = v
	if spec.Running {
		s.boot(v, time.Now())
		v.agentAt, v.agentHeld = time.Now(), false
	}
	return id
}

// VM is a snapshot of one guest.
type VM struct {
	VMID                          int
	Node, Name, Status, QMP, Lock string
	Tags, Description             string
	Config                        map[string]string
	Addr                          string
	Cloning                       bool
	// Seed is what the guest read from its seed at its last boot; Boots
	// counts its boots.
	Seed  Seed
	Boots int
}

// Template reports whether the VM is a template.
func (v VM) Template() bool { return v.Config["template"] == "1" }

// VMs returns every guest and template, by VMID.
func (s *Server) VMs() []VM {
	return readNow(s, func() (out []VM) {
		for _, id := range slices.Sorted(maps.Keys(s.vms)) {
			v := s.vms[id]
			out = append(out, VM{VMID: id, Node: v.node, Name: v.name(), Status: v.status, QMP: v.qmp, Lock: v.conf["lock"],
				Tags: v.conf["tags"], Description: v.conf["description"], Config: maps.Clone(v.conf), Addr: v.addr,
				Cloning: v.pending != nil, Seed: v.seed, Boots: v.boots})
		}
		return out
	})
}

// Volume is a file on a storage.
type Volume struct {
	// Node holding it; empty on a shared storage.
	Node, VolID string
	Size        int
	// Seed is its content read as a NoCloud seed (zero when it is not one).
	Seed Seed
}

// Volumes returns the files of every storage.
func (s *Server) Volumes() []Volume {
	return readNow(s, func() (out []Volume) {
		for _, st := range s.storages {
			for _, node := range slices.Sorted(maps.Keys(st.files)) {
				for _, id := range slices.Sorted(maps.Keys(st.files[node])) {
					vol := st.files[node][id]
					sd, _ := readSeed(vol.data)
					out = append(out, Volume{Node: node, VolID: id, Size: len(vol.data), Seed: sd})
				}
			}
		}
		return out
	})
}

func (s *Server) poke(vmid int, fn func(v *vm)) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.tick()
	v, ok2 := s.vms[vmid]
	if !ok2 {
		return fmt.Errorf("pvetest: no VM %d", vmid)
	}
	fn(v)
	return nil
}

// SetQMPStatus puts a running guest into another QEMU run state (paused,
// prelaunch, io-error, internal-error...); its agent stops answering.
func (s *Server) SetQMPStatus(vmid int, state string) error {
	return s.poke(vmid, func(v *vm) {
		if v.status == "running" {
			v.qmp = state
			if state != "running" {
				v.closeListener() // a paused or crashed guest answers nothing
			}
		}
	})
}

// Lock sets a config lock (backup, migrate, snapshot...); "" clears it.
func (s *Server) Lock(vmid int, lock string) error {
	return s.poke(vmid, func(v *vm) {
		if lock == "" {
			delete(v.conf, "lock")
			return
		}
		v.conf["lock"] = lock
	})
}

// PowerOff stops a guest as a shutdown from inside it would: stopped,
// unlocked, its agent and Squid gone.
func (s *Server) PowerOff(vmid int) error {
	return s.poke(vmid, func(v *vm) {
		v.status, v.qmp = "stopped", ""
		v.agentAt, v.agentHeld = time.Time{}, false
		v.closeListener()
	})
}

// Hibernate suspends a guest to disk: stopped, locked "suspended", its
// RAM in a vmstate volume.
func (s *Server) Hibernate(vmid int) error {
	return s.poke(vmid, func(v *vm) {
		v.status, v.qmp = "stopped", ""
		v.agentAt = time.Time{}
		v.closeListener()
		v.conf["lock"] = "suspended"
		v.conf["vmstate"] = fmt.Sprintf("local-lvm:vm-%d-state-suspend-2026-01-02", vmid)
	})
}

// Migrate moves a guest to another node. Volumes on node-local storage
// stay where they were, as they do when an admin detaches them first.
func (s *Server) Migrate(vmid int, node string) error {
	return s.poke(vmid, func(v *vm) { v.node = node })
}

// HasVM reports whether a guest (or a clone in flight) has this VMID.
func (s *Server) HasVM(vmid int) bool {
	return readNow(s, func() bool { _, ok := s.vms[vmid]; return ok })
}

// AddContainer adds an LXC container: it takes its VMID (VMIDs are unique
// across VMs and containers) and is listed with type lxc.
func (s *Server) AddContainer(vmid int, node, name string) {
	s.do(func() {
		s.cts[vmid] = &vm{vmid: vmid, node: node, conf: map[string]string{"hostname": name}, status: "running"}
	})
}

// Rename renames a guest, as an admin would.
func (s *Server) Rename(vmid int, name string) error {
	return s.poke(vmid, func(v *vm) { v.conf["name"] = name })
}

// Resume resumes a hibernated guest (or starts a stopped one), as an admin
// would from the web UI.
func (s *Server) Resume(vmid int) error {
	var msg string
	err := s.poke(vmid, func(v *vm) { msg = s.boot(v, time.Now()) })
	if err == nil && msg != "" {
		err = fmt.Errorf("pvetest: %s", msg)
	}
	return err
}

// Remove deletes a guest behind the driver's back.
func (s *Server) Remove(vmid int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if v := s.vms[vmid]; v != nil {
		v.closeListener()
		delete(s.vms, vmid)
	}
}

// HoldDestroy stops the guest and starts a destroy task that runs until
// release (idempotent) is called: the guest is in the middle of being
// deleted.
func (s *Server) HoldDestroy(vmid int) (release func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok2 := s.vms[vmid]
	if !ok2 {
		return func() {}
	}
	v.status, v.qmp = "stopped", ""
	v.closeListener()
	t := s.startTask(v.node, "qmdestroy", strconv.Itoa(vmid), vmid, Hold, func(time.Time) string {
		if s.vms[vmid] == v {
			delete(s.vms, vmid)
		}
		return ""
	})
	t.held = true
	var once bool
	return func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if once {
			return
		}
		once = true
		if t.running() {
			s.finish(t)
		}
	}
}
