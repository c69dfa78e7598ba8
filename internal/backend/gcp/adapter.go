package gcp

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"google.golang.org/api/googleapi"
	"google.golang.org/api/option"
	"google.golang.org/api/option/internaloption"
	htransport "google.golang.org/api/transport/http"

	"github.com/egressproxy/provider-egressproxy/internal/backend/gcp/computeapi"
)

// DefaultCallTimeout bounds one API call, so that a hung endpoint cannot
// hold a reconcile worker.
const DefaultCallTimeout = 30 * time.Second

// maxAnswer bounds the body of one answer read into memory. The largest
// is a listing page of 500 of the driver's instances, each with its
// metadata (cloud-init, the startup script, the Squid files): well below
// it.
const maxAnswer = 64 << 20

// sdk is API on Compute Engine's v1 REST API: one net/http client,
// authenticated and observed, JSON bodies (computeapi's types).
type sdk struct {
	project string
	timeout time.Duration
	hc      *http.Client
	// base is the endpoint with the project's path,
	// <endpoint>/compute/v1/projects/<project>.
	base *url.URL
}

// endpointDefaults resolve the endpoint as Google's clients for Compute
// Engine do: compute.googleapis.com, or the one of the credentials'
// universe domain, or the mTLS one with a client certificate, unless the
// options name one (option.WithEndpoint).
var endpointDefaults = []option.ClientOption{
	internaloption.WithDefaultEndpointTemplate("https://compute.UNIVERSE_DOMAIN"),
	internaloption.WithDefaultMTLSEndpoint("https://compute.mtls.googleapis.com"),
	internaloption.WithDefaultUniverseDomain("googleapis.com"),
}

// NewSDK builds the production API for project from client options
// (credentials, or an endpoint and no authentication in tests).
func NewSDK(ctx context.Context, project string, opts ...option.ClientOption) (API, error) {
	opts = opts[:len(opts):len(opts)]
	// One HTTP client, authenticated from opts and built on the decorator,
	// so that every request is a span, a log line and a metric.
	hc, _, err := htransport.NewClient(ctx, append(opts, option.WithScopes(scope), option.WithTelemetryDisabled())...)
	if err != nil {
		return nil, err
	}
	hc.Transport = observedTransport(hc.Transport)
	// Given the client, this only resolves the endpoint.
	_, endpoint, err := htransport.NewClient(ctx, append(append(endpointDefaults[:len(endpointDefaults):len(endpointDefaults)], opts...), option.WithHTTPClient(hc))...)
	if err != nil {
		return nil, err
	}
	base, err := url.Parse(strings.TrimSuffix(endpoint, "/"))
	if err != nil {
		return nil, fmt.Errorf("the Compute Engine endpoint %q: %w", endpoint, err)
	}
	base.Path += "/compute/v1/projects/" + project
	return &sdk{project: project, timeout: DefaultCallTimeout, hc: hc, base: base}, nil
}

// call runs fn within the call budget. A done ctx sends nothing: no token
// is fetched and no span or log line records a request that could not be
// made.
func call[T any](ctx context.Context, timeout time.Duration, fn func(ctx context.Context) (T, error)) (T, error) {
	var zero T
	if err := ctx.Err(); err != nil {
		return zero, err
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	return fn(ctx)
}

// send makes one request, within the call budget and never retried (the
// reconciler retries with backoff, a poll must cost one request, and a
// busy backend must answer at once): method on the path of segments
// below the project, each escaped (see escaped),
// with query and, unless nil, body as JSON. It decodes a 2xx answer into
// a T; any other is a *googleapi.Error, as googleapi reads Google's error
// bodies.
func send[T any](s *sdk, ctx context.Context, method string, path []string, query url.Values, body any) (*T, error) {
	return call(ctx, s.timeout, func(ctx context.Context) (*T, error) {
		u := *s.base
		u.Path, u.RawPath = s.base.Path+"/"+strings.Join(path, "/"), s.base.EscapedPath()+"/"+escaped(path)
		// Compact answers, as Google's own clients ask for: indented, a
		// listing page of 500 instances is much larger.
		q := url.Values{"prettyPrint": {"false"}}
		for k, v := range query {
			q[k] = v
		}
		u.RawQuery = q.Encode()
		var rd io.Reader
		if body != nil {
			b, err := json.Marshal(body)
			if err != nil {
				return nil, err
			}
			rd = bytes.NewReader(b)
		}
		req, err := http.NewRequestWithContext(ctx, method, u.String(), rd)
		if err != nil {
			return nil, err
		}
		if body != nil {
			req.Header.Set("Content-Type", "application/json")
		}
		resp, err := s.hc.Do(req)
		if err != nil {
			return nil, err
		}
		defer func() {
			// What is left of a body read in full is nothing; of one too
			// large, not worth reading: the connection goes.
			_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4<<10))
			_ = resp.Body.Close()
		}()
		b, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswer+1))
		if err != nil {
			return nil, err
		}
		if len(b) > maxAnswer {
			return nil, fmt.Errorf("%s %s: the answer is larger than %d MiB", method, strings.Join(path, "/"), maxAnswer>>20)
		}
		if err := googleapi.CheckResponseWithBody(resp, b); err != nil {
			return nil, err
		}
		out := new(T)
		if err := json.Unmarshal(b, out); err != nil {
			return nil, fmt.Errorf("%s %s: the answer is not a %T: %w", method, strings.Join(path, "/"), *out, err)
		}
		return out, nil
	})
}

// listQuery is the query of one page of a listing.
func listQuery(filter string, maxResults uint32, pageToken string, partial bool) url.Values {
	q := url.Values{}
	if filter != "" {
		q.Set("filter", filter)
	}
	if maxResults != 0 {
		q.Set("maxResults", strconv.FormatUint(uint64(maxResults), 10))
	}
	if pageToken != "" {
		q.Set("pageToken", pageToken)
	}
	if partial {
		// A zone that does not answer is named in unreachables instead of
		// failing the whole listing.
		q.Set("returnPartialSuccess", "true")
	}
	return q
}

func (s *sdk) GetInstance(ctx context.Context, zone, name string) (*computeapi.Instance, error) {
	return send[computeapi.Instance](s, ctx, http.MethodGet, segs("zones", zone, "instances", name), nil, nil)
}

func (s *sdk) InsertInstance(ctx context.Context, zone string, inst *computeapi.Instance) (*computeapi.Operation, error) {
	return send[computeapi.Operation](s, ctx, http.MethodPost, segs("zones", zone, "instances"), nil, inst)
}

func (s *sdk) UpdateInstance(ctx context.Context, zone string, inst *computeapi.Instance, minimalAction string) (*computeapi.Operation, error) {
	q := url.Values{"minimalAction": {minimalAction}, "mostDisruptiveAllowedAction": {"RESTART"}}
	return send[computeapi.Operation](s, ctx, http.MethodPut, segs("zones", zone, "instances", inst.GetName()), q, inst)
}

func (s *sdk) DeleteInstance(ctx context.Context, zone, name string) (*computeapi.Operation, error) {
	return send[computeapi.Operation](s, ctx, http.MethodDelete, segs("zones", zone, "instances", name), nil, nil)
}

func (s *sdk) AggregatedInstances(ctx context.Context, filter string, maxResults uint32, pageToken string) (*computeapi.InstanceAggregatedList, error) {
	return send[computeapi.InstanceAggregatedList](s, ctx, http.MethodGet, segs("aggregated", "instances"), listQuery(filter, maxResults, pageToken, true), nil)
}

func (s *sdk) AggregatedAddresses(ctx context.Context, filter string, maxResults uint32, pageToken string) (*computeapi.AddressAggregatedList, error) {
	return send[computeapi.AddressAggregatedList](s, ctx, http.MethodGet, segs("aggregated", "addresses"), listQuery(filter, maxResults, pageToken, true), nil)
}

func (s *sdk) ListFirewalls(ctx context.Context, maxResults uint32, pageToken string) (*computeapi.FirewallList, error) {
	return send[computeapi.FirewallList](s, ctx, http.MethodGet, segs("global", "firewalls"), listQuery("", maxResults, pageToken, false), nil)
}

func (s *sdk) GetOperation(ctx context.Context, op OpRef) (*computeapi.Operation, error) {
	return send[computeapi.Operation](s, ctx, http.MethodGet, op.segments(), nil, nil)
}

func (s *sdk) GetAddress(ctx context.Context, region, name string) (*computeapi.Address, error) {
	return send[computeapi.Address](s, ctx, http.MethodGet, segs("regions", region, "addresses", name), nil, nil)
}

func (s *sdk) InsertAddress(ctx context.Context, region string, a *computeapi.Address) (*computeapi.Operation, error) {
	return send[computeapi.Operation](s, ctx, http.MethodPost, segs("regions", region, "addresses"), nil, a)
}

func (s *sdk) SetAddressLabels(ctx context.Context, region, name, fingerprint string, labels map[string]string) (*computeapi.Operation, error) {
	body := &computeapi.RegionSetLabelsRequest{LabelFingerprint: ptr(fingerprint), Labels: labels}
	return send[computeapi.Operation](s, ctx, http.MethodPost, segs("regions", region, "addresses", name, "setLabels"), nil, body)
}

func (s *sdk) DeleteAddress(ctx context.Context, region, name string) (*computeapi.Operation, error) {
	return send[computeapi.Operation](s, ctx, http.MethodDelete, segs("regions", region, "addresses", name), nil, nil)
}

func (s *sdk) GetFirewall(ctx context.Context, name string) (*computeapi.Firewall, error) {
	return send[computeapi.Firewall](s, ctx, http.MethodGet, segs("global", "firewalls", name), nil, nil)
}

func (s *sdk) InsertFirewall(ctx context.Context, fw *computeapi.Firewall) (*computeapi.Operation, error) {
	return send[computeapi.Operation](s, ctx, http.MethodPost, segs("global", "firewalls"), nil, fw)
}

func (s *sdk) PatchFirewall(ctx context.Context, name string, fw *computeapi.Firewall) (*computeapi.Operation, error) {
	return send[computeapi.Operation](s, ctx, http.MethodPatch, segs("global", "firewalls", name), nil, fw)
}

func (s *sdk) DeleteFirewall(ctx context.Context, name string) (*computeapi.Operation, error) {
	return send[computeapi.Operation](s, ctx, http.MethodDelete, segs("global", "firewalls", name), nil, nil)
}

func (s *sdk) GetGuestAttribute(ctx context.Context, zone, name, key string) (*computeapi.GuestAttributes, error) {
	return send[computeapi.GuestAttributes](s, ctx, http.MethodGet, segs("zones", zone, "instances", name, "getGuestAttributes"), url.Values{"variableKey": {key}}, nil)
}

func (s *sdk) GetRegion(ctx context.Context, region string) (*computeapi.Region, error) {
	return send[computeapi.Region](s, ctx, http.MethodGet, segs("regions", region), nil, nil)
}

// Close lets the client's idle connections go; it is safe on an sdk never
// built and more than once.
func (s *sdk) Close() error {
	if s.hc != nil {
		s.hc.CloseIdleConnections()
	}
	return nil
}

// segs is a path below the project, segment by segment.
func segs(s ...string) []string { return s }

// escaped joins the path's segments, each escaped: whatever a name holds
// ("/", "..", "?"), it stays one segment of the path it was put in.
func escaped(path []string) string {
	out := make([]string, len(path))
	for i, s := range path {
		out[i] = url.PathEscape(s)
	}
	return strings.Join(out, "/")
}
