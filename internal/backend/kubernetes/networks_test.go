package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
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
		if got, err := d.clusterNetworks(ctx); !proxy.IsTransient(err) || !strings.Contains(fmt.Sprint(err), "not known yet: no answer from its service, endpoints, servicecidrs, nodes") || strings.Contains(fmt.Sprint(err), "reset") {
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
		if got, err := d.clusterNetworks(ctx); err != nil || !slices.Equal(got, want) {
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
			got[i], _ = d.clusterNetworks(context.Background())
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
	if got, err := d.clusterNetworks(context.Background()); err != nil || !slices.Equal(got, want) {
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
	if got, err := d.clusterNetworks(context.Background()); err != nil || !slices.Equal(got, want) {
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
	if _, err := d.clusterNetworks(ctx); err != nil {
		t.Fatal(err)
	}
	discovered.mu.Lock()
	e := discovered.m[d.host]
	e.at = time.Now().Add(-2 * networksTTL)
	discovered.m[d.host] = e
	discovered.mu.Unlock()
	r.fail.Store(true)
	if got, err := d.clusterNetworks(ctx); err != nil || !slices.Equal(got, []string{"10.96.0.0/12"}) {
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
	if _, err := d.clusterNetworks(ctx); !proxy.IsTransient(err) || !strings.Contains(err.Error(), "not known yet") {
		t.Errorf("clusterNetworks before discovery answered = %v; want a Transient error", err)
	}
	r.fail.Store(false)
	time.Sleep(5 * time.Millisecond)
	if got, err := d.clusterNetworks(ctx); err != nil || !slices.Equal(got, []string{"10.96.0.0/12"}) {
		t.Errorf("clusterNetworks once discovery answered = %v, %v; want the ServiceCIDR", got, err)
	}
}
