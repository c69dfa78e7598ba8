package pod

import (
	"context"
	"errors"
	"strings"
	"testing"

	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	clusterproxy "github.com/egressproxy/provider-egressproxy/apis/cluster/proxy/v1alpha1"
	nsproxy "github.com/egressproxy/provider-egressproxy/apis/namespaced/proxy/v1alpha1"
	"github.com/egressproxy/provider-egressproxy/internal/backend/kubernetes"
	"github.com/egressproxy/provider-egressproxy/internal/devenv/testenv"
)

const releaseUID = "uid-pp-1"

// proxyDeployment is a Deployment of the proxy with UID uid, owned by
// owners.
func proxyDeployment(name, uid string, owners ...metav1.OwnerReference) *appsv1.Deployment {
	return &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{
		Namespace: "proxies", Name: name, OwnerReferences: owners,
		Labels: map[string]string{kubernetes.LabelManagedBy: kubernetes.ManagedBy, kubernetes.LabelUID: uid, kubernetes.LabelInstallation: "inst"},
	}}
}

func podProxyOwner(uid string) metav1.OwnerReference {
	return metav1.OwnerReference{APIVersion: clusterproxy.PodProxyGroupVersionKind.GroupVersion().String(), Kind: "PodProxy", Name: "web", UID: types.UID(uid)}
}

var otherOwner = metav1.OwnerReference{APIVersion: "v1", Kind: "ConfigMap", Name: "keep", UID: "uid-cm"}

// deletedPodProxy is a cluster-scoped PodProxy being deleted with the
// given policies.
func deletedPodProxy(policies xpv2.ManagementPolicies, deletion xpv2.DeletionPolicy) *clusterproxy.PodProxy {
	now := metav1.Now()
	cr := &clusterproxy.PodProxy{ObjectMeta: metav1.ObjectMeta{Name: "web", UID: releaseUID, DeletionTimestamp: &now}}
	cr.SetManagementPolicies(policies)
	cr.SetDeletionPolicy(deletion)
	return cr
}

// TestReleaseKeepsTheDeploymentOfAProxyThatStays: a PodProxy whose
// deletion leaves its proxy (Observe only, no Delete, deletionPolicy
// Orphan) takes its owner reference off its Deployments before its
// finalizer goes, with a patch that holds the resourceVersion read, and
// touches no other owner reference, no other proxy's Deployment; a
// PodProxy whose deletion deletes its proxy changes nothing.
func TestReleaseKeepsTheDeploymentOfAProxyThatStays(t *testing.T) {
	all := xpv2.ManagementPolicies{xpv2.ManagementActionAll}
	cases := map[string]struct {
		cr   *clusterproxy.PodProxy
		want []metav1.OwnerReference // of the proxy's Deployment afterwards
	}{
		"ObserveOnly":     {cr: deletedPodProxy(xpv2.ManagementPolicies{xpv2.ManagementActionObserve}, xpv2.DeletionDelete), want: []metav1.OwnerReference{otherOwner}},
		"NoDelete":        {cr: deletedPodProxy(xpv2.ManagementPolicies{xpv2.ManagementActionObserve, xpv2.ManagementActionCreate, xpv2.ManagementActionUpdate}, xpv2.DeletionDelete), want: []metav1.OwnerReference{otherOwner}},
		"Orphan":          {cr: deletedPodProxy(all, xpv2.DeletionOrphan), want: []metav1.OwnerReference{otherOwner}},
		"DeletesItsProxy": {cr: deletedPodProxy(all, xpv2.DeletionDelete), want: []metav1.OwnerReference{otherOwner, podProxyOwner(releaseUID)}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			var patches []string
			ours := proxyDeployment("px-web", releaseUID, otherOwner, podProxyOwner(releaseUID))
			theirs := proxyDeployment("px-other", "uid-other", podProxyOwner("uid-other"))
			kube := fake.NewClientBuilder().WithScheme(testenv.Scheme(t)).WithObjects(ours, theirs).
				WithInterceptorFuncs(interceptor.Funcs{Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
					b, _ := patch.Data(obj)
					patches = append(patches, string(b))
					return c.Patch(ctx, obj, patch, opts...)
				}}).Build()
			b := &binding{local: &kubernetes.Cluster{}}
			if err := b.release(context.Background(), kube, tc.cr); err != nil {
				t.Fatalf("release: %v", err)
			}
			got := &appsv1.Deployment{}
			if err := kube.Get(context.Background(), client.ObjectKeyFromObject(ours), got); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got.OwnerReferences); diff != "" {
				t.Errorf("the proxy's Deployment's owners: -want, +got:\n%s", diff)
			}
			other := &appsv1.Deployment{}
			if err := kube.Get(context.Background(), client.ObjectKeyFromObject(theirs), other); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff([]metav1.OwnerReference{podProxyOwner("uid-other")}, other.OwnerReferences); diff != "" {
				t.Errorf("another proxy's Deployment's owners: -want, +got:\n%s", diff)
			}
			for _, p := range patches {
				if !strings.Contains(p, `"resourceVersion"`) {
					t.Errorf("patch %s holds no resourceVersion", p)
				}
			}
		})
	}
}

// TestReleaseRemovesTheOnlyOwner: a Deployment whose only owner is the
// PodProxy is left with none.
func TestReleaseRemovesTheOnlyOwner(t *testing.T) {
	now := metav1.Now()
	cr := &nsproxy.PodProxy{ObjectMeta: metav1.ObjectMeta{Namespace: "proxies", Name: "web", UID: releaseUID, DeletionTimestamp: &now}}
	cr.SetManagementPolicies(xpv2.ManagementPolicies{xpv2.ManagementActionObserve})
	dep := proxyDeployment("px-web", releaseUID, podProxyOwner(releaseUID))
	kube := fake.NewClientBuilder().WithScheme(testenv.Scheme(t)).WithObjects(dep).Build()
	if err := releaseDeployments(context.Background(), kube, cr); err != nil {
		t.Fatal(err)
	}
	got := &appsv1.Deployment{}
	if err := kube.Get(context.Background(), client.ObjectKeyFromObject(dep), got); err != nil {
		t.Fatal(err)
	}
	if len(got.OwnerReferences) != 0 {
		t.Errorf("owners %v; want none", got.OwnerReferences)
	}
}

// TestReleaseErrors: a conflict (the Deployment changed since it was
// read) is returned, so the reconcile retries with the finalizer kept; a
// Deployment gone meanwhile, or a provider that may not list Deployments
// (it never owned one), lets the finalizer go; a Deployment being deleted
// is not patched; a refused patch keeps the finalizer and names the
// permission.
func TestReleaseErrors(t *testing.T) {
	cr := deletedPodProxy(xpv2.ManagementPolicies{xpv2.ManagementActionObserve}, xpv2.DeletionDelete)
	gr := schema.GroupResource{Group: "apps", Resource: "deployments"}
	cases := map[string]struct {
		deleting  bool
		list      error
		patch     error
		wantErr   func(error) bool
		wantPatch bool
	}{
		"Conflict": {patch: kerrors.NewConflict(gr, "px-web", errConflict), wantErr: kerrors.IsConflict, wantPatch: true},
		"Gone":     {patch: kerrors.NewNotFound(gr, "px-web"), wantPatch: true},
		"NoRBAC":   {list: kerrors.NewForbidden(gr, "", errConflict)},
		// The finalizer stays, and the message names the grant.
		"NoPatch": {patch: kerrors.NewForbidden(gr, "px-web", errConflict), wantPatch: true, wantErr: func(err error) bool {
			return err != nil && strings.Contains(err.Error(), "may not patch deployments.apps in proxies")
		}},
		"Deleting":  {deleting: true},
		"ListFails": {list: kerrors.NewServiceUnavailable("busy"), wantErr: kerrors.IsServiceUnavailable},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			dep := proxyDeployment("px-web", releaseUID, podProxyOwner(releaseUID))
			if tc.deleting {
				now := metav1.Now()
				dep.DeletionTimestamp = &now
				dep.Finalizers = []string{"foregroundDeletion"}
			}
			patched := false
			kube := fake.NewClientBuilder().WithScheme(testenv.Scheme(t)).WithObjects(dep).
				WithInterceptorFuncs(interceptor.Funcs{
					List: func(ctx context.Context, c client.WithWatch, l client.ObjectList, opts ...client.ListOption) error {
						if tc.list != nil {
							return tc.list
						}
						return c.List(ctx, l, opts...)
					},
					Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
						patched = true
						if tc.patch != nil {
							return tc.patch
						}
						return c.Patch(ctx, obj, patch, opts...)
					},
				}).Build()
			err := releaseDeployments(context.Background(), kube, cr)
			switch {
			case tc.wantErr == nil && err != nil:
				t.Errorf("releaseDeployments: %v; want none", err)
			case tc.wantErr != nil && !tc.wantErr(err):
				t.Errorf("releaseDeployments: %v; want the API server's error", err)
			}
			if patched != tc.wantPatch {
				t.Errorf("patched: %v, want %v", patched, tc.wantPatch)
			}
		})
	}
}

var errConflict = errors.New("changed")

// TestReleaseWithoutThisCluster: a binding that cannot reach this cluster
// never made a Deployment here, and reads nothing.
func TestReleaseWithoutThisCluster(t *testing.T) {
	kube := fake.NewClientBuilder().WithScheme(testenv.Scheme(t)).WithInterceptorFuncs(interceptor.Funcs{
		List: func(context.Context, client.WithWatch, client.ObjectList, ...client.ListOption) error {
			t.Error("listed Deployments without a cluster")
			return nil
		},
	}).Build()
	cr := deletedPodProxy(xpv2.ManagementPolicies{xpv2.ManagementActionObserve}, xpv2.DeletionDelete)
	if err := (&binding{}).release(context.Background(), kube, cr); err != nil {
		t.Fatal(err)
	}
}
