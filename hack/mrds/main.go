// Command mrds writes the provider package's resource definitions: each
// managed resource kind's CRD (package/crds, what controller-gen makes) as
// a Crossplane ManagedResourceDefinition that states the keys of the
// connection Secret (spec.connectionDetails, which `kubectl get mrd -o
// yaml` shows and CRDs have no place for); the ProviderConfig kinds stay
// CRDs, as Crossplane's own conversion of a provider's CRDs leaves them.
//
//	go run ./hack/mrds -o OUT_DIR package/crds/*.yaml
//
// hack/xpkg.sh builds the provider package from its output. The MRD's
// spec is the CRD's spec (Crossplane's MRD inlines it) and no state:
// Crossplane defaults it to Inactive, and safe-start activates each kind
// through a ManagedResourceActivationPolicy, as with converted CRDs.
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"sigs.k8s.io/yaml"

	"github.com/egressproxy/provider-egressproxy/apis/spec/v1alpha1"
)

// descriptions says what each connection key holds, for the MRDs.
var descriptions = map[string]string{
	v1alpha1.ConnectionURL:             "The proxy's URL, http://[username:password@]host:port (https:// when it listens with TLS): what clients take as their HTTP and HTTPS proxy.",
	v1alpha1.ConnectionEndpoint:        "host:port of the proxy, Crossplane's conventional endpoint key.",
	v1alpha1.ConnectionHost:            "Where clients reach the proxy: an IP address, or for a PodProxy behind a ClusterIP Service the Service's DNS name.",
	v1alpha1.ConnectionPort:            "The proxy's TCP port.",
	v1alpha1.ConnectionUsername:        "The proxy's username; present only when auth is on.",
	v1alpha1.ConnectionPassword:        "The proxy's password; present only when auth is on.",
	v1alpha1.ConnectionHTTPProxy:       "The url, under the name most HTTP clients read (Go, most runtimes), for envFrom.",
	v1alpha1.ConnectionHTTPSProxy:      "The url, under the name most HTTP clients read for https:// destinations, for envFrom.",
	v1alpha1.ConnectionHTTPProxyLower:  "The url, under the name curl reads for http:// destinations (it ignores HTTP_PROXY), for envFrom.",
	v1alpha1.ConnectionHTTPSProxyLower: "The url, under the lower-case name curl, wget and Python read, for envFrom.",
	v1alpha1.ConnectionNoProxy:         "Destinations clients reach directly, comma-separated: localhost, 127.0.0.1, ::1, .svc, .cluster.local and the ProviderConfig's spec.noProxy.",
	v1alpha1.ConnectionNoProxyLower:    "NO_PROXY under its lower-case name, for envFrom.",
	v1alpha1.ConnectionEgressIP:        "The address the proxy's traffic leaves from, when the backend knows it: what a vendor's allow-list needs.",
	v1alpha1.ConnectionEgressIPs:       "Every egress address of the proxy, comma-separated: egressIP alone, or the addresses of all of a PodProxy's replicas when they leave from several nodes. What to put on an allow-list.",
	v1alpha1.ConnectionCA:              "Present when the proxy listens with TLS (proxy.tls; the url is then https://): the PEM certificate clients verify the proxy's against.",
}

// notManaged are the kinds Crossplane keeps as CRDs (its converter's list).
var notManaged = map[string]bool{"ProviderConfig": true, "ClusterProviderConfig": true, "ProviderConfigUsage": true, "ClusterProviderConfigUsage": true}

func main() {
	out := flag.String("o", "", "The folder to write the definitions to (one file per input, same name).")
	flag.Parse()
	if *out == "" || flag.NArg() == 0 {
		fmt.Fprintln(os.Stderr, "usage: mrds -o OUT_DIR CRD_FILE...")
		os.Exit(2)
	}
	if err := run(*out, flag.Args()); err != nil {
		fmt.Fprintln(os.Stderr, "mrds:", err)
		os.Exit(1)
	}
}

func run(out string, files []string) error {
	details, err := connectionDetails()
	if err != nil {
		return err
	}
	for _, f := range files {
		b, err := os.ReadFile(f) //nolint:gosec // files the build names.
		if err != nil {
			return err
		}
		o, err := definition(b, details)
		if err != nil {
			return fmt.Errorf("%s: %w", f, err)
		}
		if err := os.WriteFile(filepath.Join(out, filepath.Base(f)), o, 0o644); err != nil { //nolint:gosec // a package's file.
			return err
		}
	}
	return nil
}

// connectionDetails are the MRD's entries, one per key a connection Secret
// may hold, in spec.ConnectionKeys' order.
func connectionDetails() ([]any, error) {
	out := make([]any, 0, len(v1alpha1.ConnectionKeys))
	for _, k := range v1alpha1.ConnectionKeys {
		d, ok := descriptions[k]
		if !ok {
			return nil, fmt.Errorf("connection key %q (apis/spec/v1alpha1.ConnectionKeys) has no description in hack/mrds", k)
		}
		out = append(out, map[string]any{"name": k, "description": d})
	}
	if len(descriptions) != len(out) {
		return nil, fmt.Errorf("hack/mrds describes %d connection keys, apis/spec/v1alpha1.ConnectionKeys has %d", len(descriptions), len(out))
	}
	return out, nil
}

// definition is a CRD's YAML as the package holds it: unchanged for the
// ProviderConfig kinds, else an MRD with the connection details.
func definition(crd []byte, details []any) ([]byte, error) {
	var o map[string]any
	if err := yaml.Unmarshal(crd, &o); err != nil {
		return nil, err
	}
	if o["apiVersion"] != "apiextensions.k8s.io/v1" || o["kind"] != "CustomResourceDefinition" {
		return nil, fmt.Errorf("not a CustomResourceDefinition: %v %v", o["apiVersion"], o["kind"])
	}
	spec, _ := o["spec"].(map[string]any)
	names, _ := spec["names"].(map[string]any)
	kind, _ := names["kind"].(string)
	if kind == "" {
		return nil, fmt.Errorf("no spec.names.kind")
	}
	if notManaged[kind] {
		return crd, nil
	}
	spec["connectionDetails"] = details
	mrd := map[string]any{
		"apiVersion": "apiextensions.crossplane.io/v1alpha1",
		"kind":       "ManagedResourceDefinition",
		"metadata":   o["metadata"],
		"spec":       spec,
	}
	b, err := yaml.Marshal(mrd)
	if err != nil {
		return nil, err
	}
	return append([]byte("---\n"), b...), nil
}
