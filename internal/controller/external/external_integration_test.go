package external_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/crossplane/crossplane-runtime/v2/pkg/meta"
	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterproxy "github.com/egressproxy/provider-egressproxy/apis/cluster/proxy/v1alpha1"
	clusterv1alpha1 "github.com/egressproxy/provider-egressproxy/apis/cluster/v1alpha1"
	nsproxy "github.com/egressproxy/provider-egressproxy/apis/namespaced/proxy/v1alpha1"
	nsv1alpha1 "github.com/egressproxy/provider-egressproxy/apis/namespaced/v1alpha1"
	spec "github.com/egressproxy/provider-egressproxy/apis/spec/v1alpha1"
	"github.com/egressproxy/provider-egressproxy/internal/controller/external"
	"github.com/egressproxy/provider-egressproxy/internal/controller/health"
	"github.com/egressproxy/provider-egressproxy/internal/controller/kvm"
	"github.com/egressproxy/provider-egressproxy/internal/devenv/testenv/providerenv"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
	"github.com/egressproxy/provider-egressproxy/internal/proxy/proxytest"
	"github.com/egressproxy/provider-egressproxy/internal/telemetry"
)

const testInstallation = "test-install"

// env is a real control plane with the KVMProxy controllers of both scopes
// running in-process against an in-memory backend.
type env struct {
	*providerenv.Env
	mem *proxytest.Memory
}

func start(t *testing.T) *env {
	t.Helper()
	mem := proxytest.NewMemory("memory", testInstallation)
	kvmBlock := func() *spec.KVMConfig {
		return &spec.KVMConfig{
			Credentials: spec.KVMCredentials{
				SSHKeySecretRef: spec.SecretKeySelector{Namespace: "crossplane-system", Name: "ssh", Key: "key"}, InsecureIgnoreHostKey: true,
			},
			Images:       map[string]spec.KVMImage{"debian-12": {URL: "https://example.com/d.qcow2"}},
			MachineTypes: map[string]spec.KVMMachineType{"small": {VCPUs: 1, MemoryMiB: 512}},
			Hosts:        []spec.KVMHost{{Name: "beelink", Address: "10.0.0.5:22", User: "proxy", Bridge: "br0"}, {Name: "nuc", Address: "10.0.0.6:22", User: "proxy", Bridge: "br0"}},
		}
	}
	e := providerenv.Start(t, providerenv.Options{
		// The KVMProxy binding with its backend swapped for the in-memory
		// one: everything else (config resolution, catalogue checks, names,
		// marks, conditions, secrets) is the production code.
		Bindings: func(mgr ctrl.Manager, _ external.Options) []external.Binding {
			kind := kvm.New(mgr, kvm.Options{})
			kind.Backend.Connect = func(context.Context, *external.Config) (proxy.Driver, error) { return mem, nil }
			return []external.Binding{kind}
		},
		InstallationID: testInstallation,
		Namespaces:     []string{"team-a", "team-b"},
		Objects: []client.Object{
			&nsv1alpha1.ClusterProviderConfig{ObjectMeta: metav1.ObjectMeta{Name: "home-kvm"},
				Spec: nsv1alpha1.ClusterProviderConfigSpec{ProviderConfigSpec: spec.ProviderConfigSpec{KVM: kvmBlock()}}},
			&nsv1alpha1.ClusterProviderConfig{ObjectMeta: metav1.ObjectMeta{Name: "home-kvm-tenant-cloudinit"},
				Spec: nsv1alpha1.ClusterProviderConfigSpec{ProviderConfigSpec: spec.ProviderConfigSpec{KVM: func() *spec.KVMConfig {
					k := kvmBlock()
					k.AllowTenantCloudInit = true
					return k
				}()}}},
			&nsv1alpha1.ClusterProviderConfig{ObjectMeta: metav1.ObjectMeta{Name: "home-kvm-tenant-imports"},
				Spec: nsv1alpha1.ClusterProviderConfigSpec{ProviderConfigSpec: spec.ProviderConfigSpec{AllowTenantImports: true, KVM: kvmBlock()}}},
			&nsv1alpha1.ClusterProviderConfig{ObjectMeta: metav1.ObjectMeta{Name: "pods"},
				Spec: nsv1alpha1.ClusterProviderConfigSpec{ProviderConfigSpec: spec.ProviderConfigSpec{Kubernetes: &spec.KubernetesConfig{
					Credentials: spec.KubernetesCredentials{Source: xpv2.CredentialsSourceInjectedIdentity}}}}},
			&nsv1alpha1.ProviderConfig{ObjectMeta: metav1.ObjectMeta{Name: "team-a-kvm", Namespace: "team-a"},
				Spec: nsv1alpha1.NamespacedProviderConfigSpec{ProviderConfigSpec: spec.ProviderConfigSpec{KVM: func() *spec.KVMConfig {
					k := kvmBlock()
					k.Credentials.SSHKeySecretRef.Namespace = "" // a namespaced config reads its own namespace
					return k
				}()}}},
			&clusterv1alpha1.ProviderConfig{ObjectMeta: metav1.ObjectMeta{Name: "legacy-kvm"},
				Spec: clusterv1alpha1.ProviderConfigSpec{ProviderConfigSpec: spec.ProviderConfigSpec{KVM: kvmBlock()}}},
			&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "pw", Namespace: "team-a"}, StringData: map[string]string{"password": "from-a-secret-0123456789"}},
		},
	})
	return &env{Env: e, mem: mem}
}

func nsProxy(ns, name string, mutate ...func(*nsproxy.KVMProxy)) *nsproxy.KVMProxy {
	p := &nsproxy.KVMProxy{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: nsproxy.KVMProxySpec{
			ManagedResourceSpec: providerenv.ManagedSpec("home-kvm", name+"-conn"),
			ForProvider: spec.KVMProxyParameters{
				Host: "beelink",
				Proxy: spec.ProxySettings{
					AllowedClientCIDRs: []string{"10.0.0.0/8"},
					Auth:               &spec.ProxyAuth{Enabled: true},
				},
			},
		},
	}
	for _, m := range mutate {
		m(p)
	}
	return p
}

// settle plays the backend finishing its work (boot, delete) on the
// instance named name, once it exists.
func (e *env) settle(t *testing.T, name string) {
	t.Helper()
	e.WaitFor(t, "instance "+name+" to exist", func() (bool, string) {
		for _, i := range e.mem.Instances() {
			if i.Name == name {
				return e.mem.Settle(name) == nil, ""
			}
		}
		return false, "absent"
	})
}

func TestExternalIntegrationLifecycle(t *testing.T) {
	e := start(t)
	ctx := context.Background()

	t.Run("NamespacedProxyBecomesReadyAndPublishesItsURL", func(t *testing.T) {
		p := nsProxy("team-a", "payments")
		if err := e.Kube.Create(ctx, p); err != nil {
			t.Fatal(err)
		}
		c := e.WaitForCondition(t, p, xpv2.TypeReady, corev1.ConditionFalse, "provisioning")
		t.Logf("before boot: %s", c.Message)
		name := meta.GetExternalName(p)
		if want := external.InstanceName(p); name != want {
			t.Fatalf("external name %q, want the deterministic %q", name, want)
		}
		e.settle(t, name)
		e.WaitForCondition(t, p, xpv2.TypeReady, corev1.ConditionTrue, "")
		e.WaitForCondition(t, p, xpv2.TypeSynced, corev1.ConditionTrue, "")
		obs := p.Status.AtProvider
		if obs.State != "Running" || obs.IP == "" || obs.ID != proxytest.MemoryIDPrefix+name || obs.Placement == nil || obs.Placement.Host != "beelink" || !obs.ProxyReachable {
			t.Errorf("status.atProvider = %+v", obs)
		}
		d := e.ConnectionSecret(t, "team-a", "payments-conn", "")
		if len(d["password"]) != 32 || d["username"] != "proxy" || d["host"] != obs.IP || d["port"] != "3128" {
			t.Errorf("connection secret: username %q, password of %d chars, host %q, port %q", d["username"], len(d["password"]), d["host"], d["port"])
		}
		if want := fmt.Sprintf("http://proxy:%s@%s:3128", d["password"], obs.IP); d["url"] != want {
			t.Errorf("url = %q, want %q", d["url"], want)
		}
		inst := e.mem.Instances()
		var mark proxy.Mark
		for _, i := range inst {
			if i.Name == name {
				mark = i.Mark
			}
		}
		if mark.UID != string(p.GetUID()) || mark.InstallationID != testInstallation {
			t.Errorf("instance mark = %+v, want the resource's UID and the installation", mark)
		}

		// Every change of Ready is an event: up, down (seen at once here by
		// touching the resource instead of waiting for the poll), up again.
		e.WaitEvent(t, "team-a", "payments", corev1.EventTypeNormal, "Available", "Ready is now True (was False): instance "+name+" is running at "+obs.IP)
		if err := e.mem.SetState(obs.ID, proxy.StateStopped); err != nil {
			t.Fatal(err)
		}
		touch := func(v string) {
			t.Helper()
			if err := e.Kube.Patch(ctx, p, client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"annotations":{"test/touch":"`+v+`"}}}`))); err != nil {
				t.Fatal(err)
			}
		}
		touch("1")
		e.WaitEvent(t, "team-a", "payments", corev1.EventTypeWarning, "Unavailable", "Ready is now False (was True): instance "+name+" is Stopped")
		if err := e.mem.SetState(obs.ID, proxy.StateRunning); err != nil {
			t.Fatal(err)
		}
		touch("2")
		e.WaitForCondition(t, p, xpv2.TypeReady, corev1.ConditionTrue, "")

		// The password is stable across reconciles and restarts: it is
		// derived, not stored.
		p2 := p.DeepCopy()
		meta.SetExternalName(p2, meta.GetExternalName(p))

		t.Run("ChangingTheProxyBlockUpdatesTheInstance", func(t *testing.T) {
			before, _ := e.mem.Spec(name)
			if err := e.Kube.Get(ctx, client.ObjectKeyFromObject(p), p); err != nil {
				t.Fatal(err)
			}
			p.Spec.ForProvider.Proxy.AllowedClientCIDRs = []string{"192.168.0.0/16"}
			if err := e.Kube.Update(ctx, p); err != nil {
				t.Fatal(err)
			}
			e.WaitFor(t, "the instance to get the new CIDRs", func() (bool, string) {
				after, _ := e.mem.Spec(name)
				return strings.Join(after.Proxy.AllowedClientCIDRs, ",") == "192.168.0.0/16", strings.Join(after.Proxy.AllowedClientCIDRs, ",")
			})
			after, _ := e.mem.Spec(name)
			if after.Proxy.Auth.Password != before.Proxy.Auth.Password {
				t.Error("the generated password changed on update")
			}
		})

		t.Run("ConfigUsageIsTracked", func(t *testing.T) {
			e.WaitFor(t, "a ProviderConfigUsage for the proxy", func() (bool, string) {
				l := &nsv1alpha1.ProviderConfigUsageList{}
				if err := e.Kube.List(ctx, l, client.InNamespace("team-a")); err != nil {
					return false, err.Error()
				}
				for _, u := range l.Items {
					if u.ResourceReference.Name == "payments" && u.ProviderConfigReference.Name == "home-kvm" && u.ProviderConfigReference.Kind == "ClusterProviderConfig" {
						return true, ""
					}
				}
				return false, fmt.Sprintf("%d usages", len(l.Items))
			})
			pc := &nsv1alpha1.ClusterProviderConfig{}
			e.WaitFor(t, "the config to count its user", func() (bool, string) {
				_ = e.Kube.Get(ctx, types.NamespacedName{Name: "home-kvm"}, pc)
				return pc.Status.Users >= 1, fmt.Sprint(pc.Status.Users)
			})
		})

		t.Run("DeletingTheResourceDeletesTheInstance", func(t *testing.T) {
			if err := e.Kube.Delete(ctx, p); err != nil {
				t.Fatal(err)
			}
			e.WaitFor(t, "the resource to be gone", func() (bool, string) {
				_ = e.mem.Settle(name) // the backend finishes deleting
				err := e.Kube.Get(ctx, client.ObjectKeyFromObject(p), p)
				return kerrors.IsNotFound(err), fmt.Sprintf("%v finalizers %v conditions %+v calls %v", err, p.GetFinalizers(), p.Status.Conditions, e.mem.Calls()[max(0, len(e.mem.Calls())-5):])
			})
			for _, i := range e.mem.Instances() {
				if i.Name == name {
					t.Errorf("instance %s still exists after its resource was deleted", name)
				}
			}
		})
	})

	t.Run("ClusterScopedProxyWithLegacyConfig", func(t *testing.T) {
		p := &clusterproxy.KVMProxy{
			ObjectMeta: metav1.ObjectMeta{Name: "shared"},
			Spec: clusterproxy.KVMProxySpec{
				ClusterManagedResourceSpec: providerenv.ClusterManagedSpec("legacy-kvm", "shared-conn"),
				ForProvider:                spec.KVMProxyParameters{Host: "nuc", Proxy: spec.ProxySettings{AllowedClientCIDRs: []string{"10.0.0.0/8"}}},
			},
		}
		if err := e.Kube.Create(ctx, p); err != nil {
			t.Fatal(err)
		}
		e.WaitFor(t, "the external name", func() (bool, string) {
			_ = e.Kube.Get(ctx, client.ObjectKeyFromObject(p), p)
			return meta.GetExternalName(p) != "", ""
		})
		e.settle(t, meta.GetExternalName(p))
		e.WaitForCondition(t, p, xpv2.TypeReady, corev1.ConditionTrue, "")
		d := e.ConnectionSecret(t, "crossplane-system", "shared-conn", "")
		if _, ok := d["password"]; ok {
			t.Error("auth is off, yet the connection secret has a password")
		}
		if d["url"] != "http://"+p.Status.AtProvider.IP+":3128" {
			t.Errorf("url = %q", d["url"])
		}
		e.WaitFor(t, "a legacy ProviderConfigUsage", func() (bool, string) {
			l := &clusterv1alpha1.ProviderConfigUsageList{}
			_ = e.Kube.List(ctx, l)
			for _, u := range l.Items {
				if u.ResourceReference.Name == "shared" && u.ProviderConfigReference.Name == "legacy-kvm" {
					return true, ""
				}
			}
			return false, fmt.Sprintf("%d usages", len(l.Items))
		})
	})

	t.Run("PasswordFromASecret", func(t *testing.T) {
		p := nsProxy("team-a", "with-secret", func(p *nsproxy.KVMProxy) {
			p.Spec.ForProvider.Proxy.Auth.PasswordSecretRef = &spec.SecretKeySelector{Name: "pw", Key: "password"}
		})
		if err := e.Kube.Create(ctx, p); err != nil {
			t.Fatal(err)
		}
		e.settle(t, external.InstanceName(p))
		d := e.ConnectionSecret(t, "team-a", "with-secret-conn", "")
		if d["password"] != "from-a-secret-0123456789" {
			t.Errorf("password = %q, want the Secret's", d["password"])
		}
	})

	t.Run("ConditionsSayWhatIsWrong", func(t *testing.T) {
		cases := []struct {
			name string
			p    *nsproxy.KVMProxy
			want string
		}{
			{"WrongBackendBlock", nsProxy("team-a", "wrong-block", func(p *nsproxy.KVMProxy) {
				p.Spec.ProviderConfigReference.Name = "pods"
			}), "ClusterProviderConfig pods holds a kubernetes block, but a KVMProxy needs a config with a kvm block"},
			{"UnknownHost", nsProxy("team-a", "unknown-host", func(p *nsproxy.KVMProxy) {
				p.Spec.ForProvider.Host = "nas1"
			}), `spec.forProvider.host: "nas1" is not in ClusterProviderConfig home-kvm: want one of beelink, nuc`},
			{"HostRequiredWithSeveral", nsProxy("team-a", "no-host", func(p *nsproxy.KVMProxy) {
				p.Spec.ForProvider.Host = ""
			}), "spec.forProvider.host is required: ClusterProviderConfig home-kvm has several (beelink, nuc)"},
			{"ConfigOfAnotherNamespace", nsProxy("team-b", "other-ns", func(p *nsproxy.KVMProxy) {
				p.Spec.ProviderConfigReference = &xpv2.ProviderConfigReference{Kind: "ProviderConfig", Name: "team-a-kvm"}
			}), `ProviderConfig "team-a-kvm" in namespace "team-b" does not exist`},
			// A tenant's image by URL, where the config allows catalogue
			// images only.
			{"ImageURLNotAllowed", nsProxy("team-a", "own-image", func(p *nsproxy.KVMProxy) {
				p.Spec.ForProvider.Image = "https://images.example.com/own.qcow2"
			}), "spec.forProvider.image: ClusterProviderConfig home-kvm does not allow images by URL (its kvm.allowImageURLs is false): name a key of its kvm.images (debian-12)"},
			{"MissingPasswordSecret", nsProxy("team-b", "no-secret", func(p *nsproxy.KVMProxy) {
				p.Spec.ForProvider.Proxy.Auth.PasswordSecretRef = &spec.SecretKeySelector{Name: "pw", Key: "password"}
			}), "spec.forProvider.proxy.auth.passwordSecretRef: Secret team-b/pw does not exist"},
		}
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				if err := e.Kube.Create(ctx, tc.p); err != nil {
					t.Fatal(err)
				}
				c := e.WaitForCondition(t, tc.p, xpv2.TypeSynced, corev1.ConditionFalse, tc.want)
				t.Logf("Synced=False: %s", c.Message)
			})
		}
	})

	// A tenant's cloud-init runs as root on the VM: on the platform's
	// ClusterProviderConfig only where it allows tenants' (off by default);
	// on the tenant's own config, and for cluster-scoped proxies, as the
	// config's allowUserCloudInit says (on by default).
	t.Run("TenantCloudInit", func(t *testing.T) {
		const cloudInit = "#cloud-config\npackages: [htop]\n"
		withCloudInit := func(p *nsproxy.KVMProxy) { p.Spec.ForProvider.CloudInit = cloudInit }
		t.Run("RefusedOnAClusterProviderConfig", func(t *testing.T) {
			p := nsProxy("team-b", "tenant-cloudinit", withCloudInit)
			if err := e.Kube.Create(ctx, p); err != nil {
				t.Fatal(err)
			}
			c := e.WaitForCondition(t, p, xpv2.TypeSynced, corev1.ConditionFalse,
				"spec.forProvider.cloudInit: ClusterProviderConfig home-kvm does not allow the cloud-init of namespaced proxies (its kvm.allowTenantCloudInit is false, the default)")
			if strings.Contains(c.Message, "htop") {
				t.Errorf("the condition quotes the cloud-init: %s", c.Message)
			}
			for _, i := range e.mem.Instances() {
				if i.Name == external.InstanceName(p) {
					t.Errorf("instance %s was created for a refused cloud-init", i.Name)
				}
			}
		})
		allowed := []struct {
			name string
			p    providerenv.Conditioned
		}{
			{"AllowedWhereTheClusterProviderConfigSaysSo", nsProxy("team-b", "tenant-cloudinit-ok", withCloudInit, func(p *nsproxy.KVMProxy) {
				p.Spec.ProviderConfigReference.Name = "home-kvm-tenant-cloudinit"
			})},
			{"AllowedOnTheTenantsOwnConfig", nsProxy("team-a", "own-cloudinit", withCloudInit, func(p *nsproxy.KVMProxy) {
				p.Spec.ProviderConfigReference = &xpv2.ProviderConfigReference{Kind: "ProviderConfig", Name: "team-a-kvm"}
			})},
			{"AllowedOnAClusterScopedProxy", &clusterproxy.KVMProxy{
				ObjectMeta: metav1.ObjectMeta{Name: "platform-cloudinit"},
				Spec: clusterproxy.KVMProxySpec{
					ClusterManagedResourceSpec: providerenv.ClusterManagedSpec("legacy-kvm", "platform-cloudinit-conn"),
					ForProvider:                spec.KVMProxyParameters{Host: "nuc", CloudInit: cloudInit, Proxy: spec.ProxySettings{AllowedClientCIDRs: []string{"10.0.0.0/8"}}},
				},
			}},
		}
		for _, tc := range allowed {
			t.Run(tc.name, func(t *testing.T) {
				if err := e.Kube.Create(ctx, tc.p); err != nil {
					t.Fatal(err)
				}
				e.WaitFor(t, "the external name", func() (bool, string) {
					_ = e.Kube.Get(ctx, client.ObjectKeyFromObject(tc.p), tc.p)
					return meta.GetExternalName(tc.p) != "", ""
				})
				e.settle(t, meta.GetExternalName(tc.p))
				e.WaitForCondition(t, tc.p, xpv2.TypeReady, corev1.ConditionTrue, "")
			})
		}
	})

	t.Run("ForeignInstanceIsNotAdopted", func(t *testing.T) {
		p := nsProxy("team-b", "taken")
		name := external.InstanceName(p)
		if err := e.mem.Foreign(name); err != nil {
			t.Fatal(err)
		}
		if err := e.Kube.Create(ctx, p); err != nil {
			t.Fatal(err)
		}
		e.WaitForCondition(t, p, xpv2.TypeSynced, corev1.ConditionFalse, "refusing to adopt it")

		// A tenant imports the platform's hand-made instances only where
		// the platform's config allows it.
		t.Run("ButCanBeImportedObserveOnlyWhereTheConfigAllows", func(t *testing.T) {
			imp := nsProxy("team-b", "import", func(p *nsproxy.KVMProxy) {
				p.Spec.ManagementPolicies = xpv2.ManagementPolicies{xpv2.ManagementActionObserve}
				meta.SetExternalName(p, name)
			})
			if err := e.Kube.Create(ctx, imp); err != nil {
				t.Fatal(err)
			}
			e.WaitForCondition(t, imp, xpv2.TypeSynced, corev1.ConditionFalse, "its allowTenantImports is false")
			_ = e.Kube.Get(ctx, client.ObjectKeyFromObject(imp), imp)
			if a := imp.Status.AtProvider; a.IP != "" || a.ID != "" {
				t.Errorf("the refused import reports the instance in its status: %+v", a)
			}

			allowed := nsProxy("team-b", "import-allowed", func(p *nsproxy.KVMProxy) {
				p.Spec.ManagementPolicies = xpv2.ManagementPolicies{xpv2.ManagementActionObserve}
				p.Spec.ProviderConfigReference.Name = "home-kvm-tenant-imports"
				meta.SetExternalName(p, name)
			})
			if err := e.Kube.Create(ctx, allowed); err != nil {
				t.Fatal(err)
			}
			e.WaitForCondition(t, allowed, xpv2.TypeReady, corev1.ConditionTrue, "")
			e.WaitForCondition(t, allowed, xpv2.TypeSynced, corev1.ConditionTrue, "")
		})
	})

	// The attack: a user of team-b imports team-a's proxy by its name to
	// read its address (and, published, its connection details).
	t.Run("AnotherResourcesInstanceCannotBeImported", func(t *testing.T) {
		victim := nsProxy("team-a", "victim")
		if err := e.Kube.Create(ctx, victim); err != nil {
			t.Fatal(err)
		}
		name := external.InstanceName(victim)
		e.settle(t, name)
		e.WaitForCondition(t, victim, xpv2.TypeReady, corev1.ConditionTrue, "")
		before, err := e.mem.Get(ctx, proxy.Ref{Name: name})
		if err != nil {
			t.Fatal(err)
		}

		thief := nsProxy("team-b", "thief", func(p *nsproxy.KVMProxy) {
			p.Spec.ManagementPolicies = xpv2.ManagementPolicies{xpv2.ManagementActionObserve}
			meta.SetExternalName(p, name)
		})
		if err := e.Kube.Create(ctx, thief); err != nil {
			t.Fatal(err)
		}
		c := e.WaitForCondition(t, thief, xpv2.TypeSynced, corev1.ConditionFalse, "refusing to import it")
		if !strings.Contains(c.Message, string(victim.GetUID())) {
			t.Errorf("the condition does not name the resource the instance belongs to: %s", c.Message)
		}
		_ = e.Kube.Get(ctx, client.ObjectKeyFromObject(thief), thief)
		if a := thief.Status.AtProvider; a.IP != "" || a.ID != "" || a.Endpoint != "" {
			t.Errorf("the refused import reports the victim's instance in its status: %+v", a)
		}
		if err := e.Kube.Get(ctx, types.NamespacedName{Namespace: "team-b", Name: "thief-conn"}, &corev1.Secret{}); !kerrors.IsNotFound(err) {
			t.Errorf("the refused import has a connection Secret (err %v); want none", err)
		}
		if err := e.Kube.Delete(ctx, thief); err != nil {
			t.Fatal(err)
		}
		e.WaitFor(t, "the refused import to go", func() (bool, string) {
			err := e.Kube.Get(ctx, client.ObjectKeyFromObject(thief), thief)
			return kerrors.IsNotFound(err), fmt.Sprint(err)
		})
		after, err := e.mem.Get(ctx, proxy.Ref{Name: name})
		if err != nil || after.Mark != before.Mark || after.SpecHash != before.SpecHash {
			t.Errorf("the victim's instance after the refused import: %+v, %v; want it as it was (%+v)", after, err, before)
		}
	})

	t.Run("QuotaErrorsReachTheCondition", func(t *testing.T) {
		// Every retry meets the same answer until capacity is freed.
		for range 100 {
			e.mem.FailNext(proxytest.OpCreate, proxy.Quotaf("pool default has 1 GiB free, needs 11 GiB"))
		}
		p := nsProxy("team-b", "quota")
		if err := e.Kube.Create(ctx, p); err != nil {
			t.Fatal(err)
		}
		c := e.WaitForCondition(t, p, xpv2.TypeSynced, corev1.ConditionFalse, "pool default has 1 GiB free, needs 11 GiB")
		if !strings.Contains(c.Message, "out of quota or capacity on the backend") {
			t.Errorf("the condition does not say the backend is out of capacity: %s", c.Message)
		}
	})

	t.Run("ConfigHealthIsReported", func(t *testing.T) {
		pc := &nsv1alpha1.ClusterProviderConfig{}
		e.WaitFor(t, "Healthy=True on the config", func() (bool, string) {
			_ = e.Kube.Get(ctx, types.NamespacedName{Name: "home-kvm"}, pc)
			c := pc.GetCondition(health.TypeHealthy)
			return c.Status == corev1.ConditionTrue && len(pc.Status.Targets) == 1 && pc.Status.Targets[0].Target == proxytest.MemoryTarget, c.Message
		})
		if pc.Status.Backend != "kvm" || pc.Status.InstallationID != testInstallation {
			t.Errorf("status backend %q installation %q", pc.Status.Backend, pc.Status.InstallationID)
		}
		if c := pc.GetCondition(health.TypeSecure); c.Status != corev1.ConditionFalse || !strings.Contains(c.Message, "insecureIgnoreHostKey") {
			t.Errorf("Secure condition = %+v, want False naming insecureIgnoreHostKey", c)
		}
		gauge := telemetry.ConfigTargetHealthy.WithLabelValues("ClusterProviderConfig", "", "home-kvm", "kvm", proxytest.MemoryTarget)
		if v := testutil.ToFloat64(gauge); v != 1 {
			t.Errorf("egressproxy_provider_config_target_healthy of home-kvm's target = %v; want 1", v)
		}
		e.WaitEvent(t, "", "home-kvm", corev1.EventTypeNormal, "Healthy", "Healthy is now True (was Unknown): 1 of 1 targets healthy")
		e.WaitEvent(t, "", "home-kvm", corev1.EventTypeWarning, "VerificationOff", "Secure is now False (was Unknown): kvm.credentials.insecureIgnoreHostKey is true")

		// The target fails its next checks (a spec change runs one now; a
		// status write that conflicts with the usage controller's runs it
		// again, so one failure alone could be retried away unseen).
		for range 3 {
			e.mem.FailNext(proxytest.OpCheck, proxy.Transientf("libvirtd does not answer"))
		}
		if err := e.Kube.Get(ctx, types.NamespacedName{Name: "home-kvm"}, pc); err != nil {
			t.Fatal(err)
		}
		pc.Spec.KVM.DiskSizeGB = 12
		if err := e.Kube.Update(ctx, pc); err != nil {
			t.Fatal(err)
		}
		e.WaitEvent(t, "", "home-kvm", corev1.EventTypeWarning, "Unhealthy", "Healthy is now False (was True): memory: ")
		if v := testutil.ToFloat64(gauge); v != 0 {
			t.Errorf("egressproxy_provider_config_target_healthy of the failing target = %v; want 0", v)
		}
		for _, ev := range e.Events(t, "", "home-kvm") {
			if strings.Contains(ev.Message, "Secure is now") && ev.Count > 1 {
				t.Errorf("Secure did not change, yet its event was recorded %d times", ev.Count)
			}
		}
	})
}
