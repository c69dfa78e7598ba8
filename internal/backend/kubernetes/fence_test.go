package kubernetes

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
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

	"github.com/go-logr/logr/funcr"
	"github.com/google/go-cmp/cmp"

	"github.com/egressproxy/provider-egressproxy/internal/devenv/testenv"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

// fenceServer is a fake API server for the sweep's search for missing
// children: what it creates is age old, a NetworkPolicy create fails
// while failPolicy, the list of NetworkPolicies is Forbidden while
// refuseList and that of Secrets while refuseSecrets. gets counts the
// reads of single objects.
type fenceServer struct {
	client.WithWatch
	age           time.Duration
	failPolicy    bool
	refuseList    bool
	refuseSecrets bool
	gets          int
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
					r.Status.Allowed = a.Verb != "list" || !(s.refuseList && a.Resource == "networkpolicies" || s.refuseSecrets && a.Resource == "secrets")
					return nil
				}
				obj.SetCreationTimestamp(metav1.NewTime(time.Now().Add(-s.age)))
				return cl.Create(ctx, obj, opts...)
			},
			List: func(ctx context.Context, cl client.WithWatch, l client.ObjectList, opts ...client.ListOption) error {
				if _, ok := l.(*networkingv1.NetworkPolicyList); ok && s.refuseList {
					return kerrors.NewForbidden(schema.GroupResource{Group: "networking.k8s.io", Resource: "networkpolicies"}, "", errors.New("RBAC"))
				}
				if _, ok := l.(*corev1.SecretList); ok && s.refuseSecrets {
					return kerrors.NewForbidden(schema.GroupResource{Resource: "secrets"}, "", errors.New("RBAC"))
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

// sweepFindingTheGap checks that the proxy of req reads up to date before
// a sweep (the case shows the gap), then runs the sweep's List, which
// must send no read of a single object (no request per proxy).
func (s *fenceServer) sweepFindingTheGap(t *testing.T, drivers func() *Driver, req proxy.Request) {
	t.Helper()
	if ok, _ := upToDate(t, drivers(), req); !ok {
		t.Fatalf("before any sweep the proxy reads out of date; the case does not show the gap")
	}
	s.gets = 0
	if _, err := drivers().List(context.Background(), req.Mark.InstallationID); err != nil {
		t.Fatalf("List: %v", err)
	}
	if s.gets != 0 {
		t.Errorf("List sent %d reads of single objects; want none (no request per proxy)", s.gets)
	}
}

// wholeAfterUpdate checks that the proxy of req reads up to date after
// its Update, and still after the next sweep.
func wholeAfterUpdate(t *testing.T, drivers func() *Driver, req proxy.Request) {
	t.Helper()
	if ok, progress := upToDate(t, drivers(), req); !ok {
		t.Errorf("after Update the proxy reads out of date (%q); want up to date", progress)
	}
	if _, err := drivers().List(context.Background(), req.Mark.InstallationID); err != nil {
		t.Fatalf("List: %v", err)
	}
	if ok, progress := upToDate(t, drivers(), req); !ok {
		t.Errorf("a sweep after Update reads the proxy out of date (%q); want up to date", progress)
	}
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
			s.sweepFindingTheGap(t, drivers, req)
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
			wholeAfterUpdate(t, drivers, req)
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

// secret is the proxy's Secret, or nil.
func (s *fenceServer) secret(t *testing.T, req proxy.Request) *corev1.Secret {
	t.Helper()
	sec := &corev1.Secret{}
	err := s.Get(context.Background(), types.NamespacedName{Namespace: "egress", Name: req.Name}, sec)
	if kerrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return sec
}

// serve starts the proxy's pod, Running and Ready: Get then no longer
// reads its Secret (it has no reason to while a pod serves).
func (s *fenceServer) serve(t *testing.T, req proxy.Request) {
	t.Helper()
	ctx := context.Background()
	dep := &appsv1.Deployment{}
	if err := s.Get(ctx, types.NamespacedName{Namespace: "egress", Name: req.Name}, dep); err != nil {
		t.Fatal(err)
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "egress", Name: req.Name + "-p", Labels: dep.Spec.Template.Labels,
		Annotations: map[string]string{AnnotationConfigHash: dep.Spec.Template.Annotations[AnnotationConfigHash]}}}
	if err := s.Create(ctx, pod); err != nil {
		t.Fatal(err)
	}
	pod.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.1.0.5", Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}
	if err := s.Status().Update(ctx, pod); err != nil {
		t.Fatal(err)
	}
}

// A proxy whose Secret is deleted by hand while its pod serves keeps
// serving, but the next pod (a drain, a restart, a rollout) cannot start.
// Get reads the Secret only while no pod serves, so the proxy reads up
// to date until the sweep's List finds it; from then on Get reads it out
// of date, naming what is missing, and Update writes the Secret again.
// The List sends no request per proxy for it.
func TestSweepFindsAMissingSecret(t *testing.T) {
	ctx := context.Background()
	for name, tc := range map[string]struct {
		lose         func(t *testing.T, s *fenceServer, req proxy.Request)
		wantProgress string
	}{
		"DeletedByHand": {
			lose: func(t *testing.T, s *fenceServer, req proxy.Request) {
				if err := s.Delete(ctx, s.secret(t, req)); err != nil {
					t.Fatal(err)
				}
			},
			wantProgress: "the Secret of the proxy is missing; it is created again",
		},
		"DeletedWithTheNetworkPolicy": {
			lose: func(t *testing.T, s *fenceServer, req proxy.Request) {
				if err := s.Delete(ctx, s.policy(t, req)); err != nil {
					t.Fatal(err)
				}
				if err := s.Delete(ctx, s.secret(t, req)); err != nil {
					t.Fatal(err)
				}
			},
			wantProgress: "the Secret and NetworkPolicy of the proxy are missing; they are created again",
		},
		"NetworkPolicyListRefused": {
			lose: func(t *testing.T, s *fenceServer, req proxy.Request) {
				s.refuseList = true
				if err := s.Delete(ctx, s.secret(t, req)); err != nil {
					t.Fatal(err)
				}
			},
			wantProgress: "the Secret of the proxy is missing; it is created again",
		},
		"AnotherResourcesOfTheName": {
			lose: func(t *testing.T, s *fenceServer, req proxy.Request) {
				sec := s.secret(t, req)
				sec.Labels[LabelUID] = "another-uid"
				if err := s.Update(ctx, sec); err != nil {
					t.Fatal(err)
				}
			},
			wantProgress: "the Secret of the proxy is missing; it is created again",
		},
	} {
		t.Run(name, func(t *testing.T) {
			s := newFenceServer(t)
			req := testRequest()
			drivers := s.provider()
			if _, err := drivers().Create(ctx, req); err != nil {
				t.Fatal(err)
			}
			s.serve(t, req)
			tc.lose(t, s, req)
			s.sweepFindingTheGap(t, drivers, req)
			if ok, progress := upToDate(t, drivers(), req); ok || progress != tc.wantProgress {
				t.Fatalf("after the sweep: up to date %t, progress %q; want out of date, %q", ok, progress, tc.wantProgress)
			}
			s.refuseList = false
			_, err := drivers().Update(ctx, proxy.Ref{Name: req.Name, Mark: req.Mark}, req)
			if name == "AnotherResourcesOfTheName" {
				// Never written over: the resource says whose it is.
				if !proxy.IsPermanent(err) || !strings.Contains(err.Error(), "Secret egress/"+req.Name) {
					t.Errorf("Update over another resource's Secret = %v; want Permanent, naming it", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("Update: %v", err)
			}
			if sec := s.secret(t, req); sec == nil || sec.Labels[LabelUID] != req.Mark.UID || len(sec.Data) == 0 {
				t.Fatalf("after Update the Secret is %v; want the proxy's, written again", sec)
			}
			if p := s.policy(t, req); p == nil {
				t.Fatalf("after Update the NetworkPolicy is missing")
			}
			wholeAfterUpdate(t, drivers, req)
		})
	}
}

// What the sweep does not call a missing Secret: that of a proxy created
// a moment ago (its Create may be writing it as the list is read), and
// none where the list of Secrets is refused, which the config's health
// names instead; a NetworkPolicy missing beside it is still found.
func TestSweepLeavesAloneASecretItCannotTell(t *testing.T) {
	ctx := context.Background()
	for name, tc := range map[string]struct {
		age           time.Duration
		refuseSecrets bool
	}{
		"CreatedAMomentAgo": {age: 0},
		"ListRefused":       {age: time.Hour, refuseSecrets: true},
	} {
		t.Run(name, func(t *testing.T) {
			s := newFenceServer(t)
			s.age = tc.age
			req := testRequest()
			drivers := s.provider()
			if _, err := drivers().Create(ctx, req); err != nil {
				t.Fatal(err)
			}
			s.serve(t, req)
			if err := s.Delete(ctx, s.secret(t, req)); err != nil {
				t.Fatal(err)
			}
			s.refuseSecrets = tc.refuseSecrets
			if _, err := drivers().List(ctx, req.Mark.InstallationID); err != nil {
				t.Fatalf("List: %v; want the sweep to go on", err)
			}
			if ok, progress := upToDate(t, drivers(), req); !ok {
				t.Errorf("after the sweep the proxy reads out of date (%q); want it left as it reads", progress)
			}
			if !tc.refuseSecrets {
				return
			}
			if err := s.Delete(ctx, s.policy(t, req)); err != nil {
				t.Fatal(err)
			}
			if _, err := drivers().List(ctx, req.Mark.InstallationID); err != nil {
				t.Fatalf("List: %v", err)
			}
			want := "the NetworkPolicy of the proxy is missing; it is created again"
			if ok, progress := upToDate(t, drivers(), req); ok || progress != want {
				t.Errorf("with the Secrets' list refused, a sweep after the NetworkPolicy's deletion: up to date %t, %q; want out of date, %q", ok, progress, want)
			}
			h := drivers().Check(ctx)
			wantMissing := "list secrets in egress"
			if got := h.Targets[0].Details[DetailOptionalMissing]; !h.Healthy() || !strings.Contains(got, wantMissing) {
				t.Errorf("Check = healthy %t, %s %q; want healthy, naming %q", h.Healthy(), DetailOptionalMissing, got, wantMissing)
			}
		})
	}
}

// The progress of a proxy missing two children names both, in the order
// they are written, and says they are created again.
func TestProgressNamesEveryMissingChild(t *testing.T) {
	ctx := context.Background()
	s := newFenceServer(t)
	req := testRequest()
	req.Extension = Exposure{ServiceType: string(corev1.ServiceTypeClusterIP)}
	drivers := s.provider()
	if _, err := drivers().Create(ctx, req); err != nil {
		t.Fatal(err)
	}
	// No pod serves: Get reads the Secret itself, and the Service always.
	if err := s.Delete(ctx, s.secret(t, req)); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "egress", Name: req.Name}}); err != nil {
		t.Fatal(err)
	}
	want := "the Secret and Service of the proxy are missing; they are created again"
	if ok, progress := upToDate(t, drivers(), req); ok || progress != want {
		t.Errorf("Get: up to date %t, progress %q; want out of date, %q", ok, progress, want)
	}
	// Found by the sweep as well, the Secret is named once.
	if _, err := drivers().List(ctx, req.Mark.InstallationID); err != nil {
		t.Fatalf("List: %v", err)
	}
	if ok, progress := upToDate(t, drivers(), req); ok || progress != want {
		t.Errorf("Get after the sweep: up to date %t, progress %q; want out of date, %q", ok, progress, want)
	}
}

// A Service deleted by hand while the pod serves needs no sweep: Get
// reads the Service with the Deployment, finds it missing and Update
// creates it again.
func TestGetFindsAMissingServiceItself(t *testing.T) {
	ctx := context.Background()
	s := newFenceServer(t)
	req := testRequest()
	req.Extension = Exposure{ServiceType: string(corev1.ServiceTypeClusterIP)}
	drivers := s.provider()
	if _, err := drivers().Create(ctx, req); err != nil {
		t.Fatal(err)
	}
	s.serve(t, req)
	if err := s.Delete(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "egress", Name: req.Name}}); err != nil {
		t.Fatal(err)
	}
	want := "the Service of the proxy is missing; it is created again"
	if ok, progress := upToDate(t, drivers(), req); ok || progress != want {
		t.Fatalf("Get: up to date %t, progress %q; want out of date, %q", ok, progress, want)
	}
	if _, err := drivers().Update(ctx, proxy.Ref{Name: req.Name, Mark: req.Mark}, req); err != nil {
		t.Fatalf("Update: %v", err)
	}
	if ok, progress := upToDate(t, drivers(), req); !ok {
		t.Errorf("after Update the proxy reads out of date (%q); want up to date", progress)
	}
}

// Configs sharing a namespace and a Cluster, one with NetworkPolicies and
// one without: the first's sweeps mark none of the second's proxies
// (nothing would ever unmark them), and log nothing for them, while a
// proxy of its own whose NetworkPolicy was deleted is still found, logged
// once however many sweeps find it again, and forgotten once gone.
func TestSweepMarksOnlyProxiesWrittenWithAPolicy(t *testing.T) {
	ctx := context.Background()
	s := newFenceServer(t)
	cl := &Cluster{Client: s, Live: s}
	with := func() *Driver {
		return cl.Driver("ClusterProviderConfig pods", Config{Namespace: "egress", NetworkPolicy: true}, nil)
	}
	without := cl.Driver("ClusterProviderConfig open", Config{Namespace: "egress"}, nil)
	open := testRequest()
	if _, err := without.Create(ctx, open); err != nil {
		t.Fatal(err)
	}
	fenced := testRequest()
	fenced.Name, fenced.Mark.UID = "team-b-egress-5e6f7a8b", "0c8f6a1e-5b7d-4e2a-9c3f-00000000000b"
	if _, err := with().Create(ctx, fenced); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete(ctx, s.policy(t, fenced)); err != nil {
		t.Fatal(err)
	}
	var logs testenv.Buffer
	log := funcr.New(func(prefix, args string) { logs.Line(prefix + " " + args) }, funcr.Options{})
	for range 3 {
		d := with()
		d.log = &log
		if _, err := d.List(ctx, open.Mark.InstallationID); err != nil {
			t.Fatalf("List: %v", err)
		}
	}
	if got := cl.absent.of(types.NamespacedName{Namespace: "egress", Name: open.Name}); len(got) != 0 {
		t.Errorf("the proxy of the config without NetworkPolicies is marked missing %v; want nothing", got)
	}
	if got := cl.absent.of(types.NamespacedName{Namespace: "egress", Name: fenced.Name}); len(got) != 1 || got[0] != "NetworkPolicy" {
		t.Errorf("the proxy whose NetworkPolicy was deleted is marked missing %v; want [NetworkPolicy]", got)
	}
	if n := strings.Count(logs.String(), "proxies found without some of their children"); n != 1 || strings.Contains(logs.String(), open.Name) {
		t.Errorf("three sweeps logged %d lines of missing children; want one, naming only %s:\n%s", n, fenced.Name, logs.String())
	}
	if ok, progress := upToDate(t, without, open); !ok {
		t.Errorf("the proxy of the config without NetworkPolicies reads out of date (%q); want up to date", progress)
	}
	// A proxy gone is forgotten by the next sweep.
	dep := &appsv1.Deployment{}
	if err := s.Get(ctx, types.NamespacedName{Namespace: "egress", Name: fenced.Name}, dep); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete(ctx, dep); err != nil {
		t.Fatal(err)
	}
	if _, err := with().List(ctx, open.Mark.InstallationID); err != nil {
		t.Fatalf("List: %v", err)
	}
	if got := cl.absent.of(types.NamespacedName{Namespace: "egress", Name: fenced.Name}); len(got) != 0 {
		t.Errorf("the proxy whose Deployment is gone is still marked missing %v; want nothing", got)
	}
}

// A Deployment written before it said whether it has a NetworkPolicy
// (no AnnotationNetworkPolicy), of a config with NetworkPolicies, reads
// out of date to its own config, which the sweep does not mark it for:
// one Update writes its NetworkPolicy and the annotation, without a new
// pod, and from then on it reads up to date. The same when the config
// stops writing NetworkPolicies: one Update drops the annotation.
func TestUpdateRecordsWhetherTheProxyHasAPolicy(t *testing.T) {
	ctx := context.Background()
	s := newFenceServer(t)
	drivers := s.provider()
	req := testRequest()
	if _, err := drivers().Create(ctx, req); err != nil {
		t.Fatal(err)
	}
	dep := &appsv1.Deployment{}
	key := types.NamespacedName{Namespace: "egress", Name: req.Name}
	if err := s.Get(ctx, key, dep); err != nil {
		t.Fatal(err)
	}
	if dep.Annotations[AnnotationNetworkPolicy] != "true" {
		t.Fatalf("Create wrote annotations %v; want %s", dep.Annotations, AnnotationNetworkPolicy)
	}
	delete(dep.Annotations, AnnotationNetworkPolicy)
	// What kubectl rollout restart adds to the template: a write of the
	// record alone keeps it, and the pods do not roll.
	dep.Spec.Template.Annotations["kubectl.kubernetes.io/restartedAt"] = "2026-12-06T21:00:00Z"
	if err := s.Update(ctx, dep); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete(ctx, s.policy(t, req)); err != nil {
		t.Fatal(err)
	}
	ok, progress := upToDate(t, drivers(), req)
	if ok || !strings.Contains(progress, "NetworkPolicy") {
		t.Fatalf("an older Deployment without its NetworkPolicy: up to date %t, progress %q; want out of date, naming the NetworkPolicy", ok, progress)
	}
	if _, err := drivers().Update(ctx, proxy.Ref{Name: req.Name, Mark: req.Mark}, req); err != nil {
		t.Fatalf("Update: %v", err)
	}
	if p := s.policy(t, req); p == nil || p.Labels[LabelUID] != req.Mark.UID {
		t.Fatalf("after Update the NetworkPolicy is %v; want the proxy's, written again", p)
	}
	after := &appsv1.Deployment{}
	if err := s.Get(ctx, key, after); err != nil {
		t.Fatal(err)
	}
	if after.Annotations[AnnotationNetworkPolicy] != "true" {
		t.Errorf("after Update the Deployment's annotations are %v; want %s", after.Annotations, AnnotationNetworkPolicy)
	}
	if diff := cmp.Diff(dep.Spec.Template, after.Spec.Template); diff != "" {
		t.Errorf("Update changed the pod template (its pods roll):\n%s", diff)
	}
	if ok, progress := upToDate(t, drivers(), req); !ok {
		t.Errorf("after Update the proxy reads out of date (%q); want up to date", progress)
	}
	// The config's networkPolicy turned off: one Update drops the
	// annotation, so that no other config's sweep looks for the policy.
	open := func() *Driver { d := drivers(); d.cfg.NetworkPolicy = false; return d }
	if ok, _ := upToDate(t, open(), req); ok {
		t.Fatalf("a Deployment written with a NetworkPolicy reads up to date to its config without; want out of date")
	}
	if _, err := open().Update(ctx, proxy.Ref{Name: req.Name, Mark: req.Mark}, req); err != nil {
		t.Fatalf("Update: %v", err)
	}
	if err := s.Get(ctx, key, after); err != nil {
		t.Fatal(err)
	}
	if _, ok := after.Annotations[AnnotationNetworkPolicy]; ok {
		t.Errorf("after Update by the config without NetworkPolicies the annotations are %v; want no %s", after.Annotations, AnnotationNetworkPolicy)
	}
	if ok, progress := upToDate(t, open(), req); !ok {
		t.Errorf("after Update the proxy reads out of date (%q); want up to date", progress)
	}
}
