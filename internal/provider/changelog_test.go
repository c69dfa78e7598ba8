package provider

import (
	"context"
	"strings"
	"testing"

	changelogsv1alpha1 "github.com/crossplane/crossplane-runtime/v2/apis/changelogs/proto/v1alpha1"
	"github.com/crossplane/crossplane-runtime/v2/pkg/reconciler/managed"
	"github.com/crossplane/crossplane-runtime/v2/pkg/resource"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protojson"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	clusterproxyv1alpha1 "github.com/egressproxy/provider-egressproxy/apis/cluster/proxy/v1alpha1"
	namespacedproxyv1alpha1 "github.com/egressproxy/provider-egressproxy/apis/namespaced/proxy/v1alpha1"
	spec "github.com/egressproxy/provider-egressproxy/apis/spec/v1alpha1"
	"github.com/egressproxy/provider-egressproxy/internal/telemetry"
)

const cloudInitSentinel = "ci-S3NT1NEL-q8w3e5r7t9y2"

// changeLogService keeps the entries sent to it.
type changeLogService struct {
	entries []*changelogsv1alpha1.ChangeLogEntry
}

func (s *changeLogService) SendChangeLog(_ context.Context, in *changelogsv1alpha1.SendChangeLogRequest, _ ...grpc.CallOption) (*changelogsv1alpha1.SendChangeLogResponse, error) {
	s.entries = append(s.entries, in.GetEntry())
	return &changelogsv1alpha1.SendChangeLogResponse{}, nil
}

// TestChangeLogWithoutSecrets: the change log entry of every kind with a
// cloud-init has it redacted, in spec.forProvider.cloudInit and in
// kubectl's last-applied-configuration, keeps the rest of the proxy, and
// the reconciler's object keeps its cloud-init.
func TestChangeLogWithoutSecrets(t *testing.T) {
	ci := "#cloud-config\nbootcmd:\n  - echo " + cloudInitSentinel + "\n"
	meta := metav1.ObjectMeta{Name: "p1", Annotations: map[string]string{
		corev1.LastAppliedConfigAnnotation: `{"spec":{"forProvider":{"cloudInit":"` + cloudInitSentinel + `"}}}`,
	}}
	ns := meta
	ns.Namespace = "team-a"
	for _, mg := range []resource.Managed{
		&namespacedproxyv1alpha1.KVMProxy{ObjectMeta: ns, Spec: namespacedproxyv1alpha1.KVMProxySpec{ForProvider: spec.KVMProxyParameters{MachineType: "small", CloudInit: ci}}},
		&namespacedproxyv1alpha1.ProxmoxProxy{ObjectMeta: ns, Spec: namespacedproxyv1alpha1.ProxmoxProxySpec{ForProvider: spec.ProxmoxProxyParameters{MachineType: "small", CloudInit: ci}}},
		&namespacedproxyv1alpha1.GCPProxy{ObjectMeta: ns, Spec: namespacedproxyv1alpha1.GCPProxySpec{ForProvider: spec.GCPProxyParameters{MachineType: "small", CloudInit: ci}}},
		&clusterproxyv1alpha1.KVMProxy{ObjectMeta: meta, Spec: clusterproxyv1alpha1.KVMProxySpec{ForProvider: spec.KVMProxyParameters{MachineType: "small", CloudInit: ci}}},
		&clusterproxyv1alpha1.ProxmoxProxy{ObjectMeta: meta, Spec: clusterproxyv1alpha1.ProxmoxProxySpec{ForProvider: spec.ProxmoxProxyParameters{MachineType: "small", CloudInit: ci}}},
		&clusterproxyv1alpha1.GCPProxy{ObjectMeta: meta, Spec: clusterproxyv1alpha1.GCPProxySpec{ForProvider: spec.GCPProxyParameters{MachineType: "small", CloudInit: ci}}},
	} {
		want := mg.DeepCopyObject()
		svc := &changeLogService{}
		l := withoutSecrets(managed.NewGRPCChangeLogger(svc))
		if err := l.Log(context.Background(), mg, changelogsv1alpha1.OperationType_OPERATION_TYPE_CREATE, nil, nil); err != nil {
			t.Fatalf("%T: Log: %v", mg, err)
		}
		if len(svc.entries) != 1 {
			t.Fatalf("%T: %d change log entries sent; want 1", mg, len(svc.entries))
		}
		b, err := protojson.Marshal(svc.entries[0])
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(b), cloudInitSentinel) {
			t.Errorf("%T: the cloud-init sentinel appears in the change log entry: %s", mg, b)
		}
		fp := svc.entries[0].GetSnapshot().GetFields()["spec"].GetStructValue().GetFields()["forProvider"].GetStructValue().AsMap()
		if fp["cloudInit"] != telemetry.Redacted || fp["machineType"] != "small" {
			t.Errorf("%T: spec.forProvider in the change log entry is %v; want cloudInit %q and machineType small", mg, fp, telemetry.Redacted)
		}
		if diff := cmp.Diff(want, mg); diff != "" {
			t.Errorf("%T: the reconciler's object was changed (-before +after):\n%s", mg, diff)
		}
	}
}
