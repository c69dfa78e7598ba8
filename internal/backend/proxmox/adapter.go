package proxmox

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime/multipart"
	"net"
	"net/http"
	"net/textproto"
	"net/url"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"

	"github.com/egressproxy/provider-egressproxy/internal/netguard"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
	"github.com/egressproxy/provider-egressproxy/internal/telemetry"
)

// Credentials are what a request authenticates and verifies the server
// with. The driver asks for them on every request, so a rotated token or
// CA applies to the next request.
type Credentials struct {
	// Token is a PVE API token, user@realm!tokenid=secret. Secret: it
	// appears in no log, error or span.
	Token string
	// CA is an optional PEM bundle the server's certificate must chain to;
	// without it the system roots are used.
	CA []byte
}

// CredentialsFunc returns the credentials for one request.
type CredentialsFunc func(ctx context.Context) (Credentials, error)

// tokenRe is the API token syntax; the secret is the part after "=".
var tokenRe = regexp.MustCompile(`^([A-Za-z0-9._-]+@[A-Za-z0-9._-]+)!([A-Za-z][A-Za-z0-9._-]*)=(\S+)$`)

// secretOnlyRe is a token's secret alone (a UUID), which the Proxmox VE
// UI shows apart from the token's ID.
var secretOnlyRe = regexp.MustCompile(`^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$`)

// normalToken is token as the Authorization header takes it: without
// surrounding space, and without the header's own PVEAPIToken= prefix,
// which a token copied from a curl example carries.
func normalToken(token string) string {
	return strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(token), "PVEAPIToken="))
}

// TokenID returns the user@realm!tokenid part of a token (not secret),
// or an error that says what is wrong without quoting the token.
func TokenID(token string) (string, error) {
	t := normalToken(token)
	m := tokenRe.FindStringSubmatch(t)
	switch {
	case m != nil:
		return m[1] + "!" + m[2], nil
	case secretOnlyRe.MatchString(t):
		return "", proxy.Permanentf("the API token holds only the token's secret: want user@realm!tokenid=secret, the token's ID, '=' and the secret (the Secret's value is not shown)")
	default:
		return "", proxy.Permanentf("the API token is malformed: want user@realm!tokenid=secret (the Secret's value is not shown)")
	}
}

// Client is the production API: a thin net/http client of the Proxmox VE
// REST API. It holds no credentials; it asks for them on every request.
type Client struct {
	base       *url.URL
	creds      CredentialsFunc
	insecure   bool
	timeout    time.Duration
	transports *Transports
	// guard dials a tenant's API (nil: the platform's); with one, errors
	// never quote what the API answered.
	guard *netguard.Guard
	// wire is the logger of the wire tier (telemetry.Wire); nil: none.
	wire func(context.Context) logr.Logger
}

var _ API = (*Client)(nil)

// NewClient returns a client of the API at baseURL (https://host:8006).
// timeout bounds each request; transports pools connections (nil: a
// private pool).
func NewClient(baseURL string, creds CredentialsFunc, insecureSkipTLSVerify bool, timeout time.Duration, transports *Transports) (*Client, error) {
	u, err := url.Parse(strings.TrimSuffix(baseURL, "/"))
	// Never quoted: user info or a query may carry a password or token.
	if err != nil || u.Scheme != "https" || u.Host == "" || u.User != nil || u.RawQuery != "" || u.ForceQuery || u.Fragment != "" || (u.Path != "" && u.Path != "/") {
		return nil, proxy.Permanentf("proxmox.url is not an https://host[:port] URL: it must have no path, user info, query or fragment (the token goes in credentials.tokenSecretRef)")
	}
	if timeout <= 0 {
		timeout = 30 * time.Second
	}
	if transports == nil {
		transports = &Transports{}
	}
	return &Client{base: u, creds: creds, insecure: insecureSkipTLSVerify, timeout: timeout, transports: transports}, nil
}

// Transports pools HTTP transports by the TLS settings they were built
// from (the CA's digest and the insecure flag) and the guard they dial
// through, so connections are reused
// across reconciles and a rotated CA gets a fresh transport at once. It is
// safe for concurrent use; the zero value is ready.
type Transports struct {
	mu   sync.Mutex
	m    map[string]*http.Transport
	keys []string // oldest first, for eviction
	used map[string]time.Time
	// now is the clock (tests); time.Now when nil.
	now func() time.Time
}

// maxTransports bounds the pool: one per distinct CA in use, plus rotations.
const maxTransports = 16

// transportIdle is how long an unused transport is kept: the configs that
// used it are gone, or their CA was rotated.
const transportIdle = 10 * time.Minute

func (p *Transports) get(ca []byte, insecure bool, guard *netguard.Guard) (*http.Transport, error) {
	sum := sha256.Sum256(ca)
	key := hex.EncodeToString(sum[:]) + strconv.FormatBool(insecure) + fmt.Sprintf("%p", guard)
	p.mu.Lock()
	defer p.mu.Unlock()
	now := time.Now
	if p.now != nil {
		now = p.now
	}
	if p.used == nil {
		p.used = map[string]time.Time{}
	}
	for _, k := range slices.Clone(p.keys) {
		if k != key && now().Sub(p.used[k]) > transportIdle {
			p.evict(k)
		}
	}
	if t, ok := p.m[key]; ok {
		p.used[key] = now()
		return t, nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: insecure} //nolint:gosec // Only when the config asks for it; the health check warns.
	if len(ca) > 0 {
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(ca) {
			return nil, &proxy.Error{Class: proxy.ClassPermanent, Reason: ReasonCertificateInvalid, Err: errors.New("the CA Secret holds no PEM certificate")}
		}
		cfg.RootCAs = pool
	}
	dialer := &net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}
	// Through the environment's proxy (HTTPS_PROXY, NO_PROXY), as the
	// Kubernetes and Google clients go; a guard checks a tenant's target
	// before it is handed to the proxy (netguard.Guard.Transport).
	t := guard.Transport(&http.Transport{
		DialContext:         dialer.DialContext,
		TLSClientConfig:     cfg,
		TLSHandshakeTimeout: 10 * time.Second,
		MaxIdleConnsPerHost: 4,
		IdleConnTimeout:     90 * time.Second,
		// pveproxy speaks HTTP/1.1.
		TLSNextProto: map[string]func(string, *tls.Conn) http.RoundTripper{},
	})
	if p.m == nil {
		p.m = map[string]*http.Transport{}
	}
	// Noted only once pooled: eviction walks keys, so a refused CA's
	// entry would stay for ever.
	p.m[key] = t
	p.used[key] = now()
	p.keys = append(p.keys, key)
	if len(p.keys) > maxTransports {
		p.evict(p.keys[0])
	}
	return t, nil
}

// evict closes and forgets the transport of key; p.mu held.
func (p *Transports) evict(key string) {
	if t, ok := p.m[key]; ok {
		t.CloseIdleConnections()
	}
	delete(p.m, key)
	delete(p.used, key)
	p.keys = slices.DeleteFunc(p.keys, func(k string) bool { return k == key })
}

// size is how many transports are pooled (for tests).
func (p *Transports) size() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.m)
}

// request is one API call.
type request struct {
	method string
	// path below /api2/json, its segments already escaped.
	path  string
	query url.Values
	form  url.Values
	// multipart body, for uploads.
	body        []byte
	contentType string
}

func seg(s string) string { return url.PathEscape(s) }

func vmPath(node string, vmid int, rest string) string {
	return "/nodes/" + seg(node) + "/qemu/" + strconv.Itoa(vmid) + rest
}

// do sends r and decodes the answer's data into out (nil to ignore it).
func (c *Client) do(ctx context.Context, r request, out any) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	creds, err := c.creds(ctx)
	if err != nil {
		return err
	}
	if _, err := TokenID(creds.Token); err != nil {
		return err
	}
	tr, err := c.transports.get(creds.CA, c.insecure, c.guard)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()

	u := *c.base
	u.Path = strings.TrimSuffix(c.base.Path, "/") + "/api2/json"
	raw, _ := url.PathUnescape(r.path)
	u.Path += raw
	u.RawPath = strings.TrimSuffix(c.base.EscapedPath(), "/") + "/api2/json" + r.path
	if len(r.query) > 0 {
		u.RawQuery = r.query.Encode()
	}
	var body io.Reader
	ct := ""
	switch {
	case r.body != nil:
		body, ct = bytes.NewReader(r.body), r.contentType
	case r.form != nil:
		body, ct = strings.NewReader(r.form.Encode()), "application/x-www-form-urlencoded"
	}
	req, err := http.NewRequestWithContext(ctx, r.method, u.String(), body)
	if err != nil {
		return err
	}
	if ct != "" {
		req.Header.Set("Content-Type", ct)
	}
	req.Header.Set("Accept", "application/json")
	req.Header.Set("Authorization", "PVEAPIToken="+normalToken(creds.Token))
	var rt http.RoundTripper = tr
	if c.wire != nil {
		rt = telemetry.Wire("proxmox", c.wire, tr)
	}
	hc := &http.Client{Transport: rt}
	if c.guard != nil {
		// Proxmox does not redirect: a tenant's API that does is not
		// followed, so nothing connects to where it led.
		hc.CheckRedirect = c.guard.NoRedirects
	}
	resp, err := hc.Do(req)
	if err != nil {
		return transportError(r, err, c.guard != nil)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 32<<20))
	if err != nil {
		return transportError(r, err, c.guard != nil)
	}
	var env struct {
		Data    json.RawMessage   `json:"data"`
		Message string            `json:"message"`
		Errors  map[string]string `json:"errors"`
	}
	_ = json.Unmarshal(b, &env)
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		// pveproxy puts the error's text in the reason phrase; newer
		// versions repeat it as "message".
		msg := strings.TrimSpace(strings.TrimPrefix(resp.Status, strconv.Itoa(resp.StatusCode)))
		if env.Message != "" {
			msg = strings.TrimSpace(env.Message)
		}
		return &APIError{Method: r.method, Path: raw, Status: resp.StatusCode, Message: msg, Errors: env.Errors, Quiet: c.guard != nil,
			RetryAfter: proxy.ParseRetryAfter(resp.Header, time.Now())}
	}
	if out == nil || len(env.Data) == 0 || string(env.Data) == "null" {
		return nil
	}
	if err := json.Unmarshal(env.Data, out); err != nil {
		if c.guard != nil {
			return fmt.Errorf("%s %s: %s", r.method, raw, quietAnswer)
		}
		return fmt.Errorf("%s %s: cannot decode the answer: %w", r.method, raw, err)
	}
	return nil
}

// quietAnswer stands for what a tenant's API answered: the answer of an
// endpoint a namespaced config chose is never quoted (it could be a
// service the tenant cannot reach itself).
const quietAnswer = "what proxmox.url answered is not shown to tenants"

// transportError keeps the request's method and path (never its headers)
// and the cause, so classify can find TLS and network failures. quiet
// (a tenant's API) leaves out what the server said (netguard.Quiet).
func transportError(r request, err error, quiet bool) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	p, _ := url.PathUnescape(r.path)
	if quiet {
		err = netguard.Quiet(err, "proxmox.url")
	}
	return &callError{what: r.method + " " + p, err: err}
}

type callError struct {
	what string
	err  error
}

func (e *callError) Error() string { return e.what + ": " + e.err.Error() }
func (e *callError) Unwrap() error { return e.err }

// APIError is an answer of the API that is not a success.
type APIError struct {
	Method, Path string
	Status       int
	// Message is the server's error text.
	Message string
	// Errors are per-parameter errors of a 400.
	Errors map[string]string
	// RetryAfter is the answer's Retry-After (a 429 or 503 of a proxy in
	// front of pveproxy); 0 without one.
	RetryAfter time.Duration
	// Quiet: the API is a tenant's; Error leaves Message and Errors out.
	Quiet bool
}

// Error is the method, path, status and the server's text (never a
// header or a body that was sent).
func (e *APIError) Error() string {
	if e.Quiet {
		return fmt.Sprintf("%s %s: %d (%s)", e.Method, e.Path, e.Status, quietAnswer)
	}
	s := fmt.Sprintf("%s %s: %d %s", e.Method, e.Path, e.Status, e.Message)
	if len(e.Errors) > 0 {
		keys := make([]string, 0, len(e.Errors))
		for k := range e.Errors {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		parts := make([]string, 0, len(keys))
		for _, k := range keys {
			parts = append(parts, k+": "+e.Errors[k])
		}
		s += " (" + strings.Join(parts, "; ") + ")"
	}
	return s
}

// --- the endpoints ---

// Version implements API.
func (c *Client) Version(ctx context.Context) (Version, error) {
	var v Version
	return v, c.do(ctx, request{method: http.MethodGet, path: "/version"}, &v)
}

// Resources implements API.
func (c *Client) Resources(ctx context.Context, typ string) ([]Resource, error) {
	var out []Resource
	q := url.Values{}
	if typ != "" {
		q.Set("type", typ)
	}
	return out, c.do(ctx, request{method: http.MethodGet, path: "/cluster/resources", query: q}, &out)
}

// NodeStatus implements API.
func (c *Client) NodeStatus(ctx context.Context, node string) (NodeStatus, error) {
	var s NodeStatus
	return s, c.do(ctx, request{method: http.MethodGet, path: "/nodes/" + seg(node) + "/status"}, &s)
}

// NodeNetwork implements API.
func (c *Client) NodeNetwork(ctx context.Context, node string) ([]NodeInterface, error) {
	var out []NodeInterface
	return out, c.do(ctx, request{method: http.MethodGet, path: "/nodes/" + seg(node) + "/network"}, &out)
}

// StorageStatus implements API.
func (c *Client) StorageStatus(ctx context.Context, node, storage string) (StorageStatus, error) {
	var s StorageStatus
	return s, c.do(ctx, request{method: http.MethodGet, path: "/nodes/" + seg(node) + "/storage/" + seg(storage) + "/status"}, &s)
}

// ISOs implements API.
func (c *Client) ISOs(ctx context.Context, node, storage string) ([]Volume, error) {
	var out []Volume
	return out, c.do(ctx, request{method: http.MethodGet, path: "/nodes/" + seg(node) + "/storage/" + seg(storage) + "/content",
		query: url.Values{"content": {"iso"}}}, &out)
}

// Upload implements API.
func (c *Client) Upload(ctx context.Context, node, storage, filename string, data []byte) (string, error) {
	var buf bytes.Buffer
	w := multipart.NewWriter(&buf)
	sum := sha256.Sum256(data)
	for _, f := range [][2]string{{"content", "iso"}, {"checksum-algorithm", "sha256"}, {"checksum", hex.EncodeToString(sum[:])}} {
		if err := w.WriteField(f[0], f[1]); err != nil {
			return "", err
		}
	}
	h := textproto.MIMEHeader{}
	h.Set("Content-Disposition", fmt.Sprintf(`form-data; name="filename"; filename=%q`, filename))
	h.Set("Content-Type", "application/octet-stream")
	part, err := w.CreatePart(h)
	if err != nil {
		return "", err
	}
	if _, err := part.Write(data); err != nil {
		return "", err
	}
	if err := w.Close(); err != nil {
		return "", err
	}
	var upid string
	return upid, c.do(ctx, request{method: http.MethodPost, path: "/nodes/" + seg(node) + "/storage/" + seg(storage) + "/upload",
		body: buf.Bytes(), contentType: w.FormDataContentType()}, &upid)
}

// DeleteVolume implements API.
func (c *Client) DeleteVolume(ctx context.Context, node, volid string) (string, error) {
	storage, _, _ := strings.Cut(volid, ":")
	var upid string
	return upid, c.do(ctx, request{method: http.MethodDelete, path: "/nodes/" + seg(node) + "/storage/" + seg(storage) + "/content/" + seg(volid)}, &upid)
}

// VMConfig implements API.
func (c *Client) VMConfig(ctx context.Context, node string, vmid int) (VMConfig, error) {
	var cfg VMConfig
	return cfg, c.do(ctx, request{method: http.MethodGet, path: vmPath(node, vmid, "/config")}, &cfg)
}

// SetVMConfig implements API.
func (c *Client) SetVMConfig(ctx context.Context, node string, vmid int, u ConfigUpdate) error {
	form := url.Values{}
	for k, v := range u.Set {
		form.Set(k, v)
	}
	if len(u.Delete) > 0 {
		form.Set("delete", strings.Join(u.Delete, ","))
	}
	if u.Digest != "" {
		form.Set("digest", u.Digest)
	}
	return c.do(ctx, request{method: http.MethodPut, path: vmPath(node, vmid, "/config"), form: form}, nil)
}

// Clone implements API.
func (c *Client) Clone(ctx context.Context, node string, vmid int, p CloneParams) (string, error) {
	form := url.Values{"newid": {strconv.Itoa(p.NewID)}}
	if p.Name != "" {
		form.Set("name", p.Name)
	}
	if p.Description != "" {
		form.Set("description", p.Description)
	}
	if p.Target != "" {
		form.Set("target", p.Target)
	}
	if p.Full {
		form.Set("full", "1")
	}
	var upid string
	return upid, c.do(ctx, request{method: http.MethodPost, path: vmPath(node, vmid, "/clone"), form: form}, &upid)
}

// Resize implements API.
func (c *Client) Resize(ctx context.Context, node string, vmid int, disk, size string) (string, error) {
	var upid string
	return upid, c.do(ctx, request{method: http.MethodPut, path: vmPath(node, vmid, "/resize"),
		form: url.Values{"disk": {disk}, "size": {size}}}, &upid)
}

func (c *Client) post(ctx context.Context, path string) (string, error) {
	var upid string
	return upid, c.do(ctx, request{method: http.MethodPost, path: path, form: url.Values{}}, &upid)
}

// Start implements API.
func (c *Client) Start(ctx context.Context, node string, vmid int) (string, error) {
	return c.post(ctx, vmPath(node, vmid, "/status/start"))
}

// Stop implements API.
func (c *Client) Stop(ctx context.Context, node string, vmid int) (string, error) {
	return c.post(ctx, vmPath(node, vmid, "/status/stop"))
}

// Reboot implements API.
func (c *Client) Reboot(ctx context.Context, node string, vmid int) (string, error) {
	return c.post(ctx, vmPath(node, vmid, "/status/reboot"))
}

// Destroy implements API.
func (c *Client) Destroy(ctx context.Context, node string, vmid int) (string, error) {
	var upid string
	return upid, c.do(ctx, request{method: http.MethodDelete, path: vmPath(node, vmid, ""),
		query: url.Values{"purge": {"1"}, "destroy-unreferenced-disks": {"1"}}}, &upid)
}

// VMStatus implements API.
func (c *Client) VMStatus(ctx context.Context, node string, vmid int) (VMStatus, error) {
	var s VMStatus
	return s, c.do(ctx, request{method: http.MethodGet, path: vmPath(node, vmid, "/status/current")}, &s)
}

// AgentInterfaces implements API.
func (c *Client) AgentInterfaces(ctx context.Context, node string, vmid int) ([]Interface, error) {
	var out struct {
		Result []Interface `json:"result"`
	}
	return out.Result, c.do(ctx, request{method: http.MethodGet, path: vmPath(node, vmid, "/agent/network-get-interfaces")}, &out)
}

// AgentFileRead implements API.
func (c *Client) AgentFileRead(ctx context.Context, node string, vmid int, file string) (string, bool, error) {
	var out struct {
		Content   string `json:"content"`
		Truncated Bool   `json:"truncated"`
	}
	err := c.do(ctx, request{method: http.MethodGet, path: vmPath(node, vmid, "/agent/file-read"), query: url.Values{"file": {file}}}, &out)
	return out.Content, bool(out.Truncated), err
}

// TaskLog implements API.
func (c *Client) TaskLog(ctx context.Context, node, upid string) ([]string, error) {
	var lines []struct {
		N int    `json:"n"`
		T string `json:"t"`
	}
	err := c.do(ctx, request{method: http.MethodGet, path: "/nodes/" + seg(node) + "/tasks/" + seg(upid) + "/log",
		query: url.Values{"start": {"0"}, "limit": {"1000"}}}, &lines)
	out := make([]string, 0, len(lines))
	for _, l := range lines {
		out = append(out, l.T)
	}
	return out, err
}

// Tasks implements API.
func (c *Client) Tasks(ctx context.Context, node string, vmid int) ([]Task, error) {
	var out []Task
	return out, c.do(ctx, request{method: http.MethodGet, path: "/nodes/" + seg(node) + "/tasks",
		query: url.Values{"vmid": {strconv.Itoa(vmid)}, "source": {"all"}, "limit": {"50"}}}, &out)
}
