package external

import (
	"context"
	"encoding/base64"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
)

// TestRefusedPasswordKeyShowsNoKey: an API server (or an admission
// webhook) that refuses the password key Secret quoting its data gives
// an error (every proxy's condition and event then) without the key,
// naming the Secret and the answer's status.
func TestRefusedPasswordKeyShowsNoKey(t *testing.T) {
	var key []byte
	kube := fake.NewClientBuilder().WithScheme(clientgoscheme.Scheme).WithInterceptorFuncs(interceptor.Funcs{
		Create: func(_ context.Context, _ client.WithWatch, obj client.Object, _ ...client.CreateOption) error {
			s, _ := obj.(*corev1.Secret)
			key = s.Data[keySecretKey]
			return kerrors.NewForbidden(schema.GroupResource{Resource: "secrets"}, s.Name,
				&denial{"admission webhook \"policy.example\" denied the request: data.key " + base64.StdEncoding.EncodeToString(key) + " " + string(key)})
		},
	}).Build()
	p := &Passwords{Kube: kube, Reader: kube, Namespace: "crossplane-system"}
	_, err := p.For(context.Background(), "uid-1")
	if err == nil || len(key) == 0 {
		t.Fatalf("For = %v with key %q; want a refusal of the created key", err, key)
	}
	if strings.Contains(err.Error(), base64.StdEncoding.EncodeToString(key)) || strings.Contains(err.Error(), string(key)) {
		t.Errorf("the error holds the key: %v", err)
	}
	want := "cannot create Secret crossplane-system/" + KeySecretName + ": the API server answered 403 Forbidden (its message is not shown: it may quote the Secret's data)"
	if err.Error() != want {
		t.Errorf("For = %v; want %s", err, want)
	}
}

// denial is an error whose text a webhook chose.
type denial struct{ msg string }

func (e *denial) Error() string { return e.msg }
