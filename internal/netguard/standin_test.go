package netguard

import (
	"context"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/go-logr/logr/funcr"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
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

// platformCluster is a cluster whose network reads answer: the kubernetes
// Service 10.96.0.1, the API server 192.168.49.2, the Service CIDR
// 10.96.0.0/12, one node 10.0.1.5 with pod range 10.244.0.0/24, and an
// internal LoadBalancer Service of the platform (ingress 10.0.1.200,
// externalIP 10.0.1.201). noServiceCIDRs: the cluster predates 1.33.
func platformCluster(t *testing.T, noServiceCIDRs bool) client.Reader {
	t.Helper()
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	objs := []client.Object{
		&corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "kubernetes"}, Spec: corev1.ServiceSpec{ClusterIPs: []string{"10.96.0.1"}}},
		&discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "kubernetes", Labels: map[string]string{discoveryv1.LabelServiceName: "kubernetes"}},
			AddressType: discoveryv1.AddressTypeIPv4, Endpoints: []discoveryv1.Endpoint{{Addresses: []string{"192.168.49.2"}}}},
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}, Spec: corev1.NodeSpec{PodCIDR: "10.244.0.0/24", PodCIDRs: []string{"10.244.0.0/24"}},
			Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "10.0.1.5"}}}},
		&corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "platform", Name: "vault"},
			Spec:   corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, ClusterIPs: []string{"10.96.7.7"}, ExternalIPs: []string{"10.0.1.201"}},
			Status: corev1.ServiceStatus{LoadBalancer: corev1.LoadBalancerStatus{Ingress: []corev1.LoadBalancerIngress{{IP: "10.0.1.200"}}}}},
	}
	if !noServiceCIDRs {
		objs = append(objs, &networkingv1.ServiceCIDR{ObjectMeta: metav1.ObjectMeta{Name: "kubernetes"}, Spec: networkingv1.ServiceCIDRSpec{CIDRs: []string{"10.96.0.0/12"}}})
	}
	return fake.NewClientBuilder().WithScheme(s).WithObjects(objs...).WithInterceptorFuncs(interceptor.Funcs{
		List: func(ctx context.Context, c client.WithWatch, l client.ObjectList, opts ...client.ListOption) error {
			if _, ok := l.(*networkingv1.ServiceCIDRList); ok && noServiceCIDRs {
				return &apimeta.NoKindMatchError{GroupKind: schema.GroupKind{Group: "networking.k8s.io", Kind: "ServiceCIDR"}}
			}
			return c.List(ctx, l, opts...)
		},
	}).Build()
}

// TestUnknownServiceNetworkStaysRefused: on a cluster that serves no
// ServiceCIDRs (before Kubernetes 1.33), a tenant's endpoint at any
// ClusterIP is refused, whatever other ranges the platform team denies;
// naming the Service network stands in for the read, after which a
// private address outside the cluster's networks is allowed. The provider
// logs once that the Service network is unknown.
func TestUnknownServiceNetworkStaysRefused(t *testing.T) {
	ctx := context.Background()
	d := &Discovery{Reader: platformCluster(t, true)}
	dns := netip.MustParseAddr("10.96.0.10") // any ClusterIP but the kubernetes Service's
	var logged []string
	log := funcr.New(func(_, args string) { logged = append(logged, args) }, funcr.Options{})
	for name, g := range map[string]*Guard{
		"no flag":            New(Options{Cluster: d, Log: log}),
		"an unrelated range": New(Options{Cluster: d, Denied: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/16")}}),
		"the pod network":    New(Options{Cluster: d, PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}}),
	} {
		err := g.Check(ctx, dns)
		if !IsRefused(err) || !strings.Contains(err.Error(), "servicecidrs") || !strings.Contains(err.Error(), "--tenant-endpoint-service-cidrs") {
			t.Errorf("with %s named, Check(%s) = %v; want a refusal naming the unread servicecidrs and --tenant-endpoint-service-cidrs", name, dns, err)
		}
		_ = g.Check(ctx, dns)
	}
	if len(logged) != 1 || !strings.Contains(logged[0], "servicecidrs") {
		t.Errorf("logged %q; want one line naming servicecidrs", logged)
	}

	named := New(Options{Cluster: d, ServiceCIDRs: []netip.Prefix{netip.MustParsePrefix("10.96.0.0/12")}})
	if err := named.Check(ctx, dns); !IsRefused(err) || !strings.Contains(err.Error(), "own cluster") {
		t.Errorf("with the Service network named, Check(%s) = %v; want a refusal as the cluster's", dns, err)
	}
	if err := named.Check(ctx, netip.MustParseAddr("172.20.3.4")); err != nil {
		t.Errorf("with the Service network named, Check of a private address outside the cluster = %v; want nil", err)
	}
}

// TestServicesExternalAddressesRefused: a tenant's endpoint at a platform
// Service's load balancer or external IP (kube-proxy sends the provider's
// connection there straight to the Service's pods) is refused as the
// provider's own cluster, though every other read answers; a PodProxy's
// denials (Cluster) leave them out. Without the right to list Services,
// the provider says so and refuses every private range.
func TestServicesExternalAddressesRefused(t *testing.T) {
	ctx := context.Background()
	d := &Discovery{Reader: platformCluster(t, false), Services: true}
	g := New(Options{Cluster: d})
	for _, a := range []string{"10.0.1.200", "10.0.1.201"} {
		if err := g.Check(ctx, netip.MustParseAddr(a)); !IsRefused(err) || !strings.Contains(err.Error(), "own cluster") {
			t.Errorf("a tenant's endpoint at a platform Service's address %s: %v; want refused as the cluster's", a, err)
		}
	}
	if err := g.Check(ctx, netip.MustParseAddr("10.0.1.6")); err != nil {
		t.Errorf("a private address outside the cluster: %v; want nil", err)
	}
	for _, p := range d.Cluster().Networks(ctx) {
		if p.Contains(netip.MustParseAddr("10.0.1.200")) {
			t.Errorf("a PodProxy's denials hold the load balancer address (%s)", p)
		}
	}

	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	noServices := fake.NewClientBuilder().WithScheme(s).WithInterceptorFuncs(interceptor.Funcs{
		List: func(ctx context.Context, c client.WithWatch, l client.ObjectList, opts ...client.ListOption) error {
			if _, ok := l.(*corev1.ServiceList); ok {
				return kerrors.NewForbidden(schema.GroupResource{Resource: "services"}, "", nil)
			}
			return c.List(ctx, l, opts...)
		},
	}).Build()
	noList := &Discovery{Reader: noServices, Services: true}
	forbidden := New(Options{Cluster: noList})
	if err := forbidden.Check(ctx, netip.MustParseAddr("10.0.1.200")); !IsRefused(err) || !strings.Contains(err.Error(), "(services)") {
		t.Errorf("without the right to list Services: %v; want every private range refused, naming services", err)
	}
	// The proxies are not denied the Services' addresses, so a list they
	// do not use is nothing unknown to them.
	if p, ok := noList.Cluster().(Partial); !ok || slices.Contains(p.Unreadable(ctx), servicesSource) {
		t.Errorf("the proxies' view of the cluster counts the Services' list as unknown")
	}
}

// TestReadServicesListsFromTheWatchCache: the Services' addresses are one
// list of every namespace's Services from the API server's watch cache.
func TestReadServicesListsFromTheWatchCache(t *testing.T) {
	var calls []client.ListOptions
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	r := fake.NewClientBuilder().WithScheme(s).WithObjects(
		&corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "platform", Name: "ingress"}, Spec: corev1.ServiceSpec{LoadBalancerIP: "203.0.113.40"}},
	).WithInterceptorFuncs(interceptor.Funcs{
		List: func(ctx context.Context, c client.WithWatch, l client.ObjectList, opts ...client.ListOption) error {
			var lo client.ListOptions
			lo.ApplyOptions(opts)
			calls = append(calls, lo)
			return c.List(ctx, l, opts...)
		},
	}).Build()
	src := ReadServices(context.Background(), r)
	if src.Err != nil || len(src.Prefixes) != 1 || src.Prefixes[0] != netip.MustParsePrefix("203.0.113.40/32") {
		t.Errorf("ReadServices = %+v; want 203.0.113.40/32", src)
	}
	if len(calls) != 1 || calls[0].Namespace != "" || calls[0].Raw == nil || calls[0].Raw.ResourceVersion != "0" {
		t.Errorf("lists %+v; want one of every namespace from the watch cache", calls)
	}
}
