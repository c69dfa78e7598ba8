package kubernetes

import (
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

func TestObserve(t *testing.T) {
	req := testRequest()
	dep := buildDeployment(Config{}, req, render(t, req), "spec", now)
	dep.CreationTimestamp = metav1.NewTime(now.Add(time.Hour))
	cfgHash := Config{}.withDefaults().templateHash()
	currentHash := dep.Spec.Template.Annotations[AnnotationConfigHash]
	deleting := metav1.NewTime(now)

	pod := func(name string, phase corev1.PodPhase, ready bool, ip string, mutate ...func(*corev1.Pod)) corev1.Pod {
		p := corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID("uid-" + name), Annotations: map[string]string{AnnotationConfigHash: currentHash}}}
		p.Status.Phase, p.Status.PodIP = phase, ip
		st := corev1.ConditionFalse
		if ready {
			st = corev1.ConditionTrue
		}
		p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: st}}
		for _, m := range mutate {
			m(&p)
		}
		return p
	}
	old := func(p *corev1.Pod) { p.Annotations[AnnotationConfigHash] = "older" }
	gone := func(p *corev1.Pod) { p.DeletionTimestamp = &deleting }

	cases := map[string]struct {
		dep          func(*appsv1.Deployment)
		pods         []corev1.Pod
		svc          *corev1.Service
		wantState    proxy.State
		wantIP       string
		wantProbe    string
		wantProgress string
	}{
		"no pod yet": {
			wantState: proxy.StateProvisioning, wantProgress: startingProgress,
		},
		"pending": {
			pods:      []corev1.Pod{pod("p1", corev1.PodPending, false, "")},
			wantState: proxy.StateProvisioning, wantProgress: startingProgress,
		},
		"unschedulable": {
			pods: []corev1.Pod{pod("p1", corev1.PodPending, false, "", func(p *corev1.Pod) {
				p.Status.Conditions = append(p.Status.Conditions, corev1.PodCondition{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: "Unschedulable", Message: "0/3 nodes are available"})
			})},
			wantState: proxy.StateProvisioning, wantProgress: "pod p1 is not scheduled: Unschedulable 0/3 nodes are available",
		},
		"image pull failing": {
			pods: []corev1.Pod{pod("p1", corev1.PodPending, false, "", func(p *corev1.Pod) {
				p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "squid", State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ImagePullBackOff", Message: "not found"}}}}
			})},
			wantState: proxy.StateProvisioning, wantProgress: "pod p1: container squid is waiting: ImagePullBackOff not found",
		},
		"crash-looping: the last run's exit and message": {
			pods: []corev1.Pod{pod("p1", corev1.PodRunning, false, "10.1.0.5", func(p *corev1.Pod) {
				p.Status.ContainerStatuses = []corev1.ContainerStatus{{
					Name: "squid", RestartCount: 2,
					State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff", Message: "back-off 20s restarting failed container=squid"}},
					LastTerminationState: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
						ExitCode: 1, Reason: "Error", Message: "2026/12/01 squid starting\n\nFATAL: Bungled squid.conf line 3\n",
					}},
				}}
			})},
			wantState: proxy.StateProvisioning,
			wantProgress: "pod p1: container squid is waiting: CrashLoopBackOff back-off 20s restarting failed container=squid; " +
				"last exit 1 (Error): 2026/12/01 squid starting | FATAL: Bungled squid.conf line 3",
		},
		"running, not ready": {
			pods:      []corev1.Pod{pod("p1", corev1.PodRunning, false, "10.1.0.5")},
			wantState: proxy.StateProvisioning, wantProgress: startingProgress,
		},
		"ready": {
			pods:      []corev1.Pod{pod("p1", corev1.PodRunning, true, "10.1.0.5")},
			wantState: proxy.StateRunning, wantIP: "10.1.0.5", wantProbe: "10.1.0.5:3128",
		},
		"ready without an address is not running": {
			pods:      []corev1.Pod{pod("p1", corev1.PodRunning, true, "")},
			wantState: proxy.StateProvisioning, wantProgress: startingProgress,
		},
		"a deleting pod never reads as running": {
			pods:      []corev1.Pod{pod("p1", corev1.PodRunning, true, "10.1.0.5", gone)},
			wantState: proxy.StateProvisioning, wantProgress: startingProgress,
		},
		"a deleting pod and its replacement": {
			pods:      []corev1.Pod{pod("p1", corev1.PodRunning, true, "10.1.0.5", gone), pod("p2", corev1.PodRunning, true, "10.1.0.6")},
			wantState: proxy.StateRunning, wantIP: "10.1.0.6", wantProbe: "10.1.0.6:3128",
		},
		"rolling out: the old pod serves": {
			pods:      []corev1.Pod{pod("p1", corev1.PodRunning, true, "10.1.0.5", old), pod("p2", corev1.PodPending, false, "")},
			wantState: proxy.StateRunning, wantIP: "10.1.0.5", wantProbe: "10.1.0.5:3128",
			wantProgress: "rolling out a new configuration; the previous pod serves meanwhile",
		},
		"rolled out: the new pod is preferred": {
			pods:      []corev1.Pod{pod("p1", corev1.PodRunning, true, "10.1.0.5", old), pod("p2", corev1.PodRunning, true, "10.1.0.6")},
			wantState: proxy.StateRunning, wantIP: "10.1.0.6", wantProbe: "10.1.0.6:3128",
		},
		"failed pod being replaced": {
			pods:      []corev1.Pod{pod("p1", corev1.PodFailed, false, "")},
			wantState: proxy.StateProvisioning, wantProgress: startingProgress,
		},
		"node lost, its replacement starting": {
			pods:      []corev1.Pod{pod("p1", corev1.PodUnknown, false, "10.1.0.5"), pod("p2", corev1.PodPending, false, "")},
			wantState: proxy.StateProvisioning, wantProgress: `pod p1 is in phase "Unknown"`,
		},
		"node lost": {
			pods:      []corev1.Pod{pod("p1", corev1.PodUnknown, false, "10.1.0.5")},
			wantState: proxy.StateStopped, wantProgress: `pod p1 is in phase "Unknown"`,
		},
		"a phase nobody knows": {
			pods:      []corev1.Pod{pod("p1", "Hibernating", true, "10.1.0.5")},
			wantState: proxy.StateStopped, wantProgress: `pod p1 is in phase "Hibernating"`,
		},
		"quota refuses the pod": {
			dep: func(d *appsv1.Deployment) {
				d.Status.Conditions = []appsv1.DeploymentCondition{{Type: appsv1.DeploymentReplicaFailure, Status: corev1.ConditionTrue,
					Message: `pods "x" is forbidden: exceeded quota: q, requested: pods=1, used: pods=1, limited: pods=1`}}
			},
			wantState:    proxy.StateProvisioning,
			wantProgress: `cannot create the pod (ResourceQuota): pods "x" is forbidden: exceeded quota: q, requested: pods=1, used: pods=1, limited: pods=1`,
		},
		"deployment being deleted": {
			dep:       func(d *appsv1.Deployment) { d.DeletionTimestamp = &deleting },
			pods:      []corev1.Pod{pod("p1", corev1.PodRunning, true, "10.1.0.5")},
			wantState: proxy.StateStopped, wantProgress: "being deleted",
		},
		"scaled to zero": {
			dep:       func(d *appsv1.Deployment) { d.Spec.Replicas = ptr.To[int32](0) },
			wantState: proxy.StateStopped, wantProgress: "the Deployment is scaled to zero replicas",
		},
		"ClusterIP Service": {
			pods:      []corev1.Pod{pod("p1", corev1.PodRunning, true, "10.1.0.5")},
			svc:       &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "s"}, Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP, ClusterIP: "10.96.0.9"}},
			wantState: proxy.StateRunning, wantIP: "10.96.0.9", wantProbe: "10.1.0.5:3128",
		},
		"LoadBalancer without an address yet": {
			pods:      []corev1.Pod{pod("p1", corev1.PodRunning, true, "10.1.0.5")},
			svc:       &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "s"}, Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, ClusterIP: "10.96.0.9"}},
			wantState: proxy.StateProvisioning, wantProbe: "10.1.0.5:3128",
			wantProgress: "waiting for the load balancer of Service s to get an address",
		},
		"LoadBalancer": {
			pods: []corev1.Pod{pod("p1", corev1.PodRunning, true, "10.1.0.5")},
			svc: &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "s"}, Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer},
				Status: corev1.ServiceStatus{LoadBalancer: corev1.LoadBalancerStatus{Ingress: []corev1.LoadBalancerIngress{{IP: "203.0.113.7"}}}}},
			wantState: proxy.StateRunning, wantIP: "203.0.113.7", wantProbe: "10.1.0.5:3128",
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			d := dep.DeepCopy()
			if tc.dep != nil {
				tc.dep(d)
			}
			o := observe(d, tc.pods, tc.svc, cfgHash)
			if o.inst.State != tc.wantState || o.inst.IP != tc.wantIP || o.probe != tc.wantProbe || o.inst.Progress != tc.wantProgress {
				t.Errorf("observe: State %q, IP %q, probe %q, Progress %q\nwant State %q, IP %q, probe %q, Progress %q",
					o.inst.State, o.inst.IP, o.probe, o.inst.Progress, tc.wantState, tc.wantIP, tc.wantProbe, tc.wantProgress)
			}
			if o.inst.ID != "egress-proxies/"+req.Name || o.inst.Mark != req.Mark || !o.inst.CreatedAt.Equal(now) || o.inst.SpecHash != "spec" {
				t.Errorf("identity: ID %q, Mark %+v, CreatedAt %v, SpecHash %q", o.inst.ID, o.inst.Mark, o.inst.CreatedAt, o.inst.SpecHash)
			}
		})
	}
}

func TestObserveTemplateChangeReadsOutOfDate(t *testing.T) {
	req := testRequest()
	dep := buildDeployment(Config{Image: "old:1"}, req, render(t, req), "spec", now)
	if got := observe(dep, nil, nil, Config{Image: "old:1"}.withDefaults().templateHash()).inst.SpecHash; got != "spec" {
		t.Errorf("SpecHash %q with the same config; want %q", got, "spec")
	}
	if got := observe(dep, nil, nil, Config{Image: "new:2"}.withDefaults().templateHash()).inst.SpecHash; got == "spec" || !strings.HasPrefix(got, "spec") {
		t.Errorf("SpecHash %q after the config's image changed; want it to differ from the request's hash", got)
	}
}

func TestCreatedAtFallsBackToCreationTimestamp(t *testing.T) {
	dep := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{CreationTimestamp: metav1.NewTime(now)}}
	if got := createdAt(dep); !got.Equal(now) {
		t.Errorf("createdAt of a Deployment without the annotation = %v; want its creation time %v", got, now)
	}
}
