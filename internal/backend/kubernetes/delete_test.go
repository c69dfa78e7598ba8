package kubernetes

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	corev1 "k8s.io/api/core/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"

	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

// TestDeleteCollectionRefusedIsRemembered: Delete sends one
// deletecollection for the Secret and one for the NetworkPolicy, reading
// neither. Where the cluster refuses the verb for good (RBAC, a server
// without the verb or the resource), the Delete still succeeds, and the
// drivers of the same Cluster (one per reconcile) leave both to the
// garbage collector without asking again for five minutes; any other
// error is asked again at the next delete.
func TestDeleteCollectionRefusedIsRemembered(t *testing.T) {
	gr := schema.GroupResource{Resource: "secrets"}
	cases := map[string]struct {
		err        error
		remembered bool
	}{
		"Granted":            {},
		"Forbidden":          {err: kerrors.NewForbidden(gr, "", errors.New("RBAC")), remembered: true},
		"MethodNotSupported": {err: kerrors.NewMethodNotSupported(gr, "deletecollection"), remembered: true},
		"NoSuchResource":     {err: kerrors.NewNotFound(gr, ""), remembered: true},
		"ServerError":        {err: kerrors.NewInternalError(errors.New("etcd")), remembered: false},
	}
	both := []string{"deletecollection NetworkPolicy", "deletecollection Secret"}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			_, fc, c := countingDriver(t)
			c.collectionErr = tc.err
			cl := &Cluster{Client: fc, Live: fc}
			now := time.Now()
			deleteOne := func(name, uid string) []string {
				t.Helper()
				d := cl.Driver("ClusterProviderConfig pods", Config{Namespace: "egress", NetworkPolicy: true}, nil)
				d.now = func() time.Time { return now }
				req := testRequest()
				req.Name, req.Mark.UID = name, uid
				inst, err := d.Create(ctx, req)
				if err != nil {
					t.Fatal(err)
				}
				c.sorted()
				if err := d.Delete(ctx, proxy.Ref{ID: inst.ID, Name: req.Name, Mark: req.Mark}); err != nil {
					t.Fatalf("Delete = %v; want the Deployment deleted whatever the deletecollection's answer", err)
				}
				got := c.sorted()
				if slices.ContainsFunc(got, func(s string) bool { return s == "get Secret" || s == "get NetworkPolicy" }) {
					t.Errorf("Delete read a child first: %v", got)
				}
				err = fc.Get(ctx, types.NamespacedName{Namespace: "egress", Name: name}, &corev1.Secret{})
				if tc.err == nil && !kerrors.IsNotFound(err) {
					t.Errorf("the proxy's Secret after Delete: %v; want it gone", err)
				}
				return slices.DeleteFunc(got, func(s string) bool { return !strings.HasPrefix(s, "deletecollection ") })
			}
			if diff := cmp.Diff(both, deleteOne("proxy-a", "uid-a")); diff != "" {
				t.Errorf("the first Delete's deletecollections (-want +got):\n%s", diff)
			}
			now = now.Add(refusedTTL - time.Second)
			want := both
			if tc.remembered {
				want = nil
			}
			if diff := cmp.Diff(want, deleteOne("proxy-b", "uid-b"), cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("a Delete %v after the first (-want +got):\n%s", refusedTTL-time.Second, diff)
			}
			now = now.Add(time.Second)
			if diff := cmp.Diff(both, deleteOne("proxy-c", "uid-c")); diff != "" {
				t.Errorf("a Delete %v after the first (-want +got):\n%s", refusedTTL, diff)
			}
		})
	}
}
