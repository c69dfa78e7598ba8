package kubernetes

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/egressproxy/provider-egressproxy/internal/proxy"
	"github.com/egressproxy/provider-egressproxy/internal/proxy/proxytest"
)

// TestRefusedSecretShowsNoData: a platform's cluster (or an admission
// webhook in it) that refuses the proxy's Secret quoting its data (the
// htpasswd, squid.conf, the TLS key) gives a Create error, which becomes
// a condition, without that data: it names the Secret, the status and
// the fields refused.
func TestRefusedSecretShowsNoData(t *testing.T) {
	req, secrets := proxytest.WithSentinels(testRequest())
	refusals := map[string]struct {
		refuse func(s *corev1.Secret) error
		// want is what the error says of the answer.
		want  string
		class proxy.Class
	}{
		"422 Invalid quoting a value": {func(s *corev1.Secret) error {
			return kerrors.NewInvalid(schema.GroupKind{Kind: "Secret"}, s.Name, field.ErrorList{
				field.Invalid(field.NewPath("data").Key(KeyHtpasswd), string(s.Data[KeyHtpasswd]), "refused by policy"),
			})
		}, "answered 422 Invalid (its message is not shown: it may quote the Secret's data) for data[htpasswd]", proxy.ClassPermanent},
		"webhook denial quoting the object": {func(s *corev1.Secret) error {
			return kerrors.NewForbidden(schema.GroupResource{Resource: "secrets"}, s.Name,
				&statusMessage{"admission webhook \"policy.example\" denied the request: data " + string(s.Data[KeyHtpasswd]) + " " + string(s.Data[KeySquidConf])})
		}, "answered 403 Forbidden (its message is not shown: it may quote the Secret's data)", proxy.ClassPermanent},
		"ResourceQuota": {func(s *corev1.Secret) error {
			return kerrors.NewForbidden(schema.GroupResource{Resource: "secrets"}, s.Name,
				&statusMessage{"exceeded quota: q, requested: secrets=1, used: secrets=10, limited: secrets=10"})
		}, "answered 403 Forbidden (its message is not shown: it may quote the Secret's data): exceeded quota, a ResourceQuota of the namespace refused it", proxy.ClassQuota},
	}
	for name, tc := range refusals {
		t.Run(name, func(t *testing.T) {
			fc := fake.NewClientBuilder().WithScheme(clientgoscheme.Scheme).WithInterceptorFuncs(interceptor.Funcs{
				Create: func(ctx context.Context, cl client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
					if s, ok := obj.(*corev1.Secret); ok {
						return tc.refuse(s)
					}
					return cl.Create(ctx, obj, opts...)
				},
			}).Build()
			d := New(Options{Provider: "ClusterProviderConfig pods", Config: Config{Namespace: "egress"}, Client: fc, Live: fc})
			d.taken = &taken{}
			_, err := d.Create(context.Background(), req)
			if err == nil {
				t.Fatal("Create of a refused Secret succeeded")
			}
			for label, s := range secrets {
				if s != "" && strings.Contains(err.Error(), s) {
					t.Errorf("the error holds %s: %v", label, err)
				}
			}
			if strings.Contains(err.Error(), "http_port") {
				t.Errorf("the error holds squid.conf: %v", err)
			}
			if proxy.ClassOf(err) != tc.class || !strings.Contains(err.Error(), "Secret egress/"+req.Name+": the server "+tc.want) {
				t.Errorf("Create = %s %v; want %s naming the Secret", proxy.ClassOf(err), err, tc.class)
			}
		})
	}
}

// statusMessage is an error whose text a webhook chose.
type statusMessage struct{ msg string }

func (e *statusMessage) Error() string { return e.msg }
