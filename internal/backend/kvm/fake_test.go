package kvm

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/digitalocean/go-libvirt"
	"libvirt.org/go/libvirtxml"

	"github.com/egressproxy/provider-egressproxy/internal/squid"
)

// fakeHost is an in-memory libvirt host: domains, one or more pools with
// volumes, guest agents. Every connection dialled to it (fakeConn) shares
// its state and records its calls under its own connection number, so a
// test can tell the pooled connection from a dedicated one.
type fakeHost struct {
	mu       sync.Mutex
	domains  map[string]*fakeDomain
	pools    map[string]*fakePool
	busy     bool
	failNext map[string][]error
	// hang makes calls of a method block until the channel is closed.
	hang   map[string]chan struct{}
	calls  []fakeCall
	nconns int
	closed int
	// crashAfter makes the n-th call of method (counting from 1) fail, to
	// simulate the provider dying right after the call before it.
	crashAt    int // fail the crashAt-th call and every later one (0: off)
	ncalls     int
	libVersion uint64
	// hostname is what ConnectGetHostname answers; "fakehost" when empty.
	hostname string
	// nextIP numbers the addresses boot gives; nextAgentIP, when set, is
	// the address the next booted domain's agent reports.
	nextIP      int
	nextAgentIP string
	squid       map[string]string // ip:port answering: the identity Squid answers with
	// memAvailable is the host's available memory; 0 means plenty.
	memAvailable uint64
	guestFiles   map[string]string
	execs        []string
	// execArgv are the guest-exec commands: the path, then the args.
	execArgv [][]string
	// agentOps are the guest agent's file writes and guest-execs, in order.
	agentOps []agentOp
	// onCall runs, outside the host's lock, when a call of the method
	// begins (a fault in the middle of a call).
	onCall map[string]func()
}

// agentOp is a guest-file-write of path (content in base64), or, with
// argv, a guest-exec.
type agentOp struct {
	path, b64 string
	argv      []string
}

type fakeCall struct {
	conn   int
	method string
	arg    string
}

type fakeDomain struct {
	name    string
	xml     string
	state   libvirt.DomainState
	reason  int32
	meta    map[string]string // by namespace URI, as libvirt returns it
	agentIP string
	leaseIP string
	agentUp bool
	nvram   bool
	uuid    libvirt.UUID
}

type fakePool struct {
	name      string
	state     libvirt.StoragePoolState
	capacity  uint64
	available uint64
	vols      map[string]*fakeVol
}

type fakeVol struct {
	name     string
	format   string
	capacity uint64
	backing  string
	content  []byte
}

func newFakeHost() *fakeHost {
	return &fakeHost{
		domains:    map[string]*fakeDomain{},
		pools:      map[string]*fakePool{"default": {name: "default", state: libvirt.StoragePoolRunning, capacity: 100 << 30, available: 80 << 30, vols: map[string]*fakeVol{}}},
		failNext:   map[string][]error{},
		hang:       map[string]chan struct{}{},
		libVersion: 9000000,
		squid:      map[string]string{},
		guestFiles: map[string]string{},
	}
}

var (
	errCrashed     = errors.New("the provider is gone")
	errCrashedHere = fmt.Errorf("%w (at this call)", errCrashed)
)

func lverr(code libvirt.ErrorNumber, format string, args ...any) error {
	return libvirt.Error{Code: uint32(code), Message: fmt.Sprintf(format, args...)}
}

// conn returns a new connection to the host.
func (h *fakeHost) conn() *fakeConn {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.nconns++
	return &fakeConn{h: h, id: h.nconns}
}

// callsOf returns the methods called, in order (all connections).
func (h *fakeHost) callsOf(method string) []fakeCall {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []fakeCall
	for _, c := range h.calls {
		if c.method == method {
			out = append(out, c)
		}
	}
	return out
}

func (h *fakeHost) volNames() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []string
	for n := range h.pools["default"].vols {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

func (h *fakeHost) domainNames() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []string
	for n := range h.domains {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// boot makes a started domain finish booting: the agent reports an
// address and Squid answers on port.
func (h *fakeHost) boot(name string, port int) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	d := h.domains[name]
	if d == nil || d.state != libvirt.DomainRunning {
		return false
	}
	if d.agentIP == "" && h.nextAgentIP != "" {
		d.agentIP = h.nextAgentIP
	}
	if d.agentIP == "" {
		h.nextIP++
		d.agentIP = fmt.Sprintf("192.168.122.%d", 10+h.nextIP)
	}
	d.agentUp = true
	// The guest's Squid runs the configuration rendered for the domain's
	// resource, which names itself after the resource's UID.
	m, _ := parseMeta(d.meta[metadataURI])
	h.squid[d.agentIP+":"+strconv.Itoa(port)] = squid.Identity(m.UID)
	return true
}

// squidAsk answers a probe of addr as the guest's Squid would.
func (h *fakeHost) squidAsk(_ context.Context, addr string) (string, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if id, ok := h.squid[addr]; ok {
		return id, nil
	}
	return "", errors.New("connection refused")
}

// fakeConn is one connection to a fakeHost.
type fakeConn struct {
	h      *fakeHost
	id     int
	mu     sync.Mutex
	closed bool
}

var _ Libvirt = (*fakeConn)(nil)

// enter records the call and applies busy, failNext and hang.
func (c *fakeConn) enter(ctx context.Context, method, arg string) error {
	c.mu.Lock()
	closed := c.closed
	c.mu.Unlock()
	if closed {
		return io.EOF
	}
	h := c.h
	h.mu.Lock()
	h.calls = append(h.calls, fakeCall{conn: c.id, method: method, arg: arg})
	hang := h.hang[method]
	var err error
	if q := h.failNext[method]; len(q) > 0 {
		err, h.failNext[method] = q[0], q[1:]
	}
	busy := h.busy
	hook := h.onCall[method]
	h.ncalls++
	if h.crashAt > 0 && h.ncalls >= h.crashAt && err == nil {
		err = errCrashed
		if h.ncalls == h.crashAt {
			err = errCrashedHere
		}
	}
	h.mu.Unlock()
	if hook != nil {
		hook()
	}
	if hang != nil {
		select {
		case <-hang:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if err != nil {
		return err
	}
	if busy {
		return lverr(libvirt.ErrOperationTimeout, "Timed out during operation: cannot acquire state change lock")
	}
	return nil
}

func (c *fakeConn) ConnectGetLibVersion(ctx context.Context) (uint64, error) {
	if err := c.enter(ctx, "ConnectGetLibVersion", ""); err != nil {
		return 0, err
	}
	return c.h.libVersion, nil
}

func (c *fakeConn) ConnectGetHostname(ctx context.Context) (string, error) {
	if err := c.enter(ctx, "ConnectGetHostname", ""); err != nil {
		return "", err
	}
	if c.h.hostname != "" {
		return c.h.hostname, nil
	}
	return "fakehost", nil
}

func (c *fakeConn) ConnectListAllDomains(ctx context.Context, _ libvirt.ConnectListAllDomainsFlags) ([]libvirt.Domain, error) {
	if err := c.enter(ctx, "ConnectListAllDomains", ""); err != nil {
		return nil, err
	}
	c.h.mu.Lock()
	defer c.h.mu.Unlock()
	out := []libvirt.Domain{}
	for _, d := range c.h.domains {
		out = append(out, libvirt.Domain{Name: d.name, UUID: d.uuid})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

func (c *fakeConn) DomainGetXMLDesc(ctx context.Context, dom libvirt.Domain) (string, error) {
	d, unlock, err := c.enterDomain(ctx, "DomainGetXMLDesc", dom.Name)
	if err != nil {
		return "", err
	}
	defer unlock()
	return d.xml, nil
}

// enterDomain is enter for a call on the domain name, which it returns
// with the host locked (unlock releases it); a missing one is libvirt's
// ErrNoDomain, and the host is then left unlocked.
func (c *fakeConn) enterDomain(ctx context.Context, method, name string) (*fakeDomain, func(), error) {
	return enterFind(c, ctx, method, name, func() (*fakeDomain, error) { return c.dom(name) })
}

// enterPool is enterDomain for a storage pool.
func (c *fakeConn) enterPool(ctx context.Context, method, name string) (*fakePool, func(), error) {
	return enterFind(c, ctx, method, name, func() (*fakePool, error) { return c.pool(name) })
}

// enterVol is enterDomain for a volume.
func (c *fakeConn) enterVol(ctx context.Context, method string, v libvirt.StorageVol) (*fakeVol, func(), error) {
	return enterFind(c, ctx, method, v.Name, func() (*fakeVol, error) { return c.vol(v) })
}

func enterFind[T any](c *fakeConn, ctx context.Context, method, arg string, find func() (T, error)) (T, func(), error) {
	var zero T
	if err := c.enter(ctx, method, arg); err != nil {
		return zero, nil, err
	}
	c.h.mu.Lock()
	v, err := find()
	if err != nil {
		c.h.mu.Unlock()
		return zero, nil, err
	}
	return v, c.h.mu.Unlock, nil
}

// find is m[name], or libvirt's error code with its message (format
// names the thing missing) when there is none.
func find[T any](m map[string]*T, name string, code libvirt.ErrorNumber, format string) (*T, error) {
	if v := m[name]; v != nil {
		return v, nil
	}
	return nil, lverr(code, format, name)
}

func (c *fakeConn) dom(name string) (*fakeDomain, error) {
	return find(c.h.domains, name, libvirt.ErrNoDomain, "Domain not found: no domain with matching name '%s'")
}

func (c *fakeConn) pool(name string) (*fakePool, error) {
	return find(c.h.pools, name, libvirt.ErrNoStoragePool, "Storage pool not found: no storage pool with matching name '%s'")
}

func (c *fakeConn) vol(v libvirt.StorageVol) (*fakeVol, error) {
	p, err := c.pool(v.Pool)
	if err != nil {
		return nil, err
	}
	return find(p.vols, v.Name, libvirt.ErrNoStorageVol, "Storage volume not found: no storage vol with matching name '%s'")
}

func (c *fakeConn) DomainLookupByName(ctx context.Context, name string) (libvirt.Domain, error) {
	d, unlock, err := c.enterDomain(ctx, "DomainLookupByName", name)
	if err != nil {
		return libvirt.Domain{}, err
	}
	defer unlock()
	return libvirt.Domain{Name: d.name, UUID: d.uuid}, nil
}

// prefixedEl is the provider's metadata element as it sits under
// <metadata>; libvirt keys it by its namespace.
var prefixedEl = regexp.MustCompile(`(?s)<(\w+):instance xmlns:\w+="([^"]*)">(.*)</\w+:instance>`)

func (c *fakeConn) DomainDefineXML(ctx context.Context, x string) (libvirt.Domain, error) {
	if err := c.enter(ctx, "DomainDefineXML", domainNameOf(x)); err != nil {
		return libvirt.Domain{}, err
	}
	// Parsed as libvirt would: a document that is not a domain is refused.
	var def libvirtxml.Domain
	if err := def.Unmarshal(x); err != nil {
		return libvirt.Domain{}, lverr(libvirt.ErrXMLError, "XML error: %v", err)
	}
	name := def.Name
	if name == "" {
		return libvirt.Domain{}, lverr(libvirt.ErrXMLError, "XML error: missing name")
	}
	c.h.mu.Lock()
	defer c.h.mu.Unlock()
	d := c.h.domains[name]
	if d == nil {
		d = &fakeDomain{name: name, state: libvirt.DomainShutoff, reason: 0, meta: map[string]string{}}
		d.uuid[0] = byte(len(c.h.domains) + 1)
		c.h.domains[name] = d
	}
	d.xml = x
	d.nvram = def.OS != nil && def.OS.Firmware == "efi"
	if def.Metadata != nil {
		// libvirt returns the element without prefix or namespace.
		if e := prefixedEl.FindStringSubmatch(def.Metadata.XML); e != nil {
			d.meta[e[2]] = "<instance>" + e[3] + "</instance>"
		}
	}
	return libvirt.Domain{Name: d.name, UUID: d.uuid}, nil
}

func (c *fakeConn) DomainCreate(ctx context.Context, dom libvirt.Domain) error {
	return c.setState(ctx, "DomainCreate", dom, libvirt.DomainRunning, 1, "domain is already running")
}

func (c *fakeConn) DomainDestroy(ctx context.Context, dom libvirt.Domain) error {
	return c.setState(ctx, "DomainDestroy", dom, libvirt.DomainShutoff, 2, "domain is not running")
}

// setState moves the domain to state for reason, as libvirt does, which
// refuses (saying already) a domain in that state already. A domain that
// stops loses its guest agent.
func (c *fakeConn) setState(ctx context.Context, method string, dom libvirt.Domain, state libvirt.DomainState, reason int32, already string) error {
	d, unlock, err := c.enterDomain(ctx, method, dom.Name)
	if err != nil {
		return err
	}
	defer unlock()
	if d.state == state {
		return lverr(libvirt.ErrOperationInvalid, "Requested operation is not valid: %s", already)
	}
	d.state, d.reason = state, reason
	d.agentUp = d.agentUp && state == libvirt.DomainRunning
	return nil
}

func (c *fakeConn) DomainUndefineFlags(ctx context.Context, dom libvirt.Domain, flags libvirt.DomainUndefineFlagsValues) error {
	d, unlock, err := c.enterDomain(ctx, "DomainUndefineFlags", dom.Name)
	if err != nil {
		return err
	}
	defer unlock()
	if d.nvram && flags&libvirt.DomainUndefineNvram == 0 {
		return lverr(libvirt.ErrOperationInvalid, "Requested operation is not valid: cannot undefine domain with nvram")
	}
	delete(c.h.domains, dom.Name)
	return nil
}

func (c *fakeConn) DomainGetState(ctx context.Context, dom libvirt.Domain) (libvirt.DomainState, int32, error) {
	d, unlock, err := c.enterDomain(ctx, "DomainGetState", dom.Name)
	if err != nil {
		return 0, 0, err
	}
	defer unlock()
	return d.state, d.reason, nil
}

func (c *fakeConn) DomainGetMetadata(ctx context.Context, dom libvirt.Domain, uri string) (string, error) {
	d, unlock, err := c.enterDomain(ctx, "DomainGetMetadata", dom.Name)
	if err != nil {
		return "", err
	}
	defer unlock()
	m, ok := d.meta[uri]
	if !ok {
		return "", lverr(libvirt.ErrNoDomainMetadata, "metadata not found: Requested metadata element is not present")
	}
	return m, nil
}

func (c *fakeConn) DomainSetMetadata(ctx context.Context, dom libvirt.Domain, x, _, uri string) error {
	d, unlock, err := c.enterDomain(ctx, "DomainSetMetadata", dom.Name)
	if err != nil {
		return err
	}
	defer unlock()
	d.meta[uri] = x
	return nil
}

func (c *fakeConn) DomainInterfaceAddresses(ctx context.Context, dom libvirt.Domain, src libvirt.DomainInterfaceAddressesSource) ([]libvirt.DomainInterface, error) {
	if err := c.enter(ctx, "DomainInterfaceAddresses", dom.Name+"/"+sourceName(src)); err != nil {
		return nil, err
	}
	c.h.mu.Lock()
	defer c.h.mu.Unlock()
	d, err := c.dom(dom.Name)
	if err != nil {
		return nil, err
	}
	if d.state != libvirt.DomainRunning {
		return nil, lverr(libvirt.ErrOperationInvalid, "Requested operation is not valid: domain is not running")
	}
	lo := libvirt.DomainInterface{Name: "lo", Addrs: []libvirt.DomainIPAddr{{Type: int32(libvirt.IPAddrTypeIpv4), Addr: "127.0.0.1", Prefix: 8}}}
	switch src {
	case libvirt.DomainInterfaceAddressesSrcAgent:
		if !d.agentUp {
			return nil, lverr(libvirt.ErrAgentUnresponsive, "Guest agent is not responding: QEMU guest agent is not connected")
		}
		return []libvirt.DomainInterface{lo, {Name: "enp1s0", Addrs: []libvirt.DomainIPAddr{
			{Type: int32(libvirt.IPAddrTypeIpv6), Addr: "fe80::1", Prefix: 64},
			{Type: int32(libvirt.IPAddrTypeIpv4), Addr: d.agentIP, Prefix: 24}}}}, nil
	case libvirt.DomainInterfaceAddressesSrcLease:
		if d.leaseIP == "" {
			return nil, nil
		}
		return []libvirt.DomainInterface{{Name: "vnet0", Addrs: []libvirt.DomainIPAddr{{Type: int32(libvirt.IPAddrTypeIpv4), Addr: d.leaseIP, Prefix: 24}}}}, nil
	}
	return nil, nil
}

func (c *fakeConn) QEMUDomainAgentCommand(ctx context.Context, dom libvirt.Domain, cmd string) (string, error) {
	if err := c.enter(ctx, "QEMUDomainAgentCommand", dom.Name+"/"+agentCommandName(cmd)); err != nil {
		return "", err
	}
	c.h.mu.Lock()
	defer c.h.mu.Unlock()
	d, err := c.dom(dom.Name)
	if err != nil {
		return "", err
	}
	if !d.agentUp {
		return "", lverr(libvirt.ErrAgentUnresponsive, "Guest agent is not responding: QEMU guest agent is not connected")
	}
	var in struct {
		Execute   string         `json:"execute"`
		Arguments map[string]any `json:"arguments"`
	}
	if err := json.Unmarshal([]byte(cmd), &in); err != nil {
		return "", lverr(libvirt.ErrInvalidArg, "bad command")
	}
	switch in.Execute {
	case "guest-file-open":
		path, _ := in.Arguments["path"].(string)
		if mode, _ := in.Arguments["mode"].(string); mode == "r" && c.h.guestFiles[path] == "" {
			return "", lverr(libvirt.ErrInternalError, "internal error: unable to execute QEMU agent command 'guest-file-open': Failed to open file '%s': No such file or directory", path)
		}
		c.h.guestFiles["handle:1"] = path
		return `{"return":1}`, nil
	case "guest-file-read":
		b := c.h.guestFiles[c.h.guestFiles["handle:1"]]
		return `{"return":{"count":1,"buf-b64":"` + b + `","eof":true}}`, nil
	case "guest-file-write":
		b, _ := in.Arguments["buf-b64"].(string)
		c.h.guestFiles[c.h.guestFiles["handle:1"]] = b
		c.h.agentOps = append(c.h.agentOps, agentOp{path: c.h.guestFiles["handle:1"], b64: b})
		return `{"return":{"count":1,"eof":false}}`, nil
	case "guest-file-close":
		return `{"return":{}}`, nil
	case "guest-exec":
		args, _ := in.Arguments["arg"].([]any)
		c.h.execs = append(c.h.execs, fmt.Sprint(args...))
		path, _ := in.Arguments["path"].(string)
		argv := []string{path}
		for _, a := range args {
			s, _ := a.(string)
			argv = append(argv, s)
		}
		c.h.execArgv = append(c.h.execArgv, argv)
		c.h.agentOps = append(c.h.agentOps, agentOp{argv: argv})
		return `{"return":{"pid":42}}`, nil
	case "guest-exec-status":
		return `{"return":{"exited":true,"exitcode":0}}`, nil
	}
	return "", lverr(libvirt.ErrArgumentUnsupported, "unsupported command")
}

func (c *fakeConn) StoragePoolLookupByName(ctx context.Context, name string) (libvirt.StoragePool, error) {
	_, unlock, err := c.enterPool(ctx, "StoragePoolLookupByName", name)
	if err != nil {
		return libvirt.StoragePool{}, err
	}
	defer unlock()
	return libvirt.StoragePool{Name: name}, nil
}

func (c *fakeConn) StoragePoolListAllVolumes(ctx context.Context, p libvirt.StoragePool) ([]libvirt.StorageVol, error) {
	fp, unlock, err := c.enterPool(ctx, "StoragePoolListAllVolumes", p.Name)
	if err != nil {
		return nil, err
	}
	defer unlock()
	out := []libvirt.StorageVol{}
	for _, name := range slices.Sorted(maps.Keys(fp.vols)) {
		out = append(out, libvirt.StorageVol{Pool: p.Name, Name: name, Key: "/pool/" + name})
	}
	return out, nil
}

func (c *fakeConn) StoragePoolRefresh(ctx context.Context, p libvirt.StoragePool) error {
	return c.enter(ctx, "StoragePoolRefresh", p.Name)
}

func (c *fakeConn) StoragePoolGetInfo(ctx context.Context, p libvirt.StoragePool) (PoolInfo, error) {
	fp, unlock, err := c.enterPool(ctx, "StoragePoolGetInfo", p.Name)
	if err != nil {
		return PoolInfo{}, err
	}
	defer unlock()
	return PoolInfo{State: fp.state, Capacity: fp.capacity, Allocation: fp.capacity - fp.available, Available: fp.available}, nil
}

func (c *fakeConn) NodeGetMemoryStats(ctx context.Context) (MemoryStats, error) {
	if err := c.enter(ctx, "NodeGetMemoryStats", ""); err != nil {
		return MemoryStats{}, err
	}
	c.h.mu.Lock()
	defer c.h.mu.Unlock()
	if c.h.memAvailable == 0 {
		return MemoryStats{Total: 64 << 30, Free: 48 << 30}, nil
	}
	return MemoryStats{Total: 64 << 30, Free: c.h.memAvailable}, nil
}

func (c *fakeConn) StorageVolLookupByName(ctx context.Context, p libvirt.StoragePool, name string) (libvirt.StorageVol, error) {
	if err := c.enter(ctx, "StorageVolLookupByName", name); err != nil {
		return libvirt.StorageVol{}, err
	}
	c.h.mu.Lock()
	defer c.h.mu.Unlock()
	if _, err := c.vol(libvirt.StorageVol{Pool: p.Name, Name: name}); err != nil {
		return libvirt.StorageVol{}, err
	}
	return libvirt.StorageVol{Pool: p.Name, Name: name, Key: "/pool/" + name}, nil
}

func (c *fakeConn) StorageVolGetPath(ctx context.Context, v libvirt.StorageVol) (string, error) {
	_, unlock, err := c.enterVol(ctx, "StorageVolGetPath", v)
	if err != nil {
		return "", err
	}
	defer unlock()
	return "/var/lib/libvirt/images/" + v.Name, nil
}

func (c *fakeConn) StorageVolGetXMLDesc(ctx context.Context, v libvirt.StorageVol) (string, error) {
	fv, unlock, err := c.enterVol(ctx, "StorageVolGetXMLDesc", v)
	if err != nil {
		return "", err
	}
	defer unlock()
	x, err := volumeXML(fv.name, fv.capacity, fv.format, fv.backing, "qcow2")
	if err != nil {
		return "", err
	}
	// As libvirt reports a file's size beside its capacity (which, for
	// a qcow2 file after a refresh, is its virtual size).
	return strings.Replace(x, "</capacity>", "</capacity><physical unit=\"bytes\">"+strconv.Itoa(len(fv.content))+"</physical>", 1), nil
}

func (c *fakeConn) StorageVolCreateXML(ctx context.Context, p libvirt.StoragePool, x string) (libvirt.StorageVol, error) {
	var def libvirtxml.StorageVolume
	if err := def.Unmarshal(x); err != nil {
		return libvirt.StorageVol{}, lverr(libvirt.ErrXMLError, "XML error: %v", err)
	}
	name := def.Name
	if err := c.enter(ctx, "StorageVolCreateXML", name); err != nil {
		return libvirt.StorageVol{}, err
	}
	c.h.mu.Lock()
	defer c.h.mu.Unlock()
	fp, err := c.pool(p.Name)
	if err != nil {
		return libvirt.StorageVol{}, err
	}
	if fp.vols[name] != nil {
		return libvirt.StorageVol{}, lverr(libvirt.ErrStorageVolExist, "storage volume '%s' exists already", name)
	}
	fv := &fakeVol{name: name}
	if def.Capacity != nil {
		fv.capacity = def.Capacity.Value
	}
	if def.Target != nil && def.Target.Format != nil {
		fv.format = def.Target.Format.Type
	}
	if def.BackingStore != nil {
		fv.backing = def.BackingStore.Path
	}
	fp.vols[name] = fv
	return libvirt.StorageVol{Pool: p.Name, Name: name, Key: "/pool/" + name}, nil
}

func (c *fakeConn) StorageVolUpload(ctx context.Context, v libvirt.StorageVol, r io.Reader, length uint64) error {
	if err := c.enter(ctx, "StorageVolUpload", v.Name); err != nil {
		if errors.Is(err, errCrashedHere) {
			// Died mid-upload: half the bytes landed.
			var buf bytes.Buffer
			_, _ = io.Copy(&buf, io.LimitReader(r, int64(length/2)))
			c.h.mu.Lock()
			if fv, verr := c.vol(v); verr == nil {
				fv.content = buf.Bytes()
			}
			c.h.mu.Unlock()
		}
		return err
	}
	var buf bytes.Buffer
	if _, err := io.Copy(&buf, io.LimitReader(r, int64(length))); err != nil {
		return err
	}
	c.h.mu.Lock()
	defer c.h.mu.Unlock()
	fv, err := c.vol(v)
	if err != nil {
		return err
	}
	if uint64(buf.Len()) > fv.capacity {
		return lverr(libvirt.ErrInvalidArg, "upload larger than the volume")
	}
	fv.content = buf.Bytes()
	return nil
}

func (c *fakeConn) StorageVolDownload(ctx context.Context, v libvirt.StorageVol, w io.Writer, length uint64) error {
	if err := c.enter(ctx, "StorageVolDownload", v.Name); err != nil {
		return err
	}
	c.h.mu.Lock()
	fv, err := c.vol(v)
	var content []byte
	if err == nil {
		content = append([]byte(nil), fv.content...)
	}
	c.h.mu.Unlock()
	if err != nil {
		return err
	}
	if uint64(len(content)) > length {
		content = content[:length]
	}
	_, err = w.Write(content)
	return err
}

func (c *fakeConn) StorageVolDelete(ctx context.Context, v libvirt.StorageVol) error {
	_, unlock, err := c.enterVol(ctx, "StorageVolDelete", v)
	if err != nil {
		return err
	}
	defer unlock()
	delete(c.h.pools[v.Pool].vols, v.Name)
	return nil
}

func (c *fakeConn) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.closed {
		c.closed = true
		c.h.mu.Lock()
		c.h.closed++
		c.h.mu.Unlock()
	}
	return nil
}
