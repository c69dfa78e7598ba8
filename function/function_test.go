package function

import (
	"context"
	"encoding/base64"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/crossplane/function-sdk-go/logging"
	fnv1 "github.com/crossplane/function-sdk-go/proto/v1"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
	"sigs.k8s.io/yaml"
)

// classes is the input of the shipped namespaced Composition, so that the
// tests exercise what platform teams install.
func classes(t *testing.T, file string) *structpb.Struct {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "package", "configuration", file))
	if err != nil {
		t.Fatal(err)
	}
	var comp struct {
		Spec struct {
			Pipeline []struct {
				Input map[string]any `json:"input"`
			} `json:"pipeline"`
		} `json:"spec"`
	}
	if err := yaml.Unmarshal(b, &comp); err != nil {
		t.Fatal(err)
	}
	s, err := structpb.NewStruct(comp.Spec.Pipeline[0].Input)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func obj(t *testing.T, y string) *structpb.Struct {
	t.Helper()
	m := map[string]any{}
	if err := yaml.Unmarshal([]byte(y), &m); err != nil {
		t.Fatal(err)
	}
	s, err := structpb.NewStruct(m)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

const namespacedXR = `
apiVersion: platform.egressproxy.io/v1alpha1
kind: EgressProxy
metadata: {name: payments, namespace: team-a, uid: "1234"}
spec:
  class: %CLASS%
  size: %SIZE%
  allowedClientCIDRs: [10.20.0.0/16]
  allowedDestinations: [.stripe.com]
  auth: %AUTH%
`

const legacyXR = `
apiVersion: legacy.platform.egressproxy.io/v1alpha1
kind: XEgressProxy
metadata: {name: payments-x7k2p, uid: "5678"}
spec:
  class: standard
  allowedClientCIDRs: [10.20.0.0/16]
  writeConnectionSecretToRef: {namespace: crossplane-system, name: "5678"}
`

func xr(class, size, auth string) string {
	return strings.NewReplacer("%CLASS%", class, "%SIZE%", size, "%AUTH%", auth).Replace(namespacedXR)
}

func run(t *testing.T, req *fnv1.RunFunctionRequest) *fnv1.RunFunctionResponse {
	t.Helper()
	rsp, err := New(logging.NewNopLogger()).RunFunction(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	return rsp
}

func fatal(rsp *fnv1.RunFunctionResponse) string {
	for _, r := range rsp.GetResults() {
		if r.GetSeverity() == fnv1.Severity_SEVERITY_FATAL {
			return r.GetMessage()
		}
	}
	return ""
}

// paymentsProxy is the proxy block the namespaced XR payments asks for.
const paymentsProxy = "proxy: {allowedClientCIDRs: [10.20.0.0/16], allowedDestinations: [.stripe.com], allowedPorts: [443]"

// namespacedMR is the managed resource the namespaced Composition desires
// for the XR payments in team-a: a kind on the ClusterProviderConfig config,
// with the forProvider fields given, one a line.
func namespacedMR(kind, config string, forProvider ...string) string {
	return `
apiVersion: proxy.m.egressproxy.io/v1alpha1
kind: ` + kind + `
metadata: {name: payments, namespace: team-a}
spec:
  providerConfigRef: {kind: ClusterProviderConfig, name: ` + config + `}
  writeConnectionSecretToRef: {name: payments-backend}
  forProvider:
    ` + strings.Join(forProvider, "\n    ") + "\n"
}

func TestComposeManagedResource(t *testing.T) {
	const namespaced = "composition-namespaced.yaml"
	cases := map[string]struct {
		xr   string
		file string
		name string
		want string // the desired managed resource
	}{
		"NamespacedStandardIsAPodProxyOnTheClusterConfig": {
			xr: xr("standard", "small", "false"), file: namespaced, name: "proxy-podproxy",
			want: namespacedMR("PodProxy", "pods", paymentsProxy+"}"),
		},
		"NamespacedDedicatedMediumIsAKVMProxyWithAuth": {
			xr: xr("dedicated", "medium", "true"), file: namespaced, name: "proxy-kvmproxy",
			want: namespacedMR("KVMProxy", "home-kvm", "image: debian-12", "machineType: medium", paymentsProxy+", auth: {enabled: true}}"),
		},
		"NamespacedCloudLargeIsAGCPProxyWithAStaticAddress": {
			xr: xr("cloud", "large", "false"), file: namespaced, name: "proxy-gcpproxy",
			want: namespacedMR("GCPProxy", "gcp-prod", "image: ubuntu-2404", "machineType: large",
				"address: {type: Static}", "firewall: {manage: true}", paymentsProxy+"}"),
		},
		"NamespacedDatacenterIsAProxmoxProxy": {
			xr: xr("datacenter", "small", "false"), file: namespaced, name: "proxy-proxmoxproxy",
			want: namespacedMR("ProxmoxProxy", "home-pve", "image: debian-12", "machineType: small", paymentsProxy+"}"),
		},
		"NamespacedWithTLSNamesTheSecretOfItsNamespace": {
			xr: strings.Replace(xr("standard", "small", "true"), "spec:\n", "spec:\n  tlsSecretName: payments-proxy-tls\n", 1), file: namespaced, name: "proxy-podproxy",
			want: namespacedMR("PodProxy", "pods", paymentsProxy+", auth: {enabled: true}, tls: {secretRef: {name: payments-proxy-tls}}}"),
		},
		"LegacyWithTLSNamesTheSecretOfTheClaimsNamespace": {
			xr:   strings.Replace(strings.Replace(legacyXR, `uid: "5678"}`, `uid: "5678", labels: {crossplane.io/claim-namespace: team-a}}`, 1), "spec:\n", "spec:\n  tlsSecretName: payments-proxy-tls\n", 1),
			file: "composition-legacy.yaml", name: "proxy-podproxy",
			want: `
apiVersion: proxy.egressproxy.io/v1alpha1
kind: PodProxy
metadata: {name: payments-x7k2p}
spec:
  providerConfigRef: {name: pods}
  writeConnectionSecretToRef: {namespace: crossplane-system, name: 5678-backend}
  forProvider:
    proxy: {allowedClientCIDRs: [10.20.0.0/16], allowedPorts: [443], tls: {secretRef: {namespace: team-a, name: payments-proxy-tls}}}
`,
		},
		"LegacyIsAClusterScopedPodProxyWritingToTheConnectionNamespace": {
			xr: legacyXR, file: "composition-legacy.yaml", name: "proxy-podproxy",
			want: `
apiVersion: proxy.egressproxy.io/v1alpha1
kind: PodProxy
metadata: {name: payments-x7k2p}
spec:
  providerConfigRef: {name: pods}
  writeConnectionSecretToRef: {namespace: crossplane-system, name: 5678-backend}
  forProvider:
    proxy: {allowedClientCIDRs: [10.20.0.0/16], allowedPorts: [443]}
`,
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			rsp := run(t, &fnv1.RunFunctionRequest{
				Input:    classes(t, tc.file),
				Observed: &fnv1.State{Composite: &fnv1.Resource{Resource: obj(t, tc.xr)}},
			})
			if msg := fatal(rsp); msg != "" {
				t.Fatalf("fatal result: %s", msg)
			}
			got := rsp.GetDesired().GetResources()[tc.name]
			if got == nil {
				t.Fatalf("no desired resource %q; desired: %v", tc.name, rsp.GetDesired().GetResources())
			}
			if diff := cmp.Diff(obj(t, tc.want).AsMap(), got.GetResource().AsMap()); diff != "" {
				t.Errorf("desired managed resource (-want +got):\n%s", diff)
			}
			if got.GetReady() != fnv1.Ready_READY_FALSE {
				t.Errorf("ready = %v before the managed resource exists; want false", got.GetReady())
			}
			if _, ok := rsp.GetDesired().GetResources()[ResourceSecret]; ok {
				t.Error("a connection Secret was composed before there were connection details")
			}
		})
	}
}

func TestRefusals(t *testing.T) {
	cases := map[string]struct {
		xr   string
		file string
		want string
	}{
		"UnknownClass": {xr: xr("premium", "small", "false"), want: `class "premium" is not offered; classes offered: cloud, datacenter, dedicated, standard`},
		"UnknownSize":  {xr: xr("standard", "huge", "false"), want: `size "huge" is not offered by class "standard"; sizes offered: large, medium, small`},
		"NoClients": {xr: `
apiVersion: platform.egressproxy.io/v1alpha1
kind: EgressProxy
metadata: {name: p, namespace: a}
spec: {class: standard}
`, want: "spec.allowedClientCIDRs is required"},
		"TLSOnALegacyCompositeWithoutAClaim": {xr: strings.Replace(legacyXR, "spec:\n", "spec:\n  tlsSecretName: x\n", 1), file: "composition-legacy.yaml",
			want: "spec.tlsSecretName needs a claim"},
		"TheProxysOwnPortAsADestinationPort": {xr: withSpec(xr("standard", "small", "false"), "allowedPorts: [443, 3128]"),
			want: `spec.allowedPorts must not include 3128, the port the proxy of class "standard" listens on`},
		"TheProxysOwnPortOnALegacyComposite": {xr: withSpec(legacyXR, "allowedPorts: [3128]"), file: "composition-legacy.yaml",
			want: "spec.allowedPorts must not include 3128"},
		"ConnectionSecretNamedLikeABackendSecret": {xr: withSpec(xr("standard", "small", "false"), "connectionSecretName: payments-backend"),
			want: `spec.connectionSecretName "payments-backend" ends in "-backend"`},
		"ConnectionSecretNamedLikeTheTLSSecret": {xr: withSpec(xr("standard", "small", "true"), "connectionSecretName: payments-tls", "tlsSecretName: payments-tls"),
			want: `spec.connectionSecretName "payments-tls" is also spec.tlsSecretName`},
		"DefaultConnectionSecretNameIsTheTLSSecret": {xr: withSpec(xr("standard", "small", "true"), "tlsSecretName: payments-proxy"),
			want: `the default connection Secret name "payments-proxy" is also spec.tlsSecretName`},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			file := tc.file
			if file == "" {
				file = "composition-namespaced.yaml"
			}
			rsp := run(t, &fnv1.RunFunctionRequest{
				Input:    classes(t, file),
				Observed: &fnv1.State{Composite: &fnv1.Resource{Resource: obj(t, tc.xr)}},
			})
			if got := fatal(rsp); !strings.Contains(got, tc.want) {
				t.Errorf("fatal result %q; want it to say %q", got, tc.want)
			}
			if n := len(rsp.GetDesired().GetResources()); n != 0 {
				t.Errorf("%d resources composed for a refused request", n)
			}
			refusedOnTheClaim(t, rsp, tc.want)
		})
	}
}

// withSpec adds lines to a composite's spec.
func withSpec(xr string, lines ...string) string {
	return strings.Replace(xr, "spec:\n", "spec:\n  "+strings.Join(lines, "\n  ")+"\n", 1)
}

// refusedOnTheClaim checks that a refusal saying want reaches a claim:
// Crossplane stops at the Fatal result before making it an event, puts its
// error on the composite only, and copies to the claim only conditions and
// events aimed at it, placed before the Fatal.
func refusedOnTheClaim(t *testing.T, rsp *fnv1.RunFunctionResponse, want string) {
	t.Helper()
	var cond *fnv1.Condition
	for _, c := range rsp.GetConditions() {
		if c.GetType() == TypeRequestAccepted {
			cond = c
		}
	}
	if cond.GetStatus() != fnv1.Status_STATUS_CONDITION_FALSE || cond.GetReason() != ReasonRefused ||
		cond.GetTarget() != fnv1.Target_TARGET_COMPOSITE_AND_CLAIM || !strings.Contains(cond.GetMessage(), want) {
		t.Errorf("condition %v; want %s=False, reason %s, on the composite and claim, saying %q", cond, TypeRequestAccepted, ReasonRefused, want)
	}
	warned := false
	for _, r := range rsp.GetResults() {
		if r.GetSeverity() == fnv1.Severity_SEVERITY_FATAL {
			break
		}
		warned = warned || r.GetSeverity() == fnv1.Severity_SEVERITY_WARNING && r.GetTarget() == fnv1.Target_TARGET_COMPOSITE_AND_CLAIM && strings.Contains(r.GetMessage(), want)
	}
	if !warned {
		t.Errorf("no Warning for the composite and claim saying %q before the Fatal result; results: %v", want, rsp.GetResults())
	}
}

// A claim's owner sees why the request is refused (the classes offered),
// and sees the condition turn True once the request is fixed.
func TestRefusalReachesTheClaim(t *testing.T) {
	claimed := strings.Replace(legacyXR, `uid: "5678"}`, `uid: "5678", labels: {crossplane.io/claim-name: orders, crossplane.io/claim-namespace: team-b}}`, 1)
	rsp := run(t, &fnv1.RunFunctionRequest{
		Input:    classes(t, "composition-legacy.yaml"),
		Observed: &fnv1.State{Composite: &fnv1.Resource{Resource: obj(t, strings.Replace(claimed, "class: standard", "class: premium", 1))}},
	})
	refusedOnTheClaim(t, rsp, `class "premium" is not offered; classes offered: cloud, datacenter, dedicated, standard`)

	rsp = run(t, &fnv1.RunFunctionRequest{
		Input:    classes(t, "composition-legacy.yaml"),
		Observed: &fnv1.State{Composite: &fnv1.Resource{Resource: obj(t, claimed)}},
	})
	if msg := fatal(rsp); msg != "" {
		t.Fatal(msg)
	}
	want := &fnv1.Condition{Type: TypeRequestAccepted, Status: fnv1.Status_STATUS_CONDITION_TRUE, Reason: ReasonAccepted, Target: fnv1.Target_TARGET_COMPOSITE_AND_CLAIM.Enum()}
	if len(rsp.GetConditions()) != 1 || !proto.Equal(want, rsp.GetConditions()[0]) {
		t.Errorf("conditions %v; want only %v", rsp.GetConditions(), want)
	}
}

// A Composition step without input is the platform team's to fix, and
// says so rather than "classes offered: (none)".
func TestNoInputIsThePlatformsError(t *testing.T) {
	for name, in := range map[string]*structpb.Struct{"NoInput": nil, "NoClasses": obj(t, "{apiVersion: function.egressproxy.io/v1alpha1, kind: ProxyClasses}")} {
		t.Run(name, func(t *testing.T) {
			rsp := run(t, &fnv1.RunFunctionRequest{Input: in, Observed: &fnv1.State{Composite: &fnv1.Resource{Resource: obj(t, xr("standard", "small", "false"))}}})
			const want = "the Composition gives this function no ProxyClasses input naming classes"
			if got := fatal(rsp); !strings.Contains(got, want) || strings.Contains(got, "(none)") {
				t.Errorf("fatal result %q; want it to say %q", got, want)
			}
			refusedOnTheClaim(t, rsp, want)
		})
	}
}

// The proxy's own port is never a destination port, whoever lists it,
// and a class cannot make the proxy listen on 80 or 443: what the
// managed resource would refuse is refused here, naming whose it is.
func TestPorts(t *testing.T) {
	class := func(params map[string]any) *ProxyClasses {
		return &ProxyClasses{DefaultClass: "standard", Classes: map[string]Class{"standard": {Kind: "PodProxy",
			ProviderConfigRef: ProviderConfigRef{Name: "pods"}, Parameters: params, Sizes: map[string]Size{"small": {}}}}}
	}
	cases := map[string]struct {
		params map[string]any // the class's
		ports  []int64        // the request's
		want   string         // the refusal; empty: accepted
	}{
		"DefaultPortRequested":       {ports: []int64{443, 3128}, want: "spec.allowedPorts must not include 3128"},
		"ClassPortRequested":         {params: map[string]any{"proxy": map[string]any{"port": float64(8080)}}, ports: []int64{8080}, want: "spec.allowedPorts must not include 8080"},
		"DefaultPortFreeOnAnother":   {params: map[string]any{"proxy": map[string]any{"port": float64(8080)}}, ports: []int64{3128, 8443}},
		"OtherPorts":                 {ports: []int64{443, 8443}},
		"ClassListsItsOwnPort":       {params: map[string]any{"proxy": map[string]any{"port": int64(8080), "allowedPorts": []any{int64(443), int64(8080)}}}, want: `class "standard" (size "small") parameters list the proxy's own port 8080`},
		"TeamPortsReplaceTheClasses": {params: map[string]any{"proxy": map[string]any{"port": int64(8080), "allowedPorts": []any{int64(8080)}}}, ports: []int64{443}},
		"ClassListensOn443":          {params: map[string]any{"proxy": map[string]any{"port": float64(443)}}, want: "parameters set proxy.port 443, a destination port"},
		"ClassPortNotANumber":        {params: map[string]any{"proxy": map[string]any{"port": "http"}}, want: "parameters set proxy.port to http, not a port"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			_, _, err := Compose(class(tc.params), "team-a", "p", "uid", "", Request{AllowedClientCIDRs: []string{"10.0.0.0/16"}, AllowedPorts: tc.ports})
			if tc.want == "" {
				if err != nil {
					t.Errorf("Compose = %v; want it accepted", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Compose = %v; want it to say %q", err, tc.want)
			}
		})
	}
}

// observedMR is a PodProxy as the provider leaves it once Ready.
func observedMR(t *testing.T, ready, synced string) *fnv1.Resource {
	t.Helper()
	return &fnv1.Resource{
		Resource: obj(t, `
apiVersion: proxy.m.egressproxy.io/v1alpha1
kind: PodProxy
metadata: {name: payments, namespace: team-a}
status:
  atProvider: {endpoint: "10.1.2.3:3128", state: Running, egressIP: 203.0.113.7, egressIPs: [203.0.113.7, 203.0.113.8], egressIPSource: Verified, egressIPVerifiedAt: "2026-12-03T14:00:00Z"}
  conditions:
  - {type: Ready, status: "`+ready+`", reason: Available}
  - {type: Synced, status: "`+synced+`", reason: ReconcileError, message: "machineType: unknown key"}
  - {type: EgressVerified, status: "False", reason: CheckFailed, message: "the egress check through the proxy with http://echo.example/ip failed: answered 502"}
`),
		ConnectionDetails: map[string][]byte{"url": []byte("http://u:p@10.1.2.3:3128"), "host": []byte("10.1.2.3"), "port": []byte("3128"), "username": []byte("u"), "password": []byte("p"),
			"endpoint": []byte("10.1.2.3:3128"), "HTTP_PROXY": []byte("http://u:p@10.1.2.3:3128"), "no_proxy": []byte("localhost"), "egressIP": []byte("203.0.113.7"), "other": []byte("x")},
	}
}

func TestNamespacedReadyAndConnectionSecret(t *testing.T) {
	rsp := run(t, &fnv1.RunFunctionRequest{
		Input: classes(t, "composition-namespaced.yaml"),
		Observed: &fnv1.State{
			Composite: &fnv1.Resource{Resource: obj(t, xr("standard", "small", "true"))},
			Resources: map[string]*fnv1.Resource{"proxy-podproxy": observedMR(t, "True", "True")},
		},
	})
	if msg := fatal(rsp); msg != "" {
		t.Fatal(msg)
	}
	res := rsp.GetDesired().GetResources()
	if res["proxy-podproxy"].GetReady() != fnv1.Ready_READY_TRUE {
		t.Errorf("managed resource ready = %v; want true", res["proxy-podproxy"].GetReady())
	}
	sec := res[ResourceSecret]
	if sec == nil || sec.GetReady() != fnv1.Ready_READY_TRUE {
		t.Fatalf("connection Secret %v; want one, ready", sec)
	}
	b64 := func(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }
	want := obj(t, `
apiVersion: v1
kind: Secret
metadata: {name: payments-proxy, namespace: team-a}
type: connection.crossplane.io/v1alpha1
data: {url: `+b64("http://u:p@10.1.2.3:3128")+`, host: `+b64("10.1.2.3")+`, port: `+b64("3128")+`, username: `+b64("u")+`, password: `+b64("p")+`,
  endpoint: `+b64("10.1.2.3:3128")+`, HTTP_PROXY: `+b64("http://u:p@10.1.2.3:3128")+`, no_proxy: `+b64("localhost")+`, egressIP: `+b64("203.0.113.7")+`}
`)
	if diff := cmp.Diff(want.AsMap(), sec.GetResource().AsMap()); diff != "" {
		t.Errorf("connection Secret (-want +got):\n%s", diff)
	}
	status := rsp.GetDesired().GetComposite().GetResource().AsMap()["status"]
	wantStatus := map[string]any{"proxy": map[string]any{"class": "standard", "size": "small", "backend": "PodProxy", "endpoint": "10.1.2.3:3128", "state": "Running", "connectionSecret": "payments-proxy",
		"egressIP": "203.0.113.7", "egressIPs": []any{"203.0.113.7", "203.0.113.8"}, "egressIPSource": "Verified", "egressIPVerifiedAt": "2026-12-03T14:00:00Z", "egressCheck": "CheckFailed"}}
	if diff := cmp.Diff(wantStatus, status); diff != "" {
		t.Errorf("composite status (-want +got):\n%s", diff)
	}
	if n := len(rsp.GetDesired().GetComposite().GetConnectionDetails()); n != 0 {
		t.Errorf("a namespaced composite got %d connection details; it has no connection Secret", n)
	}
	// A failed egress check reaches the team that sees only the composite.
	var warned bool
	for _, r := range rsp.GetResults() {
		warned = warned || r.GetSeverity() == fnv1.Severity_SEVERITY_WARNING && r.GetTarget() == fnv1.Target_TARGET_COMPOSITE_AND_CLAIM &&
			strings.Contains(r.GetMessage(), "the egress address: the egress check through the proxy with http://echo.example/ip failed: answered 502")
	}
	if !warned {
		t.Errorf("no warning for the composite carrying the failed egress check; results: %v", rsp.GetResults())
	}
}

func TestLegacyConnectionDetailsAndWarning(t *testing.T) {
	rsp := run(t, &fnv1.RunFunctionRequest{
		Input: classes(t, "composition-legacy.yaml"),
		Observed: &fnv1.State{
			Composite: &fnv1.Resource{Resource: obj(t, legacyXR)},
			Resources: map[string]*fnv1.Resource{"proxy-podproxy": observedMR(t, "False", "False")},
		},
	})
	if msg := fatal(rsp); msg != "" {
		t.Fatal(msg)
	}
	if r := rsp.GetDesired().GetResources()["proxy-podproxy"].GetReady(); r != fnv1.Ready_READY_FALSE {
		t.Errorf("ready = %v for a managed resource that is not Ready; want false", r)
	}
	got := map[string]string{}
	for k, v := range rsp.GetDesired().GetComposite().GetConnectionDetails() {
		got[k] = string(v)
	}
	// Every key the provider publishes and this proxy does not is blank.
	want := map[string]string{"url": "http://u:p@10.1.2.3:3128", "host": "10.1.2.3", "port": "3128", "username": "u", "password": "p",
		"endpoint": "10.1.2.3:3128", "HTTP_PROXY": "http://u:p@10.1.2.3:3128", "no_proxy": "localhost", "egressIP": "203.0.113.7",
		"HTTPS_PROXY": "", "http_proxy": "", "https_proxy": "", "NO_PROXY": "", "egressIPs": "", "ca.crt": ""}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("composite connection details (-want +got):\n%s", diff)
	}
	if _, ok := rsp.GetDesired().GetResources()[ResourceSecret]; ok {
		t.Error("a legacy composite got a composed Secret; its connection Secret is Crossplane's")
	}
	var warned bool
	for _, r := range rsp.GetResults() {
		if r.GetSeverity() == fnv1.Severity_SEVERITY_WARNING && strings.Contains(r.GetMessage(), "machineType: unknown key") &&
			r.GetTarget() == fnv1.Target_TARGET_COMPOSITE_AND_CLAIM {
			warned = true
		}
	}
	if !warned {
		t.Errorf("no warning for the claim carrying the managed resource's Synced=False message; results: %v", rsp.GetResults())
	}
}

// TestKeepsEarlierSteps: resources an earlier pipeline step composed stay.
func TestKeepsEarlierSteps(t *testing.T) {
	rsp := run(t, &fnv1.RunFunctionRequest{
		Input:    classes(t, "composition-namespaced.yaml"),
		Observed: &fnv1.State{Composite: &fnv1.Resource{Resource: obj(t, xr("standard", "small", "false"))}},
		Desired:  &fnv1.State{Resources: map[string]*fnv1.Resource{"other": {Resource: obj(t, "{apiVersion: v1, kind: ConfigMap, metadata: {name: x}}")}}},
	})
	if _, ok := rsp.GetDesired().GetResources()["other"]; !ok {
		t.Error("the earlier step's resource was dropped")
	}
}

// A claim's connection Secret gets only the keys the legacy XRD lists:
// they must be every key the provider publishes.
func TestLegacyXRDListsEveryConnectionKey(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "package", "configuration", "xrd-legacy.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var xrd struct {
		Spec struct {
			ConnectionSecretKeys []string `json:"connectionSecretKeys"`
		} `json:"spec"`
	}
	if err := yaml.Unmarshal(b, &xrd); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(ConnectionKeys, xrd.Spec.ConnectionSecretKeys); diff != "" {
		t.Errorf("xrd-legacy.yaml connectionSecretKeys (-provider's keys +XRD's):\n%s", diff)
	}
}

// A composite that left its class to the Composition keeps the class its
// proxy was made with when the Composition's defaultClass changes.
func TestEmptyClassKeepsTheClassMadeWith(t *testing.T) {
	u := map[string]any{}
	if err := yaml.Unmarshal([]byte(strings.NewReplacer("  class: standard\n", "", "  size: small\n", "").Replace(xr("standard", "small", "true"))), &u); err != nil {
		t.Fatal(err)
	}
	u["status"] = map[string]any{"proxy": map[string]any{"class": "dedicated", "size": "large", "backend": "KVMProxy"}}
	xrs, err := structpb.NewStruct(u)
	if err != nil {
		t.Fatal(err)
	}
	rsp := run(t, &fnv1.RunFunctionRequest{Input: classes(t, "composition-namespaced.yaml"), Observed: &fnv1.State{Composite: &fnv1.Resource{Resource: xrs}}})
	if msg := fatal(rsp); msg != "" {
		t.Fatal(msg)
	}
	res := rsp.GetDesired().GetResources()
	if _, ok := res["proxy-kvmproxy"]; !ok || res["proxy-podproxy"] != nil {
		t.Fatalf("desired resources %v; want the KVMProxy of the class made with (dedicated), not the default class's PodProxy", keysOf(res))
	}
	if mt := res["proxy-kvmproxy"].GetResource().GetFields()["spec"].GetStructValue().GetFields()["forProvider"].GetStructValue().GetFields()["machineType"].GetStringValue(); mt != "large" {
		t.Errorf("machineType %v; want large, the size made with", mt)
	}
}

func keysOf[V any](m map[string]V) []string {
	out := []string{}
	for k := range m {
		out = append(out, k)
	}
	return out
}

// A Composition's class parameters that the kind has no field for are
// refused, naming them, rather than dropped by the API server in silence.
func TestClassParametersAreChecked(t *testing.T) {
	base := &ProxyClasses{DefaultClass: "dedicated", Classes: map[string]Class{}}
	cases := map[string]struct {
		class, size map[string]any
		want        []string
	}{
		"TopLevelTypo": {class: map[string]any{"image": "debian-12", "machinetype": "small"}, want: []string{`class "dedicated" (size "small")`, "machinetype (the fields here:", "machineType"}},
		"NestedTypo":   {class: map[string]any{"proxy": map[string]any{"allowedPort": []any{int64(443)}}}, want: []string{"proxy.allowedPort (the fields here:", "allowedPorts"}},
		"InTheSize":    {size: map[string]any{"zone": "europe-west1-b"}, want: []string{"zone (the fields here:"}},
		"ClassTLS":     {class: map[string]any{"proxy": map[string]any{"tls": map[string]any{"secretRef": map[string]any{"name": "x"}}}}, want: []string{"proxy.tls, which is the team's to ask for"}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			in := *base
			in.Classes = map[string]Class{"dedicated": {Kind: "KVMProxy", ProviderConfigRef: ProviderConfigRef{Kind: "ClusterProviderConfig", Name: "home-kvm"},
				Parameters: tc.class, Sizes: map[string]Size{"small": {Parameters: tc.size}}}}
			_, _, err := Compose(&in, "team-a", "p", "uid", "", Request{Size: "small", AllowedClientCIDRs: []string{"10.0.0.0/8"}})
			for _, w := range tc.want {
				if err == nil || !strings.Contains(err.Error(), w) {
					t.Errorf("Compose = %v; want it to say %q", err, w)
				}
			}
		})
	}
	// The shipped Compositions' classes are all sound.
	for _, file := range []string{"composition-namespaced.yaml", "composition-legacy.yaml"} {
		for _, class := range []string{"standard", "dedicated", "datacenter", "cloud"} {
			for _, size := range []string{"small", "medium", "large"} {
				if msg := fatal(run(t, &fnv1.RunFunctionRequest{Input: classes(t, file), Observed: &fnv1.State{Composite: &fnv1.Resource{Resource: obj(t, xr(class, size, "true"))}}})); msg != "" {
					t.Errorf("%s, class %s, size %s: %s", file, class, size, msg)
				}
			}
		}
	}
}

// A legacy composite's connection details blank every key the proxy no
// longer publishes: Crossplane merge-patches the composite's Secret (a
// missing key stays as it was) and the claim's Secret copies it. The blank
// values must survive the wire to Crossplane, where an empty value is
// written as "".
func TestLegacyBlanksKeysNoLongerPublished(t *testing.T) {
	mr := observedMR(t, "True", "True")
	for _, k := range []string{"username", "password", "egressIP"} { // auth off, the egress address unknown
		delete(mr.ConnectionDetails, k)
	}
	rsp := run(t, &fnv1.RunFunctionRequest{
		Input:    classes(t, "composition-legacy.yaml"),
		Observed: &fnv1.State{Composite: &fnv1.Resource{Resource: obj(t, legacyXR)}, Resources: map[string]*fnv1.Resource{"proxy-podproxy": mr}},
	})
	if msg := fatal(rsp); msg != "" {
		t.Fatal(msg)
	}
	b, err := proto.Marshal(rsp)
	if err != nil {
		t.Fatal(err)
	}
	wire := &fnv1.RunFunctionResponse{}
	if err := proto.Unmarshal(b, wire); err != nil {
		t.Fatal(err)
	}
	got := wire.GetDesired().GetComposite().GetConnectionDetails()
	for _, k := range ConnectionKeys {
		v, ok := got[k]
		if !ok {
			t.Errorf("connection key %s missing: the claim's Secret would keep its old value", k)
		}
		if want := string(mr.ConnectionDetails[k]); string(v) != want {
			t.Errorf("connection key %s = %q; want %q", k, v, want)
		}
	}
	if _, ok := got["other"]; ok {
		t.Error("a key the provider does not publish was passed on")
	}

	// Without connection details (the managed resource not there yet, or
	// publishing nothing) the composite's Secret is left as it is.
	rsp = run(t, &fnv1.RunFunctionRequest{Input: classes(t, "composition-legacy.yaml"), Observed: &fnv1.State{Composite: &fnv1.Resource{Resource: obj(t, legacyXR)}}})
	if n := len(rsp.GetDesired().GetComposite().GetConnectionDetails()); n != 0 {
		t.Errorf("%d connection details without a managed resource; want none", n)
	}
}

// The composed connection Secret has Crossplane's connection Secret type,
// so an existing Secret of another type (the type is immutable) is never
// taken over; one an earlier version composed as Opaque stays Opaque; and
// a name changed after creation (before the XRD fixed it) is reported,
// while the status names the Secret Crossplane goes on writing.
func TestNamespacedConnectionSecretTypeAndName(t *testing.T) {
	observed := func(name, typ, controller string) map[string]*fnv1.Resource {
		return map[string]*fnv1.Resource{
			"proxy-podproxy": observedMR(t, "True", "True"),
			ResourceSecret: {Resource: obj(t, "{apiVersion: v1, kind: Secret, type: "+typ+", metadata: {name: "+name+", namespace: team-a, "+
				"ownerReferences: [{apiVersion: platform.egressproxy.io/v1alpha1, kind: EgressProxy, name: payments, uid: '"+controller+"', controller: true}]}}")},
		}
	}
	cases := map[string]struct {
		xr       string
		observed map[string]*fnv1.Resource
		typ      string
		secret   string // status.proxy.connectionSecret
		warning  string
	}{
		"New": {xr: xr("standard", "small", "true"), observed: map[string]*fnv1.Resource{"proxy-podproxy": observedMR(t, "True", "True")},
			typ: "connection.crossplane.io/v1alpha1", secret: "payments-proxy"},
		"ComposedOpaqueBefore": {xr: xr("standard", "small", "true"), observed: observed("payments-proxy", "Opaque", "1234"), typ: "Opaque", secret: "payments-proxy"},
		"SomeoneElsesOpaque": {xr: xr("standard", "small", "true"), observed: observed("payments-proxy", "Opaque", "9999"),
			typ: "connection.crossplane.io/v1alpha1", secret: "payments-proxy"},
		"Renamed": {xr: withSpec(xr("standard", "small", "true"), "connectionSecretName: app-proxy"), observed: observed("payments-proxy", "connection.crossplane.io/v1alpha1", "1234"),
			typ: "connection.crossplane.io/v1alpha1", secret: "payments-proxy", warning: `spec.connectionSecretName "app-proxy" is not the connection Secret's name, payments-proxy`},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			rsp := run(t, &fnv1.RunFunctionRequest{
				Input:    classes(t, "composition-namespaced.yaml"),
				Observed: &fnv1.State{Composite: &fnv1.Resource{Resource: obj(t, tc.xr)}, Resources: tc.observed},
			})
			if msg := fatal(rsp); msg != "" {
				t.Fatal(msg)
			}
			if typ := rsp.GetDesired().GetResources()[ResourceSecret].GetResource().AsMap()["type"]; typ != tc.typ {
				t.Errorf("Secret type %v; want %s", typ, tc.typ)
			}
			st, _ := rsp.GetDesired().GetComposite().GetResource().AsMap()["status"].(map[string]any)
			if p, _ := st["proxy"].(map[string]any); p["connectionSecret"] != tc.secret {
				t.Errorf("status.proxy.connectionSecret %v; want %s", p["connectionSecret"], tc.secret)
			}
			warned := false
			for _, r := range rsp.GetResults() {
				warned = warned || r.GetSeverity() == fnv1.Severity_SEVERITY_WARNING && tc.warning != "" && strings.Contains(r.GetMessage(), tc.warning) && r.GetTarget() == fnv1.Target_TARGET_COMPOSITE_AND_CLAIM
			}
			if warned != (tc.warning != "") {
				t.Errorf("warned %v; want a warning saying %q; results %v", warned, tc.warning, rsp.GetResults())
			}
		})
	}
}
