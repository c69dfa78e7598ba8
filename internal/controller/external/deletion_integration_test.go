package external_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
	corev1 "k8s.io/api/core/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	nsproxy "github.com/egressproxy/provider-egressproxy/apis/namespaced/proxy/v1alpha1"
	nsv1alpha1 "github.com/egressproxy/provider-egressproxy/apis/namespaced/v1alpha1"
	spec "github.com/egressproxy/provider-egressproxy/apis/spec/v1alpha1"
	"github.com/egressproxy/provider-egressproxy/internal/controller/config"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
	"github.com/egressproxy/provider-egressproxy/internal/proxy/proxytest"
)

// TestDeletionIntegration: a resource being deleted needs only its
// external name, mark and recorded ID (and the config's credentials): not
// its password Secret, not the catalogue keys, host, image or machine type
// it was placed with. Each case makes a Ready proxy, takes away one input,
// deletes the proxy and expects it, and its instance, gone.
func TestDeletionIntegration(t *testing.T) {
	e := start(t)
	ctx := context.Background()

	ready := func(t *testing.T, p *nsproxy.KVMProxy) {
		t.Helper()
		if err := e.Kube.Create(ctx, p); err != nil {
			t.Fatal(err)
		}
		e.WaitFor(t, p.Name+" to get its external name", func() (bool, string) {
			_ = e.Kube.Get(ctx, client.ObjectKeyFromObject(p), p)
			return p.GetAnnotations()["crossplane.io/external-name"] != "", ""
		})
		e.settle(t, p.GetAnnotations()["crossplane.io/external-name"])
		e.WaitForCondition(t, p, xpv2.TypeReady, corev1.ConditionTrue, "")
	}
	gone := func(t *testing.T, p *nsproxy.KVMProxy) {
		t.Helper()
		name := p.GetAnnotations()["crossplane.io/external-name"]
		_ = e.Kube.Get(ctx, client.ObjectKeyFromObject(p), p)
		uid := string(p.GetUID())
		e.Delete(t, p)
		// The driver's Delete ran: the instance is gone.
		if slices.ContainsFunc(e.mem.Instances(), func(i proxy.Instance) bool { return i.Name == name }) {
			t.Errorf("instance %s is still on the backend after its resource was deleted", name)
		}
		// No garbage collector runs in this control plane: the provider
		// deleted the connection Secret and the usage before the resource
		// went.
		for _, o := range []client.Object{
			&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: p.Name + "-conn"}},
			&nsv1alpha1.ProviderConfigUsage{ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: uid}},
		} {
			if err := e.Kube.Get(ctx, client.ObjectKeyFromObject(o), o); !kerrors.IsNotFound(err) {
				t.Errorf("%T %s is still there after its resource was deleted (%v)", o, o.GetName(), err)
			}
		}
	}
	updateConfig := func(t *testing.T, mutate func(*spec.KVMConfig)) {
		t.Helper()
		pc := &nsv1alpha1.ClusterProviderConfig{}
		if err := e.Kube.Get(ctx, types.NamespacedName{Name: "home-kvm"}, pc); err != nil {
			t.Fatal(err)
		}
		mutate(pc.Spec.KVM)
		if err := e.Kube.Update(ctx, pc); err != nil {
			t.Fatal(err)
		}
	}

	t.Run("PasswordSecretDeletedFirst", func(t *testing.T) {
		if err := e.Kube.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "pw-first", Namespace: "team-b"},
			StringData: map[string]string{"password": "gone-before-the-proxy-0123"}}); err != nil {
			t.Fatal(err)
		}
		p := nsProxy("team-b", "pw-first", func(p *nsproxy.KVMProxy) {
			p.Spec.ForProvider.Proxy.Auth.PasswordSecretRef = &spec.SecretKeySelector{Name: "pw-first", Key: "password"}
		})
		ready(t, p)
		if err := e.Kube.Delete(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "pw-first", Namespace: "team-b"}}); err != nil {
			t.Fatal(err)
		}
		gone(t, p)
	})

	t.Run("CatalogueKeysRemovedFromTheConfig", func(t *testing.T) {
		p := nsProxy("team-b", "keys-removed", func(p *nsproxy.KVMProxy) {
			p.Spec.ForProvider.Host = "nuc"
			p.Spec.ForProvider.MachineType = "small"
			p.Spec.ForProvider.Image = "debian-12"
		})
		ready(t, p)
		updateConfig(t, func(k *spec.KVMConfig) {
			k.Hosts = slices.DeleteFunc(k.Hosts, func(h spec.KVMHost) bool { return h.Name == "nuc" })
			k.Images = map[string]spec.KVMImage{"debian-13": {URL: "https://example.com/d13.qcow2"}}
			k.MachineTypes = map[string]spec.KVMMachineType{"large": {VCPUs: 4, MemoryMiB: 4096}}
		})
		gone(t, p)
	})

	t.Run("WholeNamespaceDeleted", func(t *testing.T) {
		ns := "team-teardown"
		if err := e.Kube.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
			t.Fatal(err)
		}
		if err := e.Kube.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "pw", Namespace: ns},
			StringData: map[string]string{"password": "torn-down-with-its-namespace"}}); err != nil {
			t.Fatal(err)
		}
		p := nsProxy(ns, "teardown", func(p *nsproxy.KVMProxy) {
			p.Spec.ForProvider.Proxy.Auth.PasswordSecretRef = &spec.SecretKeySelector{Name: "pw", Key: "password"}
		})
		ready(t, p)
		name := p.GetAnnotations()["crossplane.io/external-name"]
		// No namespace controller runs here: delete what it would, Secrets
		// first (they have no finalizers), then the proxy.
		if err := e.Kube.Delete(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "pw", Namespace: ns}}); err != nil {
			t.Fatal(err)
		}
		if err := e.Kube.Delete(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "teardown-conn", Namespace: ns}}); err != nil && !kerrors.IsNotFound(err) {
			t.Fatal(err)
		}
		gone(t, p)
		if slices.ContainsFunc(e.mem.Instances(), func(i proxy.Instance) bool { return i.Name == name }) {
			t.Errorf("the namespace's proxy left its instance %s behind", name)
		}
	})

	t.Run("ConfigInUseStaysAndOneGoneForGoodSaysSo", func(t *testing.T) {
		// A namespaced config that a proxy names stays when deleted (its
		// finalizer); taken away for good all the same (its finalizers
		// removed by hand), the proxy being deleted says that its instance
		// stays, and how to let go, instead of waiting silently.
		pc := &nsv1alpha1.ProviderConfig{ObjectMeta: metav1.ObjectMeta{Name: "going-kvm", Namespace: "team-b"}}
		home := &nsv1alpha1.ClusterProviderConfig{}
		if err := e.Kube.Get(ctx, types.NamespacedName{Name: "home-kvm"}, home); err != nil {
			t.Fatal(err)
		}
		pc.Spec.KVM = home.Spec.KVM.DeepCopy()
		pc.Spec.KVM.Credentials.SSHKeySecretRef.Namespace = ""
		key := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: pc.Spec.KVM.Credentials.SSHKeySecretRef.Name, Namespace: "team-b"},
			StringData: map[string]string{pc.Spec.KVM.Credentials.SSHKeySecretRef.Key: "not read by the in-memory backend"}}
		e.Create(t, key, pc)
		p := nsProxy("team-b", "config-gone", func(p *nsproxy.KVMProxy) {
			p.Spec.ProviderConfigReference = &xpv2.ProviderConfigReference{Kind: "ProviderConfig", Name: "going-kvm"}
		})
		ready(t, p)
		name := p.GetAnnotations()["crossplane.io/external-name"]
		defer e.mem.Remove(proxytest.MemoryIDPrefix + name)
		if err := e.Kube.Delete(ctx, pc); err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * time.Second)
		if err := e.Kube.Get(ctx, client.ObjectKeyFromObject(pc), pc); err != nil || !slices.Contains(pc.Finalizers, config.InUseFinalizer) {
			t.Fatalf("the config a proxy names, deleted: %v, finalizers %v; want it kept by %s", err, pc.Finalizers, config.InUseFinalizer)
		}
		e.Update(t, pc, func() { pc.Finalizers = nil })
		e.WaitFor(t, "the config to be gone and its Secret let go of", func() (bool, string) {
			if err := e.Kube.Get(ctx, client.ObjectKeyFromObject(key), key); err != nil {
				return false, err.Error()
			}
			return kerrors.IsNotFound(e.Kube.Get(ctx, client.ObjectKeyFromObject(pc), &nsv1alpha1.ProviderConfig{})) && len(key.Finalizers) == 0,
				fmt.Sprintf("Secret finalizers %v", key.Finalizers)
		})
		if err := e.Kube.Delete(ctx, p); err != nil {
			t.Fatal(err)
		}
		e.WaitForCondition(t, p, xpv2.TypeSynced, corev1.ConditionFalse,
			`cannot delete the instance of config-gone, which stays until it can: restore its config and the Secrets the config reads (or, to leave the instance on the backend, set this resource's spec.managementPolicies to ["Observe", "Create", "Update", "LateInitialize"]: its deletion then lets the instance go without deleting it, to the config's orphan sweep where a ClusterProviderConfig does not allowTenantRelease): ProviderConfig "going-kvm" in namespace "team-b" does not exist`)
		if !slices.ContainsFunc(e.mem.Instances(), func(i proxy.Instance) bool { return i.Name == name }) {
			t.Fatalf("instance %s is gone without its config", name)
		}
		// The way out the condition names: the deletion releases the
		// instance, which stays.
		e.Update(t, p, func() {
			p.Spec.ManagementPolicies = xpv2.ManagementPolicies{xpv2.ManagementActionObserve, xpv2.ManagementActionCreate, xpv2.ManagementActionUpdate, xpv2.ManagementActionLateInitialize}
		})
		e.WaitGone(t, p)
		if !slices.ContainsFunc(e.mem.Instances(), func(i proxy.Instance) bool { return i.Name == name }) {
			t.Errorf("instance %s is gone; the management policies without Delete should have left it", name)
		}
	})

	t.Run("TenantReleaseOnPlatformConfig", func(t *testing.T) {
		// A tenant's proxy on the platform's config, deleted with
		// management policies without Delete: its instance stays, and is
		// recorded as released only where the config allows it; otherwise
		// it is the platform's orphan sweep's to report or delete.
		released := func() []string {
			pc := &nsv1alpha1.ClusterProviderConfig{}
			if err := e.Kube.Get(ctx, types.NamespacedName{Name: "home-kvm"}, pc); err != nil {
				t.Fatal(err)
			}
			var uids []string
			if r := pc.Status.Released; r != nil {
				for _, i := range r.Instances {
					uids = append(uids, i.UID)
				}
			}
			return uids
		}
		setAllow := func(allow bool) {
			pc := &nsv1alpha1.ClusterProviderConfig{}
			if err := e.Kube.Get(ctx, types.NamespacedName{Name: "home-kvm"}, pc); err != nil {
				t.Fatal(err)
			}
			pc.Spec.AllowTenantRelease = allow
			if err := e.Kube.Update(ctx, pc); err != nil {
				t.Fatal(err)
			}
		}
		defer setAllow(false)
		for _, allow := range []bool{false, true} {
			setAllow(allow)
			p := nsProxy("team-b", fmt.Sprintf("released-%v", allow))
			ready(t, p)
			name := p.GetAnnotations()["crossplane.io/external-name"]
			defer e.mem.Remove(proxytest.MemoryIDPrefix + name)
			uid := string(p.GetUID())
			e.Update(t, p, func() {
				p.Spec.ManagementPolicies = xpv2.ManagementPolicies{xpv2.ManagementActionObserve, xpv2.ManagementActionCreate, xpv2.ManagementActionUpdate, xpv2.ManagementActionLateInitialize}
			})
			e.Delete(t, p)
			if !slices.ContainsFunc(e.mem.Instances(), func(i proxy.Instance) bool { return i.Name == name }) {
				t.Errorf("allowTenantRelease %v: instance %s is gone; the policies without Delete leave it", allow, name)
			}
			if got := slices.Contains(released(), uid); got != allow {
				t.Errorf("allowTenantRelease %v: the release recorded in status.released: %v", allow, got)
			}
		}
	})

	t.Run("CreateCutShortLeavesNothing", func(t *testing.T) {
		// Every Create is refused for quota, after leaving pieces of the
		// instance (as a KVM overlay, a GCP rule or address): the
		// condition says when it is retried, and deleting the resource
		// removes the pieces before it lets go.
		for range 100 {
			e.mem.FailNext(proxytest.OpCreate, proxy.Quotaf("storage pool default on host beelink has 512 MiB available; this proxy needs 10256 MiB"))
		}
		defer e.mem.ClearFailNext(proxytest.OpCreate)
		p := nsProxy("team-b", "cut-short")
		if err := e.Kube.Create(ctx, p); err != nil {
			t.Fatal(err)
		}
		e.WaitForCondition(t, p, xpv2.TypeSynced, corev1.ConditionFalse, "out of quota or capacity on the backend; will retry in 5m0s")
		name := p.GetAnnotations()["crossplane.io/external-name"]
		if err := e.mem.PartialCreate(name, string(p.GetUID())); err != nil {
			t.Fatal(err)
		}
		gone(t, p)
		if left := e.mem.Leftovers(name); len(left) > 0 {
			t.Errorf("the deleted resource left %v on the backend", left)
		}
	})

	t.Run("InstanceThatCannotBeReadIsHandedToDelete", func(t *testing.T) {
		// As the kvm driver answers for a host the config no longer has:
		// Permanent on Get; its Delete lets go.
		p := nsProxy("team-b", "unreadable")
		ready(t, p)
		// Every read fails from now on (this subtest runs last).
		for range 1000 {
			e.mem.FailNext(proxytest.OpGet, proxy.Permanentf("host %q is no longer in the config's kvm.hosts", "beelink"))
		}
		gone(t, p)
	})
}
