package kubernetes

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	authzv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

// fenceServer is a fake API server for the sweep's search for missing
// NetworkPolicies: what it creates is age old, a NetworkPolicy create
// fails while failPolicy, and the list of NetworkPolicies is Forbidden
// while refuseList. gets counts the reads of single objects.
type fenceServer struct {
	client.WithWatch
	age        time.Duration
	failPolicy bool
	refuseList bool
	gets       int
}

func newFenceServer(t *testing.T) *fenceServer {
	t.Helper()
	s := &fenceServer{age: time.Hour}
	s.WithWatch = fake.NewClientBuilder().WithScheme(clientgoscheme.Scheme).
		WithObjects(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "egress"}}).
		WithInterceptorFuncs(interceptor.Funcs{
			Get: func(ctx context.Context, cl client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
				if key.Namespace == "egress" {
					s.gets++
				}
				return cl.Get(ctx, key, obj, opts...)
			},
			Create: func(ctx context.Context, cl client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
				switch r := obj.(type) {
				case *networkingv1.NetworkPolicy:
					if s.failPolicy {
						return kerrors.NewInternalError(errors.New("etcdserver: request timed out"))
					}
				case *authzv1.SelfSubjectAccessReview:
					a := r.Spec.ResourceAttributes
					r.Status.Allowed = !(s.refuseList && a.Resource == "networkpolicies" && a.Verb == "list")
					return nil
				}
				obj.SetCreationTimestamp(metav1.NewTime(time.Now().Add(-s.age)))
				return cl.Create(ctx, obj, opts...)
			},
			List: func(ctx context.Context, cl client.WithWatch, l client.ObjectList, opts ...client.ListOption) error {
				if _, ok := l.(*networkingv1.NetworkPolicyList); ok && s.refuseList {
					return kerrors.NewForbidden(schema.GroupResource{Group: "networking.k8s.io", Resource: "networkpolicies"}, "", errors.New("RBAC"))
				}
				return cl.List(ctx, l, opts...)
			},
		}).Build()
	return s
}

// provider is what a provider process holds of the server: its Cluster
// (one per process; a restart makes a new one) and a driver of it per
// call, as per reconcile.
func (s *fenceServer) provider() func() *Driver {
	cl := &Cluster{Client: s, Live: s}
	return func() *Driver {
		return cl.Driver("ClusterProviderConfig pods", Config{Namespace: "egress", NetworkPolicy: true}, nil)
	}
}

// policy is the proxy's NetworkPolicy, or nil.
func (s *fenceServer) policy(t *testing.T, req proxy.Request) *networkingv1.NetworkPolicy {
	t.Helper()
	p := &networkingv1.NetworkPolicy{}
	err := s.Get(context.Background(), types.NamespacedName{Namespace: "egress", Name: req.Name}, p)
	if kerrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// upToDate is whether Get reads the proxy of req up to date, and its
// progress.
func upToDate(t *testing.T, d *Driver, req proxy.Request) (bool, string) {
	t.Helper()
	inst, err := d.Get(context.Background(), proxy.Ref{Name: req.Name, Mark: req.Mark})
	if err != nil {
		t.Fatalf("Get: %v", err)
	}
	return inst.SpecHash == proxy.Hash(req), inst.Progress
}

// A proxy whose NetworkPolicy is missing (deleted by hand, or never
// written: the provider restarted between the Deployment and its
// children) reads up to date until the sweep's List finds it; from then
// on Get reads it out of date, saying why, and Update writes the
// NetworkPolicy again. The List sends no request per proxy for it.
func TestSweepFindsAMissingNetworkPolicy(t *testing.T) {
	ctx := context.Background()
	for name, lose := range map[string]func(t *testing.T, s *fenceServer, req proxy.Request) func() *Driver{
		"DeletedByHand": func(t *testing.T, s *fenceServer, req proxy.Request) func() *Driver {
			drivers := s.provider()
			if _, err := drivers().Create(ctx, req); err != nil {
				t.Fatal(err)
			}
			if err := s.Delete(ctx, s.policy(t, req)); err != nil {
				t.Fatal(err)
			}
			return drivers
		},
		"RestartedBetweenTheDeploymentAndItsChildren": func(t *testing.T, s *fenceServer, req proxy.Request) func() *Driver {
			s.failPolicy = true
			if _, err := s.provider()().Create(ctx, req); err == nil {
				t.Fatal("Create with the NetworkPolicy refused succeeded")
			}
			s.failPolicy = false
			// What the first process remembered goes with it.
			return s.provider()
		},
		"AnotherResourcesOfTheName": func(t *testing.T, s *fenceServer, req proxy.Request) func() *Driver {
			drivers := s.provider()
			if _, err := drivers().Create(ctx, req); err != nil {
				t.Fatal(err)
			}
			p := s.policy(t, req)
			p.Labels[LabelUID] = "another-uid"
			if err := s.Update(ctx, p); err != nil {
				t.Fatal(err)
			}
			return drivers
		},
	} {
		t.Run(name, func(t *testing.T) {
			s := newFenceServer(t)
			req := testRequest()
			drivers := lose(t, s, req)
			if ok, _ := upToDate(t, drivers(), req); !ok {
				t.Fatalf("before any sweep the proxy reads out of date; the case does not show the gap")
			}
			s.gets = 0
			if _, err := drivers().List(ctx, req.Mark.InstallationID); err != nil {
				t.Fatalf("List: %v", err)
			}
			if s.gets != 0 {
				t.Errorf("List sent %d reads of single objects; want none (no request per proxy)", s.gets)
			}
			ok, progress := upToDate(t, drivers(), req)
			if ok || !strings.Contains(progress, "NetworkPolicy") {
				t.Fatalf("after the sweep: up to date %t, progress %q; want out of date, naming the NetworkPolicy", ok, progress)
			}
			_, err := drivers().Update(ctx, proxy.Ref{Name: req.Name, Mark: req.Mark}, req)
			if name == "AnotherResourcesOfTheName" {
				// Never written over: the resource says whose it is.
				if !proxy.IsPermanent(err) || !strings.Contains(err.Error(), "NetworkPolicy egress/"+req.Name) {
					t.Errorf("Update over another resource's NetworkPolicy = %v; want Permanent, naming it", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("Update: %v", err)
			}
			if p := s.policy(t, req); p == nil || p.Labels[LabelUID] != req.Mark.UID || len(p.Spec.Egress) == 0 {
				t.Fatalf("after Update the NetworkPolicy is %v; want the proxy's, written again", p)
			}
			if ok, progress := upToDate(t, drivers(), req); !ok {
				t.Errorf("after Update the proxy reads out of date (%q); want up to date", progress)
			}
			if _, err := drivers().List(ctx, req.Mark.InstallationID); err != nil {
				t.Fatalf("List: %v", err)
			}
			if ok, progress := upToDate(t, drivers(), req); !ok {
				t.Errorf("a sweep after Update reads the proxy out of date (%q); want up to date", progress)
			}
		})
	}
}

// What the sweep does not call missing: the NetworkPolicy of a proxy
// created a moment ago (its Create may be writing it as the list is
// read), any of a config without NetworkPolicies, and nothing where the
// list is refused, which the config's health names instead.
func TestSweepLeavesAloneWhatItCannotTell(t *testing.T) {
	ctx := context.Background()
	for name, tc := range map[string]struct {
		age        time.Duration
		noPolicies bool
		refuseList bool
	}{
		"CreatedAMomentAgo": {age: 0},
		"ConfigWithout":     {age: time.Hour, noPolicies: true},
		"ListRefused":       {age: time.Hour, refuseList: true},
	} {
		t.Run(name, func(t *testing.T) {
			s := newFenceServer(t)
			s.age = tc.age
			req := testRequest()
			drivers := s.provider()
			if _, err := drivers().Create(ctx, req); err != nil {
				t.Fatal(err)
			}
			if err := s.Delete(ctx, s.policy(t, req)); err != nil {
				t.Fatal(err)
			}
			s.refuseList = tc.refuseList
			d := drivers()
			if tc.noPolicies {
				d.cfg.NetworkPolicy = false
			}
			if _, err := d.List(ctx, req.Mark.InstallationID); err != nil {
				t.Fatalf("List: %v; want the sweep to go on", err)
			}
			if ok, progress := upToDate(t, drivers(), req); !ok {
				t.Errorf("after the sweep the proxy reads out of date (%q); want it left as it reads", progress)
			}
			if !tc.refuseList {
				return
			}
			h := drivers().Check(ctx)
			want := "list networkpolicies.networking.k8s.io in egress"
			if got := h.Targets[0].Details[DetailOptionalMissing]; !h.Healthy() || !strings.Contains(got, want) {
				t.Errorf("Check = healthy %t, %s %q; want healthy, naming %q", h.Healthy(), DetailOptionalMissing, got, want)
			}
		})
	}
}

// The config's health names no missing list when the identity may list
// NetworkPolicies.
func TestCheckNamesNoListWhenGranted(t *testing.T) {
	s := newFenceServer(t)
	h := s.provider()().Check(context.Background())
	if got := h.Targets[0].Details[DetailOptionalMissing]; !h.Healthy() || got != "" {
		t.Errorf("Check of an identity granted everything = healthy %t, %s %q; want healthy, nothing named", h.Healthy(), DetailOptionalMissing, got)
	}
}
