package kubernetes

import (
	"fmt"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// TestProgress_tenantClusterMessagesAreNeverQuoted: a tenant's cluster (a
// namespaced config's kubeconfig) says why a proxy's pod does not serve
// with messages holding a sentinel: a condition's, a waiting container's,
// a termination message, a ReplicaSet failure's, a reason and a phase that
// are not shaped as reasons. Its driver's Progress (the proxy's Ready
// condition) names the reasons and exit codes and never the sentinel; the
// platform's driver quotes the messages, which operators need.
func TestProgress_tenantClusterMessagesAreNeverQuoted(t *testing.T) {
	const sentinel = "SENTINEL-cluster-said-9b2e"
	req := testRequest()
	base := buildDeployment(Config{}, req, render(t, req), "spec", now)
	hash := base.Spec.Template.Annotations[AnnotationConfigHash]
	pod := func(mutate func(*corev1.Pod)) []corev1.Pod {
		p := corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p1", UID: types.UID("uid-p1"), Annotations: map[string]string{AnnotationConfigHash: hash}}}
		p.Status.Phase = corev1.PodPending
		p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionFalse}}
		mutate(&p)
		return []corev1.Pod{p}
	}
	crashed := func(name, reason string) func(*corev1.Pod) {
		return func(p *corev1.Pod) {
			p.Status.Phase = corev1.PodRunning
			p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: name, RestartCount: 3,
				State:                corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: reason, Message: "back-off 40s " + sentinel}},
				LastTerminationState: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 1, Reason: "Error", Message: "FATAL: " + sentinel}}}}
		}
	}
	cases := map[string]struct {
		dep  func(*appsv1.Deployment)
		pods []corev1.Pod
		// want is in both drivers' Progress.
		want string
	}{
		"Unschedulable": {pods: pod(func(p *corev1.Pod) {
			p.Status.Conditions = append(p.Status.Conditions, corev1.PodCondition{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: "Unschedulable", Message: "0/3 nodes: " + sentinel})
		}), want: "pod p1 is not scheduled: Unschedulable"},
		"ImagePullBackOff": {pods: pod(func(p *corev1.Pod) {
			p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "squid", State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ImagePullBackOff", Message: "pull " + sentinel}}}}
		}), want: "pod p1: container squid is waiting: ImagePullBackOff"},
		"CrashLoopBackOff": {pods: pod(crashed("squid", "CrashLoopBackOff")), want: "pod p1: container squid is waiting: CrashLoopBackOff"},
		"ReasonNotShapedAsOne": {pods: pod(func(p *corev1.Pod) {
			p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "squid", State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "Backed off: " + sentinel}}}}
		}), want: "pod p1: container squid is waiting: "},
		"PhaseNotShapedAsOne": {pods: pod(func(p *corev1.Pod) { p.Status.Phase = corev1.PodPhase("Lost " + sentinel) }), want: "pod p1 is in phase "},
		"ReplicaFailure": {dep: func(d *appsv1.Deployment) {
			d.Status.Conditions = []appsv1.DeploymentCondition{{Type: appsv1.DeploymentReplicaFailure, Status: corev1.ConditionTrue, Reason: "FailedCreate",
				Message: `admission webhook "x" denied the request: ` + sentinel}}
		}, want: "cannot create the pod: "},
		"Quota": {dep: func(d *appsv1.Deployment) {
			d.Status.Conditions = []appsv1.DeploymentCondition{{Type: appsv1.DeploymentReplicaFailure, Status: corev1.ConditionTrue, Reason: "FailedCreate",
				Message: `pods "x" is forbidden: exceeded quota: ` + sentinel}}
		}, want: "cannot create the pod (ResourceQuota): "},
	}
	tenant := (&Cluster{quiet: true}).Driver("ProviderConfig test", Config{}, nil)
	platform := (&Cluster{}).Driver("ProviderConfig test", Config{}, nil)
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			dep := base.DeepCopy()
			if tc.dep != nil {
				tc.dep(dep)
			}
			for _, d := range []*Driver{tenant, platform} {
				o := d.observe(dep.DeepCopy(), tc.pods, nil)
				got := o.inst.Progress
				quoted := strings.Contains(fmt.Sprintf("%+v", o.inst), sentinel)
				if d.quiet == quoted || !strings.Contains(got, tc.want) {
					t.Errorf("quiet %v: Progress %q; want %q, quoting the cluster's messages only for the platform's driver", d.quiet, got, tc.want)
				}
			}
		})
	}
	// The exit code and its reason stay for a tenant's cluster.
	o := tenant.observe(base.DeepCopy(), pod(crashed("squid", "CrashLoopBackOff")), nil)
	if want := "CrashLoopBackOff; last exit 1 (Error)"; !strings.HasSuffix(o.inst.Progress, want) {
		t.Errorf("tenant crash loop: Progress %q; want it to end with %q", o.inst.Progress, want)
	}
}

// TestProgress_reportContainerTerminationIsNeverQuoted: the reporting
// container's log holds the echo endpoint's answer (the proxy's egress
// check names it); its termination message is never quoted, whoever's
// cluster it is, and the container does not take its log for one.
func TestProgress_reportContainerTerminationIsNeverQuoted(t *testing.T) {
	const sentinel = "SENTINEL-echo-answered-51fa"
	req := withCheck("http://echo.example.com/ip")
	remote := New(Options{Config: Config{Namespace: "egress", EgressCheck: true}})
	dep := remote.buildDeployment(req, render(t, req), "spec")
	for _, c := range dep.Spec.Template.Spec.Containers {
		if c.Name == ReportContainerName && c.TerminationMessagePolicy != corev1.TerminationMessageReadFile {
			t.Errorf("the reporting container's termination message policy is %q; want %q (its log is the echo's answer)", c.TerminationMessagePolicy, corev1.TerminationMessageReadFile)
		}
	}
	p := corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p1", Annotations: map[string]string{AnnotationConfigHash: dep.Spec.Template.Annotations[AnnotationConfigHash]}}}
	p.Status.Phase = corev1.PodRunning
	p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: ReportContainerName, RestartCount: 2,
		State:                corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff"}},
		LastTerminationState: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 137, Reason: "OOMKilled", Message: "egressproxy-egress-check 1 200 " + sentinel}}}}
	for _, quiet := range []bool{true, false} {
		got := observeFor(dep.DeepCopy(), []corev1.Pod{p}, nil, "", quiet).inst.Progress
		if strings.Contains(got, sentinel) || !strings.Contains(got, "last exit 137 (OOMKilled)") {
			t.Errorf("quiet %v: Progress %q; want the exit code and reason, never the termination message", quiet, got)
		}
	}
}
