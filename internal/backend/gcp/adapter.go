package gcp

import (
	"context"
	"errors"
	"net/http"
	"time"

	compute "cloud.google.com/go/compute/apiv1"
	"cloud.google.com/go/compute/apiv1/computepb"
	gax "github.com/googleapis/gax-go/v2"
	"google.golang.org/api/option"
	htransport "google.golang.org/api/transport/http"
	"google.golang.org/protobuf/proto"
)

// DefaultCallTimeout bounds one API call, so that a hung endpoint cannot
// hold a reconcile worker.
const DefaultCallTimeout = 30 * time.Second

// sdk is API on the SDK's REST clients.
type sdk struct {
	project   string
	timeout   time.Duration
	instances *compute.InstancesClient
	zoneOps   *compute.ZoneOperationsClient
	regionOps *compute.RegionOperationsClient
	globalOps *compute.GlobalOperationsClient
	addresses *compute.AddressesClient
	firewalls *compute.FirewallsClient
	regions   *compute.RegionsClient
	// opts and rt build the per-call clients of AggregatedInstances.
	opts []option.ClientOption
	rt   http.RoundTripper
}

// NewSDK builds the production API for project from client options
// (credentials, or an endpoint and no authentication in tests).
func NewSDK(ctx context.Context, project string, opts ...option.ClientOption) (API, error) {
	s := &sdk{project: project, timeout: DefaultCallTimeout}
	// One HTTP client for every service client, authenticated from opts and
	// built on the decorator, so that every request is a span, a log line
	// and a metric (the SDK's own instrumentation is off: it would be a
	// second span per request).
	hc, _, err := htransport.NewClient(ctx, append(opts[:len(opts):len(opts)], option.WithScopes(scope), option.WithTelemetryDisabled())...)
	if err != nil {
		return nil, err
	}
	hc.Transport = observedTransport(hc.Transport)
	s.opts, s.rt = opts[:len(opts):len(opts)], hc.Transport
	opts = append(opts[:len(opts):len(opts)], option.WithHTTPClient(hc))
	if s.instances, err = compute.NewInstancesRESTClient(ctx, opts...); err != nil {
		return nil, err
	}
	// Every constructor reads the same options; a failure after the first
	// would be odd, but must not leak what was already built.
	steps := []func() error{
		func() (err error) { s.zoneOps, err = compute.NewZoneOperationsRESTClient(ctx, opts...); return err },
		func() (err error) { s.regionOps, err = compute.NewRegionOperationsRESTClient(ctx, opts...); return err },
		func() (err error) { s.globalOps, err = compute.NewGlobalOperationsRESTClient(ctx, opts...); return err },
		func() (err error) { s.addresses, err = compute.NewAddressesRESTClient(ctx, opts...); return err },
		func() (err error) { s.firewalls, err = compute.NewFirewallsRESTClient(ctx, opts...); return err },
		func() (err error) { s.regions, err = compute.NewRegionsRESTClient(ctx, opts...); return err },
	}
	for _, step := range steps {
		if err := step(); err != nil {
			_ = s.Close()
			return nil, err
		}
	}
	return s, nil
}

// noRetry turns off the SDK's own retries (Get retries 503 and 504 for up
// to ten minutes): the reconciler retries with backoff, a poll must cost
// one request, and a busy backend must answer at once.
var noRetry = gax.WithRetry(func() gax.Retryer { return nil })

// call runs fn within the call budget. The SDK does not put ctx on every
// request (AggregatedList builds its request without it), so a done ctx is
// checked first.
func call[T any](ctx context.Context, timeout time.Duration, fn func(ctx context.Context) (T, error)) (T, error) {
	var zero T
	if err := ctx.Err(); err != nil {
		return zero, err
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	return fn(ctx)
}

func opProto(op *compute.Operation, err error) (*computepb.Operation, error) {
	if err != nil {
		return nil, err
	}
	return op.Proto(), nil
}

// sdkCall is the shape of an SDK client's method: one request, options.
type sdkCall[R, T any] func(context.Context, R, ...gax.CallOption) (T, error)

// send sends req through the SDK's method fn, within the call budget and
// without the SDK's retries.
func send[R, T any](s *sdk, ctx context.Context, fn sdkCall[R, T], req R) (T, error) {
	return call(ctx, s.timeout, func(ctx context.Context) (T, error) { return fn(ctx, req, noRetry) })
}

// start is send for a request that starts an operation.
func start[R any](s *sdk, ctx context.Context, fn sdkCall[R, *compute.Operation], req R) (*computepb.Operation, error) {
	return call(ctx, s.timeout, func(ctx context.Context) (*computepb.Operation, error) { return opProto(fn(ctx, req, noRetry)) })
}

func (s *sdk) GetInstance(ctx context.Context, zone, name string) (*computepb.Instance, error) {
	return send(s, ctx, s.instances.Get, &computepb.GetInstanceRequest{Project: s.project, Zone: zone, Instance: name})
}

func (s *sdk) InsertInstance(ctx context.Context, zone string, inst *computepb.Instance) (*computepb.Operation, error) {
	return start(s, ctx, s.instances.Insert, &computepb.InsertInstanceRequest{Project: s.project, Zone: zone, InstanceResource: inst})
}

func (s *sdk) UpdateInstance(ctx context.Context, zone string, inst *computepb.Instance, minimalAction string) (*computepb.Operation, error) {
	return start(s, ctx, s.instances.Update, &computepb.UpdateInstanceRequest{
		Project: s.project, Zone: zone, Instance: inst.GetName(), InstanceResource: inst,
		MinimalAction: proto.String(minimalAction), MostDisruptiveAllowedAction: proto.String("RESTART"),
	})
}

func (s *sdk) DeleteInstance(ctx context.Context, zone, name string) (*computepb.Operation, error) {
	return start(s, ctx, s.instances.Delete, &computepb.DeleteInstanceRequest{Project: s.project, Zone: zone, Instance: name})
}

func (s *sdk) AggregatedInstances(ctx context.Context, filter string, maxResults uint32, pageToken string) (*computepb.InstanceAggregatedList, error) {
	return call(ctx, s.timeout, func(ctx context.Context) (*computepb.InstanceAggregatedList, error) {
		req := &computepb.AggregatedListInstancesRequest{
			Project:              s.project,
			ReturnPartialSuccess: proto.Bool(true),
		}
		if filter != "" {
			req.Filter = proto.String(filter)
		}
		// The SDK builds this one request without ctx, so neither its
		// deadline nor its span would reach it: a client of its own (cheap:
		// it dials nothing) whose transport puts ctx on the request.
		ic, err := compute.NewInstancesRESTClient(ctx, append(s.opts[:len(s.opts):len(s.opts)], option.WithHTTPClient(&http.Client{Transport: withContext{ctx: ctx, next: s.rt}}))...)
		if err != nil {
			return nil, err
		}
		defer func() { _ = ic.Close() }()
		it := ic.AggregatedList(ctx, req, noRetry)
		// One page, one request: InternalFetch is the iterator's page
		// function, and Response the page it read.
		if _, _, err := it.InternalFetch(int(maxResults), pageToken); err != nil {
			return nil, err
		}
		page, ok := it.Response.(*computepb.InstanceAggregatedList)
		if !ok {
			return nil, errors.New("aggregated list: unexpected response type")
		}
		return page, nil
	})
}

func (s *sdk) AggregatedAddresses(ctx context.Context, filter string, maxResults uint32, pageToken string) (*computepb.AddressAggregatedList, error) {
	return call(ctx, s.timeout, func(ctx context.Context) (*computepb.AddressAggregatedList, error) {
		req := &computepb.AggregatedListAddressesRequest{Project: s.project, ReturnPartialSuccess: proto.Bool(true)}
		if filter != "" {
			req.Filter = proto.String(filter)
		}
		// As AggregatedInstances: a client of its own that carries ctx.
		ac, err := compute.NewAddressesRESTClient(ctx, append(s.opts[:len(s.opts):len(s.opts)], option.WithHTTPClient(&http.Client{Transport: withContext{ctx: ctx, next: s.rt}}))...)
		if err != nil {
			return nil, err
		}
		defer func() { _ = ac.Close() }()
		it := ac.AggregatedList(ctx, req, noRetry)
		if _, _, err := it.InternalFetch(int(maxResults), pageToken); err != nil {
			return nil, err
		}
		page, ok := it.Response.(*computepb.AddressAggregatedList)
		if !ok {
			return nil, errors.New("aggregated list of addresses: unexpected response type")
		}
		return page, nil
	})
}

func (s *sdk) ListFirewalls(ctx context.Context, maxResults uint32, pageToken string) (*computepb.FirewallList, error) {
	return call(ctx, s.timeout, func(ctx context.Context) (*computepb.FirewallList, error) {
		fc, err := compute.NewFirewallsRESTClient(ctx, append(s.opts[:len(s.opts):len(s.opts)], option.WithHTTPClient(&http.Client{Transport: withContext{ctx: ctx, next: s.rt}}))...)
		if err != nil {
			return nil, err
		}
		defer func() { _ = fc.Close() }()
		it := fc.List(ctx, &computepb.ListFirewallsRequest{Project: s.project}, noRetry)
		if _, _, err := it.InternalFetch(int(maxResults), pageToken); err != nil {
			return nil, err
		}
		page, ok := it.Response.(*computepb.FirewallList)
		if !ok {
			return nil, errors.New("list of firewall rules: unexpected response type")
		}
		return page, nil
	})
}

func (s *sdk) GetOperation(ctx context.Context, op OpRef) (*computepb.Operation, error) {
	switch {
	case op.Zone != "":
		return send(s, ctx, s.zoneOps.Get, &computepb.GetZoneOperationRequest{Project: s.project, Zone: op.Zone, Operation: op.Name})
	case op.Region != "":
		return send(s, ctx, s.regionOps.Get, &computepb.GetRegionOperationRequest{Project: s.project, Region: op.Region, Operation: op.Name})
	default:
		return send(s, ctx, s.globalOps.Get, &computepb.GetGlobalOperationRequest{Project: s.project, Operation: op.Name})
	}
}

func (s *sdk) GetAddress(ctx context.Context, region, name string) (*computepb.Address, error) {
	return send(s, ctx, s.addresses.Get, &computepb.GetAddressRequest{Project: s.project, Region: region, Address: name})
}

func (s *sdk) InsertAddress(ctx context.Context, region string, a *computepb.Address) (*computepb.Operation, error) {
	return start(s, ctx, s.addresses.Insert, &computepb.InsertAddressRequest{Project: s.project, Region: region, AddressResource: a})
}

func (s *sdk) SetAddressLabels(ctx context.Context, region, name, fingerprint string, labels map[string]string) (*computepb.Operation, error) {
	return start(s, ctx, s.addresses.SetLabels, &computepb.SetLabelsAddressRequest{
		Project: s.project, Region: region, Resource: name,
		RegionSetLabelsRequestResource: &computepb.RegionSetLabelsRequest{LabelFingerprint: proto.String(fingerprint), Labels: labels},
	})
}

func (s *sdk) DeleteAddress(ctx context.Context, region, name string) (*computepb.Operation, error) {
	return start(s, ctx, s.addresses.Delete, &computepb.DeleteAddressRequest{Project: s.project, Region: region, Address: name})
}

func (s *sdk) GetFirewall(ctx context.Context, name string) (*computepb.Firewall, error) {
	return send(s, ctx, s.firewalls.Get, &computepb.GetFirewallRequest{Project: s.project, Firewall: name})
}

func (s *sdk) InsertFirewall(ctx context.Context, fw *computepb.Firewall) (*computepb.Operation, error) {
	return start(s, ctx, s.firewalls.Insert, &computepb.InsertFirewallRequest{Project: s.project, FirewallResource: fw})
}

func (s *sdk) PatchFirewall(ctx context.Context, name string, fw *computepb.Firewall) (*computepb.Operation, error) {
	return start(s, ctx, s.firewalls.Patch, &computepb.PatchFirewallRequest{Project: s.project, Firewall: name, FirewallResource: fw})
}

func (s *sdk) DeleteFirewall(ctx context.Context, name string) (*computepb.Operation, error) {
	return start(s, ctx, s.firewalls.Delete, &computepb.DeleteFirewallRequest{Project: s.project, Firewall: name})
}

func (s *sdk) GetGuestAttribute(ctx context.Context, zone, name, key string) (*computepb.GuestAttributes, error) {
	return send(s, ctx, s.instances.GetGuestAttributes, &computepb.GetGuestAttributesInstanceRequest{Project: s.project, Zone: zone, Instance: name, VariableKey: proto.String(key)})
}

func (s *sdk) GetRegion(ctx context.Context, region string) (*computepb.Region, error) {
	return send(s, ctx, s.regions.Get, &computepb.GetRegionRequest{Project: s.project, Region: region})
}

// Close closes every client built; it is safe on a partly built sdk.
func (s *sdk) Close() error {
	return errors.Join(closeBuilt(s.instances), closeBuilt(s.zoneOps), closeBuilt(s.regionOps), closeBuilt(s.globalOps),
		closeBuilt(s.addresses), closeBuilt(s.firewalls), closeBuilt(s.regions))
}

// closeBuilt closes c unless it was never built (nil).
func closeBuilt[T any, C interface {
	*T
	Close() error
}](c C) error {
	if c == nil {
		return nil
	}
	return c.Close()
}

// withContext sends every request with ctx.
type withContext struct {
	ctx  context.Context //nolint:containedctx // The SDK gives the request none: this is where it comes from.
	next http.RoundTripper
}

func (w withContext) RoundTrip(req *http.Request) (*http.Response, error) {
	return w.next.RoundTrip(req.WithContext(w.ctx))
}
