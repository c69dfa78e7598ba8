package kubernetes

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

// egressPool is a config that keeps proxies on a tainted pool of egress
// nodes.
func egressPool() Config {
	return Config{
		NodeSelector: map[string]string{"egressproxy.io/egress": "true"},
		Tolerations:  []corev1.Toleration{{Key: "egressproxy.io/egress", Operator: corev1.TolerationOpEqual, Value: "true", Effect: corev1.TaintEffectNoSchedule}},
		Affinity: &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
			NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "topology.kubernetes.io/zone", Operator: corev1.NodeSelectorOpIn, Values: []string{"eu-1a", "eu-1b"}}}}},
		}}},
	}
}

func withReplicas(req proxy.Request, n int32) proxy.Request {
	e, _ := req.Extension.(Exposure)
	e.Replicas = n
	req.Extension = e
	return req
}

func TestBuildDeploymentOnEgressNodes(t *testing.T) {
	req := testRequest()
	cfg := egressPool()
	ps := buildDeployment(cfg, req, render(t, req), "h", now).Spec.Template.Spec
	if diff := cmp.Diff(cfg.Tolerations, ps.Tolerations); diff != "" {
		t.Errorf("tolerations (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(cfg.Affinity, ps.Affinity); diff != "" {
		t.Errorf("affinity (-want +got):\n%s", diff)
	}
	// The pod spec holds copies: a later change to the config's values
	// (a shared informer's object) cannot reach a built Deployment.
	cfg.Tolerations[0].Value = "changed"
	cfg.Affinity.NodeAffinity = nil
	if ps.Tolerations[0].Value != "true" || ps.Affinity.NodeAffinity == nil {
		t.Error("the Deployment shares the config's tolerations or affinity")
	}
	if len(ps.TopologySpreadConstraints) != 0 {
		t.Errorf("one replica spreads over %v; want no constraint", ps.TopologySpreadConstraints)
	}

	// Each placement field rolls the pods when it changes; an existing
	// proxy without any keeps its template hash (no rollout on upgrade).
	base := Config{NodeSelector: map[string]string{"pool": "egress"}}.withDefaults().templateHash()
	if got := (Config{NodeSelector: map[string]string{"pool": "egress"}, Tolerations: []corev1.Toleration{}}).withDefaults().templateHash(); got != base {
		t.Errorf("an empty toleration list changes the template hash %s to %s", base, got)
	}
	for name, c := range map[string]Config{
		"tolerations": {NodeSelector: map[string]string{"pool": "egress"}, Tolerations: egressPool().Tolerations},
		"affinity":    {NodeSelector: map[string]string{"pool": "egress"}, Affinity: egressPool().Affinity},
	} {
		if c.withDefaults().templateHash() == base {
			t.Errorf("the template hash does not change with %s", name)
		}
	}
}

// TestTemplateHashOfAnOldConfigIsStable: a config without the placement
// fields added later hashes as the Config before them did, so a provider
// upgrade rolls no pod.
func TestTemplateHashOfAnOldConfigIsStable(t *testing.T) {
	// The Config as it was before Tolerations and Affinity.
	type before struct {
		Namespace        string
		Image            string
		ImagePullSecrets []string
		Resources        *corev1.ResourceRequirements
		NodeSelector     map[string]string
		ClusterNetworks  []string
		NetworkPolicy    bool
	}
	c := Config{Namespace: "egress", NodeSelector: map[string]string{"pool": "egress"}, ImagePullSecrets: []string{"regcred"}}.withDefaults()
	b, err := json.Marshal(struct {
		V string
		C before
	}{templateVersion, before{Namespace: c.Namespace, Image: c.Image, ImagePullSecrets: c.ImagePullSecrets, Resources: c.Resources, NodeSelector: c.NodeSelector}})
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(b)
	if want := hex.EncodeToString(sum[:])[:16]; c.templateHash() != want {
		t.Errorf("template hash %s; want %s, the hash of the same config before tolerations and affinity", c.templateHash(), want)
	}
}

func TestBuildDeploymentReplicas(t *testing.T) {
	one := testRequest()
	three := withReplicas(testRequest(), 3)
	files := render(t, one)

	dep := buildDeployment(Config{}, three, files, "h", now)
	if *dep.Spec.Replicas != 3 {
		t.Errorf("replicas %d; want 3", *dep.Spec.Replicas)
	}
	want := []corev1.TopologySpreadConstraint{{
		MaxSkew:           1,
		TopologyKey:       "kubernetes.io/hostname",
		WhenUnsatisfiable: corev1.DoNotSchedule,
		LabelSelector:     &metav1.LabelSelector{MatchLabels: map[string]string{LabelName: one.Name, LabelUID: one.Mark.UID}},
		MatchLabelKeys:    []string{"pod-template-hash"},
		NodeTaintsPolicy:  ptr.To(corev1.NodeInclusionPolicyHonor),
	}}
	if diff := cmp.Diff(want, dep.Spec.Template.Spec.TopologySpreadConstraints); diff != "" {
		t.Errorf("spread (-want +got):\n%s", diff)
	}
	// The rollout still brings a new pod up before an old one goes.
	if ru := dep.Spec.Strategy.RollingUpdate; ru.MaxUnavailable.IntValue() != 0 || ru.MaxSurge.IntValue() != 1 {
		t.Errorf("rolling update %+v; want maxUnavailable 0, maxSurge 1", ru)
	}
	// The user's own affinity stays beside the spread.
	dep = buildDeployment(egressPool(), three, files, "h", now)
	if dep.Spec.Template.Spec.Affinity == nil || len(dep.Spec.Template.Spec.TopologySpreadConstraints) != 1 {
		t.Errorf("affinity %v, spread %v; want both", dep.Spec.Template.Spec.Affinity, dep.Spec.Template.Spec.TopologySpreadConstraints)
	}
	for _, n := range []int32{0, 1} {
		dep := buildDeployment(Config{}, withReplicas(testRequest(), n), files, "h", now)
		if *dep.Spec.Replicas != 1 || dep.Spec.Template.Spec.TopologySpreadConstraints != nil {
			t.Errorf("replicas %d: Deployment replicas %d, spread %v; want 1 and none", n, *dep.Spec.Replicas, dep.Spec.Template.Spec.TopologySpreadConstraints)
		}
	}
}

func TestBuildDisruptionBudget(t *testing.T) {
	req := withReplicas(testRequest(), 2)
	dep := buildDeployment(Config{Namespace: "egress"}, req, render(t, req), "h", now)
	dep.UID = types.UID("dep-uid")
	pdb := buildDisruptionBudget(dep, req)
	if pdb == nil {
		t.Fatal("no PodDisruptionBudget for two replicas")
	}
	want := &policyv1.PodDisruptionBudget{
		TypeMeta: metav1.TypeMeta{APIVersion: "policy/v1", Kind: "PodDisruptionBudget"},
		ObjectMeta: metav1.ObjectMeta{
			Name: dep.Name, Namespace: "egress", Labels: markLabels(req),
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "Deployment", Name: dep.Name, UID: "dep-uid", Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true)}},
		},
		Spec: policyv1.PodDisruptionBudgetSpec{
			MaxUnavailable:             ptr.To(intstr.FromInt32(1)),
			Selector:                   dep.Spec.Selector,
			UnhealthyPodEvictionPolicy: ptr.To(policyv1.AlwaysAllow),
		},
	}
	if diff := cmp.Diff(want, pdb); diff != "" {
		t.Errorf("PodDisruptionBudget (-want +got):\n%s", diff)
	}
	if got := buildDisruptionBudget(dep, testRequest()); got != nil {
		t.Errorf("one replica has a budget %+v; want none (it would only block a drain)", got.Spec)
	}
}

// TestReplicasHash: one replica hashes as before replicas existed, so no
// existing proxy is updated; more change the hash.
func TestReplicasHash(t *testing.T) {
	plain := testRequest()
	one := withReplicas(testRequest(), 1)
	two := withReplicas(testRequest(), 2)
	if proxy.Hash(plain) != proxy.Hash(one) {
		t.Errorf("replicas 1 hashes %s, a request without replicas %s; want the same", proxy.Hash(one), proxy.Hash(plain))
	}
	if proxy.Hash(two) == proxy.Hash(one) {
		t.Error("replicas 2 hashes as 1")
	}
	if err := checkRequest(withReplicas(testRequest(), MaxReplicas+1)); err == nil || !proxy.IsPermanent(err) || !strings.Contains(err.Error(), "spec.forProvider.replicas") {
		t.Errorf("replicas %d: %v; want a Permanent error naming spec.forProvider.replicas", MaxReplicas+1, err)
	}
}

func TestObserveReplicas(t *testing.T) {
	req := withReplicas(testRequest(), 2)
	dep := buildDeployment(Config{}, req, render(t, req), "spec", now)
	hash := dep.Spec.Template.Annotations[AnnotationConfigHash]
	pod := func(name, node, ip string, ready bool, configHash string) corev1.Pod {
		p := corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID("uid-" + name), Annotations: map[string]string{AnnotationConfigHash: configHash}}}
		p.Spec.NodeName = node
		p.Status.Phase, p.Status.PodIP = corev1.PodRunning, ip
		st := corev1.ConditionFalse
		if ready {
			st = corev1.ConditionTrue
		}
		p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: st}}
		return p
	}
	unschedulable := corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p2", Annotations: map[string]string{AnnotationConfigHash: hash}}}
	unschedulable.Status.Phase = corev1.PodPending
	unschedulable.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: "Unschedulable",
		Message: "0/2 nodes are available: 1 node(s) didn't match pod topology spread constraints, 1 node(s) had untolerated taint {egressproxy.io/egress: true}."}}

	for name, tc := range map[string]struct {
		pods         []corev1.Pod
		wantState    proxy.State
		wantProgress string
		wantServing  []string
		wantDetail   string
	}{
		"both serve": {
			pods:      []corev1.Pod{pod("p2", "n2", "10.1.1.6", true, hash), pod("p1", "n1", "10.1.0.5", true, hash)},
			wantState: proxy.StateRunning, wantServing: []string{"p1", "p2"}, wantDetail: "2/2",
		},
		"one serves, the other cannot be scheduled: Running, and Progress says why": {
			pods:      []corev1.Pod{pod("p1", "n1", "10.1.0.5", true, hash), unschedulable},
			wantState: proxy.StateRunning, wantServing: []string{"p1"}, wantDetail: "1/2",
			wantProgress: "1 of 2 replicas serve: pod p2 is not scheduled: Unschedulable 0/2 nodes are available: 1 node(s) didn't match pod topology spread constraints, 1 node(s) had untolerated taint {egressproxy.io/egress: true}.",
		},
		"rolling out: old and new pods all send traffic": {
			pods:      []corev1.Pod{pod("p1", "n1", "10.1.0.5", true, "older"), pod("p2", "n2", "10.1.1.6", true, "older"), pod("p3", "n1", "10.1.0.7", true, hash)},
			wantState: proxy.StateRunning, wantServing: []string{"p1", "p2", "p3"}, wantDetail: "1/2",
			wantProgress: "rolling out a new configuration: 1 of 2 replicas have it",
		},
		"none serves": {
			pods:         []corev1.Pod{pod("p1", "n1", "10.1.0.5", false, hash), unschedulable},
			wantState:    proxy.StateProvisioning,
			wantProgress: "pod p2 is not scheduled: Unschedulable 0/2 nodes are available: 1 node(s) didn't match pod topology spread constraints, 1 node(s) had untolerated taint {egressproxy.io/egress: true}.",
		},
	} {
		t.Run(name, func(t *testing.T) {
			o := observe(dep.DeepCopy(), tc.pods, nil, Config{}.withDefaults().templateHash())
			var serving []string
			for _, p := range o.serving {
				serving = append(serving, p.Name)
			}
			if o.inst.State != tc.wantState || o.inst.Progress != tc.wantProgress || !cmp.Equal(serving, tc.wantServing) || o.inst.Details["replicas"] != tc.wantDetail {
				t.Errorf("State %q, Progress %q, serving %v, replicas %q\nwant %q, %q, %v, %q", o.inst.State, o.inst.Progress, serving, o.inst.Details["replicas"],
					tc.wantState, tc.wantProgress, tc.wantServing, tc.wantDetail)
			}
		})
	}
	// Each serving pod is a replica at its own address, on its node.
	o := observe(dep.DeepCopy(), []corev1.Pod{pod("p1", "n1", "10.1.0.5", true, hash), pod("p2", "n2", "10.1.1.6", true, hash)}, nil, "")
	want := []proxy.Replica{{Name: "p1", Node: "n1", ProxyAddress: "10.1.0.5:3128"}, {Name: "p2", Node: "n2", ProxyAddress: "10.1.1.6:3128"}}
	if diff := cmp.Diff(want, servingReplicas(o.serving, portOf(dep))); diff != "" {
		t.Errorf("replicas (-want +got):\n%s", diff)
	}
	// One replica: no replica list, no detail (status as before).
	single := buildDeployment(Config{}, testRequest(), render(t, testRequest()), "spec", now)
	o = observe(single, []corev1.Pod{pod("p1", "n1", "10.1.0.5", true, hash), pod("p2", "n2", "10.1.1.6", true, "older")}, nil, "")
	if o.serving != nil || o.inst.Details["replicas"] != "" {
		t.Errorf("one replica: serving %v, replicas detail %q; want none", o.serving, o.inst.Details["replicas"])
	}
}

// The egress check sees one of several replicas at a time unless the
// provider reaches each pod.
func TestSeenOneAtATime(t *testing.T) {
	two := []*corev1.Pod{{}, {}}
	for _, tc := range []struct {
		serving  []*corev1.Pod
		replicas []proxy.Replica
		want     int
	}{
		{two, nil, 2},                     // a load balancer, or one pod's report
		{two, []proxy.Replica{{}, {}}, 0}, // checked through each
		{[]*corev1.Pod{{}}, nil, 0},       // one replica
		{nil, nil, 0},                     // none serves
	} {
		if got := seenOneAtATime(tc.serving, tc.replicas); got != tc.want {
			t.Errorf("%d serving, %d replicas reached: %d, want %d", len(tc.serving), len(tc.replicas), got, tc.want)
		}
	}
}
