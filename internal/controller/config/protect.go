package config

import (
	"context"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"reflect"
	"slices"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/crossplane/crossplane-runtime/v2/pkg/meta"
	"github.com/crossplane/crossplane-runtime/v2/pkg/resource"
	corev1 "k8s.io/api/core/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	nsv1alpha1 "github.com/egressproxy/provider-egressproxy/apis/namespaced/v1alpha1"
	spec "github.com/egressproxy/provider-egressproxy/apis/spec/v1alpha1"
)

// A tenant can always leave: deleting a namespace must delete every
// external instance of its proxies, and the namespace controller deletes
// the namespace's objects in any order, Secrets and ProviderConfigUsages
// (which have no finalizers) at once. crossplane-runtime's in-use
// finalizer on a ProviderConfig counts usages, so it goes with them, and
// the config and its credentials would be gone before the proxies' Delete
// could use them. A namespaced ProviderConfig that any managed resource
// names therefore carries InUseFinalizer, and every Secret it reads
// carries SecretFinalizer(config): both are counted from the managed
// resources themselves (which keep their own finalizer until their
// instance is deleted), and removed once the last of them is gone.

// InUseFinalizer is on a namespaced ProviderConfig while managed resources
// name it: it keeps the config for their Delete.
const InUseFinalizer = "m.egressproxy.io/in-use-by-proxies"

// usedByConfigDomain prefixes the finalizer a config's Secrets carry.
const usedByConfigDomain = "providerconfig.m.egressproxy.io/"

// deletingRecheck is how soon a config being deleted is looked at again
// while resources still name it: no event follows a resource's going (its
// usage goes just before it, or, in a namespace being deleted, long
// before), and the namespace waits on the config.
const deletingRecheck = 2 * time.Second

// resourceDeletingRecheck is that wait for a config that is not being
// deleted, one of whose resources is: only its Secrets' release waits.
const resourceDeletingRecheck = 10 * time.Second

// missingRecheck is how soon a config in use is looked at again while a
// Secret it names cannot be protected (it does not exist yet, or is being
// deleted): Secrets are not watched, and one created later must carry its
// finalizer before a namespace's deletion can take it.
const missingRecheck = 5 * time.Second

// SecretFinalizer is the finalizer the Secrets that the namespaced
// ProviderConfig name reads carry while the config is in use: the config's
// name (a finalizer's name part is at most 63 characters: a longer one is
// cut and ends with a digest of the whole).
func SecretFinalizer(config string) string {
	if len(config) <= 63 {
		return usedByConfigDomain + config
	}
	h := fnv.New32a()
	_, _ = h.Write([]byte(config))
	return fmt.Sprintf("%s%s-%08x", usedByConfigDomain, config[:54], h.Sum32())
}

// SecretNames are the names of the Secrets a config's spec names (every
// Secret key selector in it, in any block), sorted, each once. A namespaced
// config reads them in its own namespace.
func SecretNames(s *spec.ProviderConfigSpec) []string {
	var out []string
	var walk func(v reflect.Value)
	walk = func(v reflect.Value) {
		switch v.Kind() {
		case reflect.Pointer, reflect.Interface:
			if !v.IsNil() {
				walk(v.Elem())
			}
		case reflect.Struct:
			if sel, ok := v.Interface().(spec.SecretKeySelector); ok {
				if sel.Name != "" {
					out = append(out, sel.Name)
				}
				return
			}
			for i := range v.NumField() {
				if v.Type().Field(i).IsExported() {
					walk(v.Field(i))
				}
			}
		case reflect.Slice, reflect.Array:
			for i := range v.Len() {
				walk(v.Index(i))
			}
		case reflect.Map:
			for _, k := range v.MapKeys() {
				walk(v.MapIndex(k))
			}
		default:
		}
	}
	walk(reflect.ValueOf(s))
	slices.Sort(out)
	return slices.Compact(out)
}

// Protector keeps what the Delete of a namespaced ProviderConfig's managed
// resources needs (the config and the Secrets it reads) until the last of
// them is gone. It is the reconciler of namespaced ProviderConfigs, and
// Ensure is also called by a resource's Connect, so no instance is created
// before what deletes it is protected.
type Protector struct {
	// Kube reads configs and managed resources (from the manager's cache)
	// and writes finalizers.
	Kube client.Client
	// Secrets reads Secrets from the API server (they are not cached).
	Secrets client.Reader
	// Kinds are the namespaced managed resource kinds that can name a
	// ProviderConfig.
	Kinds []schema.GroupVersionKind
}

// Reconcile protects or releases the namespaced ProviderConfig req names.
func (p *Protector) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	pc := &nsv1alpha1.ProviderConfig{}
	if err := p.Kube.Get(ctx, req.NamespacedName, pc); kerrors.IsNotFound(err) {
		// Gone (its finalizer removed by hand): let go of its Secrets.
		return reconcile.Result{}, p.release(ctx, req.Namespace, req.Name, nil)
	} else if err != nil {
		return reconcile.Result{}, errors.Wrap(err, "cannot get the ProviderConfig")
	}
	users, deleting, err := p.users(ctx, pc)
	if err != nil {
		return reconcile.Result{}, err
	}
	if users == 0 {
		if err := p.release(ctx, pc.Namespace, pc.Name, nil); err != nil {
			return reconcile.Result{}, err
		}
		return reconcile.Result{}, p.removeFinalizer(ctx, pc)
	}
	if meta.WasDeleted(pc) {
		// Nothing takes a new finalizer any more: only watch for the last
		// resource to go.
		return reconcile.Result{RequeueAfter: deletingRecheck}, nil
	}
	left, err := p.ensure(ctx, pc)
	if err != nil {
		return reconcile.Result{}, err
	}
	// A Secret the config no longer names is let go of at once.
	if err := p.release(ctx, pc.Namespace, pc.Name, SecretNames(&pc.Spec.ProviderConfigSpec)); err != nil {
		return reconcile.Result{}, err
	}
	if len(left) > 0 {
		return reconcile.Result{RequeueAfter: missingRecheck}, nil
	}
	if deleting {
		return reconcile.Result{RequeueAfter: resourceDeletingRecheck}, nil
	}
	return reconcile.Result{}, nil
}

// users counts the managed resources that name pc, and whether any of
// them is being deleted. A kind whose CRD is not installed (not active
// under safe start) has none.
func (p *Protector) users(ctx context.Context, pc *nsv1alpha1.ProviderConfig) (n int, deleting bool, err error) {
	for _, gvk := range p.Kinds {
		o, err := p.Kube.Scheme().New(gvk.GroupVersion().WithKind(gvk.Kind + "List"))
		if err != nil {
			return 0, false, errors.Wrapf(err, "cannot list %s", gvk.GroupKind())
		}
		l, ok := o.(client.ObjectList)
		if !ok {
			return 0, false, errors.Errorf("cannot list %s: %T is not a list", gvk.GroupKind(), o)
		}
		if err := p.Kube.List(ctx, l, client.InNamespace(pc.Namespace), client.UnsafeDisableDeepCopy); apimeta.IsNoMatchError(err) {
			continue
		} else if err != nil {
			return 0, false, errors.Wrapf(err, "cannot list %s", gvk.GroupKind())
		}
		_ = apimeta.EachListItem(l, func(o runtime.Object) error {
			mg, ok := o.(resource.ModernManaged)
			if !ok {
				return nil
			}
			if r := mg.GetProviderConfigReference(); r != nil && r.Kind == nsv1alpha1.ProviderConfigKind && r.Name == pc.Name {
				n++
				deleting = deleting || meta.WasDeleted(mg)
			}
			return nil
		})
	}
	return n, deleting, nil
}

// Ensure puts the finalizers on the Secrets pc names and then on pc. A
// Secret that does not exist or is being deleted cannot take one and is
// left out (Connect reads no Secret without it); pc is protected all the
// same, since an instance may exist without every Secret it names (one the
// backend does not read). Ensure fails when pc itself cannot be protected.
func (p *Protector) Ensure(ctx context.Context, pc *nsv1alpha1.ProviderConfig) error {
	_, err := p.ensure(ctx, pc)
	return err
}

// ensure is Ensure, and returns the names of the Secrets it left out.
func (p *Protector) ensure(ctx context.Context, pc *nsv1alpha1.ProviderConfig) (left []string, err error) {
	f := SecretFinalizer(pc.Name)
	for _, name := range SecretNames(&pc.Spec.ProviderConfigSpec) {
		s := &corev1.Secret{}
		err := p.Secrets.Get(ctx, types.NamespacedName{Namespace: pc.Namespace, Name: name}, s)
		if kerrors.IsNotFound(err) {
			left = append(left, name)
			continue
		}
		if err != nil {
			return nil, errors.Wrapf(err, "cannot get Secret %s/%s to protect it", pc.Namespace, name)
		}
		if err := p.addFinalizer(ctx, s, f); err != nil {
			return nil, errors.Wrapf(err, "cannot protect Secret %s/%s while ProviderConfig %s is in use", pc.Namespace, name, pc.Name)
		}
		if !meta.FinalizerExists(s, f) {
			left = append(left, name)
		}
	}
	if err := p.addFinalizer(ctx, pc, InUseFinalizer); err != nil {
		return nil, errors.Wrapf(err, "cannot protect ProviderConfig %s/%s while it is in use", pc.Namespace, pc.Name)
	}
	if !Protected(pc) {
		return nil, errors.Errorf("cannot protect ProviderConfig %s/%s for the Delete of the resources that name it: it is being deleted", pc.Namespace, pc.Name)
	}
	return left, nil
}

// Protected reports whether pc carries InUseFinalizer. A Secret it names
// may still lack its own (one created or named since), which is why
// Connect checks each Secret it reads.
func Protected(pc *nsv1alpha1.ProviderConfig) bool {
	return meta.FinalizerExists(pc, InUseFinalizer)
}

// release removes config's finalizer from every Secret of namespace ns
// that carries it, except those named in keep.
func (p *Protector) release(ctx context.Context, ns, config string, keep []string) error {
	l := &metav1.PartialObjectMetadataList{}
	l.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("SecretList"))
	if err := p.Secrets.List(ctx, l, client.InNamespace(ns)); err != nil {
		return errors.Wrapf(err, "cannot list the Secrets of namespace %s", ns)
	}
	f := SecretFinalizer(config)
	for i := range l.Items {
		s := &l.Items[i]
		if !meta.FinalizerExists(s, f) || slices.Contains(keep, s.Name) {
			continue
		}
		s.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("Secret"))
		if err := p.patchFinalizers(ctx, s, slices.DeleteFunc(slices.Clone(s.GetFinalizers()), func(x string) bool { return x == f })); err != nil {
			return errors.Wrapf(err, "cannot release Secret %s/%s", ns, s.Name)
		}
	}
	return nil
}

func (p *Protector) removeFinalizer(ctx context.Context, pc *nsv1alpha1.ProviderConfig) error {
	if !meta.FinalizerExists(pc, InUseFinalizer) {
		return nil
	}
	fs := slices.DeleteFunc(slices.Clone(pc.GetFinalizers()), func(x string) bool { return x == InUseFinalizer })
	return errors.Wrapf(p.patchFinalizers(ctx, pc, fs), "cannot release ProviderConfig %s/%s", pc.Namespace, pc.Name)
}

func (p *Protector) addFinalizer(ctx context.Context, o client.Object, f string) error {
	if meta.FinalizerExists(o, f) || meta.WasDeleted(o) {
		return nil
	}
	return p.patchFinalizers(ctx, o, append(slices.Clone(o.GetFinalizers()), f))
}

// patchFinalizers sets o's finalizers to fs, if o's resourceVersion is
// still the one read (another writer's finalizers are never lost).
func (p *Protector) patchFinalizers(ctx context.Context, o client.Object, fs []string) error {
	patch := map[string]any{"metadata": map[string]any{"finalizers": fs, "resourceVersion": o.GetResourceVersion()}}
	raw, err := json.Marshal(patch)
	if err != nil {
		return err
	}
	err = p.Kube.Patch(ctx, o, client.RawPatch(types.MergePatchType, raw))
	if kerrors.IsNotFound(err) {
		return nil
	}
	return err
}
