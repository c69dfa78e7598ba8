package kubernetes_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/egressproxy/provider-egressproxy/internal/backend/kubernetes"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

// withReplicas is req asking for n pods.
func withReplicas(req proxy.Request, n int32) proxy.Request {
	e, _ := req.Extension.(kubernetes.Exposure)
	e.Replicas = n
	req.Extension = e
	return req
}

// updateRetried updates as the reconciler would: again after a conflict
// (the Deployment controller's status writes may come between the read
// and the write).
func updateRetried(t *testing.T, d *kubernetes.Driver, ref proxy.Ref, req proxy.Request) error {
	t.Helper()
	var err error
	waitFor(t, "Update to pass the conflicts", func() (bool, string) {
		_, err = d.Update(context.Background(), ref, req)
		return err == nil || !strings.Contains(err.Error(), "the object has been modified"), fmt.Sprint(err)
	})
	return err
}

// egressNodes is a config placing proxies on a tainted pool of egress
// nodes.
func egressNodes(ns string) kubernetes.Config {
	return kubernetes.Config{
		Namespace:    ns,
		NodeSelector: map[string]string{"egressproxy.io/egress": "true"},
		Tolerations:  []corev1.Toleration{{Key: "egressproxy.io/egress", Operator: corev1.TolerationOpEqual, Value: "true", Effect: corev1.TaintEffectNoSchedule}},
		Affinity: &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{PreferredDuringSchedulingIgnoredDuringExecution: []corev1.PreferredSchedulingTerm{{
			Weight: 10, Preference: corev1.NodeSelectorTerm{MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "topology.kubernetes.io/zone", Operator: corev1.NodeSelectorOpIn, Values: []string{"eu-1a"}}}},
		}}}},
	}
}

// replicaTests: a proxy on egress nodes going from one replica to two and
// back, on the real API server (which validates the pod template's
// tolerations, affinity and spread, and the budget) with the Deployment
// and ReplicaSet controllers and the garbage collector: the Deployment's
// replicas and spread follow, a PodDisruptionBudget appears marked and
// owned and goes again, every serving replica is reported at its own
// address, and a budget of the name that is not the proxy's is never
// written or deleted. No scheduler runs here: that the spread keeps
// replicas on different nodes is the scheduler's part; what it is given is
// asserted.
func (e *env) replicaTests(t *testing.T) {
	ctx := context.Background()

	t.Run("OneToTwoToOne", func(t *testing.T) {
		t.Parallel()
		ns := e.namespace(t)
		d := e.driver(egressNodes(ns), nil)
		req := withReplicas(request("replicated"), 1)
		inst := e.createSettled(t, d, req)
		key := types.NamespacedName{Namespace: ns, Name: req.Name}
		if err := e.live.Get(ctx, key, &policyv1.PodDisruptionBudget{}); !kerrors.IsNotFound(err) {
			t.Errorf("one replica: PodDisruptionBudget get = %v; want none", err)
		}
		dep := &appsv1.Deployment{}
		if err := e.live.Get(ctx, key, dep); err != nil {
			t.Fatal(err)
		}
		ps := dep.Spec.Template.Spec
		if len(ps.Tolerations) != 1 || ps.Tolerations[0].Key != "egressproxy.io/egress" || ps.Affinity == nil || ps.NodeSelector["egressproxy.io/egress"] != "true" {
			t.Errorf("pod template placement: tolerations %v, affinity %v, nodeSelector %v; want the config's", ps.Tolerations, ps.Affinity, ps.NodeSelector)
		}

		// Two: the budget first, then the Deployment.
		req = withReplicas(req, 2)
		if err := updateRetried(t, d, proxy.Ref{ID: inst.ID, Name: req.Name, Mark: req.Mark}, req); err != nil {
			t.Fatal(err)
		}
		pdb := &policyv1.PodDisruptionBudget{}
		if err := e.live.Get(ctx, key, pdb); err != nil {
			t.Fatalf("two replicas: PodDisruptionBudget: %v", err)
		}
		owner := metav1.GetControllerOf(pdb)
		if pdb.Labels[kubernetes.LabelUID] != req.Mark.UID || pdb.Labels[kubernetes.LabelInstallation] != testInstallation || owner == nil || owner.UID != dep.UID ||
			pdb.Spec.MaxUnavailable == nil || *pdb.Spec.MaxUnavailable != intstr.FromInt32(1) || pdb.Spec.Selector.MatchLabels[kubernetes.LabelUID] != req.Mark.UID {
			t.Errorf("PodDisruptionBudget labels %v, controller %v, maxUnavailable %v, selector %v; want the mark, the Deployment %s, 1, the proxy's pods",
				pdb.Labels, owner, pdb.Spec.MaxUnavailable, pdb.Spec.Selector, dep.UID)
		}
		if err := e.live.Get(ctx, key, dep); err != nil {
			t.Fatal(err)
		}
		tsc := dep.Spec.Template.Spec.TopologySpreadConstraints
		if *dep.Spec.Replicas != 2 || len(tsc) != 1 || tsc[0].TopologyKey != corev1.LabelHostname || tsc[0].WhenUnsatisfiable != corev1.DoNotSchedule || tsc[0].MaxSkew != 1 {
			t.Errorf("Deployment replicas %d, spread %+v; want 2 spread over hostnames", *dep.Spec.Replicas, tsc)
		}
		// Both pods serve (the kubelet stand-in gives each an address of
		// its own, as two nodes would): the proxy reports both.
		var got proxy.Instance
		waitFor(t, "both replicas to serve and be reported", func() (bool, string) {
			pods, err := e.pods(ctx, e.live, ns, req.Name)
			if err != nil {
				return false, err.Error()
			}
			for _, p := range pods {
				if p.DeletionTimestamp == nil && !podReady(&p) {
					if err := e.kubelet.StartPod(ctx, ns, p.Name); err != nil && !kerrors.IsNotFound(err) {
						return false, err.Error()
					}
				}
			}
			got, err = d.Get(ctx, proxy.Ref{ID: inst.ID, Name: req.Name, Mark: req.Mark})
			if err != nil {
				return false, err.Error()
			}
			return got.State == proxy.StateRunning && got.ProxyReachable && len(got.Replicas) == 2 && got.Details["replicas"] == "2/2",
				fmt.Sprintf("%s reachable %v, %d pods, replicas %+v, detail %q, progress %q", got.State, got.ProxyReachable, len(pods), got.Replicas, got.Details["replicas"], got.Progress)
		})
		if a, b := got.Replicas[0].ProxyAddress, got.Replicas[1].ProxyAddress; a == b || a == "" || !strings.HasSuffix(a, ":3128") {
			t.Errorf("replica addresses %q and %q; want two, each a pod's", a, b)
		}

		// Back to one: the budget goes, the Deployment follows.
		req = withReplicas(req, 1)
		if err := updateRetried(t, d, proxy.Ref{ID: inst.ID, Name: req.Name, Mark: req.Mark}, req); err != nil {
			t.Fatal(err)
		}
		if err := e.live.Get(ctx, key, &policyv1.PodDisruptionBudget{}); !kerrors.IsNotFound(err) {
			t.Errorf("back to one replica: PodDisruptionBudget get = %v; want it deleted", err)
		}
		if err := e.live.Get(ctx, key, dep); err != nil {
			t.Fatal(err)
		}
		if *dep.Spec.Replicas != 1 || dep.Spec.Template.Spec.TopologySpreadConstraints != nil {
			t.Errorf("Deployment replicas %d, spread %v; want 1 and none", *dep.Spec.Replicas, dep.Spec.Template.Spec.TopologySpreadConstraints)
		}

		// Two again, then deleted: the garbage collector takes the budget
		// with the Deployment.
		req = withReplicas(req, 2)
		if err := updateRetried(t, d, proxy.Ref{ID: inst.ID, Name: req.Name, Mark: req.Mark}, req); err != nil {
			t.Fatal(err)
		}
		if err := d.Delete(ctx, proxy.Ref{ID: inst.ID, Name: req.Name, Mark: req.Mark}); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "the garbage collector to delete the budget", func() (bool, string) {
			err := e.live.Get(ctx, key, &policyv1.PodDisruptionBudget{})
			return kerrors.IsNotFound(err), fmt.Sprint(err)
		})
	})

	t.Run("ABudgetOfTheNameThatIsNotOurs", func(t *testing.T) {
		t.Parallel()
		ns := e.namespace(t)
		d := e.driver(kubernetes.Config{Namespace: ns}, nil)
		req := request("budgeted")
		inst := e.createSettled(t, d, req)
		theirs := &policyv1.PodDisruptionBudget{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: req.Name, Labels: map[string]string{"app": "theirs"}},
			Spec:       policyv1.PodDisruptionBudgetSpec{MinAvailable: ptrTo(intstr.FromInt32(3)), Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "theirs"}}},
		}
		if err := e.live.Create(ctx, theirs); err != nil {
			t.Fatal(err)
		}
		err := updateRetried(t, d, proxy.Ref{ID: inst.ID, Name: req.Name, Mark: req.Mark}, withReplicas(req, 2))
		if !proxy.IsPermanent(err) || !strings.Contains(err.Error(), "PodDisruptionBudget "+ns+"/"+req.Name) {
			t.Errorf("Update to two replicas over a budget of the name that is not ours = %v; want Permanent naming it", err)
		}
		got := &policyv1.PodDisruptionBudget{}
		if err := e.live.Get(ctx, types.NamespacedName{Namespace: ns, Name: req.Name}, got); err != nil || got.ResourceVersion != theirs.ResourceVersion {
			t.Errorf("their budget after the refused Update: %v, resourceVersion %s (was %s); want it untouched", err, got.ResourceVersion, theirs.ResourceVersion)
		}
		// Deleting the proxy leaves it too.
		if err := d.Delete(ctx, proxy.Ref{ID: inst.ID, Name: req.Name, Mark: req.Mark}); err != nil {
			t.Fatal(err)
		}
		if err := e.settle(ctx, inst.ID, true); err != nil {
			t.Fatal(err)
		}
		if err := e.live.Get(ctx, types.NamespacedName{Namespace: ns, Name: req.Name}, got); err != nil || got.ResourceVersion != theirs.ResourceVersion {
			t.Errorf("their budget after the proxy's deletion: %v; want it untouched", err)
		}
	})
}

func ptrTo[T any](v T) *T { return &v }
