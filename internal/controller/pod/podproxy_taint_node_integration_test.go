//go:build linux

package pod_test

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	nsv1alpha1 "github.com/egressproxy/provider-egressproxy/apis/namespaced/v1alpha1"
	spec "github.com/egressproxy/provider-egressproxy/apis/spec/v1alpha1"
	"github.com/egressproxy/provider-egressproxy/internal/backend/kubernetes"
	"github.com/egressproxy/provider-egressproxy/internal/devenv/testenv"
)

// egressTaint keeps a node for egress proxies, as a platform team keeps
// its pool of egress nodes (the ones with static addresses).
var egressTaint = corev1.Taint{Key: "egressproxy.io/egress", Value: "true", Effect: corev1.TaintEffectNoSchedule}

// editNode changes the real node's Node object (retried on conflicts).
func (e *nodeEnv) editNode(t *testing.T, edit func(*corev1.Node)) {
	t.Helper()
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: e.node.Name}}
	e.Update(t, n, func() { edit(n) })
}

// TestPodProxyTaintedNodeIntegration: PodProxies on a pool of egress
// nodes, on the real node (kubelet, containerd, kube-scheduler), tainted
// and labelled as an egress node. A proxy whose config does not tolerate
// the taint is never scheduled, and its Ready condition says why; one
// whose config tolerates it (and selects the pool) lands there with two
// replicas, both serving, a PodDisruptionBudget, and the egress check
// through each replica: their addresses (the pods' own, as this node does
// not masquerade pod traffic) are egressIPs. Once the taint is removed,
// the first proxy lands too. One node only: that the replicas spread over
// nodes is the scheduler's work on the spread the Deployment carries
// (asserted in the driver's tests); here both share the one node the
// placement allows, as the spread lets them.
func TestPodProxyTaintedNodeIntegration(t *testing.T) {
	e := startNode(t)
	ctx := context.Background()

	e.editNode(t, func(n *corev1.Node) {
		n.Labels["egressproxy.io/egress"] = "true"
		n.Spec.Taints = append(n.Spec.Taints, egressTaint)
	})
	untaint := func() {
		e.editNode(t, func(n *corev1.Node) {
			delete(n.Labels, "egressproxy.io/egress")
			n.Spec.Taints = slices.DeleteFunc(n.Spec.Taints, func(tt corev1.Taint) bool { return tt.Key == egressTaint.Key })
		})
	}
	t.Cleanup(func() {
		n := &corev1.Node{}
		if err := e.Kube.Get(context.Background(), types.NamespacedName{Name: e.node.Name}, n); err == nil && slices.ContainsFunc(n.Spec.Taints, func(tt corev1.Taint) bool { return tt.Key == egressTaint.Key }) {
			untaint()
		}
	})
	e.Create(t, &nsv1alpha1.ClusterProviderConfig{ObjectMeta: metav1.ObjectMeta{Name: "egress-pool"},
		Spec: nsv1alpha1.ClusterProviderConfigSpec{ProviderConfigSpec: spec.ProviderConfigSpec{Kubernetes: &spec.KubernetesConfig{
			Credentials:  spec.KubernetesCredentials{Source: xpv2.CredentialsSourceInjectedIdentity},
			Namespace:    proxyNS,
			Image:        e.image.Ref,
			NodeSelector: map[string]string{"egressproxy.io/egress": "true"},
			Tolerations:  []corev1.Toleration{{Key: egressTaint.Key, Operator: corev1.TolerationOpEqual, Value: "true", Effect: corev1.TaintEffectNoSchedule}},
			EgressCheck:  &spec.EgressCheck{URL: testenv.EchoURL(e.upstream)},
		}}}})

	// Without the toleration: Pending, unscheduled, and the condition says
	// so.
	stray := nsPodProxy("team-b", "untolerated", "ClusterProviderConfig", "pods")
	stray.Spec.ForProvider.Proxy.AllowedClientCIDRs = []string{e.clients}
	e.Create(t, stray)
	c := e.WaitForCondition(t, stray, xpv2.TypeReady, corev1.ConditionFalse, "had untolerated taint")
	t.Logf("Ready of the proxy without the toleration: %s %s", c.Reason, c.Message)
	if !strings.Contains(c.Message, "is not scheduled") {
		t.Errorf("Ready message %q; want it to say the pod is not scheduled", c.Message)
	}
	for _, p := range e.proxyPods(t, stray.GetUID()) {
		if p.Spec.NodeName != "" || p.Status.Phase != corev1.PodPending {
			t.Errorf("pod %s of the untolerating proxy is on %q, %s; want Pending, on no node", p.Name, p.Spec.NodeName, p.Status.Phase)
		}
	}

	// With it, two replicas: both on the egress node, both serving, each
	// one's egress address verified through it.
	ha := nsPodProxy("team-a", "egress-pool", "ClusterProviderConfig", "egress-pool")
	ha.Spec.WriteConnectionSecretToReference = &xpv2.LocalSecretReference{Name: "egress-pool-proxy"}
	ha.Spec.ForProvider.Replicas = ptr.To[int32](2)
	ha.Spec.ForProvider.Proxy.AllowedClientCIDRs = []string{e.clients}
	ha.Spec.ForProvider.Proxy.AllowedPorts = []int32{443, e.port}
	start := time.Now()
	e.ready(t, ha)
	testenv.WaitFor(t, "both replicas to serve and both addresses to be verified", e.within(60*time.Second), func() (bool, string) {
		if err := e.Kube.Get(ctx, client.ObjectKeyFromObject(ha), ha); err != nil {
			return false, err.Error()
		}
		o := ha.Status.AtProvider
		c := ha.GetCondition(spec.TypeEgressVerified)
		return o.Details["replicas"] == "2/2" && c.Status == corev1.ConditionTrue && len(o.EgressIPs) == 2,
			fmt.Sprintf("replicas %q, progress %q, egressIPs %v, EgressVerified %s %s", o.Details["replicas"], o.Progress, o.EgressIPs, c.Status, c.Message)
	})
	t.Logf("two replicas on the tainted node, create to both verified: %.2fs", time.Since(start).Seconds())
	var podIPs []string
	for _, p := range e.proxyPods(t, ha.GetUID()) {
		if p.Spec.NodeName != e.node.Name || !podServing(&p) {
			t.Errorf("pod %s on %q, %s; want serving on the egress node %s", p.Name, p.Spec.NodeName, p.Status.Phase, e.node.Name)
		}
		e.checkContainer(t, &p)
		podIPs = append(podIPs, p.Status.PodIP)
	}
	slices.Sort(podIPs)
	o := ha.Status.AtProvider
	if !slices.Equal(o.EgressIPs, podIPs) || o.EgressIP != podIPs[0] || o.EgressIPSource != spec.EgressIPVerified {
		t.Errorf("egressIP %q, egressIPs %v (%s); want the replicas' addresses %v, which the upstream sees, Verified", o.EgressIP, o.EgressIPs, o.EgressIPSource, podIPs)
	}
	d := e.ConnectionSecret(t, "team-a", "egress-pool-proxy", "")
	if d["egressIPs"] != strings.Join(podIPs, ",") || d["egressIP"] != podIPs[0] {
		t.Errorf("connection Secret egressIP %q, egressIPs %q; want %s and %s", d["egressIP"], d["egressIPs"], podIPs[0], strings.Join(podIPs, ","))
	}
	if code, squidErr := e.get(t, d["url"]); code != http.StatusOK {
		t.Errorf("GET through %s = %d %q; want 200", d["url"], code, squidErr)
	}
	if c := ha.GetCondition(spec.TypeEgressVerified); !strings.Contains(c.Message, podIPs[0]) || !strings.Contains(c.Message, podIPs[1]) {
		t.Errorf("EgressVerified message %q; want both addresses", c.Message)
	}
	if objs := e.objects(t, ha.GetUID()); !slices.ContainsFunc(objs, func(s string) bool { return strings.Contains(s, "PodDisruptionBudget") }) {
		t.Errorf("objects of the two-replica proxy %v; want a PodDisruptionBudget", objs)
	}

	// The taint goes: the other proxy is scheduled and serves.
	untaint()
	e.WaitForCondition(t, stray, xpv2.TypeReady, corev1.ConditionTrue, "")

	e.deleteLeavingNothing(t, ha)
	e.deleteLeavingNothing(t, stray)
}

// proxyPods are the pods of the proxy with this MR UID, but those being
// deleted.
func (e *nodeEnv) proxyPods(t *testing.T, uid types.UID) []corev1.Pod {
	t.Helper()
	l := &corev1.PodList{}
	if err := e.Kube.List(context.Background(), l, client.InNamespace(proxyNS), client.MatchingLabels{kubernetes.LabelUID: string(uid)}); err != nil {
		t.Fatal(err)
	}
	return slices.DeleteFunc(l.Items, func(p corev1.Pod) bool { return p.DeletionTimestamp != nil })
}

// podServing is a pod Running and Ready with an address.
func podServing(p *corev1.Pod) bool {
	if p.Status.Phase != corev1.PodRunning || p.Status.PodIP == "" {
		return false
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
