package config

import (
	"context"
	"testing"

	"github.com/crossplane/crossplane-runtime/v2/pkg/meta"
	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	nsproxy "github.com/egressproxy/provider-egressproxy/apis/namespaced/proxy/v1alpha1"
	nsv1alpha1 "github.com/egressproxy/provider-egressproxy/apis/namespaced/v1alpha1"
	spec "github.com/egressproxy/provider-egressproxy/apis/spec/v1alpha1"
	"github.com/egressproxy/provider-egressproxy/internal/devenv/testenv"
)

// kvmConfig is ProviderConfig team-a/home with a kvm block that reads the
// SSH key from Secret key and ignores host keys, yet names Secret
// knownHosts (which the backend then never reads).
func kvmConfig(key, knownHosts string, finalizers ...string) *nsv1alpha1.ProviderConfig {
	pc := &nsv1alpha1.ProviderConfig{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "home", Finalizers: finalizers}}
	pc.Spec.KVM = &spec.KVMConfig{Credentials: spec.KVMCredentials{
		SSHKeySecretRef:       spec.SecretKeySelector{Name: key, Key: "id"},
		KnownHostsSecretRef:   &spec.SecretKeySelector{Name: knownHosts, Key: "known_hosts"},
		InsecureIgnoreHostKey: true,
	}}
	return pc
}

func teamSecret(name string, finalizers ...string) *corev1.Secret {
	return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: name, Finalizers: finalizers}}
}

// newProtector is a Protector on a fake API server holding objs and a
// KVMProxy of team-a that names ProviderConfig home.
func newProtector(t *testing.T, objs ...client.Object) (*Protector, client.Client) {
	t.Helper()
	s := testenv.Scheme(t)
	px := &nsproxy.KVMProxy{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "web"}}
	px.SetProviderConfigReference(&xpv2.ProviderConfigReference{Kind: nsv1alpha1.ProviderConfigKind, Name: "home"})
	kube := fake.NewClientBuilder().WithScheme(s).WithObjects(append(objs, px)...).Build()
	return &Protector{Kube: kube, Secrets: kube, Kinds: []schema.GroupVersionKind{nsproxy.KVMProxyGroupVersionKind}}, kube
}

// finalizersOf reads team-a/name into o and returns its finalizers.
func finalizersOf(t *testing.T, kube client.Client, o client.Object, name string) []string {
	t.Helper()
	if err := kube.Get(context.Background(), client.ObjectKey{Namespace: "team-a", Name: name}, o); err != nil {
		t.Fatal(err)
	}
	return o.GetFinalizers()
}

func reconcileHome(t *testing.T, p *Protector) reconcile.Result {
	t.Helper()
	res, err := p.Reconcile(context.Background(), reconcile.Request{NamespacedName: client.ObjectKey{Namespace: "team-a", Name: "home"}})
	if err != nil {
		t.Fatalf("Reconcile: %v", err)
	}
	return res
}

// TestConfigInUseIsProtectedWhileASecretItNamesIsMissing: a config whose
// proxies can be created without one of the Secrets it names (a
// known_hosts Secret never created, host keys ignored) is protected, as
// is the Secret that exists, so that deleting the namespace leaves the
// proxies' Delete what it reads; the config is looked at again soon.
func TestConfigInUseIsProtectedWhileASecretItNamesIsMissing(t *testing.T) {
	p, kube := newProtector(t, kvmConfig("ssh", "known-hosts"), teamSecret("ssh"))

	if diff := cmp.Diff(reconcile.Result{RequeueAfter: missingRecheck}, reconcileHome(t, p)); diff != "" {
		t.Errorf("Reconcile: -want, +got:\n%s", diff)
	}
	if diff := cmp.Diff([]string{InUseFinalizer}, finalizersOf(t, kube, &nsv1alpha1.ProviderConfig{}, "home")); diff != "" {
		t.Errorf("ProviderConfig finalizers: -want, +got:\n%s", diff)
	}
	if diff := cmp.Diff([]string{SecretFinalizer("home")}, finalizersOf(t, kube, &corev1.Secret{}, "ssh")); diff != "" {
		t.Errorf("Secret ssh finalizers: -want, +got:\n%s", diff)
	}
}

// TestSecretCreatedAfterTheConfigNamesItIsProtected: a protected config
// rotated to a Secret that does not exist yet lets go of the old one and
// protects the new one soon after it is created (Secrets are not watched).
func TestSecretCreatedAfterTheConfigNamesItIsProtected(t *testing.T) {
	p, kube := newProtector(t, kvmConfig("ssh-2", "ssh-2", InUseFinalizer), teamSecret("ssh", SecretFinalizer("home")))

	if diff := cmp.Diff(reconcile.Result{RequeueAfter: missingRecheck}, reconcileHome(t, p)); diff != "" {
		t.Errorf("Reconcile before ssh-2 exists: -want, +got:\n%s", diff)
	}
	if got := finalizersOf(t, kube, &corev1.Secret{}, "ssh"); len(got) != 0 {
		t.Errorf("Secret ssh, no longer named, keeps finalizers %v", got)
	}
	if err := kube.Create(context.Background(), teamSecret("ssh-2")); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(reconcile.Result{}, reconcileHome(t, p)); diff != "" {
		t.Errorf("Reconcile after ssh-2 exists: -want, +got:\n%s", diff)
	}
	if diff := cmp.Diff([]string{SecretFinalizer("home")}, finalizersOf(t, kube, &corev1.Secret{}, "ssh-2")); diff != "" {
		t.Errorf("Secret ssh-2 finalizers: -want, +got:\n%s", diff)
	}
}

// TestEnsureRefusesAConfigBeingDeleted: a config being deleted cannot
// take its finalizer, and Ensure says so rather than let an instance be
// created that nothing would keep the config for.
func TestEnsureRefusesAConfigBeingDeleted(t *testing.T) {
	pc := kvmConfig("ssh", "ssh", "other.example.com/keep")
	now := metav1.Now()
	pc.SetDeletionTimestamp(&now)
	p, kube := newProtector(t, pc, teamSecret("ssh"))
	if err := kube.Get(context.Background(), client.ObjectKeyFromObject(pc), pc); err != nil {
		t.Fatal(err)
	}

	err := p.Ensure(context.Background(), pc)
	want := "cannot protect ProviderConfig team-a/home for the Delete of the resources that name it: it is being deleted"
	if err == nil || err.Error() != want {
		t.Errorf("Ensure: got error %v; want %q", err, want)
	}
	if meta.FinalizerExists(pc, InUseFinalizer) {
		t.Errorf("a config being deleted took %s", InUseFinalizer)
	}
}
