package apis_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"
	"sigs.k8s.io/yaml"

	"github.com/egressproxy/provider-egressproxy/internal/devenv/controlplane"
)

// Category is the kubectl category of every kind of the provider and the
// Configuration (`kubectl get egressproxy-all -A`).
const Category = "egressproxy-all"

// namesOfOthers are resource names (plural, singular or short) of CNIs and
// common operators that a category of ours must never be: kubectl would
// expand the category and never show their resource.
var namesOfOthers = map[string]string{
	"egress":                    "Antrea (Egress.crd.antrea.io)",
	"egresses":                  "Antrea (Egress.crd.antrea.io)",
	"egressip":                  "OVN-Kubernetes (EgressIP.k8s.ovn.org)",
	"egressips":                 "OVN-Kubernetes (EgressIP.k8s.ovn.org)",
	"egressfirewall":            "OVN-Kubernetes (EgressFirewall.k8s.ovn.org)",
	"egressqos":                 "OVN-Kubernetes (EgressQoS.k8s.ovn.org)",
	"egressgateway":             "Spiderpool (EgressGateway.egressgateway.spidernet.io)",
	"egressgatewaypolicy":       "Calico Enterprise (EgressGatewayPolicy.projectcalico.org)",
	"egressgateways":            "Spiderpool (EgressGateway.egressgateway.spidernet.io)",
	"egressnetworkpolicy":       "OpenShift SDN (EgressNetworkPolicy.network.openshift.io)",
	"egressrouter":              "OpenShift (EgressRouter.network.operator.openshift.io)",
	"egresspolicy":              "Spiderpool (EgressPolicy.egressgateway.spidernet.io)",
	"ciliumegressgatewaypolicy": "Cilium (CiliumEgressGatewayPolicy.cilium.io)",
	"proxy":                     "OpenShift (Proxy.config.openshift.io)",
	"proxies":                   "OpenShift (Proxy.config.openshift.io)",
	"all":                       "kubectl's own category",
}

// xrdCRDs writes, into a folder, the CRDs Crossplane makes of the
// Configuration's XRDs (names and categories as Crossplane sets them:
// composites get "composite" and claims "claim" on top of the XRD's), so
// that the API server's discovery holds every kind a user of the
// provider sees.
func xrdCRDs(t *testing.T, root string) string {
	t.Helper()
	dir := t.TempDir()
	files, _ := filepath.Glob(filepath.Join(root, "package", "configuration", "xrd-*.yaml"))
	if len(files) == 0 {
		t.Fatal("no XRDs under package/configuration")
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		u := &unstructured.Unstructured{}
		if err := yaml.Unmarshal(b, &u.Object); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		group, _, _ := unstructured.NestedString(u.Object, "spec", "group")
		scope, _, _ := unstructured.NestedString(u.Object, "spec", "scope")
		if scope == "" || scope == "LegacyCluster" {
			scope = "Cluster"
		}
		for _, n := range []struct {
			field, scope, extra string
		}{{"names", scope, "composite"}, {"claimNames", "Namespaced", "claim"}} {
			names, ok, _ := unstructured.NestedMap(u.Object, "spec", n.field)
			if !ok {
				continue
			}
			kind, _ := names["kind"].(string)
			plural, _ := names["plural"].(string)
			cats := []string{}
			for _, c := range names["categories"].([]any) { //nolint:forcetypeassert // the XRDs list strings.
				cats = append(cats, c.(string)) //nolint:forcetypeassert // see above.
			}
			if !slices.Contains(cats, n.extra) {
				cats = append(cats, n.extra)
			}
			crd := apiextensionsv1.CustomResourceDefinition{
				TypeMeta:   metav1.TypeMeta{APIVersion: "apiextensions.k8s.io/v1", Kind: "CustomResourceDefinition"},
				ObjectMeta: metav1.ObjectMeta{Name: plural + "." + group},
				Spec: apiextensionsv1.CustomResourceDefinitionSpec{
					Group: group, Scope: apiextensionsv1.ResourceScope(n.scope),
					Names: apiextensionsv1.CustomResourceDefinitionNames{Kind: kind, Plural: plural, Categories: cats},
					Versions: []apiextensionsv1.CustomResourceDefinitionVersion{{Name: "v1alpha1", Served: true, Storage: true,
						Schema: &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{
							Type: "object", XPreserveUnknownFields: ptr(true)}}}},
				},
			}
			out, err := yaml.Marshal(crd)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, plural+".yaml"), out, 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
	return dir
}

func ptr[T any](v T) *T { return &v }

// TestKubectlIntegration checks what kubectl shows, on a real API server
// with the provider's CRDs and the Configuration's kinds: no category is
// also the name of a kind (kubectl expands a category before it looks for
// a kind, so such a name would list every kind of the category), the
// provider's category lists its kinds and the XRs, and the proxies' table
// has the columns the README shows.
func TestKubectlIntegration(t *testing.T) {
	root, err := controlplane.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	cp := controlplane.ForTest(t, controlplane.Options{CRDDirectories: []string{filepath.Join(root, "package", "crds"), xrdCRDs(t, root)}})
	dc, err := discovery.NewDiscoveryClientForConfig(cp.Config)
	if err != nil {
		t.Fatal(err)
	}
	_, lists, err := dc.ServerGroupsAndResources()
	if err != nil {
		t.Fatal(err)
	}

	// Every name kubectl resolves to a kind, and every category.
	names := map[string]string{}
	categories := map[string][]string{}
	for _, l := range lists {
		gv, _ := schema.ParseGroupVersion(l.GroupVersion)
		for _, r := range l.APIResources {
			if strings.Contains(r.Name, "/") {
				continue
			}
			gk := r.Kind + "." + gv.Group
			for _, n := range append([]string{r.Name, r.SingularName, strings.ToLower(r.Kind)}, r.ShortNames...) {
				if n != "" {
					names[n] = gk
				}
			}
			if strings.HasSuffix(gv.Group, "egressproxy.io") {
				for _, c := range r.Categories {
					categories[c] = append(categories[c], gk)
				}
			}
		}
	}
	for c := range categories {
		if gk, ok := names[c]; ok {
			t.Errorf("category %q is also a name of %s: `kubectl get %s` would list every kind of the category", c, gk, c)
		}
	}

	expander := restmapper.NewDiscoveryCategoryExpander(dc)
	if _, ok := expander.Expand("egressproxy"); ok {
		t.Error("kubectl expands egressproxy as a category; want it to name the EgressProxy XR")
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))
	if gvk, err := mapper.KindFor(schema.GroupVersionResource{Resource: "egressproxy"}); err != nil || gvk.Kind != "EgressProxy" || gvk.Group != "platform.egressproxy.io" {
		t.Errorf("kubectl get egressproxy resolves to %v (%v); want EgressProxy.platform.egressproxy.io", gvk, err)
	}
	// kubectl expands a category before it looks a name up: a category
	// that is another project's resource name hides that resource in every
	// cluster running it (Antrea's Egress was hidden by `egress`).
	for c := range categories {
		if owner, ok := namesOfOthers[c]; ok {
			t.Errorf("category %q is a resource name of %s: `kubectl get %s` would list this project's kinds instead", c, owner, c)
		}
	}
	got, ok := expander.Expand(Category)
	if !ok {
		t.Fatalf("kubectl does not know the category %s", Category)
	}
	var kinds []string
	for _, gr := range got {
		kinds = append(kinds, gr.Resource+"."+gr.Group)
	}
	sort.Strings(kinds)
	want := []string{
		"clusterproviderconfigs.m.egressproxy.io",
		"egressproxies.platform.egressproxy.io", "egressproxyclaims.legacy.platform.egressproxy.io",
		"gcpproxies.proxy.egressproxy.io", "gcpproxies.proxy.m.egressproxy.io",
		"kvmproxies.proxy.egressproxy.io", "kvmproxies.proxy.m.egressproxy.io",
		"podproxies.proxy.egressproxy.io", "podproxies.proxy.m.egressproxy.io",
		"providerconfigs.egressproxy.io", "providerconfigs.m.egressproxy.io",
		"providerconfigusages.egressproxy.io", "providerconfigusages.m.egressproxy.io",
		"proxmoxproxies.proxy.egressproxy.io", "proxmoxproxies.proxy.m.egressproxy.io",
		"xegressproxies.legacy.platform.egressproxy.io",
	}
	if fmt.Sprint(kinds) != fmt.Sprint(want) {
		t.Errorf("kubectl get %s lists\n%v\nwant\n%v", Category, kinds, want)
	}

	// The columns, as the API server renders the table kubectl prints
	// (priority 1 columns show with -o wide).
	dyn, err := dynamic.NewForConfig(cp.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	ns := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Namespace", "metadata": map[string]any{"name": "team-a"}}}
	if _, err := dyn.Resource(schema.GroupVersionResource{Version: "v1", Resource: "namespaces"}).Create(ctx, ns, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, kind := range []string{"kvmproxies", "proxmoxproxies", "gcpproxies", "podproxies"} {
		for _, group := range []string{"proxy.m.egressproxy.io", "proxy.egressproxy.io"} {
			path := "/apis/" + group + "/v1alpha1/" + kind
			if group == "proxy.m.egressproxy.io" {
				path = "/apis/" + group + "/v1alpha1/namespaces/team-a/" + kind
			}
			b, err := dc.RESTClient().Get().AbsPath(path).SetHeader("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io").Do(ctx).Raw()
			if err != nil {
				t.Fatalf("table of %s.%s: %v", kind, group, err)
			}
			var table metav1.Table
			if err := json.Unmarshal(b, &table); err != nil {
				t.Fatal(err)
			}
			var cols []string
			for _, c := range table.ColumnDefinitions {
				n := c.Name
				if c.Priority > 0 {
					n += "(wide)"
				}
				cols = append(cols, n)
			}
			if want := "[Name READY SYNCED EXTERNAL-NAME IP STATE EGRESS-IP AGE CONFIG(wide) BACKEND-ID(wide) EGRESS-SOURCE(wide)]"; fmt.Sprint(cols) != want {
				t.Errorf("%s.%s columns %v; want %s", kind, group, cols, want)
			}
		}
	}
}
