package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/egressproxy/provider-egressproxy/internal/netguard"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
	"github.com/egressproxy/provider-egressproxy/internal/squid"
)

// countingReader counts reads and can fail them.
type countingReader struct {
	client.Reader
	reads atomic.Int32
	fail  atomic.Bool
}

func (c *countingReader) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	c.reads.Add(1)
	if c.fail.Load() {
		return errors.New("connection reset by peer")
	}
	return c.Reader.Get(ctx, key, obj, opts...)
}

func (c *countingReader) List(ctx context.Context, l client.ObjectList, opts ...client.ListOption) error {
	c.reads.Add(1)
	if c.fail.Load() {
		return errors.New("connection reset by peer")
	}
	return c.Reader.List(ctx, l, opts...)
}

// fakeCluster is an API server's client holding objs.
func fakeCluster(t *testing.T, objs ...client.Object) client.Client {
	t.Helper()
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	return fake.NewClientBuilder().WithScheme(s).WithObjects(objs...).Build()
}

// serviceCIDR is the ServiceCIDR object of cidrs.
func serviceCIDR(cidrs ...string) *networkingv1.ServiceCIDR {
	return &networkingv1.ServiceCIDR{ObjectMeta: metav1.ObjectMeta{Name: "kubernetes"}, Spec: networkingv1.ServiceCIDRSpec{CIDRs: cidrs}}
}

// The cluster's networks are read once per networksTTL, not twice per
// Create; a read that failed on the way is not kept, and until every
// source has answered the networks are not known: nothing is written.
func TestClusterNetworksAreReused(t *testing.T) {
	c := fakeCluster(t,
		&corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "kubernetes", Namespace: "default"}, Spec: corev1.ServiceSpec{ClusterIPs: []string{"10.96.0.1"}}},
		serviceCIDR("10.96.0.0/12"),
	)
	ctx := context.Background()

	failing := &countingReader{Reader: c}
	failing.fail.Store(true)
	d := New(Options{Provider: "t", Client: c, Live: failing, Host: "https://flaky.example:6443"})
	for range 2 {
		if got, _, err := d.clusterNetworks(ctx); !proxy.IsTransient(err) || !strings.Contains(fmt.Sprint(err), "not known yet: no answer from its service, endpoints, servicecidrs, nodes") || strings.Contains(fmt.Sprint(err), "reset") {
			t.Errorf("clusterNetworks after failed reads = %v, %v; want a Transient error naming the sources, not quoting them", got, err)
		}
	}
	if n := failing.reads.Load(); n != 8 {
		t.Errorf("after failed reads: %d reads for two calls, want 8 (nothing kept)", n)
	}

	live := &countingReader{Reader: c}
	d = New(Options{Provider: "t", Client: c, Live: live, Host: "https://api.example:6443", Config: Config{ClusterNetworks: []string{"192.0.2.0/24"}}})
	want := []string{"10.96.0.0/12", "192.0.2.0/24"} // 10.96.0.1 is inside the first
	for range 5 {
		if got, _, err := d.clusterNetworks(ctx); err != nil || !slices.Equal(got, want) {
			t.Fatalf("clusterNetworks = %v, %v; want %v", got, err, want)
		}
	}
	if n := live.reads.Load(); n != 4 {
		t.Errorf("five calls made %d reads, want 4 (one discovery)", n)
	}
}

// Creates that start together wait for one read of the cluster's networks
// instead of each sending their own, and all get what it read.
func TestClusterNetworksAreReadOnceByConcurrentCreates(t *testing.T) {
	c := fakeCluster(t, serviceCIDR("10.96.0.0/12"))
	live := &countingReader{Reader: c}
	d := New(Options{Provider: "t", Client: c, Live: live, Host: "https://together.example:6443"})
	var wg sync.WaitGroup
	got := make([][]string, 50)
	for i := range got {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got[i], _, _ = d.clusterNetworks(context.Background())
		}()
	}
	wg.Wait()
	for i, g := range got {
		if len(g) != 1 || g[0] != "10.96.0.0/12" {
			t.Fatalf("call %d: clusterNetworks = %v, want [10.96.0.0/12]", i, g)
		}
	}
	if n := live.reads.Load(); n != 4 {
		t.Errorf("50 concurrent calls made %d reads, want 4 (one discovery)", n)
	}
}

// The pod network is the nodes' podCIDRs (podCIDR where only that is set),
// merged where they fill a range; the nodes' internal and external
// addresses are the cluster's too (their kubelets, host-network pods and
// NodePorts), and so is what the config names.
func TestClusterNetworksHoldThePodNetworkAndTheNodes(t *testing.T) {
	node := func(name string, cidrs ...string) *corev1.Node {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.NodeSpec{PodCIDRs: cidrs}}
		if len(cidrs) > 0 {
			n.Spec.PodCIDR = cidrs[0]
		}
		return n
	}
	old := node("old", "10.244.3.0/24")
	old.Spec.PodCIDRs = nil
	a := node("a", "10.244.0.0/24", "fd00:10:244::/64")
	a.Status.Addresses = []corev1.NodeAddress{
		{Type: corev1.NodeInternalIP, Address: "192.168.7.4"},
		{Type: corev1.NodeInternalIP, Address: "fd00:7::4"},
		{Type: corev1.NodeExternalIP, Address: "203.0.113.9"},
		{Type: corev1.NodeHostName, Address: "a"},
		{Type: corev1.NodeExternalDNS, Address: "a.example.com"},
	}
	c := fakeCluster(t,
		a,
		node("b", "10.244.1.0/24", "fd00:10:244:1::/64"),
		node("c", "10.244.2.0/24"),
		old,
		node("calico"), // a network plugin that assigns addresses itself
	)
	d := New(Options{Provider: "t", Client: c, Live: c, Host: "https://pods.example:6443", Config: Config{ClusterNetworks: []string{"100.96.0.0/11"}}})
	want := []string{"10.244.0.0/22", "100.96.0.0/11", "192.168.7.4/32", "203.0.113.9/32", "fd00:7::4/128", "fd00:10:244::/63"}
	if got, _, err := d.clusterNetworks(context.Background()); err != nil || !slices.Equal(got, want) {
		t.Errorf("clusterNetworks = %v, %v; want %v", got, err, want)
	}
}

// staticNetworks is a netguard.Networks that counts its calls.
type staticNetworks struct {
	nets  []netip.Prefix
	calls atomic.Int32
}

func (n *staticNetworks) Networks(context.Context) []netip.Prefix {
	n.calls.Add(1)
	return n.nets
}

// Where the provider already discovers the cluster's networks (the tenant
// guard, for its own cluster), the driver denies what that discovery says
// and reads nothing itself.
func TestClusterNetworksFromTheProvidersDiscovery(t *testing.T) {
	c := fakeCluster(t, serviceCIDR("10.96.0.0/12"))
	live := &countingReader{Reader: c}
	nets := &staticNetworks{nets: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("192.168.7.4/32")}}
	d := New(Options{Provider: "t", Client: c, Live: live, Host: "https://own.example:6443", Networks: nets, Config: Config{ClusterNetworks: []string{"100.96.0.0/11"}}})
	want := []string{"10.244.0.0/16", "100.96.0.0/11", "192.168.7.4/32"}
	if got, _, err := d.clusterNetworks(context.Background()); err != nil || !slices.Equal(got, want) {
		t.Errorf("clusterNetworks = %v, %v; want %v", got, err, want)
	}
	if n := live.reads.Load(); n != 0 {
		t.Errorf("the driver made %d reads of its own; want 0", n)
	}
	if n := nets.calls.Load(); n != 1 {
		t.Errorf("the discovery was asked %d times; want 1", n)
	}
}

func TestJoinPrefixes(t *testing.T) {
	for _, tc := range []struct{ in, want []string }{
		{[]string{"10.0.0.0/25", "10.0.0.128/25", "10.0.1.0/24"}, []string{"10.0.0.0/23"}},
		{[]string{"10.0.1.0/24", "10.0.2.0/24"}, []string{"10.0.1.0/24", "10.0.2.0/24"}}, // not halves of one
		{[]string{"10.0.0.0/8", "10.1.0.0/16", "10.0.0.1/32"}, []string{"10.0.0.0/8"}},
		{[]string{"0.0.0.0/1", "128.0.0.0/1", "::/1", "8000::/1"}, []string{"0.0.0.0/0", "::/0"}},
		{[]string{"10.0.0.0/24", "10.0.0.0/24"}, []string{"10.0.0.0/24"}},
	} {
		var ps []netip.Prefix
		for _, s := range tc.in {
			ps = append(ps, netip.MustParsePrefix(s))
		}
		var got []string
		for _, p := range joinPrefixes(ps) {
			got = append(got, p.String())
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("joinPrefixes(%v) = %v, want %v", tc.in, got, tc.want)
		}
	}
}

// TestNetworkPolicyDeniesWhatSquidDenies walks the deny lists of the
// squid.conf a proxy gets (never_dst, and private_dst less opened_dst) and
// checks that the proxy's NetworkPolicy lets no address of any of them
// through, whatever the resource opens: the metadata addresses, the
// cluster's networks and their NAT64 and 6to4 spellings included. (Port
// 53, which the policy opens everywhere for name resolution, is the one
// exception, and only for DNS.)
func TestNetworkPolicyDeniesWhatSquidDenies(t *testing.T) {
	cluster := []string{"10.0.0.0/24", "10.0.0.1", "192.0.2.2", "10.244.0.0/16", "fd00:10:96::/112", "100.65.0.0/16"}
	for name, opened := range map[string][]string{
		"nothing opened":                {},
		"RFC 1918":                      {"10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"},
		"shared and IETF space":         {"100.64.0.0/10", "192.0.0.0/24"},
		"unique local IPv6":             {"fc00::/7"},
		"NAT64 spellings":               {"64:ff9b::a00:0/104", "64:ff9b::6440:0/106", "64:ff9b::c000:0/120"},
		"6to4 spellings":                {"2002:a00::/24", "2002:6440::/26", "2002:c000::/40"},
		"exactly a metadata address":    {"100.100.100.200/32", "192.0.0.192/32", "fd00:ec2::254/128"},
		"inside the cluster's networks": {"10.0.0.0/28", "10.244.1.0/24", "64:ff9b::a00:0/120"},
		"IPv4-mapped":                   {"::ffff:10.0.0.0/104"},
		"a part of a private range":     {"10.30.0.0/16", "fd12:3456::/32"},
	} {
		t.Run(name, func(t *testing.T) {
			req := testRequest()
			req.Proxy.AllowedDestinationCIDRs = opened
			files, err := squid.Render(req.Proxy, squidOptions(req, cluster))
			if err != nil {
				t.Fatal(err)
			}
			acl := map[string][]netip.Prefix{}
			for l := range strings.Lines(files.SquidConf) {
				f := strings.Fields(l)
				if len(f) > 3 && f[0] == "acl" && f[2] == "dst" {
					for _, c := range f[3:] {
						acl[f[1]] = append(acl[f[1]], netip.MustParsePrefix(c))
					}
				}
			}
			if len(acl["never_dst"]) == 0 || len(acl["private_dst"]) == 0 || len(opened) > 0 && len(acl["opened_dst"]) == 0 {
				t.Fatalf("squid.conf has no never_dst, private_dst or opened_dst:\n%s", files.SquidConf)
			}
			dep := buildDeployment(Config{}, req, files, "h", time.Unix(0, 0))
			np := buildNetworkPolicy(dep, req, cluster)
			var peers []networkingv1.IPBlock
			for _, r := range np.Spec.Egress {
				if len(r.Ports) > 0 {
					continue // DNS
				}
				for _, p := range r.To {
					if p.IPBlock == nil {
						t.Fatalf("egress peer %+v is not an ipBlock: it would allow what no list says", p)
					}
					peers = append(peers, *p.IPBlock)
				}
			}
			// leaks is what of denied one peer lets through, given what
			// else Squid lets through (the opened ranges, for private).
			leaks := func(denied netip.Prefix, alsoAllowed []netip.Prefix) []string {
				var out []string
				for _, b := range peers {
					c := netip.MustParsePrefix(b.CIDR)
					x, ok := intersect(denied, c)
					if !ok {
						continue
					}
					except := slices.Clone(alsoAllowed)
					for _, e := range b.Except {
						except = append(except, netip.MustParsePrefix(e))
					}
					if !coveredBy(x, except) {
						out = append(out, fmt.Sprintf("%s through ipBlock %s except %v", x, b.CIDR, b.Except))
					}
				}
				return out
			}
			for _, n := range acl["never_dst"] {
				for _, l := range leaks(n, nil) {
					t.Errorf("Squid never reaches %s; the policy lets %s", n, l)
				}
			}
			for _, p := range acl["private_dst"] {
				for _, l := range leaks(p, acl["opened_dst"]) {
					t.Errorf("Squid denies %s (not opened); the policy lets %s", p, l)
				}
			}
		})
	}
}

// intersect is the common part of two prefixes (which either nest or are
// disjoint).
func intersect(a, b netip.Prefix) (netip.Prefix, bool) {
	switch {
	case a.Addr().Is4() != b.Addr().Is4():
		return netip.Prefix{}, false
	case a.Bits() >= b.Bits() && b.Contains(a.Addr()):
		return a, true
	case b.Bits() >= a.Bits() && a.Contains(b.Addr()):
		return b, true
	}
	return netip.Prefix{}, false
}

// coveredBy says every address of x lies in one of ps: one covers x, or
// each half of x is covered.
func coveredBy(x netip.Prefix, ps []netip.Prefix) bool {
	inside := false
	for _, p := range ps {
		switch q, ok := intersect(x, p); {
		case !ok:
		case q == x:
			return true
		default:
			inside = true
		}
	}
	if !inside || x.Bits() == x.Addr().BitLen() {
		return false
	}
	lo := netip.PrefixFrom(x.Addr(), x.Bits()+1)
	b := x.Addr().AsSlice()
	b[x.Bits()/8] |= 0x80 >> (x.Bits() % 8)
	a, _ := netip.AddrFromSlice(b)
	return coveredBy(lo, ps) && coveredBy(netip.PrefixFrom(a, x.Bits()+1), ps)
}

// Once a cluster's networks were known, a read that fails on the way
// gives what was kept with what answered; a create is not held up.
func TestClusterNetworksKeepWhatWasKnown(t *testing.T) {
	c := fakeCluster(t, serviceCIDR("10.96.0.0/12"))
	r := &countingReader{Reader: c}
	d := New(Options{Provider: "t", Client: c, Live: r, Host: "https://known.example:6443"})
	ctx := context.Background()
	if _, _, err := d.clusterNetworks(ctx); err != nil {
		t.Fatal(err)
	}
	discovered.mu.Lock()
	e := discovered.m[d.host]
	e.at = time.Now().Add(-2 * networksTTL)
	discovered.m[d.host] = e
	discovered.mu.Unlock()
	r.fail.Store(true)
	if got, _, err := d.clusterNetworks(ctx); err != nil || !slices.Equal(got, []string{"10.96.0.0/12"}) {
		t.Errorf("clusterNetworks after the TTL with reads failing = %v, %v; want what was known", got, err)
	}
}

// The provider's own discovery has not had an answer from every source
// yet: the driver writes nothing until it has.
func TestClusterNetworksWaitForTheProvidersDiscovery(t *testing.T) {
	c := fakeCluster(t, serviceCIDR("10.96.0.0/12"))
	r := &countingReader{Reader: c}
	r.fail.Store(true)
	disc := &netguard.Discovery{Reader: r, Retry: time.Millisecond}
	d := New(Options{Provider: "t", Client: c, Live: c, Host: "https://own.example:6443", Networks: disc.Cluster()})
	ctx := context.Background()
	if _, _, err := d.clusterNetworks(ctx); !proxy.IsTransient(err) || !strings.Contains(err.Error(), "not known yet") {
		t.Errorf("clusterNetworks before discovery answered = %v; want a Transient error", err)
	}
	r.fail.Store(false)
	time.Sleep(5 * time.Millisecond)
	if got, _, err := d.clusterNetworks(ctx); err != nil || !slices.Equal(got, []string{"10.96.0.0/12"}) {
		t.Errorf("clusterNetworks once discovery answered = %v, %v; want the ServiceCIDR", got, err)
	}
}

// forbidding is c where the reads of the cluster's networks are refused
// (403): the provider's identity there lacks the discovery grants.
func forbidding(c client.Reader) client.Reader { return forbiddingReader{c} }

type forbiddingReader struct{ client.Reader }

func (r forbiddingReader) Get(ctx context.Context, key client.ObjectKey, o client.Object, opts ...client.GetOption) error {
	if _, ok := o.(*corev1.Service); ok && key.Namespace == "default" {
		return kerrors.NewForbidden(schema.GroupResource{Resource: "services"}, key.Name, errors.New("RBAC"))
	}
	return r.Reader.Get(ctx, key, o, opts...)
}

func (r forbiddingReader) List(ctx context.Context, l client.ObjectList, opts ...client.ListOption) error {
	switch l.(type) {
	case *discoveryv1.EndpointSliceList, *networkingv1.ServiceCIDRList, *corev1.NodeList:
		return kerrors.NewForbidden(schema.GroupResource{Resource: fmt.Sprintf("%T", l)}, "", errors.New("RBAC"))
	}
	return r.Reader.List(ctx, l, opts...)
}

// fixedResolver resolves every name to its addresses, or fails without any.
type fixedResolver []netip.Addr

func (r fixedResolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	if len(r) == 0 {
		return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
	}
	return r, nil
}

// written are the squid.conf ACLs (by name) and the NetworkPolicy's
// ipBlocks (CIDR to excepts) a Create wrote.
func written(t *testing.T, c client.Reader, req proxy.Request) (acl, excepts map[string][]string) {
	t.Helper()
	ctx := context.Background()
	key := types.NamespacedName{Namespace: "egress", Name: req.Name}
	sec, np := &corev1.Secret{}, &networkingv1.NetworkPolicy{}
	if err := c.Get(ctx, key, sec); err != nil {
		t.Fatal(err)
	}
	if err := c.Get(ctx, key, np); err != nil {
		t.Fatal(err)
	}
	acl, excepts = map[string][]string{}, map[string][]string{}
	for l := range strings.Lines(string(sec.Data[KeySquidConf])) {
		if f := strings.Fields(l); len(f) > 3 && f[0] == "acl" && f[2] == "dst" {
			acl[f[1]] = append(acl[f[1]], f[3:]...)
		}
	}
	for _, r := range np.Spec.Egress {
		for _, p := range r.To {
			excepts[p.IPBlock.CIDR] = p.IPBlock.Except
		}
	}
	return acl, excepts
}

// A target cluster the provider may not read, or whose nodes state no pod
// range, has networks that are unknown, not empty: a proxy that opens a
// private range is refused (it could reach the API server, Services and
// pods inside it through both fences), naming what cannot be read and the
// way out; one that opens nothing is written with every private range and
// the kubeconfig's server denied; a config that names the cluster's
// networks stands in for what cannot be read.
func TestUnknownClusterNetworksOpenNoPrivateRange(t *testing.T) {
	ctx := context.Background()
	opened := func() proxy.Request {
		req := testRequest()
		req.Proxy.AllowedDestinationCIDRs = []string{"10.0.0.0/8"}
		return req
	}
	kubernetesService := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "kubernetes", Namespace: "default"}, Spec: corev1.ServiceSpec{ClusterIPs: []string{"10.96.0.1"}}}
	calico := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}, Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "10.0.0.5"}}}}
	for _, tc := range []struct {
		name string
		live func(c client.Reader) client.Reader
		objs []client.Object
		host string
		want []string // in the refusal
	}{
		{name: "no discovery grants", live: forbidding, host: "https://203.0.113.10:6443",
			want: []string{"opens 10.0.0.0/8", "may not get the Service default/kubernetes", "list endpointslices", "list servicecidrs", "list nodes", "cluster/rbac/podproxy.yaml", "spec.kubernetes.clusterNetworks"}},
		{name: "nodes state no pod range", objs: []client.Object{kubernetesService, serviceCIDR("10.96.0.0/12"), calico}, live: func(c client.Reader) client.Reader { return c }, host: "https://203.0.113.11:6443",
			want: []string{"a node states no pod range (spec.podCIDRs", "until they are: name the cluster's pod, Service and node networks in spec.kubernetes.clusterNetworks"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			newDriver := func(cfg Config) (*Driver, client.Client) {
				var objs []client.Object
				for _, o := range tc.objs {
					objs = append(objs, o.DeepCopyObject().(client.Object)) //nolint:forcetypeassert // a copy of one.
				}
				c := fakeCluster(t, objs...)
				cfg.Namespace, cfg.NetworkPolicy = "egress", true
				d := New(Options{Provider: "t", Config: cfg, Client: c, Live: tc.live(c), Host: tc.host})
				d.taken = &taken{}
				discovered.mu.Lock()
				delete(discovered.m, tc.host)
				discovered.mu.Unlock()
				return d, c
			}
			d, c := newDriver(Config{})
			_, err := d.Create(ctx, opened())
			if !proxy.IsPermanent(err) {
				t.Fatalf("Create of a proxy opening 10.0.0.0/8 = %v; want Permanent", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("Create = %q; want it to say %q", err, w)
				}
			}
			if err := c.Get(ctx, types.NamespacedName{Namespace: "egress", Name: opened().Name}, &appsv1.Deployment{}); !kerrors.IsNotFound(err) {
				t.Errorf("the refused proxy's Deployment: %v; want none", err)
			}

			// Opening nothing: written, every private range and the
			// kubeconfig's server denied by both fences.
			if _, err := d.Create(ctx, testRequest()); err != nil {
				t.Fatalf("Create of a proxy that opens nothing = %v", err)
			}
			server := strings.TrimSuffix(strings.TrimPrefix(tc.host, "https://"), ":6443") + "/32"
			acl, excepts := written(t, c, testRequest())
			if !slices.Contains(acl["never_dst"], server) || !slices.Contains(acl["private_dst"], "10.0.0.0/8") {
				t.Errorf("squid.conf never_dst %v, private_dst %v; want %s and 10.0.0.0/8", acl["never_dst"], acl["private_dst"], server)
			}
			if ex := excepts["0.0.0.0/0"]; !slices.Contains(ex, server) || !slices.Contains(ex, "10.0.0.0/8") {
				t.Errorf("NetworkPolicy 0.0.0.0/0 excepts %v; want %s and 10.0.0.0/8", ex, server)
			}
			if _, ok := excepts["10.0.0.0/8"]; ok {
				t.Errorf("NetworkPolicy opens 10.0.0.0/8 for a proxy that opens nothing")
			}

			// The config names the cluster's networks: they stand in.
			d, c = newDriver(Config{ClusterNetworks: []string{"10.96.0.0/12", "10.244.0.0/16"}})
			if _, err := d.Create(ctx, opened()); err != nil {
				t.Fatalf("Create with the networks named in the config = %v", err)
			}
			acl, excepts = written(t, c, opened())
			if !slices.Contains(acl["never_dst"], "10.244.0.0/16") || !slices.Contains(excepts["10.0.0.0/8"], "10.244.0.0/16") {
				t.Errorf("squid.conf never_dst %v, NetworkPolicy 10.0.0.0/8 excepts %v; want the named pod network in both", acl["never_dst"], excepts["10.0.0.0/8"])
			}
		})
	}
}

// Where the provider's own discovery serves the cluster's networks
// (netguard.Discovery.Cluster), what it may not read is unknown to the
// proxies too.
func TestUnknownNetworksOfTheProvidersDiscovery(t *testing.T) {
	disc := &netguard.Discovery{Reader: forbidding(fakeCluster(t))}
	d := New(Options{Provider: "t", Client: fakeCluster(t), Networks: disc.Cluster()})
	req := testRequest()
	req.Proxy.AllowedDestinationCIDRs = []string{"172.16.0.0/12"}
	if _, err := d.deniedNetworks(context.Background(), req); !proxy.IsPermanent(err) || !strings.Contains(err.Error(), "list nodes") {
		t.Errorf("deniedNetworks of a proxy opening 172.16.0.0/12 = %v; want Permanent, naming the reads", err)
	}
	if _, err := d.deniedNetworks(context.Background(), testRequest()); err != nil {
		t.Errorf("deniedNetworks of a proxy opening nothing = %v; want the networks", err)
	}
}

// The kubeconfig's server is denied by every address its name resolves
// to (on a managed cluster, not one the kubernetes Service's endpoints
// name); a name that does not resolve leaves it unknown.
func TestTheKubeconfigServerIsDenied(t *testing.T) {
	c := fakeCluster(t, serviceCIDR("10.96.0.0/12"))
	d := New(Options{Provider: "t", Client: c, Live: c, Host: "https://api.managed.example:443"})
	d.resolver = fixedResolver{netip.MustParseAddr("198.51.100.20"), netip.MustParseAddr("::ffff:10.0.9.9"), netip.MustParseAddr("2001:db8::20")}
	want := []string{"10.0.9.9/32", "10.96.0.0/12", "198.51.100.20/32", "2001:db8::20/128"}
	if got, unknown, err := d.clusterNetworks(context.Background()); err != nil || !slices.Equal(got, want) || len(unknown) > 0 {
		t.Errorf("clusterNetworks = %v, %v, %v; want %v, all known", got, unknown, err, want)
	}

	d = New(Options{Provider: "t", Client: c, Live: c, Host: "https://api.unresolved.example:443"})
	d.resolver = fixedResolver{}
	req := testRequest()
	req.Proxy.AllowedDestinationCIDRs = []string{"192.168.0.0/16"}
	if _, err := d.deniedNetworks(context.Background(), req); !proxy.IsPermanent(err) || !strings.Contains(err.Error(), "the API server's name does not resolve here") {
		t.Errorf("deniedNetworks with the server's name unresolved = %v; want Permanent, saying so", err)
	}
}
