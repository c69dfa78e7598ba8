package netguard

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
)

// refusingClient answers every read of the cluster's networks with err.
func refusingClient(t *testing.T, err func(what string) error) client.Reader {
	t.Helper()
	s := runtime.NewScheme()
	if e := clientgoscheme.AddToScheme(s); e != nil {
		t.Fatal(e)
	}
	return fake.NewClientBuilder().WithScheme(s).WithInterceptorFuncs(interceptor.Funcs{
		Get: func(_ context.Context, _ client.WithWatch, _ client.ObjectKey, _ client.Object, _ ...client.GetOption) error {
			return err("services")
		},
		List: func(_ context.Context, _ client.WithWatch, l client.ObjectList, _ ...client.ListOption) error {
			switch l.(type) {
			case *networkingv1.ServiceCIDRList:
				return err("servicecidrs")
			case *corev1.NodeList:
				return err("nodes")
			default:
				return err("endpointslices")
			}
		},
	}).Build()
}

// The provider's guard of tenants' endpoints cannot tell the cluster's
// networks from any other private network while it may not read them (a
// provider installed with Crossplane's grant alone): then it refuses every
// private range, saying which reads it lacks and the three ways out; a
// public address still passes, an allowed range opens, and ranges the
// platform team denies stand in for no read: the reads it lacks stay
// unknown.
func TestUnreadableClusterNetworksRefusePrivateRanges(t *testing.T) {
	ctx := context.Background()
	forbidden := func(what string) error {
		return kerrors.NewForbidden(schema.GroupResource{Resource: what}, "", nil)
	}
	d := &Discovery{Reader: refusingClient(t, forbidden)}
	g := New(Options{Cluster: d})
	for _, a := range []string{"10.96.12.34", "172.18.0.3", "192.168.1.10", "100.64.3.7", "fd12::1", "::ffff:10.244.3.7"} {
		err := g.Check(ctx, netip.MustParseAddr(a))
		if !IsRefused(err) {
			t.Errorf("Check(%s) while the cluster's networks are unreadable = %v; want a refusal", a, err)
			continue
		}
		for _, want := range []string{"may not read", "endpoints", "nodes", "servicecidrs", "cluster/rbac/podproxy.yaml", "--tenant-endpoint-service-cidrs", "--tenant-endpoint-pod-cidrs", "--tenant-endpoint-allowed-cidrs"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("Check(%s) = %q; want it to say %q", a, err, want)
			}
		}
	}
	if err := g.Check(ctx, netip.MustParseAddr("198.51.100.7")); err != nil {
		t.Errorf("Check of a public address = %v; want nil", err)
	}
	open := New(Options{Cluster: d, Allowed: []netip.Prefix{netip.MustParsePrefix("10.20.0.0/16")}})
	if err := open.Check(ctx, netip.MustParseAddr("10.20.0.9")); err != nil {
		t.Errorf("Check inside an allowed range = %v; want nil", err)
	}
	if err := open.Check(ctx, netip.MustParseAddr("10.21.0.9")); !IsRefused(err) {
		t.Errorf("Check outside the allowed range = %v; want a refusal", err)
	}
	named := New(Options{Cluster: d, Denied: []netip.Prefix{netip.MustParsePrefix("10.96.0.0/12")}})
	if err := named.Check(ctx, netip.MustParseAddr("10.96.12.34")); !IsRefused(err) || strings.Contains(err.Error(), "may not read") {
		t.Errorf("Check of a named denied range = %v; want the platform's denial", err)
	}
	if err := named.Check(ctx, netip.MustParseAddr("192.168.1.10")); !IsRefused(err) || !strings.Contains(err.Error(), "may not read") {
		t.Errorf("Check of a private address the platform did not deny, with Denied set = %v; want a refusal: the reads are still missing", err)
	}
	both := New(Options{Cluster: d, ServiceCIDRs: mustPrefixes(t, "10.96.0.0/12"), PodCIDRs: mustPrefixes(t, "10.244.0.0/16")})
	if err := both.Check(ctx, netip.MustParseAddr("192.168.1.10")); !IsRefused(err) || !strings.Contains(err.Error(), "endpoints, nodes") {
		t.Errorf("Check of a private address with the Service and pod networks named, the nodes and endpoints unread = %v; want a refusal naming those", err)
	}
}

// A cluster without the ServiceCIDR kind (before Kubernetes 1.33) leaves
// the Service network unknown: that too refuses the private ranges. A
// cluster that answers every read refuses only its own networks.
func TestServiceCIDRsNotServedIsUnreadable(t *testing.T) {
	ctx := context.Background()
	noMatch := func(what string) error {
		if what == "servicecidrs" {
			return &apimeta.NoKindMatchError{GroupKind: schema.GroupKind{Group: "networking.k8s.io", Kind: "ServiceCIDR"}}
		}
		if what == "services" {
			return kerrors.NewNotFound(schema.GroupResource{Resource: what}, "kubernetes")
		}
		return nil
	}
	d := &Discovery{Reader: refusingClient(t, noMatch)}
	if got := d.Unreadable(ctx); len(got) != 1 || got[0] != "servicecidrs" {
		t.Fatalf("Unreadable = %v; want [servicecidrs] (a missing kubernetes Service is an answer)", got)
	}
	if err := New(Options{Cluster: d}).Check(ctx, netip.MustParseAddr("10.96.12.34")); !IsRefused(err) {
		t.Errorf("Check of a private address without ServiceCIDRs = %v; want a refusal", err)
	}
	all := &Discovery{Reader: refusingClient(t, func(string) error { return nil })}
	if got := all.Unreadable(ctx); len(got) != 0 {
		t.Errorf("Unreadable of a cluster that answers = %v; want none", got)
	}
	if err := New(Options{Cluster: all}).Check(ctx, netip.MustParseAddr("10.96.12.34")); err != nil {
		t.Errorf("Check of a private address outside a readable cluster's networks = %v; want nil", err)
	}
}

// A failed dial of a name names the name, never the address it resolved
// to, and stays a dial error.
func TestDialErrorNamesTheNameNotTheAddress(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.77:0")
	if err != nil {
		t.Skipf("no 127.0.0.77: %v", err)
	}
	_, port, _ := net.SplitHostPort(l.Addr().String())
	_ = l.Close()
	g := New(Options{Allowed: []netip.Prefix{netip.MustParsePrefix("127.0.0.77/32")}, Resolver: resolver{"db.corp.example": {"127.0.0.77"}}})
	_, err = g.DialContext(context.Background(), "tcp", net.JoinHostPort("db.corp.example", port))
	var oe *net.OpError
	if err == nil || strings.Contains(err.Error(), "127.0.0.77") || !strings.Contains(err.Error(), "db.corp.example") || !errors.As(err, &oe) || oe.Op != "dial" {
		t.Errorf("dial of a closed port by name = %v; want a dial error naming db.corp.example and not its address", err)
	}
}

// A redirect the guard refuses is named by the URL the tenant wrote; the
// target the endpoint chose (a path, a query with a signature, a host) is
// never quoted.
func TestRefusedRedirectQuotesNotItsTarget(t *testing.T) {
	for name, target := range map[string]string{
		"scheme":   "ftp://SENTINEL-host.example/SENTINEL-path?X-Amz-Signature=SENTINEL-sig",
		"metadata": "http://169.254.169.254/SENTINEL-path?sig=SENTINEL-sig",
		"name":     "http://SENTINEL.localhost/x",
		"unknown":  "http://SENTINEL.invalid/x",
	} {
		t.Run(name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				http.Redirect(w, r, target, http.StatusFound)
			}))
			defer srv.Close()
			g := New(Options{Allowed: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}, Resolver: resolver{}})
			c := &http.Client{Transport: g.Transport(&http.Transport{Proxy: func(*http.Request) (*url.URL, error) { return nil, nil }}), CheckRedirect: g.CheckRedirect}
			resp, err := c.Get(srv.URL + "/image.qcow2")
			if resp != nil {
				_ = resp.Body.Close()
			}
			// net/http names the request's URL around the error; the
			// provider's callers leave that out (what the guard says is
			// what reaches a condition).
			var ue *url.Error
			if !errors.As(err, &ue) {
				t.Fatalf("GET redirected to %s = %v; want a *url.Error", target, err)
			}
			if err := ue.Err; strings.Contains(err.Error(), "SENTINEL") || !strings.Contains(err.Error(), "a redirect from "+strings.TrimPrefix(srv.URL, "http://")) {
				t.Errorf("GET redirected to %s = %v; want a refusal naming the redirect's origin, quoting nothing of its target", target, err)
			}
			// Quiet does it for a caller that does not.
			q := Quiet(fmt.Errorf("cannot read: %w", err), "the URL")
			if strings.Contains(q.Error(), "SENTINEL") || IsRefused(ue.Err) && (!IsRefused(q) || !strings.HasPrefix(q.Error(), "cannot read: ")) {
				t.Errorf("Quiet(GET redirected to %s) = %v; want the refusal, its context kept, quoting nothing of the target", target, q)
			}
		})
	}
}

// A cluster whose CNI assigns pod addresses itself (no node states a pod
// range, as with Calico's IPAM) has a pod network the provider cannot
// tell: every private range is refused for tenants, saying so, until the
// platform team names it (PodCIDRs) or opens a range; once every node
// states its range, only the cluster's networks are refused.
func TestUnstatedPodNetworkIsUnreadable(t *testing.T) {
	ctx := context.Background()
	var reads atomic.Int32
	var fail atomic.Bool
	node := func(name, podCIDR string) *corev1.Node {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "192.168.5." + name[len(name)-1:]}}}}
		if podCIDR != "" {
			n.Spec.PodCIDR, n.Spec.PodCIDRs = podCIDR, []string{podCIDR}
		}
		return n
	}
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "kubernetes"}, Spec: corev1.ServiceSpec{ClusterIP: "10.96.0.1", ClusterIPs: []string{"10.96.0.1"}}}
	cidr := &networkingv1.ServiceCIDR{ObjectMeta: metav1.ObjectMeta{Name: "kubernetes"}, Spec: networkingv1.ServiceCIDRSpec{CIDRs: []string{"10.96.0.0/12"}}}

	d := &Discovery{Reader: countingClient(t, &reads, &fail, svc, cidr, node("n1", "10.244.1.0/24"), node("n2", "")), TTL: time.Nanosecond, Retry: time.Nanosecond}
	if got := d.Unreadable(ctx); !slices.Equal(got, []string{"pod network"}) {
		t.Fatalf("Unreadable with a node that states no pod range = %v; want [pod network]", got)
	}
	// A read that fails on the way tells nothing new: still unknown.
	fail.Store(true)
	if got := d.Unreadable(ctx); !slices.Equal(got, []string{"pod network"}) {
		t.Errorf("Unreadable after a failed read = %v; want [pod network] still", got)
	}
	if err := New(Options{Cluster: d}).Check(ctx, netip.MustParseAddr("10.8.3.4")); !IsRefused(err) {
		t.Errorf("Check of a private address after a failed read = %v; want a refusal still", err)
	}
	fail.Store(false)
	err := New(Options{Cluster: d}).Check(ctx, netip.MustParseAddr("10.8.3.4"))
	if !IsRefused(err) || !strings.Contains(err.Error(), "pod network") || !strings.Contains(err.Error(), "--tenant-endpoint-pod-cidrs") || strings.Contains(err.Error(), "rbac") {
		t.Errorf("Check of a private address while the pod network is unstated = %v; want a refusal naming it and the way out", err)
	}
	if err := New(Options{Cluster: d}).Check(ctx, netip.MustParseAddr("198.51.100.7")); err != nil {
		t.Errorf("Check of a public address = %v; want nil", err)
	}
	if err := New(Options{Cluster: d, Denied: mustPrefixes(t, "10.8.0.0/16")}).Check(ctx, netip.MustParseAddr("172.20.0.9")); !IsRefused(err) {
		t.Errorf("Check with a range denied, the pod network not named = %v; want a refusal", err)
	}
	named := New(Options{Cluster: d, PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.8.0.0/16")}})
	if err := named.Check(ctx, netip.MustParseAddr("10.8.3.4")); !IsRefused(err) {
		t.Errorf("Check inside the pod network the platform named = %v; want a refusal", err)
	}
	if err := named.Check(ctx, netip.MustParseAddr("172.20.0.9")); err != nil {
		t.Errorf("Check outside it, the pod network named = %v; want nil", err)
	}

	stated := &Discovery{Reader: countingClient(t, &reads, &fail, svc, cidr, node("n1", "10.244.1.0/24"), node("n2", "10.244.2.0/24"))}
	if got := stated.Unreadable(ctx); len(got) != 0 {
		t.Errorf("Unreadable when every node states its pod range = %v; want none", got)
	}
	g := New(Options{Cluster: stated})
	if err := g.Check(ctx, netip.MustParseAddr("10.244.2.7")); !IsRefused(err) {
		t.Errorf("Check of a pod address = %v; want a refusal", err)
	}
	if err := g.Check(ctx, netip.MustParseAddr("10.8.3.4")); err != nil {
		t.Errorf("Check of a private address outside the cluster's networks = %v; want nil", err)
	}
}

// Quiet takes the URL net/http names out of every error it passes (a
// refusal, a failed dial or lookup, a timeout): after a redirect it is
// the target the endpoint chose. An API endpoint's redirect is refused
// before anything connects to where it leads, naming only its origin.
func TestQuietNamesNoURL(t *testing.T) {
	const target = "https://sentinel.example/x?token=SENTINEL"
	for name, cause := range map[string]error{
		"Dial":    &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connect: connection refused")},
		"Lookup":  &net.DNSError{Err: "no such host", Name: "db.corp.example"},
		"Timeout": context.DeadlineExceeded,
		"Refused": refused("a redirect from api.example", "its target is a loopback address"),
	} {
		q := Quiet(&url.Error{Op: "Get", URL: target, Err: cause}, "the URL")
		if strings.Contains(strings.ToLower(q.Error()), "sentinel") || !errors.Is(q, cause) {
			t.Errorf("%s: Quiet = %q; want no URL, unwrapping to its cause", name, q)
		}
	}

	srv := httptest.NewServer(http.RedirectHandler("http://sentinel.example/x", http.StatusFound))
	defer srv.Close()
	g := New(Options{Allowed: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}, Resolver: resolver{}})
	c := &http.Client{Transport: g.Transport(&http.Transport{Proxy: func(*http.Request) (*url.URL, error) { return nil, nil }}), CheckRedirect: g.NoRedirects}
	resp, err := c.Get(srv.URL + "/api")
	if resp != nil {
		_ = resp.Body.Close()
	}
	if q := Quiet(err, "the URL"); !IsRefused(q) || strings.Contains(strings.ToLower(q.Error()), "sentinel") || !strings.Contains(q.Error(), "a redirect from "+strings.TrimPrefix(srv.URL, "http://")) {
		t.Errorf("GET of an API that redirects = %v; want a refusal naming the redirect's origin alone", q)
	}
}
