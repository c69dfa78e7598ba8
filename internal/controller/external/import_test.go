package external

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/test"
	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"

	nsproxy "github.com/egressproxy/provider-egressproxy/apis/namespaced/proxy/v1alpha1"
	spec "github.com/egressproxy/provider-egressproxy/apis/spec/v1alpha1"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
	"github.com/egressproxy/provider-egressproxy/internal/proxy/proxytest"
	"github.com/egressproxy/provider-egressproxy/internal/squid"
)

// probingDriver is the memory driver with the readiness check every
// backend's Get makes: a squid.Prober asked for what the instance's mark
// expects (squid.Expected), of a Squid that answers with answer.
type probingDriver struct {
	proxy.Driver
	prober *squid.Prober
}

func newProbingDriver(mem proxy.Driver, answer string) probingDriver {
	return probingDriver{Driver: mem, prober: &squid.Prober{Wait: time.Minute, Ask: func(context.Context, string) (string, error) { return answer, nil }}}
}

func (d probingDriver) Get(ctx context.Context, ref proxy.Ref) (proxy.Instance, error) {
	inst, err := d.Driver.Get(ctx, ref)
	if err != nil || inst.State != proxy.StateRunning || inst.IP == "" {
		return inst, err
	}
	pr := d.prober.Check(ctx, nil, inst.ID, inst.IP+":3128", squid.Expected(inst.Mark), "")
	inst.ProxyReachable = pr.Serving
	if pr.Serving {
		squid.NoteAnswer(&inst, pr)
	} else {
		inst.Progress = pr.Message
	}
	return inst, nil
}

// TestObserveImportOfAHandMadeSquid: an Observe-only import of an
// unmarked instance, whose Squid answers with its own name, turns Ready,
// and Ready and status say that the instance is not the provider's and
// what its Squid answered as. An instance of the provider's answering
// with that name is not Ready, Observe-only or not.
func TestObserveImportOfAHandMadeSquid(t *testing.T) {
	const handmade = "squid-handmade"
	cases := map[string]struct {
		reason  string
		cr      *nsproxy.KVMProxy
		setup   func(t *testing.T, mem *proxytest.Memory, e *external[spec.KVMProxyParameters])
		ready   xpv2.Condition
		details map[string]string
	}{
		"UnmarkedImport": {
			reason:  "Any Squid answering serves an unmarked instance an Observe-only resource imported.",
			cr:      proxyResource(observeOnlyPolicy),
			setup:   setupForeign,
			ready:   xpv2.Available().WithMessage(`instance px-1 is not the provider's (it carries no ownership mark; imported Observe-only, so any Squid answering counts): its Squid answered as "squid-handmade"`).WithObservedGeneration(3),
			details: map[string]string{squid.DetailAnswer: `answered as "squid-handmade"`},
		},
		"OwnInstance": {
			reason: "The resource's own instance is checked as its own: another name is not Ready.",
			cr:     proxyResource(),
			setup:  setupOurs,
		},
		"OwnInstanceObserveOnly": {
			reason: "Observe-only loosens nothing for an instance that carries the provider's mark.",
			cr:     proxyResource(observeOnlyPolicy),
			setup:  setupOurs,
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			mem := proxytest.NewMemory("memory", "proxytest-installation")
			e := newExternal(testKind(nil), mem, nil)
			tc.setup(t, mem, e)
			e.driver = newProbingDriver(mem, handmade)
			if _, err := e.Observe(context.Background(), tc.cr); err != nil {
				t.Fatalf("\n%s\nObserve: %v", tc.reason, err)
			}
			got := tc.cr.GetCondition(xpv2.TypeReady)
			if tc.ready.Type == "" {
				// Not Ready, saying why, quoting nothing of the answer.
				if got.Status == corev1.ConditionTrue || !strings.Contains(got.Message, "not one of the provider's, not as this resource's") || strings.Contains(got.Message, handmade) {
					t.Errorf("\n%s\nReady: %+v; want not True, saying the name is not the provider's, without quoting it", tc.reason, got)
				}
				if tc.cr.Status.AtProvider.ProxyReachable {
					t.Errorf("\n%s\nstatus.atProvider.proxyReachable is true", tc.reason)
				}
				return
			}
			if diff := cmp.Diff(tc.ready, got, test.EquateConditions()); diff != "" {
				t.Errorf("\n%s\nReady: -want, +got:\n%s", tc.reason, diff)
			}
			if diff := cmp.Diff(tc.details, tc.cr.Status.AtProvider.Details); diff != "" {
				t.Errorf("\n%s\nstatus.atProvider.details: -want, +got:\n%s", tc.reason, diff)
			}
		})
	}
}

// TestObserveOnlyPublishesNoGeneratedPassword: an import (an instance
// without the provider's mark) with auth on publishes credentials only
// from passwordSecretRef: without one, no username, password or
// credentials in the URLs, and nothing of the password the provider would
// generate. The resource's own instance publishes its generated password,
// managed or Observe-only.
func TestObserveOnlyPublishesNoGeneratedPassword(t *testing.T) {
	withAuth := func(ref *spec.SecretKeySelector) func(*nsproxy.KVMProxy) {
		return func(cr *nsproxy.KVMProxy) {
			cr.Spec.ForProvider.Proxy.Auth = &spec.ProxyAuth{Enabled: true, Username: "team", PasswordSecretRef: ref}
		}
	}
	ctx := context.Background()
	generated, err := (&Passwords{key: []byte("unit-test-key")}).For(ctx, testUID)
	if err != nil {
		t.Fatal(err)
	}
	cases := map[string]struct {
		reason   string
		cr       *nsproxy.KVMProxy
		setup    func(t *testing.T, mem *proxytest.Memory, e *external[spec.KVMProxyParameters])
		user, pw string
	}{
		"ImportWithoutPasswordSecretRef": {
			reason: "The provider does not know an import's credentials: it publishes none.",
			cr:     proxyResource(observeOnlyPolicy, withAuth(nil)),
			setup:  setupForeign,
		},
		"ImportWithPasswordSecretRef": {
			reason: "The user's own password for the import is published.",
			cr:     proxyResource(observeOnlyPolicy, withAuth(&spec.SecretKeySelector{Name: "pw", Key: "password"})),
			setup:  setupForeign,
			user:   "team", pw: "users-own-pw",
		},
		"OwnObserveOnlyWithoutPasswordSecretRef": {
			reason: "The resource's own instance, made with the generated password, keeps it published under Observe: its clients go on working.",
			cr:     proxyResource(observeOnlyPolicy, withAuth(nil)),
			setup:  setupOurs,
			user:   "team", pw: generated,
		},
		"Managed": {
			reason: "A resource that manages its instance publishes the password it generated for it.",
			cr:     proxyResource(withAuth(nil)),
			setup:  setupOurs,
			user:   "team", pw: generated,
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			var asked []string
			kube := secretsIn(map[string]map[string][]byte{"team-a/pw": {"password": []byte("users-own-pw")}}, &asked)
			mem := proxytest.NewMemory("memory", "proxytest-installation")
			e := newExternal(testKind(nil), mem, kube)
			e.secrets = Secrets{Kube: kube, Namespace: "team-a"}
			tc.setup(t, mem, e)
			obs, err := e.Observe(ctx, tc.cr)
			if err != nil {
				t.Fatalf("\n%s\nObserve: %v", tc.reason, err)
			}
			d := obs.ConnectionDetails
			if len(d) == 0 {
				t.Fatalf("\n%s\nno connection details", tc.reason)
			}
			if got, want := string(d[spec.ConnectionUsername])+"/"+string(d[spec.ConnectionPassword]), tc.user+"/"+tc.pw; got != want {
				t.Errorf("\n%s\nusername/password %q; want %q", tc.reason, got, want)
			}
			if url := string(d[spec.ConnectionURL]); (tc.pw == "") == strings.Contains(url, "@") {
				t.Errorf("\n%s\nurl %q; want credentials in it: %t", tc.reason, url, tc.pw != "")
			}
			if tc.pw == generated {
				return
			}
			for k, v := range d {
				if strings.Contains(string(v), generated) {
					t.Errorf("\n%s\nconnection detail %s holds the generated password", tc.reason, k)
				}
			}
		})
	}
}

// TestRefusedImportForgetsWhatItPublished: a tenant's import the
// platform's config allowed shows the instance; once the config no
// longer allows it, the next Observe refuses it and the status holds
// nothing of the instance, and Ready is no longer True.
func TestRefusedImportForgetsWhatItPublished(t *testing.T) {
	mem := proxytest.NewMemory("memory", "proxytest-installation")
	e := newExternal(testKind(nil), mem, nil)
	foreignOnTenantConfig(true)(t, mem, e)
	cr := proxyResource(observeOnlyPolicy)
	if _, err := e.Observe(context.Background(), cr); err != nil {
		t.Fatalf("Observe of an allowed import: %v", err)
	}
	if cr.Status.AtProvider.IP == "" || cr.GetCondition(xpv2.TypeReady).Status != corev1.ConditionTrue {
		t.Fatalf("the allowed import shows %+v, Ready %v; want its instance, Ready", cr.Status.AtProvider, cr.GetCondition(xpv2.TypeReady).Status)
	}

	e.cfg.Spec.AllowTenantImports = false
	if _, err := e.Observe(context.Background(), cr); err == nil || !strings.Contains(err.Error(), "allowTenantImports is false") {
		t.Fatalf("Observe once imports are not allowed = %v; want the refusal", err)
	}
	if a := cr.Status.AtProvider; a.IP != "" || a.ID != "" || a.State != "" || a.EgressIP != "" {
		t.Errorf("the refused import still shows %+v", a)
	}
	if got := cr.GetCondition(xpv2.TypeReady); got.Status == corev1.ConditionTrue || got.ObservedGeneration != cr.GetGeneration() {
		t.Errorf("the refused import's Ready: %+v; want not True, of generation %d", got, cr.GetGeneration())
	}
}
