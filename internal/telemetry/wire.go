package telemetry

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/go-logr/logr"
)

// Verbosity tiers of the provider's logs (--verbosity): what each adds to
// the one below. docs/operations.md, Logs, lists the lines of each.
const (
	// VCalls is one line per reconcile, per backend request (the
	// "<backend> api call" and "libvirt call" lines) and per operation
	// outcome.
	VCalls = 1
	// VDetail is what the backend was asked and answered, curated: a
	// create's resolved parameters, the request sent to create (never
	// contents: sizes), KVM's domain and volume XML and metadata element,
	// the addresses found, the names listed.
	VDetail = 2
	// VWire is the HTTP backends' (Proxmox VE, Compute Engine) requests
	// and answers as sent and received, secrets redacted (Wire).
	VWire = 3
)

// Redacted stands for a value the wire log does not show.
const Redacted = "[redacted]"

// maxWireBody is how much of a body the wire log shows; the rest is
// counted.
const maxWireBody = 16 << 10

// Wire wraps rt so that, when the logger log gives for a request's
// context is enabled at VWire, the request and its answer are logged as
// "<backend> wire request" (method, URL, headers, body) and "<backend>
// wire response" (status, headers, body), in the context's span. Secrets
// are never shown: a header is shown only when it is one of wireHeaders,
// a URL's user and secret query values, a JSON or form body's secret
// fields (secretKey) and every value of a JSON key/value pair (instance
// metadata: cloud-init) are Redacted, and any other body (an upload, a
// multipart form) is only counted. Below VWire it costs one Enabled check.
func Wire(backend string, log func(context.Context) logr.Logger, rt http.RoundTripper) http.RoundTripper {
	if rt == nil {
		rt = http.DefaultTransport
	}
	return &wire{backend: backend, log: log, next: rt}
}

type wire struct {
	backend string
	log     func(context.Context) logr.Logger
	next    http.RoundTripper
}

func (w *wire) RoundTrip(req *http.Request) (*http.Response, error) {
	l := w.log(req.Context()).V(VWire)
	if !l.Enabled() {
		return w.next.RoundTrip(req)
	}
	kv := []any{"method", req.Method, "url", redactURL(req.URL), "headers", redactHeaders(req.Header)}
	if req.Body != nil && req.Body != http.NoBody {
		b, err := io.ReadAll(req.Body)
		_ = req.Body.Close()
		if err != nil {
			return nil, err
		}
		// The request goes on with the body read here (a clone: the
		// caller's request is not modified, as RoundTrip requires).
		req = req.Clone(req.Context())
		req.Body = io.NopCloser(bytes.NewReader(b))
		req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil }
		kv = append(kv, "body", redactBody(req.Header.Get("Content-Type"), b, int64(len(b))))
	}
	l.Info(w.backend+" wire request", kv...)
	resp, err := w.next.RoundTrip(req)
	if err != nil {
		l.Info(w.backend+" wire response", "method", req.Method, "url", redactURL(req.URL), "error", err.Error())
		return resp, err
	}
	kv = []any{"method", req.Method, "url", redactURL(req.URL), "status", resp.Status, "headers", redactHeaders(resp.Header)}
	if resp.Body != nil {
		head, err := io.ReadAll(io.LimitReader(resp.Body, maxWireBody+1))
		if err != nil {
			_ = resp.Body.Close()
			return nil, err
		}
		body := resp.Body
		resp.Body = struct {
			io.Reader
			io.Closer
		}{io.MultiReader(bytes.NewReader(head), body), body}
		size := int64(len(head))
		if len(head) > maxWireBody {
			size = resp.ContentLength
			head = nil // cut off: a JSON prefix does not parse, and is not shown
		}
		kv = append(kv, "body", redactBody(resp.Header.Get("Content-Type"), head, size))
	}
	l.Info(w.backend+" wire response", kv...)
	return resp, nil
}

// wireHeaders are the headers whose values the wire log shows; every
// other value (Authorization, Cookie, a CSRF token, a vendor's key) is
// Redacted.
var wireHeaders = map[string]bool{
	"Accept": true, "Accept-Encoding": true, "Cache-Control": true, "Connection": true, "Content-Encoding": true,
	"Content-Length": true, "Content-Type": true, "Date": true, "Etag": true, "Retry-After": true, "Server": true,
	"Transfer-Encoding": true, "User-Agent": true, "Vary": true, "X-Goog-Api-Client": true, "X-Goog-Request-Params": true,
}

func redactHeaders(h http.Header) map[string]string {
	out := make(map[string]string, len(h))
	for k, v := range h {
		if wireHeaders[http.CanonicalHeaderKey(k)] {
			out[k] = strings.Join(v, ", ")
		} else {
			out[k] = Redacted
		}
	}
	return out
}

// guestText are the fields whose text a guest chose, quoted nowhere
// (docs/allow-listing.md): a file the Proxmox guest agent read (content)
// and a Compute Engine guest attribute's value (variableValue).
var guestText = map[string]bool{"content": true, "variableValue": true}

// secretKey reports whether a field, query parameter or form value named
// k holds a secret.
func secretKey(k string) bool {
	n := strings.NewReplacer("-", "", "_", "", ".", "").Replace(strings.ToLower(k))
	for _, s := range []string{"password", "passwd", "token", "secret", "privatekey", "sshkey", "userdata", "cloudinit", "startupscript",
		"assertion", "ticket", "htpasswd", "credential", "apikey", "signature"} {
		if strings.Contains(n, s) {
			return true
		}
	}
	return false
}

// secretParam is secretKey for a URL's query, where an API key goes.
func secretParam(k string) bool {
	n := strings.ToLower(k)
	return secretKey(k) || n == "key" || n == "sig"
}

func redactURL(u *url.URL) string {
	c := *u
	if c.User != nil {
		c.User = url.User(Redacted)
	}
	if c.RawQuery != "" {
		q := c.Query()
		for k := range q {
			if secretParam(k) {
				q[k] = []string{Redacted}
			}
		}
		c.RawQuery = q.Encode()
	}
	return c.String()
}

// redactBody shows b (size bytes in all) when it is JSON or a form, its
// secrets redacted; otherwise, or when it does not parse, only its size
// and type.
func redactBody(contentType string, b []byte, size int64) string {
	mt, _, _ := mime.ParseMediaType(contentType)
	switch {
	case len(b) == 0 && size == 0:
		return ""
	case b == nil:
	case mt == "application/json" || strings.HasSuffix(mt, "+json"):
		var v any
		if json.Unmarshal(b, &v) == nil {
			if out, err := json.Marshal(redactJSON(v)); err == nil {
				return string(out)
			}
		}
	case mt == "application/x-www-form-urlencoded":
		if q, err := url.ParseQuery(string(b)); err == nil {
			for k := range q {
				if secretKey(k) {
					q[k] = []string{Redacted}
				}
			}
			return q.Encode()
		}
	}
	if mt == "" {
		mt = "no type"
	}
	return fmt.Sprintf("[%s bytes, %s, not shown]", strconv.FormatInt(size, 10), mt)
}

// redactJSON redacts the secret fields of v, the value of every
// key/value pair (Compute Engine's metadata items, where cloud-init is,
// and guest attribute entries), what a guest wrote (guestText) and the
// metadata a refusal quotes (WithoutMetadataValues).
func redactJSON(v any) any {
	switch x := v.(type) {
	case map[string]any:
		_, pair := x["key"].(string)
		for k, e := range x {
			if secretKey(k) || (pair && k == "value") || guestText[k] {
				x[k] = Redacted
				continue
			}
			x[k] = redactJSON(e)
		}
		return x
	case []any:
		for i, e := range x {
			x[i] = redactJSON(e)
		}
		return x
	case string:
		// An error answer's message may quote the metadata sent.
		return WithoutMetadataValues(x)
	default:
		return v
	}
}
