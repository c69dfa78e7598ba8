package localcrossplane

import (
	"errors"
	"fmt"
	"io"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
)

// Condition is the status and "reason: message" of o's condition typ
// (both empty when o has none of that type): what `kubectl get` and
// `crossplane resource trace` show of it.
func Condition(o *unstructured.Unstructured, typ string) (status, reasonMessage string) {
	cs, _, _ := unstructured.NestedSlice(o.Object, "status", "conditions")
	for _, c := range cs {
		m, _ := c.(map[string]any)
		if m["type"] == typ {
			st, _ := m["status"].(string)
			r, _ := m["reason"].(string)
			msg, _ := m["message"].(string)
			return st, r + ": " + msg
		}
	}
	return "", ""
}

// Conditions is every condition of o as "Type=Status Reason: message",
// joined by "; ": what a message about an object that is not there yet
// shows.
func Conditions(o *unstructured.Unstructured) string {
	cs, _, _ := unstructured.NestedSlice(o.Object, "status", "conditions")
	out := make([]string, 0, len(cs))
	for _, c := range cs {
		m, _ := c.(map[string]any)
		out = append(out, fmt.Sprintf("%v=%v %v: %v", m["type"], m["status"], m["reason"], m["message"]))
	}
	return strings.Join(out, "; ")
}

// DecodeYAML is the objects of a YAML (or JSON) stream, empty documents
// left out.
func DecodeYAML(doc string) ([]*unstructured.Unstructured, error) {
	d := utilyaml.NewYAMLOrJSONDecoder(strings.NewReader(doc), 4096)
	var out []*unstructured.Unstructured
	for {
		o := &unstructured.Unstructured{}
		if err := d.Decode(&o.Object); err != nil {
			if errors.Is(err, io.EOF) {
				return out, nil
			}
			return nil, err
		}
		if len(o.Object) > 0 {
			out = append(out, o)
		}
	}
}

// FunctionIP is a loopback address for a function's process, from the ID
// of the process that runs Crossplane core (127.M.N.9; never 127.0.0.x,
// which other processes use), so that two of them on one machine differ.
// CoreOptions.Hosts maps the function's Service name to it and
// ProcessRuntime.FunctionAddrs makes the function listen there.
func FunctionIP(pid int) string {
	return fmt.Sprintf("127.%d.%d.9", 100+pid%100, (pid/100)%250+1)
}

// PodsProviderConfig is the YAML of the provider config "pods" that the
// Configuration's standard class names: PodProxies in namespace, from
// image (the provider's default Squid image when empty), under the
// provider's own identity in the cluster (InjectedIdentity: the grant of
// cluster/rbac/podproxy.yaml). It is the ClusterProviderConfig of
// m.egressproxy.io for the namespaced kinds, or with legacy the
// ProviderConfig of egressproxy.io for the cluster-scoped ones (claims).
func PodsProviderConfig(legacy bool, namespace, image string) string {
	apiVersion, kind := "m.egressproxy.io/v1alpha1", "ClusterProviderConfig"
	if legacy {
		apiVersion, kind = "egressproxy.io/v1alpha1", "ProviderConfig"
	}
	doc := fmt.Sprintf(`apiVersion: %s
kind: %s
metadata:
  name: pods
spec:
  kubernetes:
    credentials: {source: InjectedIdentity}
    namespace: %s
`, apiVersion, kind, namespace)
	if image != "" {
		doc += "    image: " + image + "\n"
	}
	return doc
}
