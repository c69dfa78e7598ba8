package external

import (
	"context"
	"testing"

	"github.com/crossplane/crossplane-runtime/v2/pkg/reconciler/managed"
	"github.com/crossplane/crossplane-runtime/v2/pkg/resource"
	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	ktypes "k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	nsproxy "github.com/egressproxy/provider-egressproxy/apis/namespaced/proxy/v1alpha1"
	"github.com/egressproxy/provider-egressproxy/internal/controller/writes"
)

// Details the connection Secret already holds are handed to
// crossplane-runtime's publisher as nil (it then compares and sends
// nothing); any difference, a Secret of someone else, or none at all hands
// them over whole.
func TestUnpublished(t *testing.T) {
	mg := &nsproxy.KVMProxy{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "team-a", UID: "uid-1"}}
	mg.Spec.WriteConnectionSecretToReference = &xpv2.LocalSecretReference{Name: "p-proxy"}
	want := managed.ConnectionDetails{"url": []byte("http://10.0.0.5:3128"), "host": []byte("10.0.0.5")}
	secret := func(owner string, data map[string][]byte) *corev1.Secret {
		return &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: "p-proxy", Namespace: "team-a", OwnerReferences: []metav1.OwnerReference{{
				APIVersion: "proxy.m.egressproxy.io/v1alpha1", Kind: "KVMProxy", Name: "p", UID: ktypes.UID("uid-" + owner), Controller: ptr.To(true)}}},
			Type: resource.SecretTypeConnection, Data: data,
		}
	}
	cases := map[string]struct {
		existing *corev1.Secret
		nilOut   bool
	}{
		"SameData":     {existing: secret("1", map[string][]byte{"url": []byte("http://10.0.0.5:3128"), "host": []byte("10.0.0.5")}), nilOut: true},
		"ValueChanged": {existing: secret("1", map[string][]byte{"url": []byte("http://10.0.0.6:3128"), "host": []byte("10.0.0.6")})},
		"KeyMissing":   {existing: secret("1", map[string][]byte{"url": []byte("http://10.0.0.5:3128")})},
		"ExtraKey":     {existing: secret("1", map[string][]byte{"url": []byte("http://10.0.0.5:3128"), "host": []byte("10.0.0.5"), "password": []byte("x")})},
		"AnotherOwner": {existing: secret("2", map[string][]byte{"url": []byte("http://10.0.0.5:3128"), "host": []byte("10.0.0.5")})},
		"NoSecretYet":  {},
	}
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			b := fake.NewClientBuilder().WithScheme(s)
			if tc.existing != nil {
				b = b.WithObjects(tc.existing)
			}
			c := b.Build()
			e := &external[struct{}]{kube: writes.NewClient(c, c, func() bool { return true })}
			got := e.unpublished(context.Background(), mg, want)
			if tc.nilOut != (got == nil) {
				t.Errorf("unpublished = %v; want nil: %v", got, tc.nilOut)
			}
			if got != nil && len(got) != len(want) {
				t.Errorf("unpublished changed the details: %v", got)
			}
			// Without the writes client's watch the details always go whole.
			e = &external[struct{}]{kube: client.Client(c)}
			if got := e.unpublished(context.Background(), mg, want); got == nil {
				t.Error("without the writes client the details were left out")
			}
		})
	}
}
