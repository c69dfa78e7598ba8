package pod

import (
	"encoding/json"
	"testing"

	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/event"

	spec "github.com/egressproxy/provider-egressproxy/apis/spec/v1alpha1"
	"github.com/egressproxy/provider-egressproxy/internal/backend/kubernetes"
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
