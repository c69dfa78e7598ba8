package writes

import (
	"context"
	"strings"
	"testing"

	"github.com/crossplane/crossplane-runtime/v2/pkg/reconciler/managed"
	"github.com/crossplane/crossplane-runtime/v2/pkg/resource"
	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
	corev1 "k8s.io/api/core/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
)

// TestRefusedConnectionSecretShowsNoData: an API server (or an admission
// webhook) that refuses a connection Secret quoting its data gives the
// runtime's publisher, and so the resource's condition and event, an
// error without the data: it names the Secret, the answer's status and
// the fields refused.
func TestRefusedConnectionSecretShowsNoData(t *testing.T) {
	const password = "sentinel-conn-pw-7c1e"
	refusals := map[string]func(s *corev1.Secret) error{
		"422 Invalid quoting a value": func(s *corev1.Secret) error {
			return kerrors.NewInvalid(schema.GroupKind{Kind: "Secret"}, s.Name, field.ErrorList{
				field.Invalid(field.NewPath("data").Key("password"), string(s.Data["password"]), "refused by policy"),
			})
		},
		"ResourceQuota refusal": func(s *corev1.Secret) error {
			return kerrors.NewForbidden(schema.GroupResource{Resource: "secrets"}, s.Name,
				&webhookDenial{"exceeded quota: tenant-quota, requested: secrets=1, used: secrets=10, limited: secrets=10"})
		},
		"webhook denial quoting the object": func(s *corev1.Secret) error {
			return kerrors.NewForbidden(schema.GroupResource{Resource: "secrets"}, s.Name,
				&webhookDenial{"admission webhook \"policy.example\" denied the request: url " + string(s.Data["url"])})
		},
	}
	want := map[string]string{
		"422 Invalid quoting a value":       "connection Secret team-a/p-conn: the API server answered 422 Invalid (its message is not shown: it may quote the Secret's data) for data[password]",
		"webhook denial quoting the object": "connection Secret team-a/p-conn: the API server answered 403 Forbidden (its message is not shown: it may quote the Secret's data)",
		"ResourceQuota refusal":             "connection Secret team-a/p-conn: the API server answered 403 Forbidden (its message is not shown: it may quote the Secret's data): exceeded quota, a ResourceQuota of the namespace refused it",
	}
	for name, refuse := range refusals {
		t.Run(name, func(t *testing.T) {
			mr := kvmProxy()
			mr.Spec.WriteConnectionSecretToReference = &xpv2.LocalSecretReference{Name: "p-conn"}
			server := fake.NewClientBuilder().WithScheme(testScheme(t)).WithInterceptorFuncs(interceptor.Funcs{
				Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
					if s, ok := obj.(*corev1.Secret); ok {
						return refuse(s)
					}
					return c.Create(ctx, obj, opts...)
				},
			}).Build()
			c := NewClient(server, server, func() bool { return true })
			pub := managed.NewAPILocalSecretPublisher(c, server.Scheme())
			_, err := pub.PublishConnection(context.Background(), mr, managed.ConnectionDetails{"password": []byte(password), "url": []byte("http://u:" + password + "@10.0.0.1:3128")})
			if err == nil {
				t.Fatal("the refused connection Secret was published")
			}
			if strings.Contains(err.Error(), password) {
				t.Errorf("the error holds the password: %v", err)
			}
			if !strings.Contains(err.Error(), want[name]) {
				t.Errorf("the error is %v; want it to say %s", err, want[name])
			}
		})
	}
}

// webhookDenial is an error whose text a webhook chose.
type webhookDenial struct{ msg string }

func (e *webhookDenial) Error() string { return e.msg }

// TestRefusedConnectionSecretPatchShowsNoData: the same for a patch of a
// connection Secret that exists (the runtime's publisher updates by
// merge patch).
func TestRefusedConnectionSecretPatchShowsNoData(t *testing.T) {
	const password = "sentinel-conn-pw-5d2a"
	cur := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "p-conn"}, Type: resource.SecretTypeConnection,
		Data: map[string][]byte{"url": []byte("http://10.0.0.1:3128")}}
	server := fake.NewClientBuilder().WithScheme(testScheme(t)).WithObjects(cur).WithInterceptorFuncs(interceptor.Funcs{
		Patch: func(_ context.Context, _ client.WithWatch, obj client.Object, _ client.Patch, _ ...client.PatchOption) error {
			return kerrors.NewInvalid(schema.GroupKind{Kind: "Secret"}, obj.GetName(), field.ErrorList{
				field.Invalid(field.NewPath("data").Key("password"), password, "refused by policy"),
			})
		},
	}).Build()
	c := NewClient(server, server, func() bool { return true })
	next := cur.DeepCopy()
	next.Data["password"] = []byte(password)
	err := c.Patch(context.Background(), next, client.MergeFrom(cur))
	want := "connection Secret team-a/p-conn: the API server answered 422 Invalid (its message is not shown: it may quote the Secret's data) for data[password]"
	if err == nil || strings.Contains(err.Error(), password) || err.Error() != want || !kerrors.IsInvalid(err) {
		t.Errorf("Patch = %v; want %s, still Invalid to kerrors", err, want)
	}
}
