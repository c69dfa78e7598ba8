package proxytest

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"

	"github.com/egressproxy/provider-egressproxy/internal/proxy"
	"github.com/egressproxy/provider-egressproxy/internal/squid"
)

// Memory is an in-memory proxy.Driver that follows the contract exactly: the
// reference the conformance suite is proven against, and the backend the
// controller layer's tests run on. It is safe for concurrent use.
//
// Instance IDs are "memory/<name>". Names are global (Placement is stored
// and reported but does not scope names). A created instance is
// Provisioning until Settle makes it Running with an address in 10.0.0.0/8.
//
// Tests steer it with the methods below the Driver ones: Settle, SetState,
// SetUnknownState, SetBusy, HoldDelete, Foreign, ForeignMarked, Remove and
// FailNext; and inspect it with Calls, Instances, Spec and Logs. Those take
// an instance ID or a bare name.
type Memory struct {
	provider     string
	installation string
	log          logr.Logger
	// logMu guards logs apart from mu: a line is logged with mu held.
	logMu sync.Mutex
	logs  strings.Builder

	mu        sync.Mutex
	instances map[string]*memInstance // by name
	// pieces are what a Create cut short left of an instance that never
	// appeared (PartialCreate), by name, with their mark.
	pieces   map[string]proxy.Mark
	piecesAt map[string]time.Time
	busy     bool
	failNext map[string][]error // by op
	calls    []string
	lastIP   uint32
	// quiet stops recording calls and logs (Quiet).
	quiet bool
	// settleAfter settles a provisioning instance on the first Get this
	// long after its creation (SettleAfter).
	settleAfter time.Duration
}

// memState is the backend's own state, mapped onto proxy.State by Get.
type memState string

const (
	memProvisioning memState = "provisioning"
	memRunning      memState = "running"
	memStopped      memState = "stopped"
	memTerminated   memState = "terminated"
	memUnknown      memState = "hibernating-sideways" // a state drivers do not know
)

type memInstance struct {
	name      string
	mark      proxy.Mark
	spec      proxy.Request // holds secrets: never log it
	hasSpec   bool
	state     memState
	ip        string
	createdAt time.Time
	specHash  string
	deleting  bool
	// unreached: ReportEgress; report is what the guest's own egress
	// check wrote.
	unreached bool
	report    string
	// guestSaid: GuestReportsAddress set ip; tenantGuest: the last
	// Request or Ref said TenantGuest.
	guestSaid, tenantGuest bool
}

// The operations of proxy.Driver, as they appear in Calls, FailNext and
// (*proxy.Error).Op: proxy's, under the names the suite's users know.
const (
	OpCreate = proxy.OpCreate
	OpGet    = proxy.OpGet
	OpUpdate = proxy.OpUpdate
	OpDelete = proxy.OpDelete
	OpList   = proxy.OpList
	OpCheck  = proxy.OpCheck
)

// MemoryIDPrefix starts every Memory instance ID.
const MemoryIDPrefix = "memory/"

// MemoryTarget is the one target Memory's Check reports.
const MemoryTarget = "memory"

var validName = regexp.MustCompile(`^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$`)

var _ proxy.Driver = (*Memory)(nil)

// NewMemory returns an empty Memory backend whose errors carry provider and
// whose Request and ForeignMarked use installationID.
func NewMemory(provider, installationID string) *Memory {
	m := &Memory{
		provider:     provider,
		installation: installationID,
		instances:    map[string]*memInstance{},
		pieces:       map[string]proxy.Mark{},
		piecesAt:     map[string]time.Time{},
		failNext:     map[string][]error{},
	}
	m.log = funcr.New(func(prefix, args string) {
		m.logMu.Lock()
		defer m.logMu.Unlock()
		m.logs.WriteString(strings.TrimSpace(prefix+" "+args) + "\n")
	}, funcr.Options{Verbosity: 1}).WithName("memory").WithValues("provider", provider)
	return m
}

// MemoryHarness runs the conformance suite on Memory.
func MemoryHarness() Harness {
	return Harness{New: func(*testing.T) Fixture {
		return NewMemory("memory-test", "proxytest-installation").Fixture()
	}}
}

// Fixture is m with all its pokes, for Run.
func (m *Memory) Fixture() Fixture {
	return Fixture{
		Driver:              m,
		Provider:            m.provider,
		Request:             m.Request,
		Settle:              func(_ context.Context, id string) error { return m.Settle(id) },
		Foreign:             func(_ context.Context, name string) error { return m.Foreign(name) },
		ForeignMarked:       func(_ context.Context, name, uid string) error { return m.ForeignMarked(name, uid) },
		SetUnknownState:     func(_ context.Context, id string) error { return m.SetUnknownState(id) },
		SetBusy:             func(_ context.Context, busy bool) { m.SetBusy(busy) },
		HoldDelete:          func(_ context.Context, id string) func() { return m.HoldDelete(id) },
		PartialCreate:       func(_ context.Context, name, uid string) error { return m.PartialCreate(name, uid) },
		Leftovers:           func(_ context.Context, name string) ([]string, error) { return m.Leftovers(name), nil },
		ReportEgress:        func(_ context.Context, id, line string) error { return m.ReportEgress(id, line) },
		GuestReportsAddress: func(_ context.Context, id, ip string) error { return m.GuestReportsAddress(id, ip) },
		LogOutput:           m.Logs,
		MalformedIDs: []string{
			"pt-alpha",              // a name, not an ID
			"memory/",               // no name
			"memory/Not_A_Name",     // not a valid name
			"memory/pt-alpha/extra", // too many parts
			"vms/100/pt-alpha",      // another backend's ID
		},
	}
}

// Provider is the provider name m's errors carry.
func (m *Memory) Provider() string { return m.provider }

// InstallationID is the installation m's Request and ForeignMarked use.
func (m *Memory) InstallationID() string { return m.installation }

// Request returns a valid request for m, marked with uid and m's
// installation.
func (m *Memory) Request(name, uid string) proxy.Request {
	return proxy.Request{
		Name:      name,
		Mark:      proxy.Mark{UID: uid, InstallationID: m.installation},
		Placement: proxy.Placement{Location: "local", MachineType: "small", Image: "squid"},
		Proxy: proxy.Settings{
			Port:               3128,
			AllowedClientCIDRs: []string{"10.0.0.0/8"},
			AllowedPorts:       []int32{443},
		},
	}
}

// --- proxy.Driver ---

// Create implements proxy.Driver.
func (m *Memory) Create(ctx context.Context, req proxy.Request) (proxy.Instance, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.enter(ctx, OpCreate, req.Name); err != nil {
		return proxy.Instance{}, err
	}
	if !validName.MatchString(req.Name) {
		return proxy.Instance{}, m.fail(OpCreate, proxy.Permanentf("invalid instance name %q", req.Name))
	}
	if req.Mark.UID == "" || req.Mark.InstallationID == "" {
		return proxy.Instance{}, m.fail(OpCreate, proxy.Permanentf("request for %q carries no complete mark", req.Name))
	}
	if in, ok := m.instances[req.Name]; ok {
		if in.mark != req.Mark {
			return proxy.Instance{}, m.fail(OpCreate, proxy.Permanentf(
				"instance %q already exists and is not this resource's (%s); refusing to adopt it", req.Name, describeMark(in.mark)))
		}
		if in.deleting {
			return proxy.Instance{}, m.fail(OpCreate, proxy.Transientf("instance %q is being deleted", req.Name))
		}
		m.log.V(1).Info("instance exists", "id", MemoryIDPrefix+in.name)
		return m.view(in), nil
	}
	if m.pieces[req.Name] == req.Mark {
		delete(m.pieces, req.Name) // what a cut-short Create left is the instance's now
	}
	in := &memInstance{
		name:      req.Name,
		mark:      req.Mark,
		spec:      cloneRequest(req),
		hasSpec:   true,
		state:     memProvisioning,
		createdAt: time.Now().UTC().Round(0),
		specHash:  proxy.Hash(req),
		// Its guest is as the request says.
		tenantGuest: req.TenantGuest,
	}
	m.instances[in.name] = in
	m.log.Info("created instance", "id", MemoryIDPrefix+in.name, "uid", in.mark.UID, "specHash", in.specHash)
	return m.view(in), nil
}

// Get implements proxy.Driver.
func (m *Memory) Get(ctx context.Context, ref proxy.Ref) (proxy.Instance, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.enter(ctx, OpGet, refString(ref)); err != nil {
		return proxy.Instance{}, err
	}
	in, err := m.lookup(OpGet, ref)
	if proxy.IsNotFound(err) && ref.Deleting && ref.Mark.UID != "" && m.pieces[ref.Name] == ref.Mark {
		return proxy.Instance{ID: MemoryIDPrefix + ref.Name, Name: ref.Name, Mark: ref.Mark, State: proxy.StateStopped, Placement: ref.Placement,
			Progress: "no instance; what a create cut short left remains and is deleted with the resource"}, nil
	}
	if err != nil {
		return proxy.Instance{}, err
	}
	if m.settleAfter > 0 && in.state == memProvisioning && !in.deleting && time.Since(in.createdAt) >= m.settleAfter {
		m.setState(in, memRunning)
	}
	in.tenantGuest = ref.TenantGuest
	return m.view(in), nil
}

// Update implements proxy.Driver: every setting can change in place.
func (m *Memory) Update(ctx context.Context, ref proxy.Ref, req proxy.Request) (proxy.Instance, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.enter(ctx, OpUpdate, refString(ref)); err != nil {
		return proxy.Instance{}, err
	}
	in, err := m.lookup(OpUpdate, ref)
	if err != nil {
		return proxy.Instance{}, err
	}
	switch {
	case in.deleting:
		return proxy.Instance{}, m.fail(OpUpdate, proxy.Transientf("instance %q is being deleted", in.name))
	case in.mark != req.Mark:
		return proxy.Instance{}, m.fail(OpUpdate, proxy.Permanentf(
			"instance %q is not this resource's (%s); refusing to update it", in.name, describeMark(in.mark)))
	}
	in.spec, in.hasSpec = cloneRequest(req), true
	in.spec.Name = in.name
	in.tenantGuest = req.TenantGuest
	in.specHash = proxy.Hash(req)
	m.log.Info("updated instance", "id", MemoryIDPrefix+in.name, "specHash", in.specHash)
	return m.view(in), nil
}

// Delete implements proxy.Driver. It refuses (Permanent) to delete an
// instance that does not carry ref's mark: an unmarked one was made by a
// human, another mark is another resource's.
func (m *Memory) Delete(ctx context.Context, ref proxy.Ref) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.enter(ctx, OpDelete, refString(ref)); err != nil {
		return err
	}
	in, err := m.lookup(OpDelete, ref)
	switch {
	case proxy.IsNotFound(err):
		if ref.Mark.UID != "" && m.pieces[ref.Name] == ref.Mark {
			delete(m.pieces, ref.Name)
			m.log.Info("deleted what a create cut short left", "name", ref.Name)
		}
		return nil
	case err != nil:
		return err
	case in.deleting:
		return nil // already on its way
	case in.mark == (proxy.Mark{}) || in.mark != ref.Mark:
		return m.fail(OpDelete, proxy.Permanentf(
			"instance %q is not this resource's (%s); refusing to delete it", in.name, describeMark(in.mark)))
	}
	delete(m.instances, in.name)
	m.log.Info("deleted instance", "id", MemoryIDPrefix+in.name)
	return nil
}

// List implements proxy.Driver, sorted by name.
func (m *Memory) List(ctx context.Context, installationID string) ([]proxy.Instance, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.enter(ctx, OpList, installationID); err != nil {
		return nil, err
	}
	if installationID == "" {
		return nil, m.fail(OpList, proxy.Permanentf("empty installation ID"))
	}
	out := []proxy.Instance{}
	for _, name := range m.sortedNames() {
		if in := m.instances[name]; in.mark.InstallationID == installationID {
			out = append(out, m.view(in))
		}
	}
	for _, name := range slices.Sorted(maps.Keys(m.pieces)) {
		if mark := m.pieces[name]; mark.InstallationID == installationID && m.instances[name] == nil {
			out = append(out, proxy.Instance{ID: MemoryIDPrefix + name, Name: name, Mark: mark, State: proxy.StateStopped,
				CreatedAt: m.piecesAt[name], Leftovers: []string{"pieces of " + name}})
		}
	}
	return out, nil
}

// Check implements proxy.Driver: one target, MemoryTarget, healthy unless
// ctx is done, the backend is busy or FailNext(OpCheck, ...) was called.
func (m *Memory) Check(ctx context.Context) proxy.Health {
	m.mu.Lock()
	defer m.mu.Unlock()
	t := proxy.TargetHealth{Target: MemoryTarget, Address: "memory://" + m.provider}
	if err := m.enter(ctx, OpCheck, ""); err != nil {
		t.Reason, t.Message = proxy.ReasonAPIError, err.Error()
		if ctx.Err() != nil {
			t.Reason = proxy.ReasonTimeout
		}
		return proxy.Health{Targets: []proxy.TargetHealth{t}}
	}
	t.Healthy = true
	t.Details = map[string]string{"instances": fmt.Sprint(len(m.instances))}
	return proxy.Health{Targets: []proxy.TargetHealth{t}}
}

// --- controls ---

// Quiet stops m recording calls (Calls) and logs (Logs), which otherwise
// grow with every call: for a long-running process such as the scale
// benchmark's provider build (hack/benchscale).
func (m *Memory) Quiet() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.quiet = true
	m.log = logr.Discard()
}

// SettleAfter makes Get settle a provisioning instance (as Settle does)
// once d has passed since its creation; zero turns it off.
func (m *Memory) SettleAfter(d time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.settleAfter = d
}

// MemoryRecord is what Memory holds of one instance but its request's
// secrets: Records and Restore carry a backend across a restart of the
// process that holds it (the scale benchmark's provider build).
type MemoryRecord struct {
	Name      string          `json:"name"`
	Mark      proxy.Mark      `json:"mark"`
	Placement proxy.Placement `json:"placement"`
	SpecHash  string          `json:"specHash"`
	CreatedAt time.Time       `json:"createdAt"`
	IP        string          `json:"ip,omitempty"`
	Running   bool            `json:"running,omitempty"`
}

// Record returns the record of the instance named name, false when there
// is none.
func (m *Memory) Record(name string) (MemoryRecord, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	in, ok := m.instances[name]
	if !ok {
		return MemoryRecord{}, false
	}
	return MemoryRecord{Name: in.name, Mark: in.mark, Placement: in.spec.Placement, SpecHash: in.specHash,
		CreatedAt: in.createdAt, IP: in.ip, Running: in.state == memRunning}, true
}

// Restore puts r back as an instance, replacing one of the same name: Get
// then reports what it reported before the restart (the spec hash, the
// creation time, the address). The request's settings are not kept, so
// a restored instance has no Spec.
func (m *Memory) Restore(r MemoryRecord) error {
	if !validName.MatchString(r.Name) {
		return fmt.Errorf("memory: invalid instance name %q", r.Name)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	in := &memInstance{name: r.Name, mark: r.Mark, spec: proxy.Request{Name: r.Name, Placement: r.Placement},
		specHash: r.SpecHash, createdAt: r.CreatedAt, ip: r.IP, state: memProvisioning}
	if r.Running {
		in.state = memRunning
	}
	var a, b, c uint32
	if _, err := fmt.Sscanf(r.IP, "10.%d.%d.%d", &a, &b, &c); err == nil {
		m.lastIP = max(m.lastIP, a<<16|b<<8|c) // new addresses stay unique
	}
	m.instances[r.Name] = in
	return nil
}

// PartialCreate leaves what a Create of name for uid (with m's
// installation) that was cut short leaves before its instance exists:
// pieces of it, and no instance. A Create of that name and mark takes
// them over; a Delete with that mark removes them.
func (m *Memory) PartialCreate(name, uid string) error {
	if !validName.MatchString(name) {
		return fmt.Errorf("memory: invalid instance name %q", name)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.pieces[name] = proxy.Mark{UID: uid, InstallationID: m.installation}
	m.piecesAt[name] = time.Now()
	return nil
}

// Leftovers lists what a cut-short Create left of name (see
// PartialCreate).
func (m *Memory) Leftovers(name string) []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.pieces[name]; ok {
		return []string{"pieces of " + name}
	}
	return nil
}

// Settle finishes provisioning: the instance becomes Running with an
// address. It does nothing to an instance being deleted, and returns nil
// for one that does not exist.
func (m *Memory) Settle(id string) error {
	err := m.poke(id, func(in *memInstance) {
		if !in.deleting {
			m.setState(in, memRunning)
		}
	})
	if errors.Is(err, errNoInstance) {
		return nil
	}
	return err
}

// SetState puts an existing instance in state s, as Get will report it;
// Running assigns an address.
func (m *Memory) SetState(id string, s proxy.State) error {
	st, ok := map[proxy.State]memState{
		proxy.StateProvisioning: memProvisioning,
		proxy.StateRunning:      memRunning,
		proxy.StateStopped:      memStopped,
		proxy.StateTerminated:   memTerminated,
	}[s]
	if !ok {
		return fmt.Errorf("memory: unknown state %q", s)
	}
	return m.poke(id, func(in *memInstance) { m.setState(in, st) })
}

// ReportEgress makes the provider unable to reach the proxy of instance
// id and its guest report line as its own egress check (the line
// squid.ReportScript prints).
func (m *Memory) ReportEgress(id, line string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	in, ok := m.instances[strings.TrimPrefix(id, MemoryIDPrefix)]
	if !ok {
		return fmt.Errorf("no instance %q", id)
	}
	in.unreached, in.report = true, line
	return nil
}

// GuestReportsAddress makes the guest of instance id report ip as its
// address: an instance whose last Request or Ref said TenantGuest is then
// unreachable when ip is in TenantRefused, as the tenant guard would
// have it.
func (m *Memory) GuestReportsAddress(id, ip string) error {
	return m.poke(id, func(in *memInstance) { in.ip, in.guestSaid = ip, true })
}

// SetUnknownState makes the backend report a state drivers do not know.
func (m *Memory) SetUnknownState(id string) error {
	return m.poke(id, func(in *memInstance) { m.setState(in, memUnknown) })
}

// SetBusy makes every call fail Transient (busy), or behave again.
func (m *Memory) SetBusy(busy bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.busy = busy
}

// HoldDelete puts the instance in the middle of being deleted (Get reports
// it Stopped with Progress "deleting"; Delete succeeds; Create and Update
// are Transient) until release, which removes it. release is idempotent; for
// a missing instance HoldDelete does nothing.
func (m *Memory) HoldDelete(id string) (release func()) {
	m.mu.Lock()
	defer m.mu.Unlock()
	name, err := pokeName(id)
	in, ok := m.instances[name]
	if err != nil || !ok {
		return func() {}
	}
	in.deleting = true
	var once sync.Once
	return func() {
		once.Do(func() {
			m.mu.Lock()
			defer m.mu.Unlock()
			if m.instances[name] == in {
				delete(m.instances, name)
			}
		})
	}
}

// Foreign creates a running instance without a mark, as a human would.
func (m *Memory) Foreign(name string) error {
	return m.put(name, proxy.Mark{})
}

// ForeignMarked creates a running instance marked with m's installation and
// uid, as another process would.
func (m *Memory) ForeignMarked(name, uid string) error {
	return m.put(name, proxy.Mark{UID: uid, InstallationID: m.installation})
}

// Remove deletes the instance behind the driver's back (as a human in the
// backend's console would). It does nothing for a missing instance.
func (m *Memory) Remove(id string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if name, err := pokeName(id); err == nil {
		delete(m.instances, name)
		delete(m.pieces, name)
	}
}

// FailNext makes the next call of op (OpCreate, OpGet, ...) fail with err,
// after the call is recorded and ctx is checked. Calls queue: FailNext twice
// fails the next two. err is returned as the driver would, with Provider and
// Op set (an unclassified err becomes Transient). For OpCheck the target is
// reported unhealthy with err as its message.
func (m *Memory) FailNext(op string, err error) {
	switch op {
	case OpCreate, OpGet, OpUpdate, OpDelete, OpList, OpCheck:
	default:
		panic(fmt.Sprintf("proxytest: FailNext: unknown op %q", op))
	}
	if err == nil {
		panic("proxytest: FailNext: nil error")
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.failNext[op] = append(m.failNext[op], err)
}

// ClearFailNext drops the failures FailNext queued for op and not yet
// used.
func (m *Memory) ClearFailNext(op string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.failNext, op)
}

// Calls returns the calls made so far, oldest first, as "<op> <target>":
// "create <name>", "get <ID, or name when the Ref has no ID>", "update ...",
// "delete ...", "list <installation>", "check".
func (m *Memory) Calls() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.calls)
}

// Instances returns every instance in the backend, marked or not, sorted
// by name, as Get would report them.
func (m *Memory) Instances() []proxy.Instance {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := []proxy.Instance{}
	for _, name := range m.sortedNames() {
		out = append(out, m.view(m.instances[name]))
	}
	return out
}

// Spec returns the Request the instance was last created or updated from
// (secrets included), false for a missing instance or one the driver did
// not create.
func (m *Memory) Spec(id string) (proxy.Request, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	name, err := pokeName(id)
	if err != nil {
		return proxy.Request{}, false
	}
	in, ok := m.instances[name]
	if !ok || !in.hasSpec {
		return proxy.Request{}, false
	}
	return cloneRequest(in.spec), true
}

// Logs returns everything m logged so far, one line per entry.
func (m *Memory) Logs() string {
	m.logMu.Lock()
	defer m.logMu.Unlock()
	return m.logs.String()
}

// --- internals (m.mu held) ---

func (m *Memory) record(op, target string) {
	if m.quiet {
		return
	}
	m.calls = append(m.calls, strings.TrimSpace(op+" "+target))
}

// enter is what every call goes through first: it is recorded (Calls),
// then ctx, FailNext and busy are checked.
func (m *Memory) enter(ctx context.Context, op, target string) error {
	m.record(op, target)
	if err := ctx.Err(); err != nil {
		return m.fail(op, err)
	}
	if q := m.failNext[op]; len(q) > 0 {
		m.failNext[op] = q[1:]
		return m.fail(op, q[0])
	}
	if m.busy {
		return m.fail(op, proxy.Transientf("backend busy (503 Service Unavailable)"))
	}
	return nil
}

// fail classifies err as it leaves the driver, and logs it.
func (m *Memory) fail(op string, err error) error {
	err = proxy.WithContext(err, m.provider, op)
	m.log.V(1).Info("call failed", "op", op, "class", string(proxy.ClassOf(err)), "error", err.Error())
	return err
}

// lookup resolves ref: by ID when it has one (a malformed ID is
// Permanent), else by name.
func (m *Memory) lookup(op string, ref proxy.Ref) (*memInstance, error) {
	name := ref.Name
	if ref.ID != "" {
		n, ok := parseID(ref.ID)
		if !ok {
			return nil, m.fail(op, proxy.Permanentf("malformed instance ID %q: want %s<name>", ref.ID, MemoryIDPrefix))
		}
		name = n
	} else if !validName.MatchString(name) {
		return nil, m.fail(op, proxy.Permanentf("reference has no ID and an invalid name %q", name))
	}
	in, ok := m.instances[name]
	if !ok {
		return nil, m.fail(op, proxy.NotFoundf("instance %q not found", name))
	}
	return in, nil
}

func (m *Memory) view(in *memInstance) proxy.Instance {
	inst := proxy.Instance{
		ID:        MemoryIDPrefix + in.name,
		Name:      in.name,
		Mark:      in.mark,
		IP:        in.ip,
		Placement: in.spec.Placement,
		CreatedAt: in.createdAt,
		SpecHash:  in.specHash,
	}
	switch in.state {
	case memProvisioning:
		inst.State, inst.Progress = proxy.StateProvisioning, "booting"
	case memRunning:
		inst.State, inst.ProxyReachable = proxy.StateRunning, true
	case memTerminated:
		inst.State = proxy.StateTerminated
	default: // stopped, and states a driver does not know
		inst.State = proxy.StateStopped
	}
	if in.guestSaid && in.tenantGuest && inst.State == proxy.StateRunning {
		if a, err := netip.ParseAddr(in.ip); err != nil || TenantRefused.Contains(a) {
			// The tenant guard refuses what a tenant's guest names.
			inst.ProxyReachable, inst.Progress = false, "the backend reports the proxy's address as "+in.ip+", and the tenant guard refuses it"
			return inst
		}
	}
	if in.unreached && inst.State == proxy.StateRunning {
		// The provider's probe cannot reach the proxy: the guest's own
		// check, when valid, stands for it.
		inst.ProxyReachable, inst.Progress = false, "waiting for Squid to answer: unreachable"
		if r, ok, _ := squid.GuestReport([]byte(in.report), in.createdAt, time.Now()); ok {
			inst.ProxyReachable, inst.ReachableOnReport, inst.Progress = true, true, ""
			r.Publish(&inst)
		}
	}
	if in.deleting {
		inst.State, inst.ProxyReachable, inst.Progress = proxy.StateStopped, false, "deleting"
	}
	return inst
}

func (m *Memory) setState(in *memInstance, s memState) {
	in.state = s
	if s == memRunning && in.ip == "" {
		in.ip = m.nextIP()
	}
	m.log.V(1).Info("instance state", "id", MemoryIDPrefix+in.name, "state", string(s))
}

// nextIP hands out 10.0.0.1, 10.0.0.2, ..., skipping .0 and .255.
func (m *Memory) nextIP() string {
	for {
		m.lastIP++
		if b := m.lastIP & 0xff; b != 0 && b != 0xff {
			break
		}
	}
	n := m.lastIP
	return fmt.Sprintf("10.%d.%d.%d", n>>16&0xff, n>>8&0xff, n&0xff)
}

func (m *Memory) sortedNames() []string {
	names := slices.Collect(maps.Keys(m.instances))
	sort.Strings(names)
	return names
}

// errNoInstance is what poke returns for an instance that does not exist.
var errNoInstance = errors.New("memory: no instance")

// poke applies fn to an existing instance.
func (m *Memory) poke(id string, fn func(*memInstance)) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	name, err := pokeName(id)
	if err != nil {
		return err
	}
	in, ok := m.instances[name]
	if !ok {
		return fmt.Errorf("%w %q", errNoInstance, name)
	}
	fn(in)
	return nil
}

// put creates a running instance the driver did not create.
func (m *Memory) put(name string, mark proxy.Mark) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !validName.MatchString(name) {
		return fmt.Errorf("memory: invalid instance name %q", name)
	}
	if _, ok := m.instances[name]; ok {
		return fmt.Errorf("memory: instance %q exists", name)
	}
	in := &memInstance{
		name:      name,
		mark:      mark,
		spec:      proxy.Request{Placement: m.Request(name, "").Placement},
		createdAt: time.Now().UTC().Round(0),
	}
	m.instances[name] = in
	m.setState(in, memRunning)
	return nil
}

// parseID returns the name in a well-formed ID.
func parseID(id string) (string, bool) {
	name, ok := strings.CutPrefix(id, MemoryIDPrefix)
	return name, ok && validName.MatchString(name)
}

// pokeName accepts an ID or a bare name.
func pokeName(id string) (string, error) {
	if name, ok := parseID(id); ok {
		return name, nil
	}
	if validName.MatchString(id) {
		return id, nil
	}
	return "", fmt.Errorf("memory: %q is neither an instance ID nor a name", id)
}

func refString(ref proxy.Ref) string {
	if ref.ID != "" {
		return ref.ID
	}
	return ref.Name
}

func describeMark(mk proxy.Mark) string {
	if mk == (proxy.Mark{}) {
		return "no mark"
	}
	return fmt.Sprintf("UID %q, installation %q", mk.UID, mk.InstallationID)
}

// cloneRequest deep-copies req, so callers may change theirs.
func cloneRequest(req proxy.Request) proxy.Request {
	req.Proxy.AllowedClientCIDRs = slices.Clone(req.Proxy.AllowedClientCIDRs)
	req.Proxy.AllowedPorts = slices.Clone(req.Proxy.AllowedPorts)
	req.Proxy.AllowedDestinations = slices.Clone(req.Proxy.AllowedDestinations)
	req.Labels = maps.Clone(req.Labels)
	return req
}
