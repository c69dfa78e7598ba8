// Package gcptest is an in-process fake of the Compute Engine v1 REST API,
// for driving the driver's real client (gcp.NewSDK) with
// option.WithEndpoint(s.URL) and option.WithoutAuthentication().
//
// It answers in the wire format of the real API, as recorded in
// shared/data/gcp (instances, addresses, firewalls, zone, region and
// global operations, error bodies, the aggregated list with its
// NO_RESULTS_ON_PAGE warnings), for the calls the gcp driver makes:
//
//	zones/{z}/instances              POST insert, GET list
//	zones/{z}/instances/{n}          GET, PUT update, DELETE
//	zones/{z}/instances/{n}/setLabels POST
//	zones/{z}/instances/{n}/getGuestAttributes GET (variableKey)
//	aggregated/instances             GET (filter on labels, maxResults, pageToken)
//	zones/{z}/operations/{op}        GET   (and regions/{r}/..., global/...)
//	regions/{r}/addresses[/{n}]      POST, GET, DELETE, {n}/setLabels POST
//	aggregated/addresses             GET (filter on labels, maxResults, pageToken)
//	global/firewalls                 POST, GET list (maxResults, pageToken)
//	global/firewalls/{n}             GET, PATCH, DELETE
//	regions/{r}                      GET (quotas)
//
// Work is asynchronous as on GCE: a call that changes something answers
// 200 with an operation RUNNING at progress 0. Operations finish when a
// test calls Settle (or after AutoComplete, checked lazily on every
// request), and can be made to fail (FailNextOperation), to answer
// synchronously with an error (FailNext, SetBusy), or be held (HoldDelete).
// A duplicate insert is a 409. Every address handed out is a loopback
// address (127.0.x.y), so probing one never leaves the machine.
package gcptest

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"hash/fnv"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/egressproxy/provider-egressproxy/internal/cloudinit"
	"github.com/egressproxy/provider-egressproxy/internal/squid"
	"github.com/egressproxy/provider-egressproxy/internal/squid/squidtest"

	"github.com/egressproxy/provider-egressproxy/internal/backend/wirefake"
)

// Zones the fake knows (the aggregated list reports every one).
var Zones = []string{"europe-west1-b", "europe-west1-c", "us-central1-a", "us-central1-b"}

const linkBase = "https://www.googleapis.com/compute/v1/projects/"

// Server is the fake. Create it with New; it is safe for concurrent use.
type Server struct {
	// URL is the endpoint to hand option.WithEndpoint.
	URL     string
	Project string
	// CAPEM is the certificate to trust for URL, PEM (NewTLS only).
	CAPEM []byte

	srv *httptest.Server

	mu        sync.Mutex
	instances map[string]*instance // zone/name
	addresses map[string]*address  // region/name
	firewalls map[string]*firewall // name
	ops       map[string]*operation
	order     []string // op keys in creation order
	requests  []string
	// discovery checks requests and answers; violations are what it found.
	discovery  *Discovery
	violations []string
	// futureValues are enum values a test set on purpose that the
	// document does not have yet (SetStatus).
	futureValues []string
	busy         bool
	failNext     []failure
	failOps      []opFailure
	cut          *cut
	retryAfter   string
	held         map[string]bool // zone/name of instances whose deletion is held
	auto         time.Duration
	quotas       map[string][]Quota
	lastIP       map[string]int
	seq          uint64
	unreach      []string
	auth         string
	squidDown    bool
	probeFrom    string // EnforceFirewall
	squidBin     string // RunSquid
	identity     *iam
}

// Quota is one regional quota.
type Quota struct {
	Metric string  `json:"metric"`
	Limit  float64 `json:"limit"`
	Usage  float64 `json:"usage"`
}

type instance struct {
	body     map[string]any // the stored resource (secret user-data included)
	zone     string
	name     string
	status   string
	natIP    string
	insertOp string
	deleting bool
	// stopSquid stops the instance's real Squid (RunSquid) and its
	// guest's egress check.
	stopSquid func()
	// guestAttrs are what the guest wrote (namespace/key: value).
	guestAttrs map[string]string
}

type address struct {
	body   map[string]any
	region string
	name   string
}

type firewall struct {
	body map[string]any
	name string
}

type operation struct {
	key     string
	body    map[string]any
	scope   string // zones/z, regions/r, global
	started time.Time
	done    bool
	finish  func() *opFailure // applied when the operation ends; a non-nil result fails it
	target  string            // resource key the op works on
	held    bool
}

type failure struct {
	method, path string
	status       int
	reason       string
	message      string
}

// cut is a connection the fake will close (CutAt).
type cut struct {
	match func(method, path string) bool
	after bool
	n     int // matching requests still to pass before the cut one
}

type opFailure struct {
	resource   string
	opType     string
	code       string
	message    string
	httpStatus int
	httpMsg    string
}

// New starts a fake for project on plain HTTP; it stops with the test.
func New(t interface{ Cleanup(func()) }, project string) *Server {
	return start(t, project, false)
}

// NewTLS starts a fake for project on HTTPS (a certificate for 127.0.0.1
// and ::1, issued by the CA in CAPEM), for clients that take only an
// https endpoint: the provider's gcp.endpoint. Keys from ServiceAccountKey
// then name its https token endpoint.
func NewTLS(t interface{ Cleanup(func()) }, project string) *Server {
	return start(t, project, true)
}

func start(t interface{ Cleanup(func()) }, project string, tls bool) *Server {
	s := &Server{
		Project:   project,
		instances: map[string]*instance{},
		addresses: map[string]*address{},
		firewalls: map[string]*firewall{},
		ops:       map[string]*operation{},
		held:      map[string]bool{},
		quotas:    map[string][]Quota{},
		lastIP:    map[string]int{},
	}
	d, err := LoadDiscovery()
	if err != nil {
		// Without the document nothing the fake sees is checked: say so
		// on every request, so that every test using the fake fails.
		s.violations = append(s.violations, err.Error())
	}
	s.discovery = d
	if tls {
		s.srv = httptest.NewTLSServer(http.HandlerFunc(s.serve))
		s.CAPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: s.srv.Certificate().Raw})
	} else {
		s.srv = httptest.NewServer(http.HandlerFunc(s.serve))
	}
	s.URL = s.srv.URL
	t.Cleanup(s.srv.Close)
	t.Cleanup(func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		for _, in := range s.instances {
			in.stopGuestSquid()
		}
	})
	if e, ok := t.(interface{ Errorf(string, ...any) }); ok {
		t.Cleanup(func() {
			if v := s.Violations(); len(v) > 0 {
				e.Errorf("gcptest: %d request(s) or answer(s) did not match Compute Engine's discovery document:\n  %s", len(v), strings.Join(v, "\n  "))
			}
		})
	}
	return s
}

// Violations returns every difference from Compute Engine's discovery
// document seen so far in a request or an answer (a test that uses the
// fake through New fails on any).
func (s *Server) Violations() []string {
	return read(s, func() []string { return slices.Clone(s.violations) })
}

func (s *Server) isFutureValue(problem string) bool {
	for _, f := range s.futureValues {
		if strings.Contains(problem, fmt.Sprintf("%q is not one of", f)) {
			return true
		}
	}
	return false
}

// check records how a request and its successful answer differ from the
// discovery document.
func (s *Server) check(r *http.Request, rel string, body map[string]any, status int, resp any) {
	if s.discovery == nil {
		return
	}
	m, v := s.discovery.CheckRequest(r.Method, rel, r.URL.Query(), body)
	if status < 400 && m != nil {
		// The answer as the client receives it: through JSON.
		var generic any
		if b, err := json.Marshal(onTheWire(resp)); err != nil {
			v = append(v, fmt.Sprintf("%s: the answer does not encode: %v", m.ID, err))
		} else if err := json.Unmarshal(b, &generic); err == nil {
			for _, p := range s.discovery.CheckResponse(m, generic) {
				if !s.isFutureValue(p) {
					v = append(v, p)
				}
			}
		}
	}
	s.violations = append(s.violations, v...)
}

// --- test controls ---

// AutoComplete makes every operation finish by itself d after it started
// (checked on each request). Zero turns it off: operations then finish
// only at Settle.
func (s *Server) AutoComplete(d time.Duration) {
	s.do(func() { s.auto = d })
}

// Settle finishes every operation in flight on the named proxy's
// resources (instance, address, firewall rule of that name), except held
// deletions. name may be an instance ID (zones/z/instances/n).
func (s *Server) Settle(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	name = lastSegment(name)
	for _, k := range slices.Clone(s.order) {
		op := s.ops[k]
		if op != nil && !op.done && !op.held && lastSegment(op.target) == name {
			s.finish(op)
		}
	}
}

// SettleAll finishes every operation in flight except held deletions.
func (s *Server) SettleAll() {
	s.do(func() { s.finishAll() })
}

// finishAll is SettleAll with s.mu held.
func (s *Server) finishAll() {
	for _, k := range slices.Clone(s.order) {
		if op := s.ops[k]; op != nil && !op.done && !op.held {
			s.finish(op)
		}
	}
}

// SetBusy makes every call answer 503 backendError, or behave again.
func (s *Server) SetBusy(busy bool) {
	s.do(func() { s.busy = busy })
}

// FailNext makes the next request whose method is method and whose path
// contains pathPart answer status with one error of reason (quotaExceeded,
// rateLimitExceeded, forbidden, ...).
func (s *Server) FailNext(method, pathPart string, status int, reason, message string) {
	s.do(func() {
		s.failNext = append(s.failNext, failure{method: method, path: pathPart, status: status, reason: reason, message: message})
	})
}

// FailNextOperation makes the next operation of opType (insert, delete)
// on a resource of that collection (instances, addresses, firewalls)
// accepted from now on finish DONE with error code and message, and
// httpErrorStatusCode httpStatus (0 for none). A failed insert leaves no
// resource behind.
func (s *Server) FailNextOperation(resource, opType, code, message string, httpStatus int) {
	s.do(func() {
		s.failOps = append(s.failOps, opFailure{resource: resource, opType: opType, code: code, message: message, httpStatus: httpStatus, httpMsg: strings.ToUpper(http.StatusText(httpStatus))})
	})
}

// CutAt closes the connection of the n-th request (counting from 1)
// from now on for which match (nil: every request) holds, without an
// answer: before the fake acts on it, or with after, once it has (the
// client never learns that it did). It models a cut connection and a
// provider that dies in the middle of a call. Once is enough: the cut
// is then forgotten.
func (s *Server) CutAt(n int, after bool, match func(method, path string) bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if match == nil {
		match = func(string, string) bool { return true }
	}
	s.cut = &cut{match: match, after: after, n: n - 1}
}

// cutNow reports whether this request's connection is to be cut, and
// whether after the fake acted on it. s.mu is held.
func (s *Server) cutNow(method, path string) (bool, bool) {
	c := s.cut
	if c == nil || !c.match(method, path) {
		return false, false
	}
	if c.n > 0 {
		c.n--
		return false, false
	}
	s.cut = nil
	return true, c.after
}

// SetRetryAfter makes every 429 and 503 answer carry Retry-After: v
// ("" for none), as Google's front ends may.
func (s *Server) SetRetryAfter(v string) {
	s.do(func() { s.retryAfter = v })
}

// fail writes an error answer, with the Retry-After SetRetryAfter set
// when status is 429 or 503. s.mu is held.
func (s *Server) fail(w http.ResponseWriter, status int, reason, message string) {
	if s.retryAfter != "" && (status == http.StatusTooManyRequests || status == http.StatusServiceUnavailable) {
		w.Header().Set("Retry-After", s.retryAfter)
	}
	writeError(w, status, reason, message)
}

// ClearFailures drops the failures FailNext and FailNextOperation queued
// and not yet used.
func (s *Server) ClearFailures() {
	s.do(func() { s.failNext, s.failOps = nil, nil })
}

// HoldDelete puts the instance (an ID or a name) in the middle of being
// deleted, as if someone had called delete: STOPPING, with a delete
// operation RUNNING, until release, which finishes the deletion. A
// deletion the driver starts meanwhile is held too.
func (s *Server) HoldDelete(id string) (release func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	key := s.instanceKey(id)
	s.held[key] = true
	if in, ok := s.instances[key]; ok && !in.deleting {
		s.deleteInstance(in)
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			s.mu.Lock()
			defer s.mu.Unlock()
			delete(s.held, key)
			for _, k := range slices.Clone(s.order) {
				if op := s.ops[k]; op.target == "instances/"+key && op.held {
					op.held = false
					s.finish(op)
				}
			}
		})
	}
}

// SetQuotas sets a region's quotas, as regions.get reports them.
func (s *Server) SetQuotas(region string, q []Quota) {
	s.do(func() { s.quotas[region] = q })
}

// SetUnreachable makes the aggregated list report these scopes
// unreachable (partial success).
func (s *Server) SetUnreachable(scopes ...string) {
	s.do(func() { s.unreach = scopes })
}

// SetStatus sets an instance's status as Get will report it (any string:
// a status the driver does not know too, as a later API version could
// add; answers carrying one are then not held against the discovery
// document's enum).
func (s *Server) SetStatus(id, status string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	in, ok := s.instances[s.instanceKey(id)]
	if !ok {
		return fmt.Errorf("gcptest: no instance %q", id)
	}
	if s.discovery != nil && !slices.Contains(s.discovery.Schemas["Instance"].Properties["status"].Enum, status) {
		s.futureValues = append(s.futureValues, status)
	}
	in.status = status
	in.body["status"] = status
	return nil
}

// PutInstance creates a RUNNING instance with these labels directly, as
// someone else (a human, another installation) would.
func (s *Server) PutInstance(zone, name string, labels map[string]string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	body := map[string]any{"name": name, "machineType": "zones/" + zone + "/machineTypes/e2-small", "labels": toAny(labels),
		"networkInterfaces": []any{map[string]any{"accessConfigs": []any{map[string]any{"name": "external-nat", "type": "ONE_TO_ONE_NAT"}}}}}
	in := s.newInstance(zone, name, body)
	s.boot(in)
	s.instances[zone+"/"+name] = in
}

// PutFirewall creates a firewall rule from body (name, sourceRanges,
// targetTags, description...) directly and at once, as someone else would.
func (s *Server) PutFirewall(body map[string]any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.insertFirewall(body)
	s.finishAll()
}

// PutAddress reserves a static address with these labels directly and at
// once, as someone else would.
func (s *Server) PutAddress(region, name string, labels map[string]string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.insertAddress(region, map[string]any{"name": name, "labels": toAny(labels)})
	s.finishAll()
}

// Requests returns every request served, oldest first, as
// "METHOD /path?query" with the /compute/v1/projects/<p>/ prefix cut.
func (s *Server) Requests() []string {
	return read(s, func() []string { return slices.Clone(s.requests) })
}

// LastAuthorization is the Authorization header of the last request.
func (s *Server) LastAuthorization() string {
	return read(s, func() string { return s.auth })
}

// ResetRequests forgets the requests served so far.
func (s *Server) ResetRequests() {
	s.do(func() { s.requests = nil })
}

// Instance returns the stored instance resource (JSON-like), false when
// there is none.
func (s *Server) Instance(zone, name string) (map[string]any, bool) {
	return stored(s, s.instances, zone+"/"+name, s.instanceJSON)
}

// AskSquid answers a readiness probe of addr (ip:port) as the Squid of
// the running instance with that external or internal address would: with
// the visible_hostname of the squid.conf in its metadata
// (egressproxy-squid-conf), which its startup script installs. It is a
// squid.Prober's Ask. Down makes every instance's Squid silent.
func (s *Server) AskSquid(_ context.Context, addr string) (string, error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		host = addr
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.squidDown {
		return "", fmt.Errorf("dial tcp %s: connection refused", addr)
	}
	for _, in := range s.instances {
		if in.status != "RUNNING" || in.deleting {
			continue
		}
		ips := []string{in.natIP}
		for _, n := range asList(in.body["networkInterfaces"]) {
			if m, ok := n.(map[string]any); ok {
				ip, _ := m["networkIP"].(string)
				ips = append(ips, ip)
			}
		}
		if !slices.Contains(ips, host) {
			continue
		}
		if s.probeFrom != "" && !s.admits(in.name, s.probeFrom) {
			return "", fmt.Errorf("dial tcp %s: i/o timeout", addr)
		}
		if v := metadataValue(in, "egressproxy-squid-conf"); v != "" {
			return squid.IdentityOf(v), nil
		}
		return "", fmt.Errorf("%s answers HTTP, but not as Squid", addr)
	}
	return "", fmt.Errorf("dial tcp %s: connection refused", addr)
}

// EnforceFirewall makes the readiness probe come from the address from,
// which an instance's own firewall rule (the one of its name) admits only
// when from is in its sourceRanges: a rule admitting only the clients
// keeps the provider's probe out, as on GCE. Empty turns it off.
func (s *Server) EnforceFirewall(from string) {
	s.do(func() { s.probeFrom = from })
}

// Refuses says whether EnforceFirewall keeps the provider's probe from
// addr (ip:port of an instance): a prober that dials the real guest
// Squid asks it first.
func (s *Server) Refuses(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		host = addr
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.probeFrom == "" {
		return false
	}
	for _, in := range s.instances {
		ips := []string{in.natIP}
		for _, n := range asList(in.body["networkInterfaces"]) {
			if m, ok := n.(map[string]any); ok {
				ip, _ := m["networkIP"].(string)
				ips = append(ips, ip)
			}
		}
		if slices.Contains(ips, host) {
			return !s.admits(in.name, s.probeFrom)
		}
	}
	return false
}

// admits says whether the enabled firewall rule name admits from.
func (s *Server) admits(name, from string) bool {
	f, ok := s.firewalls[name]
	if !ok || f.body["disabled"] == true {
		return false
	}
	ip, err := netip.ParseAddr(from)
	if err != nil {
		return false
	}
	for _, r := range asList(f.body["sourceRanges"]) {
		if c, _ := r.(string); c != "" {
			if p, err := netip.ParsePrefix(c); err == nil && p.Contains(ip) {
				return true
			}
		}
	}
	return false
}

// Age moves the named instance's (zone/name) creation and last start d
// into the past, as if it had run that long.
func (s *Server) Age(instance string, d time.Duration) {
	s.do(func() {
		in, ok := s.instances[instance]
		if !ok {
			return
		}
		for _, k := range []string{"creationTimestamp", "lastStartTimestamp"} {
			if v, _ := in.body[k].(string); v != "" {
				if t, err := time.Parse(time.RFC3339Nano, v); err == nil {
					in.body[k] = stamp(t.Add(-d))
				}
			}
		}
	})
}

// SetSquidDown makes every instance's Squid silent (down) or answer again.
func (s *Server) SetSquidDown(down bool) {
	s.do(func() { s.squidDown = down })
}

// Address returns the stored address, false when there is none.
func (s *Server) Address(region, name string) (map[string]any, bool) {
	return stored(s, s.addresses, region+"/"+name, func(a *address) map[string]any { return a.body })
}

// Firewall returns the stored firewall rule, false when there is none.
func (s *Server) Firewall(name string) (map[string]any, bool) {
	return stored(s, s.firewalls, name, func(f *firewall) map[string]any { return f.body })
}

// stored is a copy of the resource of the kind m holds under key, as its
// JSON (body), false when there is none.
func stored[V any](s *Server, m map[string]V, key string, body func(V) map[string]any) (map[string]any, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := m[key]
	if !ok {
		return nil, false
	}
	return clone(body(v)), true
}

// Names lists the stored instances, addresses and firewalls as
// "instance zone/name", "address region/name", "firewall name", sorted.
func (s *Server) Names() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for k := range s.instances {
		out = append(out, "instance "+k)
	}
	for k := range s.addresses {
		out = append(out, "address "+k)
	}
	for k := range s.firewalls {
		out = append(out, "firewall "+k)
	}
	slices.Sort(out)
	return out
}

// --- HTTP ---

var pathRE = regexp.MustCompile(`^/compute/v1/projects/([^/]+)/(.*)$`)

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	if s.serveIdentity(w, r) {
		return
	}
	if r.URL.Query().Get("prettyPrint") != "false" {
		// Google's APIs indent their JSON unless asked not to.
		w = indented{w}
	}
	m := pathRE.FindStringSubmatch(r.URL.Path)
	if m == nil {
		writeError(w, http.StatusNotFound, "notFound", "The requested URL "+r.URL.Path+" was not found on this server.")
		return
	}
	rest := m[2]
	var body map[string]any
	if r.Body != nil && (r.Method == http.MethodPost || r.Method == http.MethodPut || r.Method == http.MethodPatch) {
		if err := json.NewDecoder(r.Body).Decode(&body); err != nil && err.Error() != "EOF" {
			writeError(w, http.StatusBadRequest, "parseError", "Parse Error")
			return
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	line := r.Method + " " + rest
	if r.URL.RawQuery != "" {
		line += "?" + r.URL.RawQuery
	}
	s.requests = append(s.requests, line)
	s.auth = r.Header.Get("Authorization")
	if !s.authorized(r) {
		writeError(w, http.StatusUnauthorized, "authError", "Request had invalid authentication credentials. Expected OAuth 2 access token, login cookie or other valid authentication credential.")
		return
	}
	s.advance()
	if m[1] != s.Project {
		writeError(w, http.StatusForbidden, "forbidden", fmt.Sprintf("Required 'compute.instances.get' permission for 'projects/%s'", m[1]))
		return
	}
	if s.busy {
		s.fail(w, http.StatusServiceUnavailable, "backendError", "Backend Error")
		return
	}
	cutIt, cutAfter := s.cutNow(r.Method, rest)
	if cutIt && !cutAfter {
		wirefake.HangUp(w)
		return
	}
	for i, f := range s.failNext {
		if f.method == r.Method && strings.Contains(rest, f.path) {
			s.failNext = slices.Delete(s.failNext, i, i+1)
			s.fail(w, f.status, f.reason, f.message)
			return
		}
	}
	status, resp := s.route(r, strings.Split(rest, "/"), body)
	s.check(r, "projects/"+m[1]+"/"+rest, body, status, resp)
	if cutIt {
		wirefake.HangUp(w)
		return
	}
	if status >= 400 {
		e := resp.(apiErr) //nolint:forcetypeassert // route returns apiErr with error statuses.
		writeError(w, status, e.reason, e.message)
		return
	}
	writeJSON(w, status, resp)
}

type apiErr struct{ reason, message string }

func notFound(what string) (int, any) {
	return http.StatusNotFound, apiErr{"notFound", fmt.Sprintf("The resource '%s' was not found", what)}
}

func exists(what string) (int, any) {
	return http.StatusConflict, apiErr{"alreadyExists", fmt.Sprintf("The resource '%s' already exists", what)}
}

func (s *Server) route(r *http.Request, p []string, body map[string]any) (int, any) {
	q := r.URL.Query()
	switch {
	case len(p) == 3 && p[0] == "zones" && p[2] == "instances" && r.Method == http.MethodPost:
		return s.insertInstance(p[1], body)
	case len(p) == 4 && p[0] == "zones" && p[2] == "instances":
		key := p[1] + "/" + p[3]
		in, ok := s.instances[key]
		if !ok {
			return notFound(fmt.Sprintf("projects/%s/zones/%s/instances/%s", s.Project, p[1], p[3]))
		}
		switch r.Method {
		case http.MethodGet:
			return http.StatusOK, s.instanceJSON(in)
		case http.MethodDelete:
			return s.deleteInstance(in)
		case http.MethodPut:
			return s.updateInstance(in, body, q.Get("minimalAction"))
		}
	case len(p) == 5 && p[0] == "zones" && p[2] == "instances" && p[4] == "setLabels" && r.Method == http.MethodPost:
		in, ok := s.instances[p[1]+"/"+p[3]]
		if !ok {
			return notFound(fmt.Sprintf("projects/%s/zones/%s/instances/%s", s.Project, p[1], p[3]))
		}
		if body["labelFingerprint"] != in.body["labelFingerprint"] {
			return http.StatusPreconditionFailed, apiErr{"conditionNotMet", "Labels fingerprint either invalid or resource labels have changed"}
		}
		in.body["labels"] = body["labels"]
		in.body["labelFingerprint"] = fingerprint(body["labels"])
		return http.StatusOK, s.newOp("zones/"+in.zone, "compute.instance.setLabels", "instances/"+in.zone+"/"+in.name, in.body["selfLink"], in.body["id"], nil)
	case len(p) == 5 && p[0] == "zones" && p[2] == "instances" && p[4] == "getGuestAttributes" && r.Method == http.MethodGet:
		in, ok := s.instances[p[1]+"/"+p[3]]
		if !ok {
			return notFound(fmt.Sprintf("projects/%s/zones/%s/instances/%s", s.Project, p[1], p[3]))
		}
		return s.guestAttribute(in, q.Get("variableKey"))
	case len(p) == 2 && p[0] == "aggregated" && p[1] == "instances" && r.Method == http.MethodGet:
		return s.aggregated(q)
	case len(p) == 4 && p[1] != "" && p[2] == "operations" && (p[0] == "zones" || p[0] == "regions") && r.Method == http.MethodGet:
		return s.getOp(p[0] + "/" + p[1] + "/" + p[3])
	case len(p) == 3 && p[0] == "global" && p[1] == "operations" && r.Method == http.MethodGet:
		return s.getOp("global/" + p[2])
	case len(p) == 3 && p[0] == "regions" && p[2] == "addresses" && r.Method == http.MethodPost:
		return s.insertAddress(p[1], body)
	case len(p) >= 4 && p[0] == "regions" && p[2] == "addresses":
		a, ok := s.addresses[p[1]+"/"+p[3]]
		if !ok {
			return notFound(fmt.Sprintf("projects/%s/regions/%s/addresses/%s", s.Project, p[1], p[3]))
		}
		switch {
		case len(p) == 4 && r.Method == http.MethodGet:
			return http.StatusOK, a.body
		case len(p) == 4 && r.Method == http.MethodDelete:
			return s.deleteAddress(a)
		case len(p) == 5 && p[4] == "setLabels" && r.Method == http.MethodPost:
			if body["labelFingerprint"] != a.body["labelFingerprint"] {
				return http.StatusPreconditionFailed, apiErr{"conditionNotMet", "Labels fingerprint either invalid or resource labels have changed"}
			}
			a.body["labels"] = body["labels"]
			a.body["labelFingerprint"] = fingerprint(body["labels"])
			op := s.newOp("regions/"+a.region, "setLabels", "addresses/"+a.region+"/"+a.name, a.body["selfLink"], a.body["id"], nil)
			return http.StatusOK, op
		}
	case len(p) == 2 && p[0] == "global" && p[1] == "firewalls" && r.Method == http.MethodPost:
		return s.insertFirewall(body)
	case len(p) == 2 && p[0] == "global" && p[1] == "firewalls" && r.Method == http.MethodGet:
		return s.listFirewalls(q)
	case len(p) == 2 && p[0] == "aggregated" && p[1] == "addresses" && r.Method == http.MethodGet:
		return s.aggregatedAddresses(q)
	case len(p) == 3 && p[0] == "global" && p[1] == "firewalls":
		f, ok := s.firewalls[p[2]]
		if !ok {
			return notFound(fmt.Sprintf("projects/%s/global/firewalls/%s", s.Project, p[2]))
		}
		switch r.Method {
		case http.MethodGet:
			return http.StatusOK, f.body
		case http.MethodPatch:
			for k, v := range body {
				if k != "name" {
					f.body[k] = v
				}
			}
			return http.StatusOK, s.newOp("global", "patch", "firewalls/"+f.name, f.body["selfLink"], f.body["id"], nil)
		case http.MethodDelete:
			return s.deleteFirewall(f)
		}
	case len(p) == 2 && p[0] == "regions" && r.Method == http.MethodGet:
		return s.region(p[1])
	}
	return http.StatusBadRequest, apiErr{"badRequest", fmt.Sprintf("Invalid request: %s %s", r.Method, strings.Join(p, "/"))}
}

// --- instances ---

func (s *Server) link(rest string) string { return linkBase + s.Project + "/" + rest }

func (s *Server) newInstance(zone, name string, body map[string]any) *instance {
	now := stamp(time.Now())
	body = clone(body)
	body["kind"] = "compute#instance"
	body["id"] = s.id(zone + "/" + name)
	body["creationTimestamp"] = now
	body["selfLink"] = s.link("zones/" + zone + "/instances/" + name)
	body["zone"] = s.link("zones/" + zone)
	body["status"] = "PROVISIONING"
	body["fingerprint"] = fingerprint(now)
	body["labelFingerprint"] = fingerprint(body["labels"])
	body["canIpForward"] = false
	body["deletionProtection"] = false
	body["startRestricted"] = false
	body["cpuPlatform"] = "Unknown CPU Platform"
	if mt, ok := body["machineType"].(string); ok && !strings.HasPrefix(mt, "https://") {
		body["machineType"] = s.link(strings.TrimPrefix(mt, "projects/"+s.Project+"/"))
	}
	md, _ := body["metadata"].(map[string]any)
	if md == nil {
		md = map[string]any{}
	}
	md["kind"] = "compute#metadata"
	md["fingerprint"] = fingerprint(md["items"])
	body["metadata"] = md
	tags, _ := body["tags"].(map[string]any)
	if tags == nil {
		tags = map[string]any{}
	}
	tags["fingerprint"] = fingerprint(tags["items"])
	body["tags"] = tags
	body["scheduling"] = map[string]any{"automaticRestart": true, "onHostMaintenance": "MIGRATE", "preemptible": false, "provisioningModel": "STANDARD"}
	body["shieldedInstanceConfig"] = map[string]any{"enableIntegrityMonitoring": true, "enableSecureBoot": false, "enableVtpm": true}
	body["shieldedInstanceIntegrityPolicy"] = map[string]any{"updateAutoLearnPolicy": true}
	body["resourceStatus"] = map[string]any{"scheduling": map[string]any{}}
	body["satisfiesPzi"] = true
	var disks []any
	for i, d := range asList(body["disks"]) {
		dm, _ := d.(map[string]any)
		size := "10"
		if ip, ok := dm["initializeParams"].(map[string]any); ok && ip["diskSizeGb"] != nil {
			size = fmt.Sprint(ip["diskSizeGb"])
		}
		disks = append(disks, map[string]any{
			"kind": "compute#attachedDisk", "type": "PERSISTENT", "mode": "READ_WRITE",
			"source":     s.link(fmt.Sprintf("zones/%s/disks/%s", zone, name)),
			"deviceName": fmt.Sprintf("persistent-disk-%d", i), "index": i, "boot": dm["boot"] == true,
			"autoDelete": dm["autoDelete"] == true, "interface": "SCSI", "diskSizeGb": size,
			"architecture": "X86_64", "guestOsFeatures": []any{map[string]any{"type": "VIRTIO_SCSI_MULTIQUEUE"}, map[string]any{"type": "GVNIC"}},
		})
	}
	body["disks"] = disks
	var nics []any
	natIP := ""
	for i, n := range asList(body["networkInterfaces"]) {
		nm, _ := n.(map[string]any)
		nic := map[string]any{
			"kind": "compute#networkInterface", "name": fmt.Sprintf("nic%d", i), "stackType": "IPV4_ONLY",
			"network":     s.link("global/networks/default"),
			"subnetwork":  s.link("regions/" + regionOf(zone) + "/subnetworks/default"),
			"networkIP":   s.nextIP("internal"),
			"fingerprint": fingerprint(name + "nic"),
		}
		if v, ok := nm["network"].(string); ok {
			nic["network"] = s.link(strings.TrimPrefix(v, "projects/"+s.Project+"/"))
		}
		if v, ok := nm["subnetwork"].(string); ok {
			nic["subnetwork"] = s.link(strings.TrimPrefix(v, "projects/"+s.Project+"/"))
		}
		var acs []any
		for _, ac := range asList(nm["accessConfigs"]) {
			am, _ := ac.(map[string]any)
			out := map[string]any{"kind": "compute#accessConfig", "name": "external-nat", "type": "ONE_TO_ONE_NAT", "networkTier": "PREMIUM"}
			if v, ok := am["name"].(string); ok {
				out["name"] = v
			}
			if v, ok := am["natIP"].(string); ok && v != "" {
				out["natIP"] = v
				natIP = v
			}
			acs = append(acs, out)
		}
		if acs != nil {
			nic["accessConfigs"] = acs
		}
		nics = append(nics, nic)
	}
	body["networkInterfaces"] = nics
	in := &instance{body: body, zone: zone, name: name, status: "PROVISIONING", natIP: natIP}
	for _, a := range s.addresses {
		if natIP != "" && a.body["address"] == natIP {
			a.body["status"] = "IN_USE"
			a.body["users"] = []any{body["selfLink"]}
		}
	}
	return in
}

// boot makes an instance RUNNING, with an ephemeral NAT IP where its
// access config has none.
func (s *Server) boot(in *instance) {
	defer s.startSquid(in)
	in.status = "RUNNING"
	in.body["status"] = "RUNNING"
	in.body["lastStartTimestamp"] = stamp(time.Now())
	for _, n := range asList(in.body["networkInterfaces"]) {
		for _, ac := range asList(n.(map[string]any)["accessConfigs"]) { //nolint:forcetypeassert // Built by newInstance.
			am := ac.(map[string]any) //nolint:forcetypeassert // Built by newInstance.
			if am["natIP"] == nil {
				am["natIP"] = s.nextIP("ephemeral")
			}
			in.natIP, _ = am["natIP"].(string)
		}
	}
}

func (s *Server) insertInstance(zone string, body map[string]any) (int, any) {
	name, _ := body["name"].(string)
	what := fmt.Sprintf("projects/%s/zones/%s/instances/%s", s.Project, zone, name)
	if _, ok := s.instances[zone+"/"+name]; ok {
		return exists(what)
	}
	if !slices.Contains(Zones, zone) {
		return http.StatusBadRequest, apiErr{"invalid", fmt.Sprintf("Invalid value for field 'zone': '%s'. Unknown zone.", zone)}
	}
	if name == "" {
		return http.StatusBadRequest, apiErr{"required", "Required field 'resource.name' not specified"}
	}
	in := s.newInstance(zone, name, body)
	key := zone + "/" + name
	s.instances[key] = in
	fail := s.takeOpFailure("instances", "insert")
	op := s.newOp("zones/"+zone, "insert", "instances/"+key, in.body["selfLink"], in.body["id"], func() *opFailure {
		if fail != nil {
			delete(s.instances, key)
			return fail
		}
		if cur := s.instances[key]; cur == in {
			s.boot(in)
		}
		return nil
	})
	in.insertOp = op["name"].(string) //nolint:forcetypeassert // newOp sets it.
	return http.StatusOK, op
}

func (s *Server) deleteInstance(in *instance) (int, any) {
	key := in.zone + "/" + in.name
	in.status, in.deleting = "STOPPING", true
	in.body["status"] = "STOPPING"
	in.stopGuestSquid()
	fail := s.takeOpFailure("instances", "delete")
	op := s.newOp("zones/"+in.zone, "delete", "instances/"+key, in.body["selfLink"], in.body["id"], func() *opFailure {
		if fail != nil {
			in.deleting = false
			return fail
		}
		if s.instances[key] == in {
			delete(s.instances, key)
			for _, a := range s.addresses {
				if a.body["status"] == "IN_USE" && a.body["address"] == in.natIP {
					a.body["status"] = "RESERVED"
					delete(a.body, "users")
				}
			}
		}
		return nil
	})
	if s.held[key] {
		s.ops[s.opKeyOf(op)].held = true
	}
	return http.StatusOK, op
}

func (s *Server) updateInstance(in *instance, body map[string]any, minimalAction string) (int, any) {
	if body["fingerprint"] != in.body["fingerprint"] {
		return http.StatusPreconditionFailed, apiErr{"conditionNotMet", "Supplied fingerprint does not match current fingerprint."}
	}
	if md, ok := body["metadata"].(map[string]any); ok {
		cur, _ := in.body["metadata"].(map[string]any)
		if md["fingerprint"] != cur["fingerprint"] {
			return http.StatusPreconditionFailed, apiErr{"conditionNotMet", "Supplied fingerprint does not match current metadata fingerprint."}
		}
		in.body["metadata"] = map[string]any{"kind": "compute#metadata", "items": md["items"], "fingerprint": fingerprint(md["items"])}
	}
	if l, ok := body["labels"]; ok {
		in.body["labels"] = l
		in.body["labelFingerprint"] = fingerprint(l)
	}
	in.body["fingerprint"] = fingerprint(stamp(time.Now()) + in.name + fmt.Sprint(s.seq))
	key := in.zone + "/" + in.name
	restart := minimalAction == "RESTART"
	if restart {
		in.status = "STOPPING"
		in.body["status"] = "STOPPING"
		in.stopGuestSquid()
	}
	return http.StatusOK, s.newOp("zones/"+in.zone, "update", "instances/"+key, in.body["selfLink"], in.body["id"], func() *opFailure {
		if restart && s.instances[key] == in {
			s.boot(in)
		}
		return nil
	})
}

func (s *Server) instanceJSON(in *instance) map[string]any {
	return in.body
}

func (s *Server) instanceKey(id string) string {
	p := strings.Split(id, "/")
	if len(p) == 4 && p[0] == "zones" {
		return p[1] + "/" + p[3]
	}
	for k := range s.instances {
		if strings.HasSuffix(k, "/"+id) {
			return k
		}
	}
	return id
}

var filterRE = regexp.MustCompile(`labels\.([-a-z0-9_]+)\s*=\s*"?([^"\s)]*)"?`)

func (s *Server) aggregated(q map[string][]string) (int, any) {
	get := func(k string) string {
		if v := q[k]; len(v) > 0 {
			return v[0]
		}
		return ""
	}
	want := map[string]string{}
	for _, m := range filterRE.FindAllStringSubmatch(get("filter"), -1) {
		want[m[1]] = m[2]
	}
	var keys []string
	for k, in := range s.instances {
		labels, _ := in.body["labels"].(map[string]any)
		ok := true
		for lk, lv := range want {
			if labels[lk] != lv {
				ok = false
			}
		}
		if ok && !slices.Contains(s.unreach, "zones/"+in.zone) {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	start, _ := strconv.Atoi(get("pageToken"))
	max := len(keys)
	if m, err := strconv.Atoi(get("maxResults")); err == nil && m > 0 {
		max = m
	}
	end := min(len(keys), start+max)
	items := map[string]any{}
	for _, z := range Zones {
		items["zones/"+z] = map[string]any{"warning": map[string]any{
			"code": "NO_RESULTS_ON_PAGE", "message": fmt.Sprintf("No results for the scope 'zones/%s'.", z),
			"data": []any{map[string]any{"key": "scope", "value": "zones/" + z}},
		}}
	}
	for _, k := range keys[start:end] {
		in := s.instances[k]
		scope := "zones/" + in.zone
		sl, _ := items[scope].(map[string]any)
		list, _ := sl["instances"].([]any)
		items[scope] = map[string]any{"instances": append(list, in.body)}
	}
	resp := map[string]any{
		"kind":     "compute#instanceAggregatedList",
		"id":       "projects/" + s.Project + "/aggregated/instances",
		"selfLink": s.link("aggregated/instances"),
		"items":    items,
	}
	if end < len(keys) {
		resp["nextPageToken"] = strconv.Itoa(end)
	}
	if len(s.unreach) > 0 {
		resp["unreachables"] = s.unreach
	}
	return http.StatusOK, resp
}

// page is the [start, end) window of n items that the query's pageToken
// and maxResults ask for, and the next page's token ("" on the last).
func page(q map[string][]string, n int) (start, end int, next string) {
	get := func(k string) string {
		if v := q[k]; len(v) > 0 {
			return v[0]
		}
		return ""
	}
	start, _ = strconv.Atoi(get("pageToken"))
	start = min(max(start, 0), n)
	size := n
	if m, err := strconv.Atoi(get("maxResults")); err == nil && m > 0 {
		size = m
	}
	end = min(n, start+size)
	if end < n {
		next = strconv.Itoa(end)
	}
	return start, end, next
}

// listFirewalls is global/firewalls GET: every rule, by name, a page at
// a time (no filter: the driver asks for none).
func (s *Server) listFirewalls(q map[string][]string) (int, any) {
	names := slices.Sorted(maps.Keys(s.firewalls))
	start, end, next := page(q, len(names))
	items := []any{}
	for _, n := range names[start:end] {
		items = append(items, s.firewalls[n].body)
	}
	resp := map[string]any{
		"kind":     "compute#firewallList",
		"id":       "projects/" + s.Project + "/global/firewalls",
		"selfLink": s.link("global/firewalls"),
		"items":    items,
	}
	if next != "" {
		resp["nextPageToken"] = next
	}
	return http.StatusOK, resp
}

// aggregatedAddresses is aggregated/addresses GET, filtered on labels as
// aggregated/instances is.
func (s *Server) aggregatedAddresses(q map[string][]string) (int, any) {
	want := map[string]string{}
	if f := q["filter"]; len(f) > 0 {
		for _, m := range filterRE.FindAllStringSubmatch(f[0], -1) {
			want[m[1]] = m[2]
		}
	}
	var keys []string
	for k, a := range s.addresses {
		labels, _ := a.body["labels"].(map[string]any)
		ok := true
		for lk, lv := range want {
			if labels[lk] != lv {
				ok = false
			}
		}
		if ok {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	start, end, next := page(q, len(keys))
	items := map[string]any{}
	for _, k := range keys[start:end] {
		a := s.addresses[k]
		scope := "regions/" + a.region
		sl, _ := items[scope].(map[string]any)
		list, _ := sl["addresses"].([]any)
		items[scope] = map[string]any{"addresses": append(list, a.body)}
	}
	resp := map[string]any{
		"kind":     "compute#addressAggregatedList",
		"id":       "projects/" + s.Project + "/aggregated/addresses",
		"selfLink": s.link("aggregated/addresses"),
		"items":    items,
	}
	if next != "" {
		resp["nextPageToken"] = next
	}
	return http.StatusOK, resp
}

// --- addresses ---

func (s *Server) insertAddress(region string, body map[string]any) (int, any) {
	name, _ := body["name"].(string)
	key := region + "/" + name
	if _, ok := s.addresses[key]; ok {
		return exists(fmt.Sprintf("projects/%s/regions/%s/addresses/%s", s.Project, region, name))
	}
	b := clone(body)
	b["kind"] = "compute#address"
	b["id"] = s.id("address/" + key)
	b["creationTimestamp"] = stamp(time.Now())
	b["selfLink"] = s.link("regions/" + region + "/addresses/" + name)
	b["region"] = s.link("regions/" + region)
	b["status"] = "RESERVING"
	b["networkTier"] = "PREMIUM"
	b["labelFingerprint"] = fingerprint(b["labels"])
	if b["description"] == nil {
		b["description"] = ""
	}
	if b["addressType"] == nil {
		b["addressType"] = "EXTERNAL"
	}
	a := &address{body: b, region: region, name: name}
	s.addresses[key] = a
	fail := s.takeOpFailure("addresses", "insert")
	return http.StatusOK, s.newOp("regions/"+region, "insert", "addresses/"+key, b["selfLink"], b["id"], func() *opFailure {
		if fail != nil {
			delete(s.addresses, key)
			return fail
		}
		b["status"] = "RESERVED"
		b["address"] = s.nextIP("static")
		return nil
	})
}

func (s *Server) deleteAddress(a *address) (int, any) {
	key := a.region + "/" + a.name
	for _, in := range s.instances {
		if in.natIP != "" && in.natIP == a.body["address"] {
			// Recorded as RESOURCE_IN_USE_BY_ANOTHER_RESOURCE on a
			// finished operation.
			return http.StatusOK, s.newOp("regions/"+a.region, "delete", "addresses/"+key, a.body["selfLink"], a.body["id"], func() *opFailure {
				return &opFailure{code: "RESOURCE_IN_USE_BY_ANOTHER_RESOURCE", message: fmt.Sprintf("The address resource 'projects/%s/regions/%s/addresses/%s' is already being used by 'projects/%s/zones/%s/instances/%s'", s.Project, a.region, a.name, s.Project, in.zone, in.name), httpStatus: 400, httpMsg: "BAD REQUEST"}
			})
		}
	}
	return http.StatusOK, s.newOp("regions/"+a.region, "delete", "addresses/"+key, a.body["selfLink"], a.body["id"], func() *opFailure {
		delete(s.addresses, key)
		return nil
	})
}

// --- firewalls ---

func (s *Server) insertFirewall(body map[string]any) (int, any) {
	name, _ := body["name"].(string)
	if _, ok := s.firewalls[name]; ok {
		return exists(fmt.Sprintf("projects/%s/global/firewalls/%s", s.Project, name))
	}
	b := clone(body)
	b["kind"] = "compute#firewall"
	b["id"] = s.id("firewall/" + name)
	b["creationTimestamp"] = stamp(time.Now())
	b["selfLink"] = s.link("global/firewalls/" + name)
	if v, ok := b["network"].(string); ok {
		b["network"] = s.link(strings.TrimPrefix(v, "projects/"+s.Project+"/"))
	}
	defaults := map[string]any{"direction": "INGRESS", "priority": 1000, "description": "", "disabled": false, "sourceRanges": []any{"0.0.0.0/0"}, "logConfig": map[string]any{"enable": false}}
	for k, v := range defaults {
		if b[k] == nil {
			b[k] = v
		}
	}
	f := &firewall{body: b, name: name}
	s.firewalls[name] = f
	fail := s.takeOpFailure("firewalls", "insert")
	return http.StatusOK, s.newOp("global", "insert", "firewalls/"+name, b["selfLink"], b["id"], func() *opFailure {
		if fail != nil {
			delete(s.firewalls, name)
			return fail
		}
		return nil
	})
}

func (s *Server) deleteFirewall(f *firewall) (int, any) {
	return http.StatusOK, s.newOp("global", "delete", "firewalls/"+f.name, f.body["selfLink"], f.body["id"], func() *opFailure {
		if s.firewalls[f.name] == f {
			delete(s.firewalls, f.name)
		}
		return nil
	})
}

func (s *Server) region(name string) (int, any) {
	if !slices.ContainsFunc(Zones, func(z string) bool { return regionOf(z) == name }) {
		return notFound(fmt.Sprintf("projects/%s/regions/%s", s.Project, name))
	}
	q := s.quotas[name]
	if q == nil {
		q = []Quota{{"CPUS", 24, 0}, {"INSTANCES", 6000, 0}, {"IN_USE_ADDRESSES", 8, 0}, {"STATIC_ADDRESSES", 8, 0}}
	}
	var zones []any
	for _, z := range Zones {
		if regionOf(z) == name {
			zones = append(zones, s.link("zones/"+z))
		}
	}
	var quotas []any
	for _, x := range q {
		quotas = append(quotas, map[string]any{"metric": x.Metric, "limit": x.Limit, "usage": x.Usage})
	}
	return http.StatusOK, map[string]any{
		"kind": "compute#region", "id": s.id("region/" + name), "name": name, "description": name,
		"creationTimestamp": "1969-12-31T16:00:00.000-08:00", "status": "UP",
		"selfLink": s.link("regions/" + name), "zones": zones, "quotas": quotas, "supportsPzs": false,
	}
}

// --- operations ---

func (s *Server) opKeyOf(op map[string]any) string {
	return op["x-key"].(string) //nolint:forcetypeassert // newOp sets it.
}

// newOp starts an operation on target; finish runs when it ends.
func (s *Server) newOp(scope, opType, target string, targetLink, targetID any, finish func() *opFailure) map[string]any {
	s.seq++
	now := time.Now()
	name := fmt.Sprintf("operation-%d-%016x-%08x", now.UnixMilli(), s.seq*0x9e3779b97f4a7c15, s.seq)
	body := map[string]any{
		"kind":          "compute#operation",
		"id":            s.id("op/" + name),
		"name":          name,
		"operationType": opType,
		"progress":      0,
		"selfLink":      s.link(scope + "/operations/" + name),
		"startTime":     stamp(now),
		"insertTime":    stamp(now),
		"status":        "RUNNING",
		"targetId":      targetID,
		"targetLink":    targetLink,
		"user":          "egressproxy-test@" + s.Project + ".iam.gserviceaccount.com",
	}
	switch {
	case strings.HasPrefix(scope, "zones/"):
		body["zone"] = s.link(scope)
	case strings.HasPrefix(scope, "regions/"):
		body["region"] = s.link(scope)
	}
	if finish == nil {
		finish = func() *opFailure { return nil }
	}
	key := scope + "/" + name
	s.ops[key] = &operation{key: key, body: body, scope: scope, started: now, finish: finish, target: target}
	s.order = append(s.order, key)
	out := clone(body)
	out["x-key"] = key
	return out
}

func (s *Server) getOp(key string) (int, any) {
	op, ok := s.ops[key]
	if !ok {
		p := strings.Split(key, "/")
		return notFound(fmt.Sprintf("projects/%s/%s/operations/%s", s.Project, strings.Join(p[:len(p)-1], "/"), p[len(p)-1]))
	}
	return http.StatusOK, op.body
}

// advance finishes operations past AutoComplete, and reports progress on
// the others. Called with mu held.
func (s *Server) advance() {
	if s.auto <= 0 {
		return
	}
	now := time.Now()
	for _, k := range slices.Clone(s.order) {
		op := s.ops[k]
		if op == nil || op.done || op.held {
			continue
		}
		if el := now.Sub(op.started); el >= s.auto {
			s.finish(op)
		} else {
			op.body["progress"] = int(100 * el / s.auto)
		}
	}
}

// finish ends op, applying its effect. Called with mu held.
func (s *Server) finish(op *operation) {
	op.done = true
	f := op.finish()
	op.body["status"] = "DONE"
	op.body["progress"] = 100
	op.body["endTime"] = stamp(time.Now())
	if f != nil {
		op.body["error"] = map[string]any{"errors": []any{map[string]any{"code": f.code, "message": f.message}}}
		if f.httpStatus != 0 {
			op.body["httpErrorStatusCode"] = f.httpStatus
			op.body["httpErrorMessage"] = f.httpMsg
		}
	}
}

func (s *Server) takeOpFailure(resource, opType string) *opFailure {
	for i, f := range s.failOps {
		if f.opType == opType && f.resource == resource {
			s.failOps = slices.Delete(s.failOps, i, i+1)
			return &f
		}
	}
	return nil
}

// --- helpers ---

// nextIP hands out loopback addresses: ephemeral NAT IPs in 127.0.1.0/24,
// static ones in 127.0.2.0/24, internal ones in 127.0.3.0/24.
func (s *Server) nextIP(kind string) string {
	s.lastIP[kind]++
	n := s.lastIP[kind]%250 + 1
	third := map[string]int{"ephemeral": 1, "static": 2, "internal": 3}[kind]
	return fmt.Sprintf("127.0.%d.%d", third, n)
}

// id is a stable numeric ID, as a string (uint64 on the wire is a string).
func (s *Server) id(key string) string {
	h := fnv.New64a()
	_, _ = h.Write([]byte(s.Project + "/" + key))
	return strconv.FormatUint(h.Sum64()>>1, 10)
}

// fingerprint has the shape of GCE's: base64 of 8 bytes ("abcdef0123A=").
func fingerprint(v any) string {
	b, _ := json.Marshal(v)
	h := fnv.New64a()
	_, _ = h.Write(b)
	return base64.StdEncoding.EncodeToString(h.Sum(nil))
}

func stamp(t time.Time) string { return t.Format("2006-01-02T15:04:05.000-07:00") }

// onTheWire is v as the fake sends it: without its own bookkeeping.
func onTheWire(v any) any {
	if m, ok := v.(map[string]any); ok {
		if _, internal := m["x-key"]; internal {
			m = maps.Clone(m)
			delete(m, "x-key")
			return m
		}
	}
	return v
}

// indented writes each JSON body it is given indented, as Google's APIs
// answer without prettyPrint=false (writeJSON writes a body at once).
type indented struct{ http.ResponseWriter }

func (w indented) Write(b []byte) (int, error) {
	var buf bytes.Buffer
	if err := json.Indent(&buf, b, "", "  "); err != nil {
		return w.ResponseWriter.Write(b)
	}
	if _, err := w.ResponseWriter.Write(buf.Bytes()); err != nil {
		return 0, err
	}
	return len(b), nil
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	v = onTheWire(v)
	w.Header().Set("Content-Type", "application/json; charset=UTF-8")
	w.Header().Set("Server", "ESF")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// writeError writes the error body of the recorded 404s:
// {"error": {"code", "message", "errors": [{"domain", "message", "reason"}]}}.
func writeError(w http.ResponseWriter, status int, reason, message string) {
	domain := "global"
	if reason == "quotaExceeded" || reason == "rateLimitExceeded" {
		domain = "usageLimits"
	}
	writeJSON(w, status, map[string]any{"error": map[string]any{
		"code":    status,
		"message": message,
		"errors":  []any{map[string]any{"domain": domain, "message": message, "reason": reason}},
	}})
}

func asList(v any) []any {
	l, _ := v.([]any)
	return l
}

func toAny(m map[string]string) map[string]any {
	out := map[string]any{}
	for k, v := range m {
		out[k] = v
	}
	return out
}

// clone deep-copies JSON-like values.
func clone(m map[string]any) map[string]any {
	b, _ := json.Marshal(m)
	var out map[string]any
	_ = json.Unmarshal(b, &out)
	return out
}

func regionOf(zone string) string {
	if i := strings.LastIndex(zone, "-"); i > 0 {
		return zone[:i]
	}
	return zone
}

func lastSegment(s string) string {
	if i := strings.LastIndex(s, "/"); i >= 0 {
		return s[i+1:]
	}
	return s
}

// Exchange is one request and its answer from a recorded .http.log (the
// format of shared/data/gcp): "METHOD URL", headers, an optional JSON
// body, then "STATUS TEXT", headers and the JSON answer; entries are
// separated by "---" lines.
type Exchange struct {
	Method, URL  string
	RequestBody  string
	Status       int
	ResponseBody string
}

// ParseHTTPLog reads a recorded .http.log.
func ParseHTTPLog(text string) []Exchange {
	var out []Exchange
	for _, entry := range strings.Split(text, "\n---\n") {
		lines := strings.Split(strings.Trim(entry, "\n"), "\n")
		if len(lines) == 0 {
			continue
		}
		method, url, ok := strings.Cut(lines[0], " ")
		if !ok {
			continue
		}
		ex := Exchange{Method: method, URL: url}
		statusAt := -1
		for i := 1; i < len(lines); i++ {
			if len(lines[i]) > 4 && lines[i][3] == ' ' {
				if n, err := strconv.Atoi(lines[i][:3]); err == nil && n >= 100 {
					ex.Status, statusAt = n, i
					break
				}
			}
		}
		if statusAt < 0 {
			continue
		}
		ex.RequestBody = bodyAfterHeaders(lines[1:statusAt])
		ex.ResponseBody = bodyAfterHeaders(lines[statusAt+1:])
		out = append(out, ex)
	}
	return out
}

// bodyAfterHeaders is what follows the first blank line.
func bodyAfterHeaders(lines []string) string {
	for i, l := range lines {
		if strings.TrimSpace(l) == "" {
			return strings.TrimSpace(strings.Join(lines[i+1:], "\n"))
		}
	}
	return ""
}

// do runs fn under the server's lock (a test control's change).
func (s *Server) do(fn func()) { wirefake.Do(&s.mu, fn) }

// read returns what fn reads under the server's lock.
func read[T any](s *Server, fn func() T) T { return wirefake.Read(&s.mu, fn) }

// RunSquid makes every instance that boots from now on run a real Squid
// (bin) on its external address (its internal one without), from the
// squid.conf and htpasswd of its metadata, as its startup script
// installs them (squidtest.StartGuest): requests through its proxy then
// really go out. A Squid that cannot start leaves the address silent.
func (s *Server) RunSquid(bin string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.squidBin = bin
}

// startSquid starts in's real Squid, with s.mu held.
func (s *Server) startSquid(in *instance) {
	in.stopGuestSquid()
	if s.squidBin == "" {
		return
	}
	f := squid.Files{SquidConf: metadataValue(in, "egressproxy-squid-conf"), Htpasswd: metadataValue(in, "egressproxy-htpasswd"),
		TLSCert: metadataValue(in, "egressproxy-tls-crt"), TLSKey: metadataValue(in, "egressproxy-tls-key")}
	ip := in.natIP
	if ip == "" {
		for _, n := range asList(in.body["networkInterfaces"]) {
			if m, ok := n.(map[string]any); ok && ip == "" {
				ip, _ = m["networkIP"].(string)
			}
		}
	}
	port := 0
	for _, l := range strings.Split(f.SquidConf, "\n") {
		// The first listener is the proxy's (a second one is its loopback
		// listener for the check from inside).
		if f := strings.Fields(l); len(f) >= 2 && (f[0] == "http_port" || f[0] == "https_port") {
			port, _ = strconv.Atoi(f[1])
			break
		}
	}
	if ip == "" || port == 0 {
		return
	}
	stop, err := squidtest.StartGuest(s.squidBin, ip, port, f)
	if err != nil {
		return
	}
	in.stopSquid = stop
	req := cloudinit.EgressRequestOf(metadataValue(in, "user-data"))
	if req == "" || metadataValue(in, "enable-guest-attributes") != "TRUE" {
		return
	}
	// The guest's own egress check (its cloud-init's timer), in the
	// background: its line becomes the guest attribute, as the guest's
	// script puts it.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	go func() {
		line, _ := squidtest.RunReport(ctx, req, ip, squidtest.ReportPortOf(f.SquidConf, port))
		if line == "" {
			return
		}
		s.do(func() {
			// Stopped meanwhile (under the same lock): the guest is gone.
			if ctx.Err() != nil && !errors.Is(context.Cause(ctx), context.DeadlineExceeded) {
				return
			}
			if in.guestAttrs == nil {
				in.guestAttrs = map[string]string{}
			}
			in.guestAttrs[cloudinit.GuestAttributeKey] = line
		})
	}()
	in.stopSquid = func() { cancel(); stop() }
}

// guestAttribute answers getGuestAttributes of one key, as Compute
// Engine does: the key and its value, or 404 when the guest wrote none
// (guest attributes off, or not written yet).
func (s *Server) guestAttribute(in *instance, key string) (int, any) {
	v, ok := in.guestAttrs[key]
	if key == "" || !ok {
		return notFound(fmt.Sprintf("projects/%s/zones/%s/instances/%s/guestAttributes/%s", s.Project, in.zone, in.name, key))
	}
	return http.StatusOK, map[string]any{
		"kind":          "compute#guestAttributes",
		"selfLink":      s.link("zones/"+in.zone+"/instances/"+in.name) + "/getGuestAttributes?variableKey=" + key,
		"variableKey":   key,
		"variableValue": v,
	}
}

// SetGuestAttribute writes a guest attribute of the named instance
// (zone/name), as a guest may: what a tenant's guest says.
func (s *Server) SetGuestAttribute(instance, key, value string) {
	s.do(func() {
		if in, ok := s.instances[instance]; ok {
			if in.guestAttrs == nil {
				in.guestAttrs = map[string]string{}
			}
			in.guestAttrs[key] = value
		}
	})
}

func (in *instance) stopGuestSquid() {
	if in.stopSquid != nil {
		in.stopSquid()
		in.stopSquid = nil
	}
}

// metadataValue is the value of in's metadata item key, "" when none.
func metadataValue(in *instance, key string) string {
	md, _ := in.body["metadata"].(map[string]any)
	for _, it := range asList(md["items"]) {
		if m, ok := it.(map[string]any); ok && m["key"] == key {
			v, _ := m["value"].(string)
			return v
		}
	}
	return ""
}
