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

// An egress address no longer known while the proxy has no address
// either (an instance recreated and booting): the details name only the
// egress keys, without a value, and the connection Secret loses those two
// and nothing else, whichever client writes it; a Secret without them
// gets no write, and none is made for them.
func TestConnectionSecretLosesTheEgressAddressNoLongerKnown(t *testing.T) {
	owned := []string{"url", "egressIP", "egressIPs"}
	gone := managed.ConnectionDetails{"egressIP": nil, "egressIPs": nil}
	clients := map[string]func(client.Client) client.Client{
		"Client": func(c client.Client) client.Client {
			wc := NewClient(c, c, func() bool { return true })
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
				"url": []byte("http://10.0.0.1:3128"), "egressIP": []byte("203.0.113.7"), "egressIPs": []byte("203.0.113.7"),
			})
			key := types.NamespacedName{Namespace: mr.GetNamespace(), Name: "p-conn"}
			got := &nsproxy.KVMProxy{}
			if err := server.Get(ctx, client.ObjectKeyFromObject(mr), got); err != nil {
				t.Fatal(err)
			}
			pub := managed.NewAPILocalSecretPublisher(wrap(server), server.Scheme())
			if _, err := pub.PublishConnection(ctx, got, gone); err != nil {
				t.Fatal(err)
			}
			sec := &corev1.Secret{}
			if err := server.Get(ctx, key, sec); err != nil {
				t.Fatal(err)
			}
			if keys := slices.Sorted(maps.Keys(sec.Data)); !slices.Equal(keys, []string{"url"}) || string(sec.Data["url"]) != "http://10.0.0.1:3128" {
				t.Errorf("the connection Secret holds %v (url %q); want url alone, as it was", keys, sec.Data["url"])
			}
			version := sec.ResourceVersion
			if _, err := pub.PublishConnection(ctx, got, gone); err != nil {
				t.Fatal(err)
			}
			if err := server.Get(ctx, key, sec); err != nil || (name == "Client" && sec.ResourceVersion != version) {
				t.Errorf("publishing the removal again: %v, version %s after %s; want no write", err, sec.ResourceVersion, version)
			}
			// No Secret is made to hold nothing.
			if err := server.Delete(ctx, sec); err != nil {
				t.Fatal(err)
			}
			if _, err := pub.PublishConnection(ctx, got, gone); err != nil {
				t.Fatal(err)
			}
			if err := server.Get(ctx, key, &corev1.Secret{}); name == "Client" && err == nil {
				t.Error("publishing only removals made a connection Secret")
			}
		})
	}
}
