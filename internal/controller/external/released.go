package external

import (
	"context"
	"slices"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/crossplane/crossplane-runtime/v2/pkg/resource"
	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1alpha1 "github.com/egressproxy/provider-egressproxy/apis/cluster/v1alpha1"
	namespacedv1alpha1 "github.com/egressproxy/provider-egressproxy/apis/namespaced/v1alpha1"
	spec "github.com/egressproxy/provider-egressproxy/apis/spec/v1alpha1"
)

// Deletes reports whether deleting mg deletes its instance: its management
// policies allow Delete (none means all), and its deletion policy, where it
// has one, is not Orphan. It errs on the side of keeping: a cluster-scoped
// resource with deletionPolicy Orphan and explicit policies that include
// Delete is deleted by crossplane-runtime, but counts here as one that
// leaves its instance (recording a release of an instance that is gone
// costs one entry until the next sweep; missing one costs the instance).
func Deletes(mg resource.Managed) bool {
	p := mg.GetManagementPolicies()
	if len(p) > 0 && !slices.Contains(p, xpv2.ManagementActionAll) && !slices.Contains(p, xpv2.ManagementActionDelete) {
		return false
	}
	if l, ok := mg.(interface{ GetDeletionPolicy() xpv2.DeletionPolicy }); ok && l.GetDeletionPolicy() == xpv2.DeletionOrphan {
		return false
	}
	return true
}

// configStatus is what the three config kinds share for the record.
type configStatus interface {
	client.Object
	ConfigStatus() *spec.ProviderConfigStatus
}

// referencedConfig returns the config mg's providerConfigRef names, empty
// but for its key, or nil when it names none this provider knows.
func referencedConfig(mg resource.Managed) configStatus {
	switch m := mg.(type) {
	case resource.ModernManaged:
		ref := m.GetProviderConfigReference()
		if ref == nil || ref.Name == "" {
			return nil
		}
		switch ref.Kind {
		case "ProviderConfig":
			return &namespacedv1alpha1.ProviderConfig{ObjectMeta: metav1.ObjectMeta{Namespace: m.GetNamespace(), Name: ref.Name}}
		case "ClusterProviderConfig":
			return &namespacedv1alpha1.ClusterProviderConfig{ObjectMeta: metav1.ObjectMeta{Name: ref.Name}}
		}
	case resource.LegacyManaged:
		if ref := m.GetProviderConfigReference(); ref != nil && ref.Name != "" {
			return &clusterv1alpha1.ProviderConfig{ObjectMeta: metav1.ObjectMeta{Name: ref.Name}}
		}
	}
	return nil
}

// recordRelease records, in status.released of the config mg uses, that
// mg's deletion leaves its instance, so that the orphan sweep never deletes
// it; for a namespaced resource on a ClusterProviderConfig only when the
// config allows it (allowTenantRelease). It reads and writes only the API server: a backend out of reach or a
// config the backend refuses does not stop a resource from going. Without
// the config (gone, or a kind not installed) there is no sweep of it and
// nothing to record. The write holds the resourceVersion read: a config
// changed since fails with a conflict, returned so that the reconcile
// retries with a fresh read (the finalizer stays until then). A full record
// sets status.released.unrecordedTime instead, which stops the sweep from
// deleting any orphan as old.
func recordRelease(ctx context.Context, kube client.Client, mg resource.Managed, now time.Time) error {
	uid := string(mg.GetUID())
	pc := referencedConfig(mg)
	if uid == "" || pc == nil {
		return nil
	}
	if err := kube.Get(ctx, types.NamespacedName{Namespace: pc.GetNamespace(), Name: pc.GetName()}, pc); err != nil {
		if kerrors.IsNotFound(err) || apimeta.IsNoMatchError(err) {
			return nil
		}
		return errors.Wrapf(err, "cannot read %s to record that this resource's deletion leaves its instance", configName(pc))
	}
	var tenant string
	if c, ok := pc.(*namespacedv1alpha1.ClusterProviderConfig); ok && mg.GetNamespace() != "" {
		if !c.Spec.AllowTenantRelease {
			// A tenant's instance on the platform's backend: left to the
			// platform's orphan sweep, unrecorded.
			return nil
		}
		// Named, so that the sweep honours it only while still allowed.
		tenant = mg.GetNamespace()
	}
	st := pc.ConfigStatus()
	if st.Released != nil && slices.ContainsFunc(st.Released.Instances, func(r spec.ReleasedInstance) bool { return r.UID == uid }) {
		return nil
	}
	orig, ok := pc.DeepCopyObject().(client.Object)
	if !ok {
		return errors.Errorf("cannot copy %T", pc)
	}
	if st.Released == nil {
		st.Released = &spec.ReleasedStatus{}
	}
	// Whole seconds, rounded up: the sweep compares it with creation
	// times, and an instance created in the same second must count as
	// before it.
	at := metav1.NewTime(now.Truncate(time.Second).Add(time.Second))
	if len(st.Released.Instances) < spec.MaxReleased {
		st.Released.Instances = append(st.Released.Instances, spec.ReleasedInstance{UID: uid, ReleasedAt: at, Namespace: tenant})
	} else {
		st.Released.UnrecordedTime = &at
	}
	err := kube.Status().Patch(ctx, pc, client.MergeFromWithOptions(orig, client.MergeFromWithOptimisticLock{}))
	if kerrors.IsInvalid(err) {
		// The record refused (a schema it does not fit): say that a
		// release went unrecorded, which needs no list.
		err = unrecorded(ctx, kube, pc, at)
	}
	if kerrors.IsNotFound(err) {
		return nil
	}
	return errors.Wrapf(err, "cannot record in %s that this resource's deletion leaves its instance (status.released), which keeps the orphan sweep from deleting it", configName(pc))
}

// unrecorded sets status.released.unrecordedTime to at (now), with no
// lock: every writer sets the time it writes at, and the sweep clears it
// with one.
func unrecorded(ctx context.Context, kube client.Client, pc client.Object, at metav1.Time) error {
	b, err := at.MarshalJSON()
	if err != nil {
		return err
	}
	patch := []byte(`{"status":{"released":{"unrecordedTime":` + string(b) + `}}}`)
	return kube.Status().Patch(ctx, pc, client.RawPatch(types.MergePatchType, patch))
}

// configName names pc as Config.Name does.
func configName(pc client.Object) string {
	switch pc.(type) {
	case *namespacedv1alpha1.ClusterProviderConfig:
		return "ClusterProviderConfig " + pc.GetName()
	case *namespacedv1alpha1.ProviderConfig:
		return "ProviderConfig " + pc.GetNamespace() + "/" + pc.GetName()
	}
	return "ProviderConfig " + pc.GetName()
}
