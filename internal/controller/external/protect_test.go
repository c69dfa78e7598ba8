package external

import (
	"context"
	"testing"

	"github.com/crossplane/crossplane-runtime/v2/pkg/resource"
	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/egressproxy/provider-egressproxy/apis"
	nsproxy "github.com/egressproxy/provider-egressproxy/apis/namespaced/proxy/v1alpha1"
	namespacedv1alpha1 "github.com/egressproxy/provider-egressproxy/apis/namespaced/v1alpha1"
	spec "github.com/egressproxy/provider-egressproxy/apis/spec/v1alpha1"
	"github.com/egressproxy/provider-egressproxy/internal/controller/config"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
	"github.com/egressproxy/provider-egressproxy/internal/proxy/proxytest"
)

// TestConnectProtectsWhatDeletesTheInstance: a resource that is not being
// deleted gets no external client (so creates nothing) until its
// namespaced config and every Secret of the config that Connect reads
// carry their finalizers, whatever Secrets the config names that do not
// exist or were named after the config was protected; a resource being
// deleted connects as it finds things, and a protected config costs no
// request more.
func TestConnectProtectsWhatDeletesTheInstance(t *testing.T) {
	now := metav1.Now()
	beingDeleted := func(o client.Object) client.Object {
		o.SetDeletionTimestamp(&now)
		o.SetFinalizers(append(o.GetFinalizers(), "other.example.com/keep"))
		return o
	}
	// home reads the SSH key from Secret key; with host keys checked it
	// reads Secret known-hosts too, else it only names it.
	home := func(key string, checkHostKeys bool, finalizers ...string) *namespacedv1alpha1.ProviderConfig {
		pc := &namespacedv1alpha1.ProviderConfig{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "home", Finalizers: finalizers}}
		pc.Spec.KVM = &spec.KVMConfig{Credentials: spec.KVMCredentials{
			SSHKeySecretRef:       spec.SecretKeySelector{Name: key, Key: "id"},
			KnownHostsSecretRef:   &spec.SecretKeySelector{Name: "known-hosts", Key: "known_hosts"},
			InsecureIgnoreHostKey: !checkHostKeys,
		}}
		return pc
	}
	secret := func(name string, finalizers ...string) *corev1.Secret {
		return &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: name, Finalizers: finalizers},
			Data:       map[string][]byte{"id": []byte("key"), "known_hosts": []byte("hosts")},
		}
	}
	protected := config.SecretFinalizer("home")

	cases := map[string]struct {
		reason   string
		objs     []client.Object
		deleting bool
		wantErr  string
		// want are the finalizers of the config and of each Secret after
		// Connect, by name.
		want map[string][]string
		// wantPatches is how many writes Connect made.
		wantPatches int
		// wantReads, when set, is how many Secret reads Connect made.
		wantReads int
	}{
		"ConfigNamingAMissingSecret": {
			reason: "A config whose proxies need not read one of its Secrets (never created) is protected before use, with the Secret that exists.",
			objs:   []client.Object{home("ssh", false), secret("ssh")},
			want:   map[string][]string{"home": {config.InUseFinalizer}, "ssh": {protected}},
			// The Secret, then the config.
			wantPatches: 2,
		},
		"ConfigBeingDeleted": {
			reason:  "A config being deleted cannot be protected: no instance is created through it.",
			objs:    []client.Object{beingDeleted(home("ssh", false)), secret("ssh")},
			wantErr: "cannot protect ProviderConfig team-a/home for the Delete of the resources that name it: it is being deleted",
			want:    map[string][]string{"home": {"other.example.com/keep"}, "ssh": {protected}},
			// The Secret only.
			wantPatches: 1,
		},
		"SecretNamedAfterTheConfigWasProtected": {
			reason:      "A Secret a protected config names since (rotated credentials) is protected before Connect uses it.",
			objs:        []client.Object{home("ssh-2", true, config.InUseFinalizer), secret("ssh-2"), secret("known-hosts", protected)},
			want:        map[string][]string{"home": {config.InUseFinalizer}, "ssh-2": {protected}, "known-hosts": {protected}},
			wantPatches: 1,
		},
		"SecretBeingDeleted": {
			reason:  "A Secret being deleted cannot be protected: Connect does not use it.",
			objs:    []client.Object{home("ssh", false, config.InUseFinalizer), beingDeleted(secret("ssh"))},
			wantErr: "cannot connect to the kvm backend of ProviderConfig team-a/home: spec.kvm.credentials.sshKeySecretRef: cannot get Secret team-a/ssh: it is being deleted, so ProviderConfig team-a/home cannot protect it for the Delete of the resources that name the config",
			want:    map[string][]string{"home": {config.InUseFinalizer}, "ssh": {"other.example.com/keep"}},
		},
		"DeletingResourceGoesOn": {
			reason:   "A resource being deleted is never stopped by protection, and writes nothing for it.",
			objs:     []client.Object{beingDeleted(home("ssh", false)), beingDeleted(secret("ssh"))},
			deleting: true,
			want:     map[string][]string{"home": {"other.example.com/keep"}, "ssh": {"other.example.com/keep"}},
		},
		"Protected": {
			reason:    "A protected config whose Secrets are protected reads them once each and writes nothing.",
			objs:      []client.Object{home("ssh", true, config.InUseFinalizer), secret("ssh", protected), secret("known-hosts", protected)},
			want:      map[string][]string{"home": {config.InUseFinalizer}, "ssh": {protected}, "known-hosts": {protected}},
			wantReads: 2,
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			s := runtime.NewScheme()
			if err := clientgoscheme.AddToScheme(s); err != nil {
				t.Fatal(err)
			}
			if err := apis.AddToScheme(s); err != nil {
				t.Fatal(err)
			}
			patches, reads := 0, 0
			kube := fake.NewClientBuilder().WithScheme(s).WithObjects(tc.objs...).WithInterceptorFuncs(interceptor.Funcs{
				Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, o client.Object, opts ...client.GetOption) error {
					if _, ok := o.(*corev1.Secret); ok {
						reads++
					}
					return c.Get(ctx, key, o, opts...)
				},
				Patch: func(ctx context.Context, c client.WithWatch, o client.Object, p client.Patch, opts ...client.PatchOption) error {
					patches++
					return c.Patch(ctx, o, p, opts...)
				},
			}).Build()
			// The backend reads what the kvm backend reads.
			backend := testKind(nil).Backend
			backend.Connect = func(ctx context.Context, cfg *Config) (proxy.Driver, error) {
				k := cfg.Spec.KVM
				if _, err := cfg.Secrets.Get(ctx, "spec.kvm.credentials.sshKeySecretRef", &k.Credentials.SSHKeySecretRef); err != nil {
					return nil, err
				}
				if !k.Credentials.InsecureIgnoreHostKey {
					if _, err := cfg.Secrets.Get(ctx, "spec.kvm.credentials.knownHostsSecretRef", k.Credentials.KnownHostsSecretRef); err != nil {
						return nil, err
					}
				}
				return proxytest.NewMemory("memory", "proxytest-installation"), nil
			}
			k := testKind(nil)
			k.Backend = backend
			c := &connector[spec.KVMProxyParameters]{
				kind:      k,
				configs:   ConfigReader{Kube: kube, SecretReader: kube, Backends: []Backend{backend}},
				modern:    resource.ModernTrackerFn(func(context.Context, resource.ModernManaged) error { return nil }),
				passwords: &Passwords{key: []byte("k")},
				protect:   (&config.Protector{Kube: kube, Secrets: kube}).Ensure,
			}
			cr := proxyResource(func(cr *nsproxy.KVMProxy) {
				cr.SetProviderConfigReference(&xpv2.ProviderConfigReference{Kind: "ProviderConfig", Name: "home"})
				if tc.deleting {
					deleting(cr)
				}
			})

			ec, err := c.Connect(context.Background(), cr)
			if diff := cmp.Diff(tc.wantErr, errText(err)); diff != "" {
				t.Errorf("\n%s\nConnect(...): -want error, +got error:\n%s", tc.reason, diff)
			}
			if tc.wantErr == "" && ec == nil {
				t.Errorf("\n%s\nConnect returned no client", tc.reason)
			}
			if tc.wantErr != "" && ec != nil {
				t.Errorf("\n%s\nConnect returned a client; want none", tc.reason)
			}
			if tc.wantReads != 0 && reads != tc.wantReads {
				t.Errorf("\n%s\nConnect read %d Secrets; want %d", tc.reason, reads, tc.wantReads)
			}
			got := map[string][]string{}
			for _, o := range tc.objs {
				if err := kube.Get(context.Background(), client.ObjectKeyFromObject(o), o); err != nil {
					t.Fatal(err)
				}
				got[o.GetName()] = o.GetFinalizers()
			}
			if diff := cmp.Diff(tc.want, got, cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("\n%s\nfinalizers after Connect: -want, +got:\n%s", tc.reason, diff)
			}
			if patches != tc.wantPatches {
				t.Errorf("\n%s\nConnect made %d writes; want %d", tc.reason, patches, tc.wantPatches)
			}
		})
	}
}
