package kubernetes_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	authzv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/egressproxy/provider-egressproxy/internal/backend/kubernetes"
	"github.com/egressproxy/provider-egressproxy/internal/devenv/testenv"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

// deleteByMarkTests: Delete removes the proxy's Secret and NetworkPolicy
// itself, with a deletecollection by the proxy's mark, on the real API
// server with its garbage collector.
func (e *env) deleteByMarkTests(t *testing.T) {
	ctx := context.Background()

	// Objects in the same namespace that differ from the proxy's only in
	// the UID or the installation, or carry no mark, survive; the proxy's
	// own are gone as soon as Delete returns, before the collector could
	// have reached them.
	t.Run("OnlyTheProxysOwnMark", func(t *testing.T) {
		t.Parallel()
		ns := e.namespace(t)
		counted := &collections{Client: e.cached}
		d := kubernetes.New(kubernetes.Options{
			Provider: testProvider, Config: kubernetes.Config{Namespace: ns, NetworkPolicy: true},
			Client: counted, Live: e.live, Version: e.remote.Version, Host: e.cp.Config.Host, DialPods: true,
		})
		req := request("by-mark")
		inst := e.createSettled(t, d, req)

		other := map[string]map[string]string{
			"other-uid":          marked(req.Name, "0c8f6a1e-5b7d-4e2a-9c3f-ffffffffffff"),
			"other-installation": marked(req.Name, req.Mark.UID),
			"unmarked":           nil,
			// The whole mark copied onto an object of another name: a
			// label is anyone's to write who may write the object.
			"forged-mark": marked(req.Name, req.Mark.UID),
		}
		other["other-installation"][kubernetes.LabelInstallation] = "another-installation"
		var survivors []client.Object
		for suffix, labels := range other {
			meta := metav1.ObjectMeta{Namespace: ns, Name: req.Name + "-" + suffix, Labels: labels}
			survivors = append(survivors,
				&corev1.Secret{ObjectMeta: meta, StringData: map[string]string{"squid.conf": "# not this proxy's\n"}},
				&networkingv1.NetworkPolicy{ObjectMeta: meta, Spec: networkingv1.NetworkPolicySpec{PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeEgress}}})
		}
		for _, o := range survivors {
			if err := e.live.Create(ctx, o); err != nil {
				t.Fatal(err)
			}
		}

		ref := proxy.Ref{ID: inst.ID, Name: req.Name, Mark: req.Mark}
		e.deleteByMark(t, d, ref, counted, ns)
		e.deleteToTheEnd(t, d, ref)
		for _, o := range survivors {
			if err := e.live.Get(ctx, client.ObjectKeyFromObject(o), o); err != nil {
				t.Errorf("%T %s after the proxy's deletion: %v; want it untouched", o, o.GetName(), err)
			}
		}
	})

	// An identity granted kubernetes.Permissions alone (no
	// OptionalPermissions): the deletecollection is refused, the deletion
	// completes through the garbage collector, and the drivers of the
	// Cluster (one per reconcile) ask once, not once per proxy. With
	// OptionalPermissions granted too, it is the driver's again.
	t.Run("RefusedByRBAC", func(t *testing.T) {
		ns := e.namespace(t)
		user := "dc-refused-" + ns
		cfg := *e.cp.Config
		cfg.Impersonate.UserName = user
		c, err := client.New(&cfg, client.Options{Scheme: e.scheme})
		if err != nil {
			t.Fatal(err)
		}
		kcfg := kubernetes.Config{Namespace: ns, NetworkPolicy: true}
		cluster := func() (*kubernetes.Cluster, *collections) {
			counted := &collections{Client: c}
			cl, err := kubernetes.NewCluster(&cfg, nil, counted, nil)
			if err != nil {
				t.Fatal(err)
			}
			return cl, counted
		}
		// Healthy either way; the optional verbs missing are named.
		healthy := func(d *kubernetes.Driver, optionalMissing bool) {
			waitFor(t, "Check to be healthy with the grant", func() (bool, string) {
				h := d.Check(ctx)
				return h.Healthy(), fmt.Sprintf("%+v", h)
			})
			got := d.Check(ctx).Targets[0].Details[kubernetes.DetailOptionalMissing]
			if optionalMissing != (strings.Contains(got, "deletecollection secrets in "+ns) && strings.Contains(got, "deletecollection networkpolicies.networking.k8s.io in "+ns)) || !optionalMissing && got != "" {
				t.Errorf("health detail %s = %q; want the optional verbs named: %v", kubernetes.DetailOptionalMissing, got, optionalMissing)
			}
		}

		e.grant(t, user, ns, kubernetes.Permissions(ns, false))
		cl, counted := cluster()
		healthy(cl.Driver(testProvider, kcfg, nil), true)
		for i, name := range []string{"refused-a", "refused-b"} {
			req := request(name)
			req.Mark.UID = fmt.Sprintf("0c8f6a1e-5b7d-4e2a-9c3f-%012d", 100+i)
			d := cl.Driver(testProvider, kcfg, nil)
			inst := e.createSettled(t, d, req)
			ref := proxy.Ref{ID: inst.ID, Name: req.Name, Mark: req.Mark, Live: true}
			if err := d.Delete(ctx, ref); err != nil {
				t.Fatalf("Delete of %s with deletecollection refused = %v; want it to go on without", name, err)
			}
			// Get alone: the resource stays until the collector is done.
			waitDeleted(t, cl.Driver(testProvider, kcfg, nil), ref)
			e.childrenGone(t, ns, name, "after its deletion")
		}
		if sent, refused := counted.counts(); sent != 2 || refused != 2 {
			t.Errorf("two deletes sent %d deletecollections, %d refused; want 2, both refused (one per resource, the second delete asking nothing)", sent, refused)
		}

		optional := kubernetes.OptionalPermissions(ns)
		e.grant(t, user, ns, append(kubernetes.Permissions(ns, false), optional...))
		waitFor(t, "the grant of OptionalPermissions to take effect", func() (bool, string) {
			for _, p := range optional {
				r := &authzv1.SelfSubjectAccessReview{Spec: authzv1.SelfSubjectAccessReviewSpec{ResourceAttributes: p.Attributes()}}
				if err := c.Create(ctx, r); err != nil || !r.Status.Allowed {
					return false, fmt.Sprintf("%s: %v, allowed %t", p, err, r.Status.Allowed)
				}
			}
			return true, ""
		})
		cl, counted = cluster()
		d := cl.Driver(testProvider, kcfg, nil)
		healthy(d, false)
		req := request("granted")
		inst := e.createSettled(t, d, req)
		ref := proxy.Ref{ID: inst.ID, Name: req.Name, Mark: req.Mark, Live: true}
		e.deleteByMark(t, d, ref, counted, ns)
		waitDeleted(t, d, ref)
	})
}

// deleteByMark deletes ref's proxy with d, whose client is counted: two
// deletecollections, none refused, and the proxy's Secret and
// NetworkPolicy gone as Delete returns.
func (e *env) deleteByMark(t *testing.T, d *kubernetes.Driver, ref proxy.Ref, counted *collections, ns string) {
	t.Helper()
	if err := d.Delete(context.Background(), ref); err != nil {
		t.Fatal(err)
	}
	if sent, refused := counted.counts(); sent != 2 || refused != 0 {
		t.Errorf("Delete sent %d deletecollections, %d refused; want 2 (the Secret's, the NetworkPolicy's), none refused", sent, refused)
	}
	e.childrenGone(t, ns, ref.Name, "right after Delete")
}

// childrenGone checks that the Secret and NetworkPolicy of the proxy name
// in ns are gone.
func (e *env) childrenGone(t *testing.T, ns, name, when string) {
	t.Helper()
	for _, o := range []client.Object{&corev1.Secret{}, &networkingv1.NetworkPolicy{}} {
		if err := e.live.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: name}, o); !kerrors.IsNotFound(err) {
			t.Errorf("%s's %T %s: %v; want it gone", name, o, when, err)
		}
	}
}

// waitDeleted waits for Get of the resource being deleted to say NotFound.
func waitDeleted(t *testing.T, d *kubernetes.Driver, ref proxy.Ref) {
	t.Helper()
	waitFor(t, "the deletion of "+ref.ID+" to end", func() (bool, string) {
		_, err := d.Get(context.Background(), proxy.Ref{ID: ref.ID, Name: ref.Name, Mark: ref.Mark, Live: true, Deleting: true})
		return proxy.IsNotFound(err), fmt.Sprint(err)
	})
}

// deleteToTheEnd runs the resource's deletion as the reconciler does (Get,
// then Delete while anything is left) until Get says NotFound.
func (e *env) deleteToTheEnd(t *testing.T, d *kubernetes.Driver, ref proxy.Ref) {
	t.Helper()
	ctx := context.Background()
	ref.Live, ref.Deleting = true, true
	testenv.WaitFor(t, "the deletion of "+ref.ID+" to end", time.Minute, func() (bool, string) {
		got, err := d.Get(ctx, ref)
		if proxy.IsNotFound(err) {
			return true, ""
		}
		if err != nil {
			return false, err.Error()
		}
		if err := d.Delete(ctx, ref); err != nil {
			t.Fatalf("Delete: %v", err)
		}
		return false, got.Progress
	})
}

// collections counts a client's deletecollection requests, and how many
// the API server refused.
type collections struct {
	client.Client
	mu            sync.Mutex
	sent, refused int
}

func (c *collections) DeleteAllOf(ctx context.Context, obj client.Object, opts ...client.DeleteAllOfOption) error {
	err := c.Client.DeleteAllOf(ctx, obj, opts...)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sent++
	if kerrors.IsForbidden(err) {
		c.refused++
	}
	return err
}

func (c *collections) counts() (sent, refused int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.sent, c.refused
}
