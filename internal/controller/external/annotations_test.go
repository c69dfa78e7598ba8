package external

import (
	"context"
	"testing"

	"github.com/crossplane/crossplane-runtime/v2/pkg/reconciler/managed"
	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	nsproxy "github.com/egressproxy/provider-egressproxy/apis/namespaced/proxy/v1alpha1"
	spec "github.com/egressproxy/provider-egressproxy/apis/spec/v1alpha1"
)

// TestAnnotationUpdateKeepsWhatCreateRecorded: the annotation update's
// response carries the server's older status; what Create observed and
// the conditions it set (Secure, EgressVerified) stay, so the status
// write after Create saves them and the first Observe records no Warning
// again. The reconciler's own conditions come from the server.
func TestAnnotationUpdateKeepsWhatCreateRecorded(t *testing.T) {
	secure := xpv2.Condition{Type: spec.TypeSecure, Status: corev1.ConditionFalse, Reason: reasonCredentialsInClear, Message: "in clear"}
	egress := xpv2.Condition{Type: spec.TypeEgressVerified, Status: corev1.ConditionTrue, Reason: "Verified"}
	cr := proxyResource(func(cr *nsproxy.KVMProxy) {
		cr.Status.AtProvider = spec.ProxyObservation{ID: "hosts/local/domains/px-1", State: "Provisioning"}
		cr.SetConditions(secure, egress, xpv2.Creating())
	})
	server := xpv2.Available()
	u := annotationUpdater{inner: managed.CriticalAnnotationUpdateFn(func(_ context.Context, o client.Object) error {
		// What the API server answers: the stored status, which has
		// neither the observation nor Create's conditions.
		p := o.(*nsproxy.KVMProxy) //nolint:forcetypeassert // the test's own object.
		p.Status = nsproxy.KVMProxyStatus{}
		p.SetConditions(server)
		return nil
	})}
	if err := u.UpdateCriticalAnnotations(context.Background(), cr); err != nil {
		t.Fatal(err)
	}
	if cr.Status.AtProvider.ID != "hosts/local/domains/px-1" {
		t.Errorf("status.atProvider.id = %q after the update; want what Create observed", cr.Status.AtProvider.ID)
	}
	ignore := cmpopts.IgnoreFields(xpv2.Condition{}, "LastTransitionTime")
	for _, want := range []xpv2.Condition{secure, egress, server} {
		if diff := cmp.Diff(want, cr.GetCondition(want.Type), ignore); diff != "" {
			t.Errorf("condition %s after the update (-want +got):\n%s", want.Type, diff)
		}
	}
}
