package pod_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/meta"
	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	spec "github.com/egressproxy/provider-egressproxy/apis/spec/v1alpha1"
	"github.com/egressproxy/provider-egressproxy/internal/backend/kubernetes"
	"github.com/egressproxy/provider-egressproxy/internal/devenv/testenv"
)

// replicatedProxy: a PodProxy of two replicas through the provider's
// controllers: both pods serve (a real Squid each), the proxy is Ready,
// says how many replicas serve, has a PodDisruptionBudget, and its egress
// address is checked through each replica and published in status and in
// the connection Secret (egressIP, egressIPs); scaled down to one, the
// budget goes. Here every pod's traffic leaves from the same address (one
// machine), so egressIPs holds one: several addresses are the real node
// test's (TestPodProxyTaintedNodeIntegration) and the unit tests'.
func (e *env) replicatedProxy(t *testing.T) {
	ctx := context.Background()
	p := nsPodProxy("team-a", "replicated", "ClusterProviderConfig", "pods-echo")
	p.Spec.WriteConnectionSecretToReference = &xpv2.LocalSecretReference{Name: "replicated-proxy"}
	p.Spec.ForProvider.Replicas = ptr.To[int32](2)
	p.Spec.ForProvider.Proxy.AllowedPorts = []int32{443, e.port}
	e.ready(t, p)
	key := types.NamespacedName{Namespace: proxyNS, Name: meta.GetExternalName(p)}
	testenv.WaitFor(t, "both replicas to serve and the egress check through each", e.within(30*time.Second), func() (bool, string) {
		if err := e.Kube.Get(ctx, client.ObjectKeyFromObject(p), p); err != nil {
			return false, err.Error()
		}
		o := p.Status.AtProvider
		c := p.GetCondition(spec.TypeEgressVerified)
		return o.Details["replicas"] == "2/2" && c.Status == corev1.ConditionTrue && len(o.EgressIPs) > 0,
			fmt.Sprintf("replicas %q, progress %q, EgressVerified %s %s", o.Details["replicas"], o.Progress, c.Status, c.Message)
	})
	o := p.Status.AtProvider
	if o.EgressIP != o.EgressIPs[0] || o.EgressIPSource != spec.EgressIPVerified || !slices.IsSorted(o.EgressIPs) {
		t.Errorf("egressIP %q, egressIPs %v (%s); want egressIP the first of a sorted list, Verified", o.EgressIP, o.EgressIPs, o.EgressIPSource)
	}
	d := e.ConnectionSecret(t, "team-a", "replicated-proxy", "")
	if d["egressIP"] != o.EgressIP || d["egressIPs"] != strings.Join(o.EgressIPs, ",") {
		t.Errorf("connection Secret egressIP %q, egressIPs %q; want %q and %q", d["egressIP"], d["egressIPs"], o.EgressIP, strings.Join(o.EgressIPs, ","))
	}
	// Each pod is a Squid of its own that serves.
	pods := &corev1.PodList{}
	if err := e.Kube.List(ctx, pods, client.InNamespace(proxyNS), client.MatchingLabels{kubernetes.LabelUID: string(p.GetUID())}); err != nil {
		t.Fatal(err)
	}
	var ips []string
	for _, pod := range pods.Items {
		if pod.DeletionTimestamp == nil && pod.Status.PodIP != "" {
			ips = append(ips, pod.Status.PodIP)
		}
	}
	if len(ips) != 2 || ips[0] == ips[1] {
		t.Fatalf("pod addresses %v; want two", ips)
	}
	for _, ip := range ips {
		if code, _ := e.get(t, "http://"+net.JoinHostPort(ip, "3128")); code != http.StatusOK {
			t.Errorf("GET through the replica at %s = %d; want 200", ip, code)
		}
	}
	pdb := &policyv1.PodDisruptionBudget{}
	if err := e.Kube.Get(ctx, key, pdb); err != nil {
		t.Fatalf("the proxy's PodDisruptionBudget: %v", err)
	}
	if pdb.Labels[kubernetes.LabelUID] != string(p.GetUID()) || len(pdb.OwnerReferences) != 1 || pdb.OwnerReferences[0].Kind != "Deployment" {
		t.Errorf("PodDisruptionBudget labels %v, owners %v; want the mark, owned by the Deployment", pdb.Labels, pdb.OwnerReferences)
	}

	// Down to one: the budget goes, one pod remains, the proxy stays Ready.
	e.Update(t, p, func() { p.Spec.ForProvider.Replicas = ptr.To[int32](1) })
	testenv.WaitFor(t, "the budget to go and one replica to remain", e.within(30*time.Second), func() (bool, string) {
		err := e.Kube.Get(ctx, key, &policyv1.PodDisruptionBudget{})
		dep := &appsv1.Deployment{}
		if err := e.Kube.Get(ctx, key, dep); err != nil {
			return false, err.Error()
		}
		if err := e.Kube.Get(ctx, client.ObjectKeyFromObject(p), p); err != nil {
			return false, err.Error()
		}
		_, detail := p.Status.AtProvider.Details["replicas"]
		return kerrors.IsNotFound(err) && *dep.Spec.Replicas == 1 && !detail && p.GetCondition(xpv2.TypeReady).Status == corev1.ConditionTrue,
			fmt.Sprintf("budget get: %v, Deployment replicas %d, details %v", err, *dep.Spec.Replicas, p.Status.AtProvider.Details)
	})
	e.deleteLeavingNothing(t, p)
}
