// Package function is the composition function behind the EgressProxy
// composite resources (package/configuration): it turns an application
// team's request (a class, a size, allowed clients and destinations, auth
// on or off) into the managed resource the platform team's class names
// (KVMProxy, ProxmoxProxy, GCPProxy or PodProxy, in the composite's scope),
// with the platform's defaults, reports the managed resource's readiness
// as the composite's, and delivers the proxy URL:
//
//   - a cluster-scoped (legacy) composite gets the managed resource's
//     connection details as its own, which Crossplane writes to the
//     composite's connection Secret and from there to its claim's;
//   - a namespaced composite, which in Crossplane v2 has no connection
//     Secret, gets a composed Secret in its namespace holding them.
//
// The mapping from classes to backends is the function's input
// (ProxyClasses), written by the platform team in the Composition.
package function

import (
	"context"
	"encoding/base64"
	"fmt"
	"maps"
	"math"
	"slices"
	"sort"
	"strings"

	xpresource "github.com/crossplane/crossplane-runtime/v2/pkg/resource"
	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
	"github.com/crossplane/function-sdk-go/errors"
	"github.com/crossplane/function-sdk-go/logging"
	fnv1 "github.com/crossplane/function-sdk-go/proto/v1"
	"github.com/crossplane/function-sdk-go/request"
	"github.com/crossplane/function-sdk-go/resource"
	"github.com/crossplane/function-sdk-go/resource/composed"
	"github.com/crossplane/function-sdk-go/response"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	spec "github.com/egressproxy/provider-egressproxy/apis/spec/v1alpha1"
)

// Names of the composed resources, as the Composition's pipeline knows
// them.
const (
	// ResourceProxyPrefix, followed by the lowercase kind, names the
	// managed resource. The kind is part of the name so that a composite
	// whose class moved to another backend gets a new managed resource and
	// loses the old one, instead of Crossplane trying to turn one kind into
	// another.
	ResourceProxyPrefix = "proxy-"
	// ResourceSecret names the composed connection Secret of a namespaced
	// composite.
	ResourceSecret = "connection-secret"
)

// API groups and version of the managed resources, by the composite's
// scope.
const (
	// GroupNamespaced is the group of the kinds a namespaced composite gets.
	GroupNamespaced = "proxy.m.egressproxy.io"
	// GroupCluster is the group of the kinds a cluster-scoped (legacy)
	// composite gets.
	GroupCluster = "proxy.egressproxy.io"
	// Version of both.
	Version = "v1alpha1"
)

// LabelClaimNamespace is the label Crossplane puts on a claim's composite,
// naming the claim's namespace.
const LabelClaimNamespace = "crossplane.io/claim-namespace"

// Kinds are the managed resource kinds a class may name.
var Kinds = []string{"GCPProxy", "KVMProxy", "PodProxy", "ProxmoxProxy"}

// Defaults.
const (
	// DefaultSize is the size of a request that names none, when its class
	// sets no defaultSize.
	DefaultSize = "small"
	// DefaultConnectionSecretNamespace is where cluster-scoped managed
	// resources write their connection Secrets when nothing else says.
	DefaultConnectionSecretNamespace = "crossplane-system" //nolint:gosec // A namespace, not a credential.
	// SecretSuffix names a namespaced composite's connection Secret when
	// the request names none: <composite name>-proxy.
	SecretSuffix = "-proxy"
	// BackendSecretSuffix names the managed resource's own connection
	// Secret, which the function reads and application teams need not:
	// <composite name>-backend in the composite's namespace, or
	// <composite UID>-backend in the legacy connection namespace.
	BackendSecretSuffix = "-backend"
)

// ConnectionKeys are the keys of the connection Secret, as the provider
// publishes them; the composite passes on these and no others.
var ConnectionKeys = spec.ConnectionKeys

// Request is what an application team writes in a composite's (or
// claim's) spec.
type Request struct {
	// Class the platform team maps to a backend.
	Class string `json:"class,omitempty"`
	// Size: small, medium, large; the class says what each means.
	Size string `json:"size,omitempty"`
	// AllowedClientCIDRs may use the proxy.
	AllowedClientCIDRs []string `json:"allowedClientCIDRs,omitempty"`
	// AllowedDestinations is an optional domain allow-list.
	AllowedDestinations []string `json:"allowedDestinations,omitempty"`
	// AllowedPorts are the CONNECT ports; the class's default otherwise.
	// Never the proxy's own port.
	AllowedPorts []int64 `json:"allowedPorts,omitempty"`
	// Auth turns basic authentication on.
	Auth bool `json:"auth,omitempty"`
	// TLSSecretName names a Secret with tls.crt and tls.key in the
	// composite's namespace (a claim's, for a cluster-scoped composite):
	// the proxy listens with TLS.
	TLSSecretName string `json:"tlsSecretName,omitempty"`
	// ClaimNamespace is the namespace of a cluster-scoped composite's
	// claim (its crossplane.io/claim-namespace label), where its
	// TLSSecretName is read: never one the spec names.
	ClaimNamespace string `json:"-"`
	// ConnectionSecretName names a namespaced composite's connection
	// Secret. Default: <composite name>-proxy. Never TLSSecretName nor a
	// name ending in BackendSecretSuffix; fixed once created (the XRD).
	ConnectionSecretName string `json:"connectionSecretName,omitempty"`
}

// Function is the composition function.
type Function struct {
	fnv1.UnimplementedFunctionRunnerServiceServer

	log logging.Logger
}

// New returns the function, logging to log.
func New(log logging.Logger) *Function { return &Function{log: log} }

// The condition saying whether the function accepted the request, on the
// composite and its claim.
const (
	// TypeRequestAccepted is True once the request composed, False with
	// the reason it was refused.
	TypeRequestAccepted = "RequestAccepted"
	// ReasonAccepted: the request composed.
	ReasonAccepted = "Accepted"
	// ReasonRefused: the request, or the Composition, was refused; the
	// message says why and what would be accepted.
	ReasonRefused = "Refused"
)

// RunFunction composes the managed resource (and, for a namespaced
// composite, its connection Secret) for one composite resource. Whatever
// stops it is a RequestAccepted=False condition and a Warning on the
// composite and its claim, then a Fatal result, and nothing new is
// composed.
func (f *Function) RunFunction(_ context.Context, req *fnv1.RunFunctionRequest) (*fnv1.RunFunctionResponse, error) {
	rsp := response.To(req, response.DefaultTTL)
	if err := f.compose(req, rsp); err != nil {
		// Crossplane stops at a Fatal result before making it an event,
		// and sets its error on the composite only; the conditions and
		// results placed before it are what reach the claim.
		response.ConditionFalse(rsp, TypeRequestAccepted, ReasonRefused).WithMessage(err.Error()).TargetCompositeAndClaim()
		response.Warning(rsp, err).TargetCompositeAndClaim()
		response.Fatal(rsp, err)
		return rsp, nil
	}
	// True again once a refused request is fixed.
	response.ConditionTrue(rsp, TypeRequestAccepted, ReasonAccepted).TargetCompositeAndClaim()
	return rsp, nil
}

// compose fills rsp for req.
func (f *Function) compose(req *fnv1.RunFunctionRequest, rsp *fnv1.RunFunctionResponse) error {
	in := &ProxyClasses{}
	if err := request.GetInput(req, in); err != nil {
		return errors.Wrap(err, "cannot read the function's input (ProxyClasses)")
	}
	oxr, err := request.GetObservedCompositeResource(req)
	if err != nil {
		return errors.Wrap(err, "cannot read the observed composite resource")
	}
	var r Request
	if err := oxr.Resource.GetValueInto("spec", &r); err != nil {
		return errors.Wrap(err, "cannot read the composite resource's spec")
	}
	r.ClaimNamespace = oxr.Resource.GetLabels()[LabelClaimNamespace]
	// The class and size the proxy was made with, not today's defaults: a
	// Composition whose defaults change must not replace or resize the
	// proxies of every composite that left the choice to it.
	if r.Class == "" {
		if made, err := oxr.Resource.GetString("status.proxy.class"); err == nil {
			r.Class = made
		}
	}
	if r.Size == "" {
		if made, err := oxr.Resource.GetString("status.proxy.size"); err == nil {
			r.Size = made
		}
	}
	log := f.log.WithValues("xr", oxr.Resource.GetName(), "namespace", oxr.Resource.GetNamespace(), "class", r.Class, "size", r.Size)

	mr, plan, err := Compose(in, oxr.Resource.GetNamespace(), oxr.Resource.GetName(), string(oxr.Resource.GetUID()), connectionNamespace(in, oxr), r)
	if err != nil {
		// The application team's mistake (an unknown class or size) or
		// the platform team's (a class without a ProviderConfig): say
		// so on the composite and its claim, and compose nothing new.
		return err
	}

	observed, err := request.GetObservedComposedResources(req)
	if err != nil {
		return errors.Wrap(err, "cannot read the observed composed resources")
	}
	desired, err := request.GetDesiredComposedResources(req)
	if err != nil {
		return errors.Wrap(err, "cannot read the desired composed resources")
	}
	dxr, err := request.GetDesiredCompositeResource(req)
	if err != nil {
		return errors.Wrap(err, "cannot read the desired composite resource")
	}

	name := resource.Name(ResourceProxyPrefix + strings.ToLower(plan.Kind))
	omr, exists := observed[name]
	ready := resource.ReadyFalse
	var conn resource.ConnectionDetails
	status := map[string]any{"class": plan.Class, "size": plan.Size, "backend": plan.Kind}
	if exists {
		if omr.Resource.GetCondition(xpv2.TypeReady).Status == corev1.ConditionTrue {
			ready = resource.ReadyTrue
		}
		if c := omr.Resource.GetCondition(xpv2.TypeSynced); c.Status == corev1.ConditionFalse && c.Message != "" {
			// Whatever the provider refuses (an unknown catalogue key,
			// a missing ProviderConfig) is the team's to see.
			response.Warning(rsp, errors.Errorf("%s %s: %s", plan.Kind, omr.Resource.GetName(), c.Message)).TargetCompositeAndClaim()
		}
		conn = omr.ConnectionDetails
		if s, err := omr.Resource.GetString("status.atProvider.endpoint"); err == nil && s != "" {
			status["endpoint"] = s
		}
		if s, err := omr.Resource.GetString("status.atProvider.state"); err == nil && s != "" {
			status["state"] = s
		}
		// The address a vendor allow-lists, and how the provider knows it.
		for _, k := range []string{"egressIP", "egressIPSource", "egressIPVerifiedAt"} {
			if s, err := omr.Resource.GetString("status.atProvider." + k); err == nil && s != "" {
				status[k] = s
			}
		}
		// Every address, where a PodProxy's replicas leave from several.
		if ips, err := omr.Resource.GetStringArray("status.atProvider.egressIPs"); err == nil && len(ips) > 0 {
			status["egressIPs"] = ips
		}
		// Whether the check stands behind the address: a team that sees
		// only the composite must see a check that fails or disagrees.
		if c := omr.Resource.GetCondition(spec.TypeEgressVerified); c.Reason != "" {
			status["egressCheck"] = string(c.Reason)
			if c.Status == corev1.ConditionFalse && c.Message != "" {
				response.Warning(rsp, errors.Errorf("%s %s: the egress address: %s", plan.Kind, omr.Resource.GetName(), c.Message)).TargetCompositeAndClaim()
			}
		}
	}
	desired[name] = &resource.DesiredComposed{Resource: mr, Ready: ready}

	details := resource.ConnectionDetails{}
	for _, k := range ConnectionKeys {
		if v, ok := conn[k]; ok && len(v) > 0 {
			details[k] = v
		}
	}
	if plan.Namespaced {
		// The composed Secret appears once there is something to put in
		// it: an empty Secret would only tell a client to retry.
		if len(details[spec.ConnectionURL]) > 0 {
			s := ConnectionSecret(oxr.Resource.GetNamespace(), plan.SecretName, details)
			if o, ok := observed[ResourceSecret]; ok {
				// A Secret's type is immutable: one this composite made
				// Opaque, in an earlier version, stays so.
				if c := metav1.GetControllerOf(o.Resource); c != nil && c.UID == oxr.Resource.GetUID() {
					if t, err := o.Resource.GetString("type"); err == nil && t != "" {
						s.Object["type"] = t
					}
				}
				// Crossplane goes on writing the Secret it made first.
				// The XRD fixes the name; a composite renamed before it
				// did is told, and its status names the Secret that
				// exists.
				if n := o.Resource.GetName(); n != "" && n != plan.SecretName {
					response.Warning(rsp, errors.Errorf("spec.connectionSecretName %q is not the connection Secret's name, %s, which is fixed once created; create a new EgressProxy for another name", plan.SecretName, n)).TargetCompositeAndClaim()
					plan.SecretName = n
				}
			}
			desired[ResourceSecret] = &resource.DesiredComposed{Resource: s, Ready: resource.ReadyTrue}
			status["connectionSecret"] = plan.SecretName
		}
	} else if len(details) > 0 {
		if dxr.ConnectionDetails == nil {
			dxr.ConnectionDetails = resource.ConnectionDetails{}
		}
		maps.Copy(dxr.ConnectionDetails, details)
		// Crossplane writes the composite's Secret with a JSON merge
		// patch, which never removes a key, and the claim's Secret copies
		// it: a key the proxy no longer publishes (auth turned off, TLS
		// removed, the egress address no longer known) is blanked, never
		// left stale. An empty value reaches Crossplane as "", not null.
		for _, k := range ConnectionKeys {
			if _, ok := dxr.ConnectionDetails[k]; !ok {
				dxr.ConnectionDetails[k] = []byte{}
			}
		}
	}

	if err := response.SetDesiredComposedResources(rsp, desired); err != nil {
		return errors.Wrap(err, "cannot set the desired composed resources")
	}
	if err := dxr.Resource.SetValue("status.proxy", status); err != nil {
		return errors.Wrap(err, "cannot set the composite's status")
	}
	if err := response.SetDesiredCompositeResource(rsp, dxr); err != nil {
		return errors.Wrap(err, "cannot set the desired composite resource")
	}
	log.Debug("Composed", "plan", plan.String(), "ready", ready, "connectionKeys", len(details))
	return nil
}

// connectionNamespace is where a cluster-scoped managed resource writes its
// connection Secret: the composite's own connection namespace (set from the
// Composition's writeConnectionSecretsToNamespace), else the input's, else
// crossplane-system.
func connectionNamespace(in *ProxyClasses, oxr *resource.Composite) string {
	if ref := oxr.Resource.GetWriteConnectionSecretToReference(); ref != nil && ref.Namespace != "" {
		return ref.Namespace
	}
	if in.ConnectionSecretNamespace != "" {
		return in.ConnectionSecretNamespace
	}
	return DefaultConnectionSecretNamespace
}

// Plan is what Compose decided, besides the managed resource itself.
type Plan struct {
	// Class and Size chosen (the request's, or the defaults), and the
	// managed resource Kind the class names.
	Class, Size, Kind string
	// Namespaced is true for a namespaced composite.
	Namespaced bool
	// SecretName is a namespaced composite's connection Secret.
	SecretName string
}

// Compose returns the managed resource for a request of the composite
// namespace/name (namespace empty for a cluster-scoped composite, whose UID
// names the managed resource's connection Secret in connNamespace).
func Compose(in *ProxyClasses, namespace, name, uid, connNamespace string, r Request) (*composed.Unstructured, Plan, error) {
	p := Plan{Class: r.Class, Size: r.Size, Namespaced: namespace != ""}
	if len(in.Classes) == 0 {
		// Not the team's mistake: a pipeline step without input (or with
		// no classes) offers nothing to anyone.
		return nil, p, errors.New("the Composition gives this function no ProxyClasses input naming classes (its pipeline step's input): no class can be offered until the platform team fixes the Composition")
	}
	if p.Class == "" {
		p.Class = in.DefaultClass
	}
	if p.Class == "" {
		return nil, p, errors.Errorf("the request names no class and the Composition sets no defaultClass; classes offered: %s", keys(in.Classes))
	}
	c, ok := in.Classes[p.Class]
	if !ok {
		return nil, p, errors.Errorf("class %q is not offered; classes offered: %s", p.Class, keys(in.Classes))
	}
	if !slices.Contains(Kinds, c.Kind) {
		return nil, p, errors.Errorf("class %q names kind %q; the Composition must name one of %s", p.Class, c.Kind, strings.Join(Kinds, ", "))
	}
	p.Kind = c.Kind
	if p.Size == "" {
		p.Size = c.DefaultSize
	}
	if p.Size == "" {
		p.Size = DefaultSize
	}
	sz, ok := c.Sizes[p.Size]
	if !ok {
		return nil, p, errors.Errorf("size %q is not offered by class %q; sizes offered: %s", p.Size, p.Class, keys(c.Sizes))
	}
	pc := c.ProviderConfigRef
	if sz.ProviderConfigRef != nil {
		pc = *sz.ProviderConfigRef
	}
	if pc.Name == "" {
		return nil, p, errors.Errorf("class %q (size %q) names no providerConfigRef in the Composition", p.Class, p.Size)
	}
	if len(r.AllowedClientCIDRs) == 0 {
		// The XRD requires them; a composite written around it (or an
		// older schema) must not get an open proxy.
		return nil, p, errors.New("spec.allowedClientCIDRs is required: the proxy is never open")
	}

	fp := merge(merge(map[string]any{}, c.Parameters), sz.Parameters)
	if bad := unknownFields(fp, parameters[c.Kind], ""); len(bad) > 0 {
		return nil, p, errors.Errorf("class %q (size %q) parameters name what %s's spec.forProvider has not: %s; fix the Composition", p.Class, p.Size, c.Kind, strings.Join(bad, "; "))
	}
	if px, _ := fp["proxy"].(map[string]any); px != nil && px["tls"] != nil {
		return nil, p, errors.Errorf("class %q (size %q) parameters set proxy.tls, which is the team's to ask for (spec.tlsSecretName), never a class's; fix the Composition", p.Class, p.Size)
	}
	proxy, _ := fp["proxy"].(map[string]any)
	if proxy == nil {
		proxy = map[string]any{}
	}
	proxy["allowedClientCIDRs"] = strs(r.AllowedClientCIDRs)
	if len(r.AllowedDestinations) > 0 {
		proxy["allowedDestinations"] = strs(r.AllowedDestinations)
	}
	if len(r.AllowedPorts) > 0 {
		ports := make([]any, len(r.AllowedPorts))
		for i, v := range r.AllowedPorts {
			ports[i] = v
		}
		proxy["allowedPorts"] = ports
	}
	if err := checkPorts(p, proxy, len(r.AllowedPorts) > 0); err != nil {
		return nil, p, err
	}
	if r.Auth {
		auth, _ := proxy["auth"].(map[string]any)
		if auth == nil {
			auth = map[string]any{}
		}
		auth["enabled"] = true
		proxy["auth"] = auth
	} else {
		// Off means off, whatever the class's defaults say.
		delete(proxy, "auth")
	}
	delete(proxy, "tls") // the team's to ask for, never a class's
	if r.TLSSecretName != "" {
		ref := map[string]any{"name": r.TLSSecretName}
		if !p.Namespaced {
			// The claim's own namespace: a claim never names a Secret of
			// another (as a namespaced resource's refs cannot).
			if r.ClaimNamespace == "" {
				return nil, p, errors.New("spec.tlsSecretName needs a claim: a cluster-scoped composite reads the Secret from its claim's namespace")
			}
			ref["namespace"] = r.ClaimNamespace
		}
		proxy["tls"] = map[string]any{"secretRef": ref}
	}
	fp["proxy"] = proxy

	mr := composed.New()
	mr.SetKind(c.Kind)
	mr.SetName(name)
	specm := map[string]any{"forProvider": fp}
	if p.Namespaced {
		mr.SetAPIVersion(GroupNamespaced + "/" + Version)
		mr.SetNamespace(namespace)
		kind := pc.Kind
		if kind == "" {
			kind = "ClusterProviderConfig"
		}
		specm["providerConfigRef"] = map[string]any{"kind": kind, "name": pc.Name}
		specm["writeConnectionSecretToRef"] = map[string]any{"name": name + BackendSecretSuffix}
		p.SecretName = r.ConnectionSecretName
		if p.SecretName == "" {
			p.SecretName = name + SecretSuffix
		}
		if err := checkSecretName(p.SecretName, r); err != nil {
			return nil, p, err
		}
	} else {
		mr.SetAPIVersion(GroupCluster + "/" + Version)
		specm["providerConfigRef"] = map[string]any{"name": pc.Name}
		specm["writeConnectionSecretToRef"] = map[string]any{"namespace": connNamespace, "name": uid + BackendSecretSuffix}
	}
	mr.Object["spec"] = specm
	return mr, p, nil
}

// DefaultProxyPort is the port a proxy listens on when its class sets no
// proxy.port: the managed resources' default.
const DefaultProxyPort = 3128

// checkPorts refuses what the managed resource would refuse about the
// ports of the merged proxy block: the proxy's own port as a destination
// port (a tunnel there could loop back into the proxy), and a listening
// port of 80 or 443. teamPorts says whether allowedPorts are the request's
// (the team's to fix) or the class's (the platform team's).
func checkPorts(p Plan, proxy map[string]any, teamPorts bool) error {
	port := int64(DefaultProxyPort)
	if v, ok := proxy["port"]; ok {
		n, ok := integer(v)
		if !ok || n < 1 || n > 65535 {
			return errors.Errorf("class %q (size %q) parameters set proxy.port to %v, not a port from 1 to 65535; fix the Composition", p.Class, p.Size, v)
		}
		port = n
	}
	if port == 80 || port == 443 {
		return errors.Errorf("class %q (size %q) parameters set proxy.port %d, a destination port (plain HTTP goes to 80 and 443); fix the Composition", p.Class, p.Size, port)
	}
	ports, _ := proxy["allowedPorts"].([]any)
	for _, v := range ports {
		if n, ok := integer(v); !ok || n != port {
			continue
		}
		if teamPorts {
			return errors.Errorf("spec.allowedPorts must not include %d, the port the proxy of class %q listens on: a tunnel to it could loop back into the proxy; accepted: up to 32 ports from 1 to 65535 other than %d, or none for 443", port, p.Class, port)
		}
		return errors.Errorf("class %q (size %q) parameters list the proxy's own port %d in proxy.allowedPorts; fix the Composition", p.Class, p.Size, port)
	}
	return nil
}

// integer is v as an integer, as JSON (float64) or Go (int64, int) gives
// it.
func integer(v any) (int64, bool) {
	switch n := v.(type) {
	case int64:
		return n, true
	case int:
		return int64(n), true
	case int32:
		return int64(n), true
	case float64:
		if n != math.Trunc(n) || math.Abs(n) > 1<<53 {
			return 0, false
		}
		return int64(n), true
	}
	return 0, false
}

// checkSecretName refuses a namespaced composite's connection Secret name
// that is another Secret the proxy depends on: the composite would become
// its controller, overwrite its keys and delete it with itself.
func checkSecretName(name string, r Request) error {
	field := "spec.connectionSecretName"
	if r.ConnectionSecretName == "" {
		field = "the default connection Secret name"
	}
	if strings.HasSuffix(name, BackendSecretSuffix) {
		return errors.Errorf("%s %q ends in %q, which names the managed resources' own connection Secrets; choose a name that does not", field, name, BackendSecretSuffix)
	}
	if r.TLSSecretName != "" && name == r.TLSSecretName {
		return errors.Errorf("%s %q is also spec.tlsSecretName, the proxy's certificate; the connection Secret needs a name of its own (spec.connectionSecretName)", field, name)
	}
	return nil
}

// ConnectionSecret is a namespaced composite's connection Secret, of the
// type Crossplane gives connection Secrets: an existing Secret of another
// type (immutable) is never taken over.
func ConnectionSecret(namespace, name string, details resource.ConnectionDetails) *composed.Unstructured {
	s := composed.New()
	s.SetAPIVersion("v1")
	s.SetKind("Secret")
	s.SetNamespace(namespace)
	s.SetName(name)
	data := map[string]any{}
	for k, v := range details {
		// Unstructured Secrets carry data base64-encoded, as the API does.
		data[k] = base64.StdEncoding.EncodeToString(v)
	}
	s.Object["type"] = string(xpresource.SecretTypeConnection)
	s.Object["data"] = data
	return s
}

// merge copies src into dst, recursively for maps, and returns dst. Lists
// and scalars in src replace dst's.
func merge(dst, src map[string]any) map[string]any {
	for k, v := range src {
		if sm, ok := v.(map[string]any); ok {
			dm, _ := dst[k].(map[string]any)
			if dm == nil {
				dm = map[string]any{}
			}
			dst[k] = merge(dm, sm)
			continue
		}
		dst[k] = deepCopy(v)
	}
	return dst
}

func deepCopy(v any) any {
	switch t := v.(type) {
	case map[string]any:
		return merge(map[string]any{}, t)
	case []any:
		out := make([]any, len(t))
		for i := range t {
			out[i] = deepCopy(t[i])
		}
		return out
	default:
		return v
	}
}

func strs(s []string) []any {
	out := make([]any, len(s))
	for i := range s {
		out[i] = s[i]
	}
	return out
}

func keys[V any](m map[string]V) string {
	if len(m) == 0 {
		return "(none)"
	}
	k := make([]string, 0, len(m))
	for n := range m {
		k = append(k, n)
	}
	sort.Strings(k)
	return strings.Join(k, ", ")
}

// String describes a plan for logs and messages.
func (p Plan) String() string {
	return fmt.Sprintf("class %s, size %s: %s", p.Class, p.Size, p.Kind)
}
