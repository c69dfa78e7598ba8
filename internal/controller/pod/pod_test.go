package pod

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/crossplane/crossplane-runtime/v2/pkg/resource"
	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/priorityqueue"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	clusterproxy "github.com/egressproxy/provider-egressproxy/apis/cluster/proxy/v1alpha1"
	nsproxy "github.com/egressproxy/provider-egressproxy/apis/namespaced/proxy/v1alpha1"
	spec "github.com/egressproxy/provider-egressproxy/apis/spec/v1alpha1"
	"github.com/egressproxy/provider-egressproxy/internal/backend/kubernetes"
	"github.com/egressproxy/provider-egressproxy/internal/controller/external"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

// TestRequestService: the Service type and the replicas reach the driver
// as the kubernetes backend's Extension, hashing as it did when the
// contract held it (replicas only when more than one); no Service is no
// Extension (the hash of the empty block).
func TestRequestService(t *testing.T) {
	cases := map[string]struct {
		params   spec.PodProxyParameters
		want     proxy.Extension
		wantHash string
	}{
		"NoService": {},
		"LoadBalancer": {
			params:   spec.PodProxyParameters{Service: &spec.PodService{Type: "LoadBalancer"}},
			want:     kubernetes.Exposure{ServiceType: "LoadBalancer"},
			wantHash: `{"AddressType":"","RetainAddress":false,"ManageFirewall":false,"ServiceType":"LoadBalancer"}`,
		},
		// One replica (admission's default) hashes as no replicas did.
		"OneReplica": {
			params:   spec.PodProxyParameters{Replicas: ptr.To[int32](1)},
			want:     kubernetes.Exposure{Replicas: 1},
			wantHash: `{"AddressType":"","RetainAddress":false,"ManageFirewall":false,"ServiceType":""}`,
		},
		"ThreeReplicasBehindAService": {
			params:   spec.PodProxyParameters{Replicas: ptr.To[int32](3), Service: &spec.PodService{Type: "ClusterIP"}},
			want:     kubernetes.Exposure{ServiceType: "ClusterIP", Replicas: 3},
			wantHash: `{"AddressType":"","RetainAddress":false,"ManageFirewall":false,"ServiceType":"ClusterIP","Replicas":3}`,
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			req := proxy.Request{}
			if err := request(nil, &tc.params, &req); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, req.Extension); diff != "" {
				t.Errorf("request(...).Extension: -want, +got:\n%s", diff)
			}
			if tc.want == nil {
				return
			}
			b, _ := json.Marshal(req.Extension.HashInput())
			if diff := cmp.Diff(tc.wantHash, string(b)); diff != "" {
				t.Errorf("HashInput: -want, +got:\n%s", diff)
			}
		})
	}
}

func TestBlock(t *testing.T) {
	if _, ok := block(&spec.ProviderConfigSpec{GCP: &spec.GCPConfig{}}); ok {
		t.Error("block of a gcp config: ok; want false")
	}
	b, ok := block(&spec.ProviderConfigSpec{Kubernetes: &spec.KubernetesConfig{Credentials: spec.KubernetesCredentials{Source: xpv2.CredentialsSourceInjectedIdentity}}})
	if !ok || b.CredentialsSource == nil || *b.CredentialsSource != xpv2.CredentialsSourceInjectedIdentity || b.AllowUserCloudInit != nil {
		t.Errorf("block(kubernetes) = %+v, %v; want the credentials source and nothing else", b, ok)
	}
}

// TestDeploymentDeletionsThatWaitedReconcile: a Deployment deleted at once
// (the driver's background deletion) reconciles nothing, its pods' deletions
// do; one whose deletion waited (foreground: it carries its deletion
// timestamp to the end), or one the watch missed, reconciles the proxy.
func TestDeploymentDeletionsThatWaitedReconcile(t *testing.T) {
	now := metav1.Now()
	cases := map[string]struct {
		ev   event.TypedDeleteEvent[*appsv1.Deployment]
		want bool
	}{
		"Background":   {ev: event.TypedDeleteEvent[*appsv1.Deployment]{Object: &appsv1.Deployment{}}, want: false},
		"Foreground":   {ev: event.TypedDeleteEvent[*appsv1.Deployment]{Object: &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{DeletionTimestamp: &now}}}, want: true},
		"MissedDelete": {ev: event.TypedDeleteEvent[*appsv1.Deployment]{Object: &appsv1.Deployment{}, DeleteStateUnknown: true}, want: true},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if got := deploymentChanged().Delete(tc.ev); got != tc.want {
				t.Errorf("Delete = %v; want %v", got, tc.want)
			}
		})
	}
}

// TestPodDeletionGoesFirst: a pod's deletion queues its proxy above the
// other watch events (a resource being deleted waits for its last pod, and
// its finalizer should go at once), also when the proxy was queued
// already; the pod's other changes, and a Deployment's deletion, go at
// the watches' priority, first come first served.
func TestPodDeletionGoesFirst(t *testing.T) {
	ctx := context.Background()
	toRequests := func(_ context.Context, o client.Object) []reconcile.Request {
		return []reconcile.Request{{NamespacedName: types.NamespacedName{Name: o.GetLabels()[kubernetes.LabelUID]}}}
	}
	meta := func(uid string) metav1.ObjectMeta {
		return metav1.ObjectMeta{Labels: map[string]string{kubernetes.LabelUID: uid}}
	}
	pod := func(uid string) *corev1.Pod { return &corev1.Pod{ObjectMeta: meta(uid)} }
	pods := enqueue[*corev1.Pod](toRequests, gonePriority)
	deployments := enqueue[*appsv1.Deployment](toRequests, watchPriority)
	q := priorityqueue.New[reconcile.Request]("test")
	defer q.ShutDown()

	pods.Update(ctx, event.TypedUpdateEvent[*corev1.Pod]{ObjectOld: pod("ready"), ObjectNew: pod("ready")}, q)
	deployments.Delete(ctx, event.TypedDeleteEvent[*appsv1.Deployment]{Object: &appsv1.Deployment{ObjectMeta: meta("deployment-gone")}}, q)
	pods.Update(ctx, event.TypedUpdateEvent[*corev1.Pod]{ObjectOld: pod("queued-then-gone"), ObjectNew: pod("queued-then-gone")}, q)
	pods.Delete(ctx, event.TypedDeleteEvent[*corev1.Pod]{Object: pod("gone")}, q)
	pods.Delete(ctx, event.TypedDeleteEvent[*corev1.Pod]{Object: pod("queued-then-gone")}, q)

	type queued struct {
		Name     string
		Priority int
	}
	want := []queued{{"gone", gonePriority}, {"queued-then-gone", gonePriority}, {"ready", watchPriority}, {"deployment-gone", watchPriority}}
	var got []queued
	for range want {
		r, p, _ := q.GetWithPriority()
		got = append(got, queued{r.Name, p})
		q.Done(r)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("the queue's order (-want +got):\n%s", diff)
	}
}

// TestOwned: the PodProxy owns its Deployment only where the garbage
// collector can honour it and where deleting the resource deletes the
// proxy anyway: in the provider's own cluster, cluster-scoped or in the
// Deployment's namespace, without deletionPolicy Orphan or management
// policies that leave the instance. Elsewhere an owner the collector
// cannot find would make it delete the Deployment at once.
func TestOwned(t *testing.T) {
	injected := &external.Config{}
	injected.Spec.Kubernetes = &spec.KubernetesConfig{Namespace: "egress-proxies"}
	injected.Spec.Kubernetes.Credentials.Source = xpv2.CredentialsSourceInjectedIdentity
	remote := &external.Config{}
	remote.Spec.Kubernetes = &spec.KubernetesConfig{Namespace: "egress-proxies"}
	remote.Spec.Kubernetes.Credentials.Source = xpv2.CredentialsSourceSecret

	cluster := func(mutate ...func(*clusterproxy.PodProxy)) *clusterproxy.PodProxy {
		p := &clusterproxy.PodProxy{ObjectMeta: metav1.ObjectMeta{Name: "shared", UID: "uid-1"}}
		for _, m := range mutate {
			m(p)
		}
		return p
	}
	inNS := func(ns string) *nsproxy.PodProxy {
		return &nsproxy.PodProxy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "team", UID: "uid-2"}}
	}
	cases := map[string]struct {
		cfg  *external.Config
		mg   resource.Managed
		want *kubernetes.Owner
	}{
		"ClusterScopedInThisCluster": {injected, cluster(), &kubernetes.Owner{APIVersion: "proxy.egressproxy.io/v1alpha1", Kind: "PodProxy", Name: "shared", UID: "uid-1"}},
		"NamespacedInTheDeploymentsNamespace": {injected, inNS("egress-proxies"),
			&kubernetes.Owner{APIVersion: "proxy.m.egressproxy.io/v1alpha1", Kind: "PodProxy", Name: "team", UID: "uid-2"}},
		"NamespacedInAnotherNamespace": {injected, inNS("team-a"), nil},
		"RemoteCluster":                {remote, cluster(), nil},
		"DeletionPolicyOrphan": {injected, cluster(func(p *clusterproxy.PodProxy) {
			p.SetDeletionPolicy(xpv2.DeletionOrphan)
		}), nil},
		"ManagementPoliciesWithoutDelete": {injected, cluster(func(p *clusterproxy.PodProxy) {
			p.SetManagementPolicies(xpv2.ManagementPolicies{xpv2.ManagementActionObserve, xpv2.ManagementActionCreate, xpv2.ManagementActionUpdate})
		}), nil},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			req := proxy.Request{Extension: kubernetes.Exposure{ServiceType: "ClusterIP"}}
			owned(tc.cfg, tc.mg, &req)
			e, _ := req.Extension.(kubernetes.Exposure)
			if e.ServiceType != "ClusterIP" {
				t.Errorf("the Service type was lost: %+v", e)
			}
			if diff := cmp.Diff(tc.want, e.Owner); diff != "" {
				t.Errorf("owner (-want +got):\n%s", diff)
			}
		})
	}
}
