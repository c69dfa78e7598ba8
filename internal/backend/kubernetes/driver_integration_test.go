package kubernetes_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/egressproxy/provider-egressproxy/internal/backend/kubernetes"
	"github.com/egressproxy/provider-egressproxy/internal/devenv/testenv"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
	"github.com/egressproxy/provider-egressproxy/internal/squid"
)

// namespace creates a fresh namespace.
func (e *env) namespace(t *testing.T) string {
	t.Helper()
	ns := fmt.Sprintf("dt-%d", e.seq.Add(1))
	if err := e.live.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = e.live.Delete(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	})
	return ns
}

// quota creates a ResourceQuota and plays the quota controller (not
// running here): it sets the quota's status, without which the quota
// admission refuses everything as "status unknown".
func (e *env) quota(t *testing.T, ns, name string, hard corev1.ResourceList) {
	t.Helper()
	ctx := context.Background()
	q := &corev1.ResourceQuota{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Spec: corev1.ResourceQuotaSpec{Hard: hard}}
	if err := e.live.Create(ctx, q); err != nil {
		t.Fatal(err)
	}
	used := corev1.ResourceList{}
	for k := range hard {
		used[k] = resource.MustParse("0")
	}
	q.Status = corev1.ResourceQuotaStatus{Hard: hard, Used: used}
	if err := e.live.Status().Update(ctx, q); err != nil {
		t.Fatal(err)
	}
	// The quota admission plugin reads quotas from an informer: until it
	// holds this one with its status, a create passes or is refused as
	// "status unknown". A dry run of what the quota forbids tells when.
	pod := corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "quota-probe"}}}
	probe := func() client.Object {
		if _, ok := hard[corev1.ResourcePods]; ok {
			return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{GenerateName: "quota-probe-", Namespace: ns}, Spec: pod}
		}
		labels := map[string]string{"quota-probe": "true"}
		return &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{GenerateName: "quota-probe-", Namespace: ns}, Spec: appsv1.DeploymentSpec{
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: pod},
		}}
	}
	waitFor(t, "the quota admission to enforce "+name, func() (bool, string) {
		err := e.live.Create(ctx, probe(), client.DryRunAll)
		return err != nil && strings.Contains(err.Error(), "exceeded quota"), fmt.Sprintf("a dry-run create: %v", err)
	})
}

// driver is a driver on this cluster, reading through the cache, for cfg.
func (e *env) driver(cfg kubernetes.Config, now func() time.Time) *kubernetes.Driver {
	return kubernetes.New(kubernetes.Options{
		Provider: testProvider, Config: cfg, Client: e.cached, Live: e.live,
		Version: e.remote.Version, Host: e.cp.Config.Host, Now: now, DialPods: true,
	})
}

func request(name string) proxy.Request {
	return proxy.Request{
		Name:  name,
		Mark:  proxy.Mark{UID: "0c8f6a1e-5b7d-4e2a-9c3f-" + fmt.Sprintf("%012d", len(name)), InstallationID: testInstallation},
		Proxy: proxy.Settings{Port: 3128, AllowedClientCIDRs: []string{"10.0.0.0/8"}, AllowedPorts: []int32{443}},
	}
}

func (e *env) driverTests(t *testing.T) {
	ctx := context.Background()

	t.Run("QuotaRefusingTheDeploymentIsQuota", func(t *testing.T) {
		t.Parallel()
		ns := e.namespace(t)
		e.quota(t, ns, "no-deployments", corev1.ResourceList{"count/deployments.apps": resource.MustParse("0")})
		d := e.driver(kubernetes.Config{Namespace: ns}, nil)
		_, err := d.Create(ctx, request("quota"))
		var pe *proxy.Error
		if !errors.As(err, &pe) || pe.Class != proxy.ClassQuota || pe.Provider != testProvider || pe.Op != "create" {
			t.Fatalf("Create under a quota of no Deployments = %v; want a Quota error from %q in create", err, testProvider)
		}
		if !strings.Contains(err.Error(), "exceeded quota") {
			t.Errorf("error %q does not say which quota", err)
		}
	})

	t.Run("QuotaRefusingThePodShowsInProgress", func(t *testing.T) {
		t.Parallel()
		ns := e.namespace(t)
		e.quota(t, ns, "no-pods", corev1.ResourceList{corev1.ResourcePods: resource.MustParse("0")})
		d := e.driver(kubernetes.Config{Namespace: ns}, nil)
		inst, err := d.Create(ctx, request("nopods"))
		if err != nil {
			t.Fatal(err)
		}
		waitFor(t, "the quota to show in Progress", func() (bool, string) {
			got, err := d.Get(ctx, proxy.Ref{ID: inst.ID})
			if err != nil {
				return false, err.Error()
			}
			return got.State == proxy.StateProvisioning && strings.Contains(got.Progress, "(ResourceQuota)") && strings.Contains(got.Progress, "exceeded quota"),
				fmt.Sprintf("%s: %s", got.State, got.Progress)
		})
	})

	t.Run("MissingNamespace", func(t *testing.T) {
		t.Parallel()
		d := e.driver(kubernetes.Config{Namespace: "does-not-exist"}, nil)
		_, err := d.Create(ctx, request("nowhere"))
		if !proxy.IsPermanent(err) || !strings.Contains(err.Error(), `namespace "does-not-exist" does not exist`) || !strings.Contains(err.Error(), testProvider) {
			t.Errorf("Create in a missing namespace = %v; want Permanent, naming the namespace and the config", err)
		}
		h := d.Check(ctx)
		if h.Healthy() || h.Targets[0].Reason != kubernetes.ReasonNamespaceMissing {
			t.Errorf("Check with a missing namespace = %+v; want unhealthy, %s", h, kubernetes.ReasonNamespaceMissing)
		}
	})

	// The pod network, as the nodes' podCIDRs say it, and the nodes' own
	// addresses are denied like the Service network, in squid.conf and
	// the NetworkPolicy, and a proxy that opens 10.0.0.0/8 does not reopen
	// them.
	t.Run("PodNetworkAndNodesAreDenied", func(t *testing.T) {
		t.Parallel()
		node := &corev1.Node{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("podcidrs-%d", e.seq.Add(1))},
			Spec: corev1.NodeSpec{
				PodCIDR: "10.244.7.0/24", PodCIDRs: []string{"10.244.7.0/24", "fd00:10:244:7::/64"},
				// Nothing runs there: no kubelet stands behind it.
				Unschedulable: true, Taints: []corev1.Taint{{Key: "egressproxy.io/test", Effect: corev1.TaintEffectNoSchedule}},
			},
		}
		if err := e.live.Create(ctx, node); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = e.live.Delete(context.Background(), node) })
		node.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "10.3.9.7"}, {Type: corev1.NodeExternalIP, Address: "198.51.100.7"}}
		if err := e.live.Status().Update(ctx, node); err != nil {
			t.Fatal(err)
		}
		ns := e.namespace(t)
		// A host of its own: discovered networks are kept per API server,
		// and other tests read this one's before the node existed.
		d := kubernetes.New(kubernetes.Options{
			Provider: testProvider, Config: kubernetes.Config{Namespace: ns, NetworkPolicy: true}, Client: e.cached, Live: e.live,
			Version: e.remote.Version, Host: e.cp.Config.Host + "/" + node.Name, DialPods: true,
		})
		req := request("podnet")
		req.Proxy.AllowedDestinationCIDRs = []string{"10.0.0.0/8", "fc00::/7"}
		if _, err := d.Create(ctx, req); err != nil {
			t.Fatal(err)
		}
		sec := &corev1.Secret{}
		if err := e.live.Get(ctx, types.NamespacedName{Namespace: ns, Name: req.Name}, sec); err != nil {
			t.Fatal(err)
		}
		var never []string
		for l := range strings.Lines(string(sec.Data[kubernetes.KeySquidConf])) {
			if f := strings.Fields(l); len(f) > 3 && f[0] == "acl" && f[1] == "never_dst" {
				never = f[3:]
			}
		}
		for _, c := range []string{"10.244.7.0/24", "fd00:10:244:7::/64", "64:ff9b::af4:700/120", "10.3.9.7/32", "198.51.100.7/32"} {
			if !slices.Contains(never, c) {
				t.Errorf("squid.conf never_dst does not hold %s: %v", c, never)
			}
		}
		np := &networkingv1.NetworkPolicy{}
		if err := e.live.Get(ctx, types.NamespacedName{Namespace: ns, Name: req.Name}, np); err != nil {
			t.Fatal(err)
		}
		excepts := map[string][]string{}
		for _, p := range np.Spec.Egress[1].To {
			excepts[p.IPBlock.CIDR] = p.IPBlock.Except
		}
		for _, c := range []struct{ cidr, except string }{
			{"0.0.0.0/0", "10.244.7.0/24"}, {"10.0.0.0/8", "10.244.7.0/24"}, {"::/0", "fd00:10:244:7::/64"}, {"fc00::/7", "fd00:10:244:7::/64"},
			{"0.0.0.0/0", "10.3.9.7/32"}, {"10.0.0.0/8", "10.3.9.7/32"}, {"0.0.0.0/0", "198.51.100.7/32"},
		} {
			if ex, ok := excepts[c.cidr]; !ok || !slices.Contains(ex, c.except) {
				t.Errorf("NetworkPolicy ipBlock %s (present: %v) does not except the cluster's %s: %v", c.cidr, ok, c.except, ex)
			}
		}
	})

	t.Run("CheckReportsTheServerVersion", func(t *testing.T) {
		t.Parallel()
		h := e.driver(kubernetes.Config{Namespace: e.namespace(t)}, nil).Check(ctx)
		if !h.Healthy() || !strings.HasPrefix(h.Targets[0].Details["serverVersion"], "v1.") {
			t.Errorf("Check = %+v; want healthy with the server version", h)
		}
	})

	t.Run("MissingChildrenAreCreatedAgain", func(t *testing.T) {
		t.Parallel()
		ns := e.namespace(t)
		later := func() time.Time { return time.Now().Add(time.Minute) }
		d := e.driver(kubernetes.Config{Namespace: ns}, nil)
		req := request("orphan")
		req.Extension = kubernetes.Exposure{ServiceType: "ClusterIP"}
		inst, err := d.Create(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		key := types.NamespacedName{Namespace: ns, Name: "orphan"}
		if err := e.live.Delete(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "orphan"}}); err != nil {
			t.Fatal(err)
		}
		if err := e.live.Delete(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "orphan"}}); err != nil {
			t.Fatal(err)
		}
		// A minute later, no pod serving: the driver looks for the Secret.
		dl := e.driver(kubernetes.Config{Namespace: ns}, later)
		var got proxy.Instance
		waitFor(t, "Get to report the proxy out of date", func() (bool, string) {
			got, err = dl.Get(ctx, proxy.Ref{ID: inst.ID})
			if err != nil {
				return false, err.Error()
			}
			return got.SpecHash != proxy.Hash(req) && strings.Contains(got.Progress, "Secret and Service"), got.SpecHash + ": " + got.Progress
		})
		if _, err := dl.Update(ctx, proxy.Ref{ID: inst.ID}, req); err != nil {
			t.Fatal(err)
		}
		if err := e.live.Get(ctx, key, &corev1.Secret{}); err != nil {
			t.Errorf("Secret after Update: %v", err)
		}
		if err := e.live.Get(ctx, key, &corev1.Service{}); err != nil {
			t.Errorf("Service after Update: %v", err)
		}
		waitFor(t, "Get to report the proxy up to date", func() (bool, string) {
			got, err = dl.Get(ctx, proxy.Ref{ID: inst.ID})
			if err != nil {
				return false, err.Error()
			}
			return got.SpecHash == proxy.Hash(req), got.SpecHash
		})
	})

	t.Run("ReachabilityInThisClusterAndARemoteOne", func(t *testing.T) {
		t.Parallel()
		ns := e.namespace(t)
		inst := e.createSettled(t, e.driver(kubernetes.Config{Namespace: ns}, nil), request("reach"))
		refused := &squid.Prober{Dial: func(context.Context, string, string) (net.Conn, error) {
			return nil, errors.New("no route to host")
		}}
		for _, c := range []struct {
			dialPods bool
			want     bool
		}{
			// In this cluster the pod's address is dialled: refused, not reachable.
			{dialPods: true, want: false},
			// From outside, the pod's readiness probe stands for the check.
			{dialPods: false, want: true},
		} {
			d := kubernetes.New(kubernetes.Options{Provider: testProvider, Config: kubernetes.Config{Namespace: ns},
				Client: e.cached, Live: e.live, Prober: refused, DialPods: c.dialPods})
			got, err := d.Get(ctx, proxy.Ref{ID: inst.ID})
			if err != nil {
				t.Fatal(err)
			}
			if got.State != proxy.StateRunning || got.ProxyReachable != c.want {
				t.Errorf("DialPods %v, dial refused: State %s, ProxyReachable %v (%s); want Running, %v", c.dialPods, got.State, got.ProxyReachable, got.Progress, c.want)
			}
		}
	})

	t.Run("ConfigChangeRollsThePods", func(t *testing.T) {
		t.Parallel()
		ns := e.namespace(t)
		old := e.driver(kubernetes.Config{Namespace: ns, Image: "example.com/squid:1"}, nil)
		req := request("rolling")
		inst := e.createSettled(t, old, req)
		res := corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("512Mi")}}
		changed := e.driver(kubernetes.Config{Namespace: ns, Image: "example.com/squid:2", Resources: &res}, nil)
		got, err := changed.Get(ctx, proxy.Ref{ID: inst.ID})
		if err != nil {
			t.Fatal(err)
		}
		if got.SpecHash == proxy.Hash(req) {
			t.Fatalf("after the config's image changed, Get reports SpecHash %q, the request's: the controller would not update", got.SpecHash)
		}
		if _, err := changed.Update(ctx, proxy.Ref{ID: inst.ID}, req); err != nil {
			t.Fatal(err)
		}
		if err := e.settle(ctx, inst.ID, true); err != nil {
			t.Fatal(err)
		}
		dep := &appsv1.Deployment{}
		if err := e.live.Get(ctx, types.NamespacedName{Namespace: ns, Name: "rolling"}, dep); err != nil {
			t.Fatal(err)
		}
		c := dep.Spec.Template.Spec.Containers[0]
		if c.Image != "example.com/squid:2" || c.Resources.Limits.Memory().String() != "512Mi" {
			t.Errorf("after Update: image %q, memory limit %v; want the config's", c.Image, c.Resources.Limits.Memory())
		}
		pods, err := e.pods(ctx, e.live, ns, "rolling")
		if err != nil {
			t.Fatal(err)
		}
		if len(pods) != 1 || pods[0].Spec.Containers[0].Image != "example.com/squid:2" {
			t.Errorf("pods after the rollout: %d, want 1 with the new image", len(pods))
		}
		if got, err := changed.Get(ctx, proxy.Ref{ID: inst.ID}); err != nil || got.SpecHash != proxy.Hash(req) || got.State != proxy.StateRunning {
			t.Errorf("Get after the rollout = %+v, %v; want Running and up to date", got, err)
		}
	})

	// The Deployment of a resource being deleted goes in the background;
	// the resource must not end while its pod remains (held here by a
	// finalizer, as a pod in its grace period is).
	t.Run("ResourceBeingDeletedStaysUntilItsPodIsGone", func(t *testing.T) {
		t.Parallel()
		ns, d, req := e.fresh(t, "lingering")
		inst := e.createSettled(t, d, req)
		release := e.holdPods(t, ns, req.Name)
		deleting := proxy.Ref{ID: inst.ID, Name: req.Name, Mark: req.Mark, Live: true, Deleting: true}
		if err := d.Delete(ctx, deleting); err != nil {
			t.Fatal(err)
		}
		// In the background: the Deployment goes at once (in the
		// foreground the held pod would keep it); the garbage collector
		// then deletes the ReplicaSet and the pod, which the finalizer
		// keeps.
		waitFor(t, "the Deployment to go and its pod to be deleted", func() (bool, string) {
			err := e.live.Get(ctx, types.NamespacedName{Namespace: ns, Name: req.Name}, &appsv1.Deployment{})
			pods, perr := e.pods(ctx, e.live, ns, req.Name)
			if perr != nil || len(pods) != 1 {
				t.Fatalf("pods of the proxy: %v, %d; want the held one", perr, len(pods))
			}
			return kerrors.IsNotFound(err) && pods[0].DeletionTimestamp != nil, fmt.Sprintf("Deployment: %v; pod deleted: %v", err, pods[0].DeletionTimestamp)
		})
		if err := e.waitCache(ctx, ns, req.Name, true); err != nil {
			t.Fatal(err)
		}
		got, err := d.Get(ctx, deleting)
		switch {
		case err != nil:
			t.Errorf("Get of the resource being deleted, its Deployment gone and its pod still there = %v; want the proxy, Stopped, so that it is not let go", err)
		case got.ID != inst.ID || got.Mark != req.Mark || got.State != proxy.StateStopped || !strings.Contains(got.Progress, "stopping"):
			t.Errorf("Get while the pod remains = ID %q, mark %+v, %s (%s); want %q, the resource's mark, Stopped, saying the pod is stopping", got.ID, got.Mark, got.State, got.Progress, inst.ID)
		}
		if err := d.Delete(ctx, deleting); err != nil {
			t.Errorf("Delete again while the pod remains = %v; want nil", err)
		}
		release()
		if err := e.settle(ctx, inst.ID, true); err != nil {
			t.Fatal(err)
		}
		if got, err := d.Get(ctx, deleting); !proxy.IsNotFound(err) {
			t.Errorf("Get once the pod is gone = %+v, %v; want NotFound", got, err)
		}
	})
}

// takeoverTests: an external name that names someone else's Secret or
// Service never makes the driver merge into it, own it or delete it, on
// Create, on Update and when the proxy is deleted.
func (e *env) takeoverTests(t *testing.T) {
	ctx := context.Background()
	const apiKey = "sk-S3NT1NEL-7d2f9a41c0e3"

	// snapshot is what must not change about an object.
	snapshot := func(t *testing.T, obj client.Object) string {
		t.Helper()
		if err := e.live.Get(ctx, client.ObjectKeyFromObject(obj), obj); err != nil {
			t.Fatalf("the victim %s is gone: %v", obj.GetName(), err)
		}
		return fmt.Sprintf("rv=%s uid=%s labels=%v owners=%v", obj.GetResourceVersion(), obj.GetUID(), obj.GetLabels(), obj.GetOwnerReferences())
	}
	noLeak := func(t *testing.T, err error) {
		t.Helper()
		if err != nil && strings.Contains(fmt.Sprintf("%+v", err), apiKey) {
			t.Errorf("the error holds the victim Secret's data: %v", err)
		}
	}

	t.Run("ExternalNameOfASecretHoldingAnAPIKey", func(t *testing.T) {
		t.Parallel()
		ns := e.namespace(t)
		victim := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "billing-api"}, Data: map[string][]byte{"api-key": []byte(apiKey)}}
		if err := e.live.Create(ctx, victim); err != nil {
			t.Fatal(err)
		}
		before := snapshot(t, &corev1.Secret{ObjectMeta: victim.ObjectMeta})
		d := e.driver(kubernetes.Config{Namespace: ns}, nil)
		req := request("billing-api")
		_, err := d.Create(ctx, req)
		noLeak(t, err)
		if !proxy.IsPermanent(err) || !strings.Contains(err.Error(), "Secret "+ns+"/billing-api") {
			t.Fatalf("Create with the external name of an existing Secret = %v; want Permanent naming the Secret", err)
		}
		if err := e.live.Get(ctx, types.NamespacedName{Namespace: ns, Name: "billing-api"}, &appsv1.Deployment{}); !kerrors.IsNotFound(err) {
			t.Errorf("a Deployment mounting the victim Secret was created (get: %v)", err)
		}
		// The resource is deleted: Get says there is nothing, Delete succeeds.
		if _, err := d.Get(ctx, proxy.Ref{Name: req.Name, Mark: req.Mark, Live: true}); !proxy.IsNotFound(err) {
			t.Errorf("Get after the refused Create = %v; want NotFound", err)
		}
		if err := d.Delete(ctx, proxy.Ref{Name: req.Name, Mark: req.Mark, Live: true}); err != nil {
			t.Errorf("Delete after the refused Create = %v; want nil", err)
		}
		got := &corev1.Secret{ObjectMeta: victim.ObjectMeta}
		if after := snapshot(t, got); after != before || string(got.Data["api-key"]) != apiKey || len(got.Data) != 1 {
			t.Errorf("the victim Secret changed:\nbefore %s\nafter  %s, keys %d", before, after, len(got.Data))
		}
	})

	t.Run("ExternalNameOfAService", func(t *testing.T) {
		t.Parallel()
		ns := e.namespace(t)
		victim := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "payments"},
			Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "payments"}, Ports: []corev1.ServicePort{{Port: 443}}}}
		if err := e.live.Create(ctx, victim); err != nil {
			t.Fatal(err)
		}
		before := snapshot(t, &corev1.Service{ObjectMeta: victim.ObjectMeta})
		d := e.driver(kubernetes.Config{Namespace: ns}, nil)
		req := request("payments")
		req.Extension = kubernetes.Exposure{ServiceType: "LoadBalancer"}
		if _, err := d.Create(ctx, req); !proxy.IsPermanent(err) || !strings.Contains(err.Error(), "Service "+ns+"/payments") {
			t.Fatalf("Create with the external name of an existing Service = %v; want Permanent naming the Service", err)
		}
		if err := e.live.Get(ctx, types.NamespacedName{Namespace: ns, Name: "payments"}, &appsv1.Deployment{}); !kerrors.IsNotFound(err) {
			t.Errorf("a Deployment was created for the refused proxy (get: %v)", err)
		}
		if after := snapshot(t, &corev1.Service{ObjectMeta: victim.ObjectMeta}); after != before {
			t.Errorf("the victim Service changed:\nbefore %s\nafter  %s", before, after)
		}
	})

	// A Service of the proxy's name made after the proxy: turning the
	// Service on must not re-point it, and deleting the proxy must not
	// collect it.
	t.Run("ServiceMadeLaterIsNeitherRepointedNorCollected", func(t *testing.T) {
		t.Parallel()
		ns, d, req := e.fresh(t, "later")
		inst, err := d.Create(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		victim := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "later"},
			Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "other"}, Ports: []corev1.ServicePort{{Port: 80}}}}
		if err := e.live.Create(ctx, victim); err != nil {
			t.Fatal(err)
		}
		before := snapshot(t, &corev1.Service{ObjectMeta: victim.ObjectMeta})
		withService := req
		withService.Extension = kubernetes.Exposure{ServiceType: "ClusterIP"}
		ref := proxy.Ref{ID: inst.ID, Name: req.Name, Mark: req.Mark}
		if _, err := d.Update(ctx, ref, withService); !proxy.IsPermanent(err) || !strings.Contains(err.Error(), "Service "+ns+"/later") {
			t.Errorf("Update turning on a Service whose name is taken = %v; want Permanent naming the Service", err)
		}
		ref.Live = true
		if err := d.Delete(ctx, ref); err != nil {
			t.Fatal(err)
		}
		// The Deployment and its pods gone: the garbage collector has
		// been through what the Deployment owned.
		if err := e.settle(ctx, inst.ID, true); err != nil {
			t.Fatal(err)
		}
		if after := snapshot(t, &corev1.Service{ObjectMeta: victim.ObjectMeta}); after != before {
			t.Errorf("the victim Service changed:\nbefore %s\nafter  %s", before, after)
		}
	})

	// The proxy's own children follow the request: a Service that changes
	// type both ways and goes, a Secret that loses its htpasswd when auth
	// is turned off (what is no longer wanted is removed, not kept).
	t.Run("OwnChildrenFollowTheRequest", func(t *testing.T) {
		t.Parallel()
		ns, d, req := e.fresh(t, "follows")
		req.Proxy.Auth = proxy.Auth{Enabled: true, Username: "u", Password: "pw-0123456789abcdef"}
		req.Extension = kubernetes.Exposure{ServiceType: "LoadBalancer"}
		inst, err := d.Create(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		key := types.NamespacedName{Namespace: ns, Name: "follows"}
		ref := proxy.Ref{ID: inst.ID, Name: req.Name, Mark: req.Mark}
		for _, step := range []struct {
			service string
			auth    bool
		}{{"ClusterIP", true}, {"LoadBalancer", false}, {"ClusterIP", false}, {"", false}} {
			req.Extension = kubernetes.Exposure{ServiceType: step.service}
			req.Proxy.Auth.Enabled = step.auth
			// As the controller does: a Transient error (a cached
			// Deployment the Deployment controller just changed) is retried.
			waitFor(t, fmt.Sprintf("Update to service %q, auth %v", step.service, step.auth), func() (bool, string) {
				_, err := d.Update(ctx, ref, req)
				if err != nil && !proxy.IsTransient(err) {
					t.Fatalf("Update to service %q, auth %v: %v", step.service, step.auth, err)
				}
				return err == nil, fmt.Sprint(err)
			})
			svc := &corev1.Service{}
			err := e.live.Get(ctx, key, svc)
			switch {
			case step.service == "" && !kerrors.IsNotFound(err):
				t.Errorf("no Service wanted, yet Get = %v (type %s)", err, svc.Spec.Type)
			case step.service != "" && (err != nil || string(svc.Spec.Type) != step.service):
				t.Errorf("Service after Update to %q: type %q, %v", step.service, svc.Spec.Type, err)
			}
			sec := &corev1.Secret{}
			if err := e.live.Get(ctx, key, sec); err != nil {
				t.Fatal(err)
			}
			if _, has := sec.Data[kubernetes.KeyHtpasswd]; has != step.auth {
				t.Errorf("Secret with auth %v holds htpasswd: %v", step.auth, has)
			}
		}
	})

	// Another resource's proxy of the same name in the same namespace (two
	// installations sharing it): its Secret is not ours either.
	t.Run("SecretOfAnotherInstallation", func(t *testing.T) {
		t.Parallel()
		ns := e.namespace(t)
		d := e.driver(kubernetes.Config{Namespace: ns}, nil)
		theirs := request("shared")
		theirs.Mark.InstallationID = "another-installation"
		if _, err := d.Create(ctx, theirs); err != nil {
			t.Fatal(err)
		}
		// Their Deployment is gone (orphaning its children), ours comes.
		if err := e.live.Delete(ctx, &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "shared"}},
			client.PropagationPolicy(metav1.DeletePropagationOrphan)); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "their Deployment to go", func() (bool, string) {
			err := e.live.Get(ctx, types.NamespacedName{Namespace: ns, Name: "shared"}, &appsv1.Deployment{})
			return kerrors.IsNotFound(err), fmt.Sprint(err)
		})
		before := snapshot(t, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "shared"}})
		if _, err := d.Create(ctx, request("shared")); !proxy.IsPermanent(err) || !strings.Contains(err.Error(), "another resource") {
			t.Errorf("Create over another installation's Secret = %v; want Permanent saying it belongs to another resource", err)
		}
		if after := snapshot(t, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "shared"}}); after != before {
			t.Errorf("their Secret changed:\nbefore %s\nafter  %s", before, after)
		}
	})
}

// fresh is a new namespace, a driver for it and the request for the
// proxy name.
func (e *env) fresh(t *testing.T, name string) (string, *kubernetes.Driver, proxy.Request) {
	t.Helper()
	ns := e.namespace(t)
	return ns, e.driver(kubernetes.Config{Namespace: ns}, nil), request(name)
}

// createSettled creates req with d and settles it: its pod Ready, the
// rollout done, the cache caught up.
func (e *env) createSettled(t *testing.T, d *kubernetes.Driver, req proxy.Request) proxy.Instance {
	t.Helper()
	inst, err := d.Create(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.settle(context.Background(), inst.ID, true); err != nil {
		t.Fatal(err)
	}
	return inst
}

// holdPods puts a finalizer on the pods of the proxy name in ns, so that
// they stay (being deleted) until the returned release, or the test's end.
func (e *env) holdPods(t *testing.T, ns, name string) func() {
	t.Helper()
	ctx := context.Background()
	pods, err := e.pods(ctx, e.live, ns, name)
	if err != nil || len(pods) == 0 {
		t.Fatalf("pods of %s/%s to hold: %v, %d", ns, name, err, len(pods))
	}
	for i := range pods {
		pods[i].Finalizers = append(pods[i].Finalizers, holdFinalizer)
		if err := e.live.Update(ctx, &pods[i]); err != nil {
			t.Fatal(err)
		}
	}
	var once sync.Once
	release := func() {
		once.Do(func() {
			for _, p := range pods {
				patch := client.RawPatch(types.JSONPatchType, []byte(`[{"op":"remove","path":"/metadata/finalizers"}]`))
				if err := e.live.Patch(context.Background(), &p, patch); err != nil && !kerrors.IsNotFound(err) {
					t.Errorf("releasing pod %s: %v", p.Name, err)
				}
			}
		})
	}
	t.Cleanup(release)
	return release
}

// waitFor polls cond for up to 20 s.
func waitFor(t *testing.T, what string, cond func() (bool, string)) {
	t.Helper()
	testenv.WaitFor(t, what, 20*time.Second, cond)
}
