package writes

import (
	"context"
	"maps"
	"slices"
	"testing"

	"github.com/crossplane/crossplane-runtime/v2/pkg/reconciler/managed"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	nsproxy "github.com/egressproxy/provider-egressproxy/apis/namespaced/proxy/v1alpha1"
)

// Details that lose keys (authentication turned off, an egress address no
// longer known) leave the connection Secret without them, through the
// runtime's own publisher, whichever client it writes with; a key the
// provider does not own stays.
func TestConnectionSecretLosesTheKeysTheDetailsLeaveOut(t *testing.T) {
	owned := []string{"url", "username", "password", "egressIP"}
	clients := map[string]func(client.Client) client.Client{
		"Client": func(c client.Client) client.Client {
			wc := NewClient(c, nil, nil)
			wc.ConnectionKeys = owned
			return wc
		},
		"AllWrites": func(c client.Client) client.Client {
			return RemovingStaleKeys(fakeManager{client: c}, owned).GetClient()
		},
	}
	for name, wrap := range clients {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			_, server, mr := reconcileOnce(t, managed.ConnectionDetails{
				"url": []byte("http://u:pw@10.0.0.1:3128"), "username": []byte("u"), "password": []byte("pw"), "egressIP": []byte("203.0.113.7"),
			})
			key := types.NamespacedName{Namespace: mr.GetNamespace(), Name: "p-conn"}
			sec := &corev1.Secret{}
			if err := server.Get(ctx, key, sec); err != nil {
				t.Fatal(err)
			}
			sec.Data["team-note"] = []byte("kept")
			if err := server.Update(ctx, sec); err != nil {
				t.Fatal(err)
			}
			got := &nsproxy.KVMProxy{}
			if err := server.Get(ctx, client.ObjectKeyFromObject(mr), got); err != nil {
				t.Fatal(err)
			}
			pub := managed.NewAPILocalSecretPublisher(wrap(server), server.Scheme())
			if _, err := pub.PublishConnection(ctx, got, managed.ConnectionDetails{"url": []byte("http://10.0.0.1:3128")}); err != nil {
				t.Fatal(err)
			}
			sec = &corev1.Secret{}
			if err := server.Get(ctx, key, sec); err != nil {
				t.Fatal(err)
			}
			if keys := slices.Sorted(maps.Keys(sec.Data)); !slices.Equal(keys, []string{"team-note", "url"}) {
				t.Errorf("the connection Secret holds %v; want the published url and the key the provider does not own, team-note", keys)
			}
			if string(sec.Data["url"]) != "http://10.0.0.1:3128" {
				t.Errorf("url = %q, want the new details'", sec.Data["url"])
			}
		})
	}
}
