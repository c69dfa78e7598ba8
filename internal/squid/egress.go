package squid

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

// CheckUsername is the name of the egress check's credential in every
// proxy's htpasswd. A proxy's own user may not take it.
const CheckUsername = "egressproxy-check"

// checkURL is an egress check URL taken apart: what Squid matches and
// where the checker connects.
type checkURL struct {
	https      bool
	host, port string // host without brackets
	path       string
}

func parseCheckURL(raw string) (checkURL, string) {
	u, err := url.Parse(raw)
	switch {
	case err != nil:
		return checkURL{}, "is not a URL"
	case u.Scheme != "http" && u.Scheme != "https":
		return checkURL{}, fmt.Sprintf("has scheme %q; want http or https", u.Scheme)
	case u.User != nil:
		return checkURL{}, "must not hold user info"
	case u.RawQuery != "" || u.ForceQuery || u.Fragment != "":
		return checkURL{}, "must have no query or fragment"
	case u.Hostname() == "":
		return checkURL{}, "has no host"
	}
	c := checkURL{https: u.Scheme == "https", host: strings.ToLower(u.Hostname()), port: u.Port(), path: u.EscapedPath()}
	if c.port == "" {
		c.port = "80"
		if c.https {
			c.port = "443"
		}
	}
	if p, err := strconv.Atoi(c.port); err != nil || p < 1 || p > 65535 {
		return checkURL{}, fmt.Sprintf("has port %q; want 1-65535", c.port)
	}
	if c.path == "" {
		c.path = "/"
	}
	if msg := checkToken(c.host + c.path); msg != "" {
		return checkURL{}, msg
	}
	return c, ""
}

// checkEgressCheck is what Validate says of s.EgressCheck.
func checkEgressCheck(s proxy.Settings, c *proxy.EgressCheck) fieldErrors {
	var errs fieldErrors
	if _, msg := parseCheckURL(c.URL); msg != "" {
		detail := fmt.Sprintf("%q %s", c.URL, msg)
		if strings.ContainsAny(c.URL, "@?#") {
			// User info, a query or a fragment may be credentials.
			detail = msg + " (the URL is not shown: it holds user info, a query or a fragment)"
		}
		errs = append(errs, &FieldError{Field: "egressCheck.url", Detail: detail})
	} else if n := len(slices.MaxFunc(egressCheckACLs(c), func(a, b string) int { return len(a) - len(b) })); n > maxLine {
		errs = append(errs, &FieldError{Field: "egressCheck.url", Detail: fmt.Sprintf("is too long: escaped for Squid it takes %d bytes of a squid.conf line, over the %d Squid reads whole; use a shorter URL, with fewer characters such as . ? + ( ) that a pattern escapes", n, maxLine)})
	}
	if msg := checkUsername(c.Username); msg != "" {
		errs = append(errs, &FieldError{Field: "egressCheck.username", Detail: msg})
	}
	if msg := checkPassword(c.Password); msg != "" {
		errs = append(errs, &FieldError{Field: "egressCheck.password", Detail: msg})
	}
	if s.Auth.Enabled && s.Auth.Username == c.Username {
		errs = append(errs, &FieldError{Field: "auth.username", Detail: "is the name of the provider's egress check credential (" + CheckUsername + "); choose another"})
	}
	return errs
}

// egressCheckACLs are the ACLs of the egress check: its method, its URL
// (a plain GET of exactly that URL; a CONNECT to exactly that host and
// port for https, whose path is inside the tunnel) and its user, all of
// which egress_check needs.
func egressCheckACLs(c *proxy.EgressCheck) []string {
	u, _ := parseCheckURL(c.URL) // Validate checked it.
	method, re := "GET", ""
	hostPort := regexp.QuoteMeta(u.host)
	if strings.Contains(u.host, ":") {
		hostPort = `\[` + hostPort + `\]`
	}
	if u.https {
		// Squid's URL of a CONNECT is host:port.
		method, re = "CONNECT", "^"+hostPort+":"+u.port+"$"
	} else {
		port := ":" + u.port
		if u.port == "80" {
			port = "(:80)?"
		}
		re = "^http://" + hostPort + port + regexp.QuoteMeta(u.path) + "$"
	}
	return []string{
		"# The provider's egress check: its own credential, for one request",
		"# to the echo endpoint, from wherever the provider is. Nothing else",
		"# is allowed with that credential.",
		"acl egress_check_method method " + method,
		"acl egress_check_url url_regex -i " + re,
		"acl egress_check_user proxy_auth " + c.Username,
		"acl egress_check all-of egress_check_method egress_check_url egress_check_user",
	}
}

// ParseEcho reads the caller's address from an echo endpoint's answer:
// plain text holding an address and nothing else, or JSON with the
// address in "ip", "origin" or "address" (ipify, httpbin, ifconfig.co).
func ParseEcho(body []byte) (string, error) {
	text := strings.TrimSpace(string(body))
	if a, err := netip.ParseAddr(text); err == nil {
		return source(a)
	}
	var v map[string]any
	if json.Unmarshal(body, &v) == nil {
		for _, k := range []string{"ip", "origin", "address"} {
			if s, ok := v[k].(string); ok {
				// httpbin's origin may list proxies: "a, b".
				first, _, _ := strings.Cut(s, ",")
				if a, err := netip.ParseAddr(strings.TrimSpace(first)); err == nil {
					return source(a)
				}
			}
		}
	}
	// Not quoted: what an endpoint a config names answers is not repeated
	// in a condition (docs/security.md).
	return "", fmt.Errorf("the echo endpoint's answer (%d bytes) is neither an address nor JSON with an address in ip or origin", len(body))
}

// source is a, unmapped, when it can be the source address of a
// connection the echo endpoint saw: not unspecified, multicast or a
// zone's link-local address, which no allow-list could use. Loopback and
// link-local are refused too: an echo beside the proxy (or one that lies)
// saw no address a vendor could allow-list.
func source(a netip.Addr) (string, error) {
	a = a.Unmap()
	switch {
	case a.IsUnspecified() || a.IsMulticast() || a.Zone() != "":
		return "", fmt.Errorf("the echo endpoint answered %s, which cannot be the address a connection comes from", a.WithZone(""))
	case a.IsLoopback():
		return "", errors.New("the echo endpoint answered a loopback address: it stands beside the proxy, not where a vendor sees the proxy's traffic from")
	case a.IsLinkLocalUnicast():
		return "", errors.New("the echo endpoint answered a link-local address, which does not leave its network: not where a vendor sees the proxy's traffic from")
	}
	return a.String(), nil
}

// maxEchoAnswer is the most AskEgress reads of an echo endpoint's answer.
const maxEchoAnswer = 4096

// AskEgress sends the egress check through the proxy at proxyAddr: one GET
// of c.URL with the check's credential (inside a CONNECT tunnel for
// https), and returns the address the endpoint saw. It follows no
// redirect and fails on an answer longer than 4 KiB. With c.ProxyCA set the
// connection to the proxy is TLS, its certificate verified against that CA
// (ClientTLS).
func AskEgress(ctx context.Context, dial func(ctx context.Context, network, addr string) (net.Conn, error), proxyAddr string, c proxy.EgressCheck) (string, error) {
	if dial == nil {
		dial = (&net.Dialer{}).DialContext
	}
	u, msg := parseCheckURL(c.URL)
	if msg != "" {
		return "", fmt.Errorf("egress check URL %s", msg)
	}
	if c.ProxyCA != "" {
		cfg, err := ClientTLS(c.ProxyCA)
		if err != nil {
			return "", err
		}
		plain := dial
		// TLS to the proxy here, under an http:// proxy URL: a Transport's
		// TLSClientConfig would apply to the echo endpoint's TLS too,
		// which must be verified against the system's roots instead.
		dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
			conn, err := plain(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			tc := tls.Client(conn, cfg)
			if err := tc.HandshakeContext(ctx); err != nil {
				_ = conn.Close()
				return nil, fmt.Errorf("TLS with the proxy: %w", err)
			}
			return tc, nil
		}
	}
	pu := &url.URL{Scheme: "http", Host: proxyAddr, User: url.UserPassword(c.Username, c.Password)}
	tr := &http.Transport{
		Proxy:             http.ProxyURL(pu),
		DialContext:       dial,
		DisableKeepAlives: true,
		// net/http would quote the status text of a refused CONNECT.
		OnProxyConnectResponse: func(_ context.Context, _ *url.URL, _ *http.Request, resp *http.Response) error {
			if resp.StatusCode != http.StatusOK {
				return &proxyStatusError{code: resp.StatusCode}
			}
			return nil
		},
	}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.URL, nil)
	if err != nil {
		return "", fmt.Errorf("egress check URL: %w", err)
	}
	resp, err := hc.Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return "", fmt.Errorf("no answer through the proxy at %s: %w", proxyAddr, unquoted(err))
	}
	defer func() { _ = resp.Body.Close() }()
	// One byte over the cap tells a long answer from one that fits: a
	// cut-off answer could end in another address (203.0.113.71 read as
	// 203.0.113.7).
	body, readErr := io.ReadAll(io.LimitReader(bufio.NewReader(resp.Body), maxEchoAnswer+1))
	if resp.StatusCode != http.StatusOK {
		// The code, never the status text: what answers chose it.
		return "", fmt.Errorf("%s answered %d %s through the proxy at %s", u.host, resp.StatusCode, http.StatusText(resp.StatusCode), proxyAddr)
	}
	if readErr != nil {
		// Cut off, it could end in another address as well.
		return "", fmt.Errorf("the echo endpoint's answer was cut off through the proxy at %s (what arrived is not read)", proxyAddr)
	}
	if len(body) > maxEchoAnswer {
		return "", fmt.Errorf("the echo endpoint's answer is longer than %d bytes; an address takes a few dozen", maxEchoAnswer)
	}
	return ParseEcho(body)
}

// proxyStatusError is a CONNECT the proxy did not accept.
type proxyStatusError struct{ code int }

func (e *proxyStatusError) Error() string {
	return fmt.Sprintf("the proxy answered the CONNECT with %d %s", e.code, http.StatusText(e.code))
}

// unquoted is err when it carries nothing the other end sent (a failed
// dial, a refusal, a timeout, a refused CONNECT), and otherwise a fixed
// text: net/http quotes the first bytes of an answer it cannot read, TLS
// errors a certificate's names, and the proxy's address is one a tenant's
// backend may have chosen.
func unquoted(err error) error {
	var oe *net.OpError
	var pe *proxyStatusError
	var re *ReportedRefusedError
	var ce *tls.CertificateVerificationError
	switch {
	case errors.As(err, &ce):
		return errors.New("the echo endpoint's TLS certificate could not be verified (its names are not shown)")
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded),
		errors.As(err, &oe) && oe.Op == "dial", errors.As(err, &pe), errors.As(err, &re):
		return err
	}
	return errors.New("the answer could not be read (what was answered is not shown)")
}

// Egress is what an EgressChecker knows of one proxy's egress address.
type Egress struct {
	// IP is the address the echo endpoint saw; empty until a check
	// succeeded.
	IP string
	// At is when IP was seen.
	At time.Time
	// URL is the echo URL the check that saw IP (or failed with Error)
	// asked: a result is that URL's word alone.
	URL string
	// Error says why the latest check failed (no secret in it); empty
	// when it succeeded or none finished yet.
	Error string
	// Moved is true while no check through this instance and proxy
	// address, with this URL, has succeeded, and the checker's last
	// success was through another or with another URL: an address
	// published from it is not this proxy's by this URL.
	Moved bool
	// Next is when the next check of the same instance is due; zero while
	// one is in flight.
	Next time.Time
}

// IdleConnectionGap is the least time between two checks through one
// proxy. Squid keeps an idle connection to a server for the next request
// to it for a minute (server_idle_pconn_timeout, which squid.conf leaves
// at its default), on a clock of whole seconds checked about once a
// second: a check sooner than this after the last one can be sent over
// the last one's connection, and sees the address that connection was
// opened from, not the one a new connection leaves from now (a NAT
// gateway or node address changed in between).
const IdleConnectionGap = 65 * time.Second

// EgressChecker runs egress checks in the background, one at a time per
// key, and keeps each key's latest result: a check is sent when a key is
// new, at once when its instance or proxy address changes (a recreated
// instance, another node), then every interval (a failure again after
// RetryInterval); through the same instance and address never sooner
// than IdleConnectionGap after the last, even when its version, URL or
// CA changed.
// Check never waits longer than Wait, so no reconcile is held by a slow
// echo endpoint; the result is there for a later Check. Safe for
// concurrent use; the zero value uses the defaults.
type EgressChecker struct {
	// Ask sends one check; default AskEgress over Dial.
	Ask func(ctx context.Context, proxyAddr string, c proxy.EgressCheck) (string, error)
	// Dial connects for the default Ask.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// Timeout of one check; default 10 s.
	Timeout time.Duration
	// Wait is how long Check waits for a check it started; default 2 s.
	Wait time.Duration
	// RetryInterval is how soon a failed check is tried again; default 1m
	// (and never sooner than IdleConnectionGap).
	RetryInterval time.Duration
	// Now is the clock; default time.Now.
	Now func() time.Time
	// ForgetAfter drops a key no Check has asked about for this long (a
	// proxy deleted without a last look, a check turned off, a replica
	// gone); default 24 h.
	ForgetAfter time.Duration

	mu      sync.Mutex
	entries map[string]*egressEntry
	swept   time.Time
}

type egressEntry struct {
	instance, addr, url string
	ca                  string // the proxy's CA: a new one is checked at once
	done                chan struct{}
	result              Egress
	finished            time.Time
	asked               time.Time
}

// Check returns key's latest egress result for a proxy at proxyAddr, and
// starts a check when none is known for that instance (any string that
// changes when the instance does: its identity before a '#', its version
// after), address and URL, or the latest is older than interval. A failed
// check keeps the address last seen only through the same identity and
// address, and with the same URL (Moved otherwise): what another URL
// answered is never returned as this one's.
//
// guard, when not nil, checks proxyAddr (an address the backend reported)
// and dials it (the config's netguard.Guard); a refused address is never
// connected to.
func (e *EgressChecker) Check(ctx context.Context, guard Guard, key, instance, proxyAddr string, c proxy.EgressCheck, interval time.Duration) Egress {
	e.mu.Lock()
	if e.entries == nil {
		e.entries = map[string]*egressEntry{}
	}
	e.sweep()
	en := e.entries[key]
	var prev Egress
	start := en == nil
	// Another instance, or the proxy elsewhere, is checked at once; any
	// other change (an update in place, another URL or CA) goes through
	// the same Squid, and waits out the gap too.
	moved := en != nil && (identity(en.instance) != identity(instance) || en.addr != proxyAddr)
	if en != nil {
		select {
		case <-en.done:
			// Kept until the next check of the same instance answers:
			// a failed check says nothing of the address.
			prev = en.result
			start = moved || !e.now().Before(e.due(en, instance, c, interval))
		default: // in flight
			start = moved
		}
	}
	if start {
		if en != nil && (moved || en.url != c.URL) {
			// Another instance, or the proxy elsewhere: what was seen
			// through the last one says nothing of this one's address;
			// nor is another URL's answer this one's word.
			prev = Egress{Moved: en.result.IP != "" || en.result.Moved}
		}
		en = &egressEntry{instance: instance, addr: proxyAddr, url: c.URL, ca: c.ProxyCA, done: make(chan struct{}), result: prev}
		e.entries[key] = en
		go e.run(en, c, guard) //nolint:gosec // The check outlives the reconcile that started it; a later Check reads its result.
	}
	en.asked = e.now()
	e.mu.Unlock()

	wait := e.Wait
	if wait <= 0 {
		wait = 2 * time.Second
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-en.done:
	case <-t.C:
	case <-ctx.Done():
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	r := en.result
	r.URL = en.url
	if en.url != c.URL {
		// The URL changed and its own check waits for the gap (or the
		// old URL's to finish).
		r = Egress{URL: c.URL, Moved: r.IP != "" || r.Moved}
	}
	select {
	case <-en.done:
		r.Next = e.due(en, instance, c, interval)
	default:
	}
	return r
}

// due is when the check after en's finished one is: after interval (a
// failure's RetryInterval), or when instance, URL or CA changed since, as
// soon as IdleConnectionGap allows.
func (e *EgressChecker) due(en *egressEntry, instance string, c proxy.EgressCheck, interval time.Duration) time.Time {
	ttl := interval
	if en.result.Error != "" {
		ttl = e.retry()
	}
	if en.instance != instance || en.url != c.URL || en.ca != c.ProxyCA {
		ttl = 0
	}
	return en.finished.Add(max(ttl, IdleConnectionGap))
}

func (e *EgressChecker) now() time.Time {
	if e.Now != nil {
		return e.Now()
	}
	return time.Now()
}

// identity is the part of an instance string that names the instance
// itself: before its first '#'; what follows is its version (an update in
// place), checked as soon as IdleConnectionGap allows, and no move.
func identity(instance string) string {
	id, _, _ := strings.Cut(instance, "#")
	return id
}

// sweep drops, at most every tenth of ForgetAfter, the finished entries
// no Check asked about within ForgetAfter. Called with e.mu held.
func (e *EgressChecker) sweep() {
	after := e.ForgetAfter
	if after <= 0 {
		after = 24 * time.Hour
	}
	now := e.now()
	if now.Sub(e.swept) < after/10 {
		return
	}
	e.swept = now
	for k, en := range e.entries {
		select {
		case <-en.done:
			if now.Sub(en.asked) > after {
				delete(e.entries, k)
			}
		default: // in flight: its run still writes to it
		}
	}
}

// Forget drops key (a proxy that is gone).
func (e *EgressChecker) Forget(key string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	delete(e.entries, key)
}

// CheckTimeout is the longest one check takes: a check in flight has
// answered, or failed, within it.
func (e *EgressChecker) CheckTimeout() time.Duration {
	if e.Timeout > 0 {
		return e.Timeout
	}
	return defaultCheckTimeout
}

// defaultCheckTimeout is EgressChecker.Timeout's default.
const defaultCheckTimeout = 10 * time.Second

func (e *EgressChecker) run(en *egressEntry, c proxy.EgressCheck, guard Guard) {
	ctx, cancel := context.WithTimeout(context.Background(), e.CheckTimeout())
	defer cancel()
	dial := e.Dial
	if guard != nil {
		dial = guard.DialContext
	}
	ask := e.Ask
	if ask == nil {
		ask = func(ctx context.Context, addr string, c proxy.EgressCheck) (string, error) {
			return AskEgress(ctx, dial, addr, c)
		}
	}
	var ip string
	err := checkReported(ctx, guard, en.addr)
	if err == nil {
		ip, err = ask(ctx, en.addr, c)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	en.finished = e.now()
	if err != nil {
		// Keep the address last seen: a failed check says nothing of it.
		en.result.Error = strings.ReplaceAll(err.Error(), c.Password, "[redacted]")
	} else {
		en.result = Egress{IP: ip, At: en.finished}
	}
	close(en.done)
}

func (e *EgressChecker) retry() time.Duration {
	if e.RetryInterval > 0 {
		return e.RetryInterval
	}
	return time.Minute
}
