// Package pvetest is a fake Proxmox VE API server for tests: an
// httptest TLS server (with its own CA) that speaks the real wire format
// and behaves like a PVE cluster where it matters to a client:
//
//   - Every request is checked against the published API schema
//     (pve-apidoc.json, embedded): an unknown path, method or parameter,
//     a missing required one, or a value of the wrong type, enum, pattern,
//     range or format is answered as the real server would (400
//     "Parameter verification failed." with per-parameter errors, 501 for
//     an unknown method) and recorded as a violation. Every answer the fake
//     gives is checked against the schema's return shape too. Tests fail on
//     any violation (see New).
//   - API tokens only: "Authorization: PVEAPIToken=user@realm!id=secret".
//   - Long work runs as tasks with real UPIDs
//     (UPID:node:pid:pstart:starttime:type:id:user:), a status, an exit
//     status and a log; tasks take time (Durations) or are held until the
//     test releases them.
//   - A clone leaves a nameless entry locked "clone" until its task ends;
//     config locks (backup, migrate, suspended...) and the per-VM file
//     lock a running task holds refuse conflicting calls with the real
//     texts; the guest agent answers only some time after boot, and only
//     when the guest has it (installed by the seed's user-data, or
//     preinstalled in the template).
//   - Errors carry the real API's texts in the HTTP reason phrase
//     ("500 Configuration file 'nodes/pve1/qemu-server/100.conf' does not
//     exist"), with a {"data":null} body, as pveproxy sends them.
//   - /cluster/resources lists every node, storage and guest, including
//     the guests of an unreachable node (status "unknown"), whose own
//     endpoints answer 595.
//
// Tests steer it with the methods below Server (FinishTasks, Inject,
// SetBusy, Lock, Hibernate, Migrate, HoldDestroy, AddVM...) and inspect it
// with Requests, VMs, Volumes and Violations.
package pvetest

import (
	"bufio"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"mime"
	"mime/multipart"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/egressproxy/provider-egressproxy/internal/backend/wirefake"
)

// DefaultToken is the API token a default server accepts.
const DefaultToken = "egress@pve!provider=5e0f4b8e-1d2c-4a6b-9f00-5E471NE1c0de"

// Hold as a duration keeps a task running (or an agent silent) until
// FinishTasks.
const Hold time.Duration = -1

// Durations say how long each kind of task runs, and how long after boot
// the guest agent starts answering. Zero fields take the defaults (a few
// hundred milliseconds); Hold keeps them waiting for FinishTasks.
type Durations struct {
	Clone, Upload, DeleteVolume, Resize, Start, Stop, Reboot, Destroy, Agent time.Duration
}

// FastDurations make everything finish at the next request: tasks are
// still asynchronous, but tests need not wait.
var FastDurations = Durations{Clone: time.Nanosecond, Upload: time.Nanosecond, DeleteVolume: time.Nanosecond,
	Resize: time.Nanosecond, Start: time.Nanosecond, Stop: time.Nanosecond, Reboot: time.Nanosecond,
	Destroy: time.Nanosecond, Agent: time.Nanosecond}

// HeldDurations keep every task and agent waiting for FinishTasks.
var HeldDurations = Durations{Clone: Hold, Upload: Hold, DeleteVolume: Hold, Resize: Hold, Start: Hold,
	Stop: Hold, Reboot: Hold, Destroy: Hold, Agent: Hold}

func (d Durations) withDefaults() Durations {
	def := Durations{Clone: 400 * time.Millisecond, Upload: 50 * time.Millisecond, DeleteVolume: 30 * time.Millisecond,
		Resize: 100 * time.Millisecond, Start: 200 * time.Millisecond, Stop: 150 * time.Millisecond,
		Reboot: 300 * time.Millisecond, Destroy: 200 * time.Millisecond, Agent: 500 * time.Millisecond}
	for _, p := range []struct{ v, d *time.Duration }{
		{&d.Clone, &def.Clone}, {&d.Upload, &def.Upload}, {&d.DeleteVolume, &def.DeleteVolume},
		{&d.Resize, &def.Resize}, {&d.Start, &def.Start}, {&d.Stop, &def.Stop}, {&d.Reboot, &def.Reboot},
		{&d.Destroy, &def.Destroy}, {&d.Agent, &def.Agent},
	} {
		if *p.v == 0 {
			*p.v = *p.d
		}
	}
	return d
}

// Node is one cluster node.
type Node struct {
	Name string
	// Offline nodes are listed with status offline, their guests with
	// status unknown, and their endpoints answer 595.
	Offline bool
	// Addresses are the node's own, as its network configuration states
	// them on vmbr0 (IPv4 or IPv6); nil means 198.51.100.(10+its index).
	Addresses []string
}

// Storage is one storage of the datacenter.
type Storage struct {
	ID string
	// Type is the plugin type: dir, nfs, lvmthin...
	Type string
	// Content types it holds: iso, images, vztmpl, backup...
	Content []string
	// Shared storages hold the same files on every node.
	Shared bool
	// Nodes it is available on; empty means all.
	Nodes []string
	// Disabled storages are listed but inactive.
	Disabled bool
	// TotalGiB is its size.
	TotalGiB int64
}

// Template is a template VM the fake starts with.
type Template struct {
	VMID int
	Node string
	Name string
	// Config overrides or adds config keys ("scsi0", "net0", "ide2"...).
	Config map[string]string
	// NotTemplate makes it a plain VM (to test the driver's refusal).
	NotTemplate bool
	// AgentPreinstalled: clones run qemu-guest-agent even when the seed
	// does not install it.
	AgentPreinstalled bool
}

// Options configure a Server.
type Options struct {
	// Token accepted in the Authorization header; default DefaultToken.
	Token string
	// Nodes of the cluster; default pve1 and pve2 online, pve3 offline.
	Nodes []Node
	// Storages; default local (dir: iso, vztmpl, backup on each node),
	// local-lvm (lvmthin: images on each node) and shared-iso (nfs: iso,
	// shared).
	Storages []Storage
	// Templates; default VMID 9000 "debian-12-cloud" on pve1 with a 3 GiB
	// scsi0 on local-lvm and net0 on vmbr0.
	Templates []Template
	// Durations of tasks and agent start-up.
	Durations Durations
	// Listen opens a real TCP listener on each running guest's address at
	// ProxyPort once its agent answers, so a readiness probe can connect.
	Listen bool
	// ProxyPort is the port of those listeners; default 3128.
	ProxyPort int
	// Squid, with Listen, is the path of a real squid: each running
	// guest then runs it from the squid.conf and htpasswd its seed
	// installs (GuestSquid), instead of a stand-in that only answers
	// probes, so requests through the guest's proxy really go out.
	Squid string
	// Version reported by /version; default 9.0.10.
	Version string
}

// Request is one request the fake received, as the log records it. The
// upload's file and the token are never recorded.
type Request struct {
	Method string
	// Path is the request path below /api2/json, unescaped.
	Path string
	// Endpoint is "METHOD /schema/path/{with}/{placeholders}", empty when
	// the schema has no such path.
	Endpoint string
	// Params are the query or form parameters (path placeholders not
	// included).
	Params map[string]string
	// Status is the HTTP status answered (0 when the connection was cut).
	Status int
	// Message is the error text of a failed request.
	Message string
}

// Fault makes matching requests fail. It is consumed after Times matches
// (default 1; negative for ever).
type Fault struct {
	// Match selects requests; Endpoint and Params are filled.
	Match func(Request) bool
	// Status and Message are the answer (for example 500 and a real API
	// text); ignored with Drop.
	Status  int
	Message string
	// After serves the request first and fails only its answer: the server
	// acted, the client never learns it (a crash or a cut connection).
	After bool
	// Drop closes the connection without an answer.
	Drop  bool
	Times int
	// RetryAfter, when set, is the answer's Retry-After header (as a
	// rate-limiting proxy in front of pveproxy sends it).
	RetryAfter string
}

// Server is the fake. Create it with New.
type Server struct {
	*httptest.Server

	t      testing.TB
	opts   Options
	schema *Schema

	// probed counts the connections the guests' listeners accepted.
	probed atomic.Int64

	mu sync.Mutex
	// probesBlocked: BlockProbes.
	probesBlocked bool
	auth          *authority
	token         string
	busy          bool
	nodes         map[string]*Node
	storages      []*storageState
	vms           map[int]*vm
	cts           map[int]*vm // containers: only their VMIDs and names matter
	tasks         []*task
	pid           int
	requests      []Request
	violations    []string
	faults        []*Fault
	failTasks     map[string][]failure // task type -> how the next tasks of that type fail
}

// New starts a fake cluster for t and stops it when t ends. Any schema
// violation makes t fail at its end (t.Errorf), listing them.
func New(t testing.TB, o Options) *Server {
	t.Helper()
	s, err := Start(o)
	if err != nil {
		t.Fatalf("pvetest: %v", err)
	}
	s.t = t
	t.Cleanup(func() {
		s.Close()
		if v := s.Violations(); len(v) > 0 {
			t.Errorf("pvetest: %d request(s) or answer(s) did not match the published API schema:\n  %s", len(v), strings.Join(v, "\n  "))
		}
	})
	return s
}

// Start starts a fake cluster without a test; Close stops it.
func Start(o Options) (*Server, error) {
	schema, err := LoadSchema()
	if err != nil {
		return nil, err
	}
	if o.Token == "" {
		o.Token = DefaultToken
	}
	if o.ProxyPort == 0 {
		o.ProxyPort = 3128
	}
	if o.Version == "" {
		o.Version = "9.0.10"
	}
	o.Durations = o.Durations.withDefaults()
	if o.Nodes == nil {
		o.Nodes = []Node{{Name: "pve1"}, {Name: "pve2"}, {Name: "pve3", Offline: true}}
	}
	if o.Storages == nil {
		o.Storages = []Storage{
			{ID: "local", Type: "dir", Content: []string{"iso", "vztmpl", "backup"}, TotalGiB: 100},
			{ID: "local-lvm", Type: "lvmthin", Content: []string{"images", "rootdir"}, TotalGiB: 400},
			{ID: "shared-iso", Type: "nfs", Content: []string{"iso"}, Shared: true, TotalGiB: 1000},
		}
	}
	if o.Templates == nil {
		o.Templates = []Template{{VMID: 9000, Node: "pve1", Name: "debian-12-cloud"}}
	}
	auth, err := newAuthority("pve.example")
	if err != nil {
		return nil, err
	}
	s := &Server{opts: o, schema: schema, auth: auth, token: o.Token, nodes: map[string]*Node{}, vms: map[int]*vm{}, cts: map[int]*vm{},
		pid: 0x1f00, failTasks: map[string][]failure{}}
	for i := range o.Nodes {
		n := o.Nodes[i]
		if n.Addresses == nil {
			n.Addresses = []string{fmt.Sprintf("198.51.100.%d", 10+i)}
		}
		s.nodes[n.Name] = &n
	}
	for _, st := range o.Storages {
		s.storages = append(s.storages, &storageState{Storage: st, files: map[string]map[string]*volume{}})
	}
	for _, tp := range o.Templates {
		s.addTemplate(tp)
	}
	s.Server = httptest.NewUnstartedServer(http.HandlerFunc(s.serve))
	// Refused handshakes are what the TLS tests are about: not noise.
	s.Server.Config.ErrorLog = log.New(io.Discard, "", 0)
	s.Server.TLS = &tls.Config{
		MinVersion:   tls.VersionTLS12,
		Certificates: []tls.Certificate{auth.cert},
		// The certificate of the moment, so RotateCA takes effect.
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			s.mu.Lock()
			defer s.mu.Unlock()
			return &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{s.auth.cert}}, nil
		},
	}
	s.Server.StartTLS()
	return s, nil
}

// Close stops the server and every guest listener.
func (s *Server) Close() {
	s.Server.Close()
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, v := range s.vms {
		v.closeListener()
	}
}

// CAPEM is the PEM of the CA that signed the server's certificate.
func (s *Server) CAPEM() []byte {
	return read(s, func() []byte { return slices.Clone(s.auth.caPEM) })
}

// RotateCA replaces the server's certificate with one from a new CA and
// returns the new CA's PEM: clients that trust only the old CA fail.
func (s *Server) RotateCA() ([]byte, error) {
	a, err := newAuthority("pve.example")
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.auth = a
	// Established connections keep the old certificate: close them.
	s.Server.CloseClientConnections()
	return slices.Clone(a.caPEM), nil
}

// SetToken changes the token the server accepts (a rotation).
func (s *Server) SetToken(token string) {
	s.do(func() { s.token = token })
}

// Token returns the token the server accepts.
func (s *Server) Token() string {
	return read(s, func() string { return s.token })
}

// Requests returns the requests received so far, oldest first.
func (s *Server) Requests() []Request {
	return read(s, func() []Request { return slices.Clone(s.requests) })
}

// ResetRequests forgets the request log (to count from a point on).
func (s *Server) ResetRequests() {
	s.do(func() { s.requests = nil })
}

// Violations returns every schema violation seen so far.
func (s *Server) Violations() []string {
	return read(s, func() []string { return slices.Clone(s.violations) })
}

// ResetViolations forgets the violations (for tests that send invalid
// requests on purpose).
func (s *Server) ResetViolations() {
	s.do(func() { s.violations = nil })
}

// Inject adds a fault.
func (s *Server) Inject(f Fault) {
	if f.Times == 0 {
		f.Times = 1
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.faults = append(s.faults, &f)
}

// ClearFaults removes every fault not yet consumed.
func (s *Server) ClearFaults() {
	s.do(func() { s.faults = nil })
}

// SetBusy makes every request fail with 596 (pveproxy cannot reach its
// worker in time), or behave again.
func (s *Server) SetBusy(busy bool) {
	s.do(func() { s.busy = busy })
}

// SetNodeOnline takes a node off the network or brings it back.
func (s *Server) SetNodeOnline(node string, online bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if n, ok := s.nodes[node]; ok {
		n.Offline = !online
	}
}

// FailNextTask makes the next task of type typ (qmclone, qmstart,
// qmresize, qmstop, qmdestroy, qmreboot, imgcopy, imgdel) fail with exit
// status exit when it ends, after writing log to its log.
func (s *Server) FailNextTask(typ, exit string, log ...string) {
	s.do(func() { s.failTasks[typ] = append(s.failTasks[typ], failure{exit: exit, log: log}) })
}

// failure is how a task will fail.
type failure struct {
	exit string
	log  []string
}

// FinishTasks ends every running task that is not held by HoldDestroy and
// lets every booted guest's agent answer, as if enough time had passed.
func (s *Server) FinishTasks() {
	s.mu.Lock()
	defer s.mu.Unlock()
	// Finishing a task can start nothing new, but a clone's end makes a VM
	// whose start may already have been asked for: loop until quiet.
	for range 10 {
		n := 0
		for _, t := range s.tasks {
			if t.running() && !t.held {
				s.finish(t)
				n++
			}
		}
		if n == 0 {
			break
		}
	}
	now := time.Now()
	for _, v := range s.vms {
		if v.status == "running" && (v.agentHeld || v.agentAt.After(now)) {
			v.agentAt, v.agentHeld = now, false
		}
		s.maybeListen(v, now)
	}
}

// PendingTasks returns the UPIDs of the tasks still running.
func (s *Server) PendingTasks() []string {
	return readNow(s, func() (out []string) {
		for _, t := range s.tasks {
			if t.running() {
				out = append(out, t.upid)
			}
		}
		return out
	})
}

// --- HTTP ---

const apiPrefix = "/api2/json"

// answer is what a handler returns: data for a 200, or an error.
type answer struct {
	data   any
	status int
	msg    string
	errors map[string]string
	// retryAfter is a Retry-After header to send with an error.
	retryAfter string
}

func ok(data any) answer { return answer{data: data, status: http.StatusOK} }

func fail(status int, format string, args ...any) answer {
	return answer{status: status, msg: fmt.Sprintf(format, args...)}
}

// apiError is a handler's way to fail from deep inside.
type apiError struct {
	status int
	msg    string
}

func (e *apiError) Error() string { return e.msg }

func errf(format string, args ...any) *apiError {
	return &apiError{status: 500, msg: fmt.Sprintf(format, args...)}
}

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	rec := Request{Method: r.Method}
	escaped, isAPI := strings.CutPrefix(r.URL.EscapedPath(), apiPrefix)
	rec.Path, _ = url.PathUnescape(escaped)
	params, perr := readParams(r)
	rec.Params = publicParams(params)

	s.mu.Lock()
	defer s.mu.Unlock()
	idx := len(s.requests)
	s.requests = append(s.requests, rec)
	record := func(status int, msg string) {
		s.requests[idx].Status = status
		s.requests[idx].Message = msg
	}
	respond := func(a answer) {
		record(a.status, a.msg)
		s.write(w, a)
	}

	if !isAPI {
		respond(fail(http.StatusNotImplemented, "Method '%s %s' not implemented", r.Method, r.URL.Path))
		return
	}
	if !s.authorized(r) {
		if r.Header.Get("Authorization") == "" {
			respond(fail(http.StatusUnauthorized, "No ticket"))
		} else {
			respond(fail(http.StatusUnauthorized, "invalid token value!"))
		}
		return
	}
	if s.busy {
		respond(fail(596, "Connection timed out"))
		return
	}
	m, pathParams, err := s.schema.Lookup(r.Method, escaped)
	if err != nil {
		s.violations = append(s.violations, fmt.Sprintf("%s %s: %v", r.Method, rec.Path, err))
		respond(fail(http.StatusNotImplemented, "Method '%s %s' not implemented", r.Method, rec.Path))
		return
	}
	rec.Endpoint = m.Method + " " + m.Path
	s.requests[idx].Endpoint = rec.Endpoint
	if perr != nil {
		s.violations = append(s.violations, fmt.Sprintf("%s: %v", rec.Endpoint, perr))
		respond(fail(http.StatusBadRequest, "%v", perr))
		return
	}
	all := map[string]string{}
	for k, v := range rec.Params {
		all[k] = v
	}
	for k, v := range pathParams {
		if _, dup := all[k]; dup {
			s.violations = append(s.violations, fmt.Sprintf("%s: parameter %q sent in the path and the body", rec.Endpoint, k))
		}
		all[k] = v
	}
	if errs := m.ValidateParams(all); len(errs) > 0 {
		keys := make([]string, 0, len(errs))
		for k := range errs {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			s.violations = append(s.violations, fmt.Sprintf("%s: parameter %s: %s", rec.Endpoint, k, errs[k]))
		}
		a := fail(http.StatusBadRequest, "Parameter verification failed.")
		a.errors = errs
		respond(a)
		return
	}

	fault := s.fault(rec)
	// serveFault answers with the fault instead; dropped is what the log
	// records of a dropped connection.
	serveFault := func(dropped string) {
		if fault.Drop {
			record(0, dropped)
			wirefake.HangUp(w)
			return
		}
		a := fail(fault.Status, "%s", fault.Message)
		a.retryAfter = fault.RetryAfter
		respond(a)
	}
	if fault != nil && !fault.After {
		serveFault("connection dropped")
		return
	}

	s.tick()
	if f, ok := params[fileKey]; ok {
		all[fileKey] = f
	}
	a := s.route(m, all)
	if a.status == http.StatusOK {
		if v := validateAnswer(m, a.data); len(v) > 0 {
			for _, msg := range v {
				s.violations = append(s.violations, fmt.Sprintf("answer of %s: %s", rec.Endpoint, msg))
			}
		}
	}
	if fault != nil {
		serveFault("connection dropped after serving")
		return
	}
	respond(a)
}

// validateAnswer checks data as the client will decode it.
func validateAnswer(m *MethodInfo, data any) []string {
	b, err := json.Marshal(data)
	if err != nil {
		return []string{err.Error()}
	}
	var generic any
	if err := json.Unmarshal(b, &generic); err != nil {
		return []string{err.Error()}
	}
	return m.ValidateReturn(generic)
}

func (s *Server) fault(rec Request) *Fault {
	for i, f := range s.faults {
		if f.Match == nil || !f.Match(rec) {
			continue
		}
		if f.Times > 0 {
			f.Times--
			if f.Times == 0 {
				s.faults = append(s.faults[:i], s.faults[i+1:]...)
			}
		}
		return f
	}
	return nil
}

func (s *Server) authorized(r *http.Request) bool {
	h := r.Header.Get("Authorization")
	tok, ok := strings.CutPrefix(h, "PVEAPIToken=")
	return ok && tok == s.token
}

// user is the token's user@realm!tokenid, as UPIDs name it.
func (s *Server) user() string {
	u, _, _ := strings.Cut(s.token, "=")
	return u
}

// write sends an answer the way pveproxy does: the error text in the
// status line's reason phrase, {"data":null} (plus "errors") as the body.
func (s *Server) write(w http.ResponseWriter, a answer) {
	if a.status == http.StatusOK {
		b, _ := json.Marshal(map[string]any{"data": a.data})
		w.Header().Set("Content-Type", "application/json;charset=UTF-8")
		w.Header().Set("Content-Length", strconv.Itoa(len(b)))
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write(b)
		return
	}
	body := map[string]any{"data": nil}
	if len(a.errors) > 0 {
		body["errors"] = a.errors
	}
	b, _ := json.Marshal(body)
	hj, ok := w.(http.Hijacker)
	if !ok {
		w.Header().Set("Content-Type", "application/json;charset=UTF-8")
		w.WriteHeader(a.status)
		_, _ = w.Write(b)
		return
	}
	conn, buf, err := hj.Hijack()
	if err != nil {
		return
	}
	defer conn.Close()
	// net/http cannot send a custom reason phrase; pveproxy does.
	reason := strings.ReplaceAll(strings.TrimSpace(a.msg), "\n", " ")
	extra := ""
	if a.retryAfter != "" {
		extra = "Retry-After: " + a.retryAfter + "\r\n"
	}
	fmt.Fprintf(buf, "HTTP/1.1 %d %s\r\nContent-Type: application/json;charset=UTF-8\r\nContent-Length: %d\r\n%sConnection: close\r\n\r\n%s",
		a.status, reason, len(b), extra, b)
	_ = buf.Flush()
}

// readParams reads query parameters (GET, DELETE) or the form body (POST,
// PUT: urlencoded, JSON or, for uploads, multipart). A multipart file is
// kept under the reserved key "\x00file" and never recorded.
func readParams(r *http.Request) (map[string]string, error) {
	out := map[string]string{}
	for k, vs := range r.URL.Query() {
		if len(vs) != 1 {
			return out, fmt.Errorf("parameter %q given %d times", k, len(vs))
		}
		out[k] = vs[0]
	}
	if r.Method == http.MethodGet || r.Method == http.MethodDelete {
		return out, nil
	}
	ct, ctParams, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	switch ct {
	case "", "application/x-www-form-urlencoded":
		b, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
		if err != nil {
			return out, err
		}
		q, err := url.ParseQuery(string(b))
		if err != nil {
			return out, err
		}
		for k, vs := range q {
			if len(vs) != 1 {
				return out, fmt.Errorf("parameter %q given %d times", k, len(vs))
			}
			out[k] = vs[0]
		}
	case "application/json":
		var m map[string]any
		if err := json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&m); err != nil {
			return out, err
		}
		for k, v := range m {
			out[k] = fmt.Sprint(v)
		}
	case "multipart/form-data":
		mr := multipart.NewReader(bufio.NewReader(r.Body), ctParams["boundary"])
		for {
			p, err := mr.NextPart()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				return out, err
			}
			b, err := io.ReadAll(io.LimitReader(p, 64<<20))
			if err != nil {
				return out, err
			}
			if p.FileName() != "" {
				// pveproxy stores the file and passes its original name as
				// "filename".
				out[p.FormName()] = p.FileName()
				out[fileKey] = string(b)
				continue
			}
			out[p.FormName()] = string(b)
		}
	default:
		return out, fmt.Errorf("unsupported content type %q", ct)
	}
	return out, nil
}

// fileKey holds an uploaded file's content among the parameters.
const fileKey = "\x00file"

// Params without the uploaded file, for the request log and the schema.
func publicParams(p map[string]string) map[string]string {
	if _, ok := p[fileKey]; !ok {
		return p
	}
	out := map[string]string{}
	for k, v := range p {
		if k != fileKey {
			out[k] = v
		}
	}
	return out
}

// AskSquid answers a readiness probe of addr (ip:port) as the Squid of
// the running guest at addr would once its agent answers: with the
// identity of the squid.conf its seed's user-data installs
// (squid.IdentityOf). It is a squid.Prober's Ask for drivers under test
// that cannot dial (see Options.Listen for real listeners).
// GuestConnections is how many connections the guests' listeners
// (Options.Listen, without Squid) accepted: a readiness probe's.
func (s *Server) GuestConnections() int64 { return s.probed.Load() }

func (s *Server) AskSquid(_ context.Context, addr string) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.tick()
	host, port, err := net.SplitHostPort(addr)
	if err != nil || port != strconv.Itoa(s.opts.ProxyPort) || s.probesBlocked {
		return "", fmt.Errorf("dial tcp %s: connection refused", addr)
	}
	now := time.Now()
	for _, v := range s.vms {
		if v.addr == host && v.status == "running" && v.qmp == "running" && v.agentReady(now) {
			return v.squidIdentity(), nil
		}
	}
	return "", fmt.Errorf("dial tcp %s: connection refused", addr)
}

func digestOf(parts ...string) string {
	h := sha256.New()
	for _, p := range parts {
		h.Write([]byte(p))
		h.Write([]byte{0})
	}
	return hex.EncodeToString(h.Sum(nil))[:40]
}

// SetGuestFile makes the guest of vmid hold a file its agent reads
// (agent/file-read): what a tenant's guest may write.
func (s *Server) SetGuestFile(vmid int, path, content string) {
	s.do(func() {
		if v := s.vms[vmid]; v != nil {
			if v.files == nil {
				v.files = map[string]string{}
			}
			v.files[path] = content
		}
	})
}

// SetGuestAddress makes the guest agent of vmid report addr as its
// address (agent/network-get-interfaces): what a guest a tenant writes
// may claim.
func (s *Server) SetGuestAddress(vmid int, addr string) {
	s.do(func() {
		if v := s.vms[vmid]; v != nil {
			v.addr = addr
		}
	})
}

// BlockProbes makes AskSquid refuse every guest (a firewall between the
// provider and the guests), or answer again.
func (s *Server) BlockProbes(blocked bool) {
	s.do(func() { s.probesBlocked = blocked })
}

// do runs fn under the server's lock (a test control's change).
func (s *Server) do(fn func()) { wirefake.Do(&s.mu, fn) }

// read returns what fn reads under the server's lock.
func read[T any](s *Server, fn func() T) T { return wirefake.Read(&s.mu, fn) }

// readNow is read of the state as of now: what is due (a task's end, a
// guest agent starting) has happened first.
func readNow[T any](s *Server, fn func() T) T {
	return read(s, func() T { s.tick(); return fn() })
}
