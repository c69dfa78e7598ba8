package netguard_test

import (
	"context"
	"net"
	"net/netip"
	"slices"
	"sync/atomic"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/egressproxy/provider-egressproxy/internal/devenv/controlplane"
	"github.com/egressproxy/provider-egressproxy/internal/devenv/testenv"
	"github.com/egressproxy/provider-egressproxy/internal/netguard"
)

// TestDiscoveryIntegration reads the cluster networks from a real API
// server: the kubernetes Service's IP, its ServiceCIDR and endpoints, and a
// node's podCIDRs and addresses. A guard that allows loopback for tenants
// still refuses the node's address inside it, and nothing connects there.
func TestDiscoveryIntegration(t *testing.T) {
	cp, s := testenv.Start(t, controlplane.Options{})
	ctx := context.Background()
	kube, err := client.New(cp.Config, client.Options{Scheme: s})
	if err != nil {
		t.Fatal(err)
	}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}, Spec: corev1.NodeSpec{PodCIDRs: []string{"10.250.0.0/24", "fd10:250::/64"}}}
	if err := kube.Create(ctx, node); err != nil {
		t.Fatal(err)
	}
	node.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "127.0.0.5"}, {Type: corev1.NodeHostName, Address: "n1"}}
	if err := kube.Status().Update(ctx, node); err != nil {
		t.Fatal(err)
	}
	svc := &corev1.Service{}
	if err := kube.Get(ctx, client.ObjectKey{Namespace: "default", Name: "kubernetes"}, svc); err != nil {
		t.Fatal(err)
	}

	d := netguard.NewDiscovery(kube, cp.Config.Host)
	nets := d.Networks(ctx)
	for _, want := range []string{"10.250.0.0/24", "fd10:250::/64", "127.0.0.5/32", svc.Spec.ClusterIP + "/32"} {
		if !slices.Contains(nets, netip.MustParsePrefix(want)) {
			t.Errorf("discovered %v; want %s among them", nets, want)
		}
	}

	g := netguard.New(netguard.Options{Allowed: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}, Cluster: d})
	for _, a := range []string{"127.0.0.5", "10.250.0.9", "::ffff:10.250.0.9", svc.Spec.ClusterIP} {
		if err := g.Check(ctx, netip.MustParseAddr(a)); !netguard.IsRefused(err) {
			t.Errorf("Check(%s) = %v; want refused as the cluster's", a, err)
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.5:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var n atomic.Int32
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			n.Add(1)
			_ = c.Close()
		}
	}()
	if c, err := g.DialContext(ctx, "tcp", ln.Addr().String()); err == nil {
		_ = c.Close()
		t.Error("dialled the node's address")
	}
	if got := n.Load(); got != 0 {
		t.Errorf("the listener on the node's address accepted %d connections; want 0", got)
	}
	if err := g.Check(ctx, netip.MustParseAddr("127.0.0.9")); err != nil {
		t.Errorf("Check(127.0.0.9) = %v; want allowed (loopback is allowed, only the node's address is the cluster's)", err)
	}
}
