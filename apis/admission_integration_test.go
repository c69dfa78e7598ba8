package apis_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/egressproxy/provider-egressproxy/internal/devenv/controlplane"
)

// loadExamples reads every object of examples/, in file order.
func loadExamples(t *testing.T, root string) []*unstructured.Unstructured {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(root, "examples", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no examples found under %s/examples: %v", root, err)
	}
	sort.Strings(files)
	var out []*unstructured.Unstructured
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		d := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(b), 4096)
		for {
			u := &unstructured.Unstructured{}
			if err := d.Decode(&u.Object); err != nil {
				if errors.Is(err, io.EOF) {
					break
				}
				t.Fatalf("%s: %v", f, err)
			}
			if len(u.Object) == 0 {
				continue
			}
			out = append(out, u)
		}
	}
	return out
}

// find returns a deep copy of the example of kind in group with name.
func find(t *testing.T, objs []*unstructured.Unstructured, group, kind, name string) *unstructured.Unstructured {
	t.Helper()
	for _, o := range objs {
		gvk := o.GroupVersionKind()
		if gvk.Group == group && gvk.Kind == kind && o.GetName() == name {
			return o.DeepCopy()
		}
	}
	t.Fatalf("no example %s.%s %s", kind, group, name)
	return nil
}

func set(path string, v any) func(*unstructured.Unstructured) {
	return func(u *unstructured.Unstructured) {
		if err := unstructured.SetNestedField(u.Object, v, strings.Split(path, ".")...); err != nil {
			panic(err)
		}
	}
}

func unset(path string) func(*unstructured.Unstructured) {
	return func(u *unstructured.Unstructured) {
		unstructured.RemoveNestedField(u.Object, strings.Split(path, ".")...)
	}
}

// namespacedGCP is a ClusterProviderConfig's gcp block as a namespaced
// config would hold it, with the provider's own identity.
func namespacedGCP(u *unstructured.Unstructured) map[string]any {
	gcp, _, _ := unstructured.NestedMap(u.Object, "spec", "gcp")
	gcp["credentials"] = map[string]any{"source": "InjectedIdentity"}
	return gcp
}

// namespacedGCPWithEndpoint is the gcp block of a ClusterProviderConfig as
// a namespace user would write it (a key Secret of its own namespace),
// with an endpoint.
func namespacedGCPWithEndpoint(u *unstructured.Unstructured, endpoint string) map[string]any {
	gcp, _, _ := unstructured.NestedMap(u.Object, "spec", "gcp")
	gcp["credentials"] = map[string]any{"source": "Secret", "secretRef": map[string]any{"name": "gcp-key", "key": "key.json"}}
	gcp["endpoint"] = endpoint
	return gcp
}

// slash8s are n IPv4 /8s, each within the limit for a proxy without auth.
func slash8s(n int) []any {
	out := make([]any, n)
	for i := range out {
		out[i] = fmt.Sprintf("%d.0.0.0/8", i+1)
	}
	return out
}

// slash24s are n IPv4 /24s.
func slash24s(n int) []any {
	out := make([]any, n)
	for i := range out {
		out[i] = fmt.Sprintf("10.%d.0.0/24", i)
	}
	return out
}

const (
	nsProxy     = "proxy.m.egressproxy.io"
	clProxy     = "proxy.egressproxy.io"
	nsConfig    = "m.egressproxy.io"
	legacyGroup = "egressproxy.io"
)

// TestAdmissionIntegration sends every example and every kind of bad input
// to a real kube-apiserver with the provider's CRDs, and asserts that the
// examples are accepted and that each rejection names the field at fault.
func TestAdmissionIntegration(t *testing.T) {
	root, err := controlplane.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	cp := controlplane.ForTest(t, controlplane.Options{CRDDirectories: []string{filepath.Join(root, "package", "crds")}})
	kube, err := client.New(cp.Config, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	examples := loadExamples(t, root)

	// Every example is accepted (and later cases build on them).
	{
		kinds := map[string]bool{}
		for _, o := range examples {
			if err := kube.Create(ctx, o.DeepCopy()); err != nil {
				t.Errorf("%s %s/%s rejected: %v", o.GroupVersionKind(), o.GetNamespace(), o.GetName(), err)
			}
			kinds[o.GroupVersionKind().GroupKind().String()] = true
		}
		for _, want := range []string{
			"KVMProxy." + nsProxy, "ProxmoxProxy." + nsProxy, "GCPProxy." + nsProxy, "PodProxy." + nsProxy,
			"KVMProxy." + clProxy, "ProxmoxProxy." + clProxy, "GCPProxy." + clProxy, "PodProxy." + clProxy,
			"ProviderConfig." + nsConfig, "ClusterProviderConfig." + nsConfig, "ProviderConfig." + legacyGroup,
		} {
			if !kinds[want] {
				t.Errorf("examples/ has no %s", want)
			}
		}
	}
	if t.Failed() {
		t.FailNow()
	}

	type example struct{ group, kind, name string }
	var (
		nsPod   = example{nsProxy, "PodProxy", "payments-egress"}
		clPod   = example{clProxy, "PodProxy", "shared-egress"}
		nsKVM   = example{nsProxy, "KVMProxy", "payments-egress"}
		nsGCP   = example{nsProxy, "GCPProxy", "payments-egress"}
		cpcKVM  = example{nsConfig, "ClusterProviderConfig", "home-kvm"}
		cpcPVE  = example{nsConfig, "ClusterProviderConfig", "home-pve"}
		cpcGCP  = example{nsConfig, "ClusterProviderConfig", "gcp-prod"}
		cpcPods = example{nsConfig, "ClusterProviderConfig", "pods"}
		nsPC    = example{nsConfig, "ProviderConfig", "team-pods"}
		legKVM  = example{legacyGroup, "ProviderConfig", "home-kvm"}
	)
	kvmCreds := func(u *unstructured.Unstructured) {
		set("spec.kubernetes.credentials", map[string]any{"source": "Secret", "secretRef": map[string]any{"namespace": "x", "name": "kc", "key": "kubeconfig"}})(u)
	}

	gcpBlock, _ := find(t, examples, nsConfig, "ClusterProviderConfig", "gcp-prod").Object["spec"].(map[string]any)["gcp"]
	type rejection struct {
		name   string
		base   example
		mutate []func(*unstructured.Unstructured)
		want   []string // substrings of the rejection: the field path and the reason
	}
	cases := []rejection{
		{"PortZero", nsPod, []func(*unstructured.Unstructured){set("spec.forProvider.proxy.port", int64(0))}, []string{"spec.forProvider.proxy.port", "greater than or equal to 1"}},
		{"PortTooHigh", nsPod, []func(*unstructured.Unstructured){set("spec.forProvider.proxy.port", int64(70000))}, []string{"spec.forProvider.proxy.port", "less than or equal to 65535"}},
		{"NoClientCIDRs", nsPod, []func(*unstructured.Unstructured){set("spec.forProvider.proxy.allowedClientCIDRs", []any{})}, []string{"spec.forProvider.proxy.allowedClientCIDRs", "at least 1 items"}},
		{"ClientCIDRsMissing", clPod, []func(*unstructured.Unstructured){unset("spec.forProvider.proxy.allowedClientCIDRs")}, []string{"spec.forProvider.proxy.allowedClientCIDRs", "Required value"}},
		{"BareIPIsNotACIDR", nsPod, []func(*unstructured.Unstructured){set("spec.forProvider.proxy.allowedClientCIDRs", []any{"10.0.0.1"})}, []string{"spec.forProvider.proxy.allowedClientCIDRs[0]", "must be a CIDR"}},
		{"GarbageCIDR", clPod, []func(*unstructured.Unstructured){set("spec.forProvider.proxy.allowedClientCIDRs", []any{"10.0.0.0/8", "everyone"})}, []string{"spec.forProvider.proxy.allowedClientCIDRs[1]", "must be a CIDR"}},
		{"ConnectPortZero", nsPod, []func(*unstructured.Unstructured){set("spec.forProvider.proxy.allowedPorts", []any{int64(0)})}, []string{"spec.forProvider.proxy.allowedPorts[0]", "greater than or equal to 1"}},
		{"BadDestination", nsPod, []func(*unstructured.Unstructured){set("spec.forProvider.proxy.allowedDestinations", []any{"exa mple.com"})}, []string{"spec.forProvider.proxy.allowedDestinations[0]", "should match"}},
		{"BadUsername", nsPod, []func(*unstructured.Unstructured){set("spec.forProvider.proxy.auth.username", "a user")}, []string{"spec.forProvider.proxy.auth.username", "should match"}},
		{"UsernameREQUIRED", nsPod, []func(*unstructured.Unstructured){set("spec.forProvider.proxy.auth.username", "REQUIRED")}, []string{"spec.forProvider.proxy.auth.username", "not REQUIRED"}},
		{"UsernameLikeAnOption", clPod, []func(*unstructured.Unstructured){set("spec.forProvider.proxy.auth.username", "-i")}, []string{"spec.forProvider.proxy.auth.username", "not starting with '-'"}},
		{"NamespacedPasswordRefWithNamespace", nsPod, []func(*unstructured.Unstructured){set("spec.forProvider.proxy.auth.passwordSecretRef", map[string]any{"namespace": "other", "name": "pw", "key": "password"})}, []string{"spec.forProvider.proxy.auth.passwordSecretRef", "not allowed on a namespaced resource"}},
		{"ClusterPasswordRefWithoutNamespace", clPod, []func(*unstructured.Unstructured){set("spec.forProvider.proxy.auth.passwordSecretRef", map[string]any{"name": "pw", "key": "password"})}, []string{"spec.forProvider.proxy.auth.passwordSecretRef", "required on a cluster-scoped resource"}},
		{"NamespacedTLSRefWithNamespace", nsPod, []func(*unstructured.Unstructured){set("spec.forProvider.proxy.tls.secretRef", map[string]any{"namespace": "other", "name": "proxy-tls"})}, []string{"spec.forProvider.proxy.tls.secretRef", "not allowed on a namespaced resource"}},
		{"ClusterTLSRefWithoutNamespace", clPod, []func(*unstructured.Unstructured){set("spec.forProvider.proxy.tls.secretRef", map[string]any{"name": "proxy-tls"})}, []string{"spec.forProvider.proxy.tls.secretRef", "required on a cluster-scoped resource"}},
		{"TLSWithoutSecretRef", nsPod, []func(*unstructured.Unstructured){set("spec.forProvider.proxy.tls", map[string]any{})}, []string{"spec.forProvider.proxy.tls.secretRef", "Required value"}},
		{"HostNotAName", nsKVM, []func(*unstructured.Unstructured){set("spec.forProvider.host", "Bad_Host")}, []string{"spec.forProvider.host", "should match"}},
		{"ImageNeitherKeyNorURL", nsKVM, []func(*unstructured.Unstructured){set("spec.forProvider.image", "ftp://example.com/img")}, []string{"spec.forProvider.image", "catalogue key"}},
		{"ZoneNotAZone", nsGCP, []func(*unstructured.Unstructured){set("spec.forProvider.zone", "europe")}, []string{"spec.forProvider.zone", "must be a Compute Engine zone such as europe-west1-b"}},
		{"UnknownAddressType", nsGCP, []func(*unstructured.Unstructured){set("spec.forProvider.address.type", "Floating")}, []string{"spec.forProvider.address.type", "Unsupported value"}},
		{"NoReplicas", nsPod, []func(*unstructured.Unstructured){set("spec.forProvider.replicas", int64(0))}, []string{"spec.forProvider.replicas", "greater than or equal to 1"}},
		{"TooManyReplicas", clPod, []func(*unstructured.Unstructured){set("spec.forProvider.replicas", int64(11))}, []string{"spec.forProvider.replicas", "less than or equal to 10"}},
		{"TolerationWithAnUnknownOperator", cpcPods, []func(*unstructured.Unstructured){set("spec.kubernetes.tolerations", []any{map[string]any{"key": "egressproxy.io/egress", "operator": "Maybe"}})}, []string{"spec.kubernetes.tolerations[0]", "operator must be Exists or Equal"}},
		{"TolerationExistsWithAValue", cpcPods, []func(*unstructured.Unstructured){set("spec.kubernetes.tolerations", []any{map[string]any{"key": "egressproxy.io/egress", "operator": "Exists", "value": "true"}})}, []string{"spec.kubernetes.tolerations[0]", "value must be empty when operator is Exists"}},
		{"TolerationWithoutAKey", cpcPods, []func(*unstructured.Unstructured){set("spec.kubernetes.tolerations", []any{map[string]any{"value": "true", "effect": "NoSchedule"}})}, []string{"spec.kubernetes.tolerations[0]", "without a key must have operator Exists"}},
		{"TolerationWithAnUnknownEffect", cpcPods, []func(*unstructured.Unstructured){set("spec.kubernetes.tolerations", []any{map[string]any{"key": "k", "effect": "NoRun"}})}, []string{"spec.kubernetes.tolerations[0]", "effect must be NoSchedule, PreferNoSchedule, NoExecute"}},
		{"TolerationSecondsWithoutNoExecute", cpcPods, []func(*unstructured.Unstructured){set("spec.kubernetes.tolerations", []any{map[string]any{"key": "k", "effect": "NoSchedule", "tolerationSeconds": int64(30)}})}, []string{"spec.kubernetes.tolerations[0]", "tolerationSeconds applies to effect NoExecute only"}},
		{"AffinityOfTheWrongShape", cpcPods, []func(*unstructured.Unstructured){set("spec.kubernetes.affinity", map[string]any{"nodeAffinity": map[string]any{"requiredDuringSchedulingIgnoredDuringExecution": map[string]any{"nodeSelectorTerms": "eu-1a"}}})}, []string{"spec.kubernetes.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms", "must be of type array"}},
		{"UnknownServiceType", nsPod, []func(*unstructured.Unstructured){set("spec.forProvider.service.type", "NodePort")}, []string{"spec.forProvider.service.type", "Unsupported value"}},
		{"ConfigWithTwoBlocks", cpcPods, []func(*unstructured.Unstructured){set("spec.gcp", gcpBlock)}, []string{"spec", "exactly one of kvm, proxmox, gcp or kubernetes"}},
		{"ConfigWithNoBlock", cpcPods, []func(*unstructured.Unstructured){unset("spec.kubernetes")}, []string{"spec", "exactly one of kvm, proxmox, gcp or kubernetes"}},
		{"ClusterConfigRefWithoutNamespace", cpcKVM, []func(*unstructured.Unstructured){unset("spec.kvm.credentials.sshKeySecretRef.namespace")}, []string{"spec.kvm.credentials.sshKeySecretRef.namespace", "required on a cluster-scoped config"}},
		{"LegacyConfigRefWithoutNamespace", legKVM, []func(*unstructured.Unstructured){unset("spec.kvm.credentials.knownHostsSecretRef.namespace")}, []string{"spec.kvm.credentials.knownHostsSecretRef.namespace", "required on a cluster-scoped config"}},
		{"NamespacedConfigRefWithNamespace", nsPC, []func(*unstructured.Unstructured){kvmCreds}, []string{"spec.kubernetes.credentials.secretRef.namespace", "not allowed on a namespaced ProviderConfig"}},
		{"HostAddressWithoutPort", cpcKVM, []func(*unstructured.Unstructured){set("spec.kvm.hosts", []any{map[string]any{"name": "beelink", "address": "10.0.0.5", "user": "proxy"}})}, []string{"spec.kvm.hosts[0].address", "must be host:port of the SSH server"}},
		{"HostWithBridgeAndNetwork", cpcKVM, []func(*unstructured.Unstructured){set("spec.kvm.hosts", []any{map[string]any{"name": "a", "address": "h:22", "user": "proxy", "bridge": "br0", "network": "default"}})}, []string{"spec.kvm.hosts[0].bridge", "exactly one of bridge", "and network"}},
		{"HostWithNeitherBridgeNorNetwork", cpcKVM, []func(*unstructured.Unstructured){set("spec.kvm.hosts", []any{map[string]any{"name": "a", "address": "h:22", "user": "proxy"}})}, []string{"spec.kvm.hosts[0].bridge", "exactly one of bridge"}},
		{"DuplicateHostNames", cpcKVM, []func(*unstructured.Unstructured){set("spec.kvm.hosts", []any{map[string]any{"name": "a", "address": "h:22", "user": "proxy"}, map[string]any{"name": "a", "address": "h:23", "user": "proxy"}})}, []string{"spec.kvm.hosts[1]", "Duplicate value"}},
		{"ImageKeyNotAName", cpcKVM, []func(*unstructured.Unstructured){set("spec.kvm.images", map[string]any{"Debian_12": map[string]any{"url": "https://example.com/d.qcow2"}})}, []string{"spec.kvm.images", "image keys must be lowercase"}},
		{"ImageSHA256Malformed", cpcKVM, []func(*unstructured.Unstructured){set("spec.kvm.images.debian-12.sha256", "abc")}, []string{"spec.kvm.images.debian-12.sha256", "should match"}},
		{"NoKnownHostsWithoutInsecure", cpcKVM, []func(*unstructured.Unstructured){unset("spec.kvm.credentials.knownHostsSecretRef")}, []string{"spec.kvm.credentials.knownHostsSecretRef", "required unless insecureIgnoreHostKey"}},
		{"NoMachineTypes", cpcKVM, []func(*unstructured.Unstructured){set("spec.kvm.machineTypes", map[string]any{})}, []string{"spec.kvm.machineTypes", "at least 1 properties"}},
		{"ProxmoxPlainHTTP", cpcPVE, []func(*unstructured.Unstructured){set("spec.proxmox.url", "http://pve.example:8006")}, []string{"spec.proxmox.url", "must be https://"}},
		{"VMIDRangeInverted", cpcPVE, []func(*unstructured.Unstructured){set("spec.proxmox.vmidRange", map[string]any{"min": int64(2000), "max": int64(1000)})}, []string{"spec.proxmox.vmidRange", "min must not exceed"}},
		{"VLANTagTooHigh", cpcPVE, []func(*unstructured.Unstructured){set("spec.proxmox.vlanTag", int64(5000))}, []string{"spec.proxmox.vlanTag", "less than or equal to 4094"}},
		{"ProxmoxNoISOStorage", cpcPVE, []func(*unstructured.Unstructured){unset("spec.proxmox.isoStorage")}, []string{"spec.proxmox.isoStorage", "Required value"}},
		{"GCPSecretSourceWithoutRef", cpcGCP, []func(*unstructured.Unstructured){unset("spec.gcp.credentials.secretRef")}, []string{"spec.gcp.credentials", "secretRef is required"}},
		{"GCPUnknownCredentialsSource", cpcGCP, []func(*unstructured.Unstructured){set("spec.gcp.credentials.source", "Environment")}, []string{"spec.gcp.credentials.source", "Unsupported value"}},
		{"GCPProjectNotAnID", cpcGCP, []func(*unstructured.Unstructured){set("spec.gcp.project", "X")}, []string{"spec.gcp.project", "should match"}},
		{"EgressCheckURLWithAQuery", cpcPods, []func(*unstructured.Unstructured){set("spec.kubernetes.egressCheck", map[string]any{"url": "https://api.ipify.org/?format=json"})}, []string{"spec.kubernetes.egressCheck.url", "should match"}},
		{"EgressCheckURLNotHTTP", cpcGCP, []func(*unstructured.Unstructured){set("spec.gcp.egressCheck", map[string]any{"url": "ftp://echo.example.com/ip"})}, []string{"spec.gcp.egressCheck.url", "should match"}},
		{"EgressCheckURLWithUserInfo", cpcPVE, []func(*unstructured.Unstructured){set("spec.proxmox.egressCheck", map[string]any{"url": "http://u:p@echo.example.com/ip"})}, []string{"spec.proxmox.egressCheck.url", "should match"}},
		{"EgressCheckURLPortTooHigh", cpcKVM, []func(*unstructured.Unstructured){set("spec.kvm.egressCheck", map[string]any{"url": "http://echo.example:99999/ip"})}, []string{"spec.kvm.egressCheck.url", "egressCheck.url's port must be 1 to 65535"}},
		{"EgressCheckURLPortZero", cpcPVE, []func(*unstructured.Unstructured){set("spec.proxmox.egressCheck", map[string]any{"url": "http://echo.example:0/ip"})}, []string{"spec.proxmox.egressCheck.url", "egressCheck.url's port must be 1 to 65535"}},
		{"EgressCheckURLBadEscape", cpcGCP, []func(*unstructured.Unstructured){set("spec.gcp.egressCheck", map[string]any{"url": "https://echo.example/%zz"})}, []string{"spec.gcp.egressCheck.url", "egressCheck.url may hold % only as an escape of two hex digits"}},
		{"EgressCheckURLBarePercent", cpcPods, []func(*unstructured.Unstructured){set("spec.kubernetes.egressCheck", map[string]any{"url": "https://echo.example/a%"})}, []string{"spec.kubernetes.egressCheck.url", "egressCheck.url may hold % only as an escape of two hex digits"}},
		{"EgressCheckURLBracketedIPv4", cpcKVM, []func(*unstructured.Unstructured){set("spec.kvm.egressCheck", map[string]any{"url": "http://[1.2.3.4]/"})}, []string{"spec.kvm.egressCheck.url", "egressCheck.url's host in brackets must be an IPv6 address"}},
		{"EgressCheckURLBracketedNotIPv6", cpcPods, []func(*unstructured.Unstructured){set("spec.kubernetes.egressCheck", map[string]any{"url": "http://[::1::2]/"})}, []string{"spec.kubernetes.egressCheck.url", "egressCheck.url's host in brackets must be an IPv6 address"}},
		{"EgressCheckURLTooLong", cpcKVM, []func(*unstructured.Unstructured){set("spec.kvm.egressCheck", map[string]any{"url": "http://echo.example/" + strings.Repeat(".", 461)})}, []string{"spec.kvm.egressCheck.url", "480"}},
		{"EgressCheckWithoutURL", cpcKVM, []func(*unstructured.Unstructured){set("spec.kvm.egressCheck", map[string]any{"interval": "1h"})}, []string{"spec.kvm.egressCheck.url", "Required value"}},
		{"GuestNetworkUnknown", cpcKVM, []func(*unstructured.Unstructured){set("spec.kvm.hosts", []any{map[string]any{"name": "a", "address": "h:22", "user": "proxy", "bridge": "br0", "guestNetwork": "Bridged"}})}, []string{"spec.kvm.hosts[0].guestNetwork", "Unsupported value"}},
		{"NoProxyWithAComma", cpcPods, []func(*unstructured.Unstructured){set("spec.noProxy", []any{".corp.example,10.0.0.0/8"})}, []string{"spec.noProxy[0]", "should match"}},
		{"GCPImpersonateNotAServiceAccount", cpcGCP, []func(*unstructured.Unstructured){set("spec.gcp.credentials.impersonateServiceAccount", "someone@example.com")}, []string{"spec.gcp.credentials.impersonateServiceAccount", "should match"}},
		{"GCPDelegatesWithoutImpersonation", cpcGCP, []func(*unstructured.Unstructured){set("spec.gcp.credentials.delegates", []any{"broker@p.iam.gserviceaccount.com"})}, []string{"spec.gcp.credentials.delegates", "delegates need impersonateServiceAccount"}},
		// A CIDR with host bits is not widened in silence.
		{"ClientCIDRWithHostBits", nsPod, []func(*unstructured.Unstructured){set("spec.forProvider.proxy.allowedClientCIDRs", []any{"10.20.3.7/16"})}, []string{"spec.forProvider.proxy.allowedClientCIDRs[0]", "must not have host bits set"}},
		{"DestinationCIDRWithHostBits", clPod, []func(*unstructured.Unstructured){set("spec.forProvider.proxy.allowedDestinationCIDRs", []any{"10.30.4.9/24"})}, []string{"spec.forProvider.proxy.allowedDestinationCIDRs[0]", "must not have host bits set"}},
		{"ClusterNetworkWithHostBits", cpcPods, []func(*unstructured.Unstructured){set("spec.kubernetes.clusterNetworks", []any{"10.96.0.1/12"})}, []string{"spec.kubernetes.clusterNetworks[0]", "must not have host bits set"}},
		{"UsernameOfTheEgressCheck", nsPod, []func(*unstructured.Unstructured){set("spec.forProvider.proxy.auth.username", "egressproxy-check")}, []string{"spec.forProvider.proxy.auth.username", "the provider's own egress check user"}},
		// Durations the provider could not decode (which would stop every
		// config of the kind from being read) are refused.
		{"MinAgeInDays", cpcPods, []func(*unstructured.Unstructured){set("spec.orphans", map[string]any{"policy": "Delete", "minAge": "1d"})}, []string{"spec.orphans.minAge", "must be a duration such as 30m"}},
		{"MinAgeNegative", nsPC, []func(*unstructured.Unstructured){set("spec.orphans", map[string]any{"minAge": "-1h"})}, []string{"spec.orphans.minAge", "must be a duration such as 30m"}},
		{"RetentionTooLong", cpcKVM, []func(*unstructured.Unstructured){set("spec.kvm.unusedImageRetention", "3000000h")}, []string{"spec.kvm.unusedImageRetention", "must be under 2562047h"}},
		{"EgressCheckIntervalTooShort", cpcKVM, []func(*unstructured.Unstructured){set("spec.kvm.egressCheck", map[string]any{"url": "http://echo.example.com/ip", "interval": "30s"})}, []string{"spec.kvm.egressCheck.interval", "at least 1m"}},
		{"EgressCheckIntervalNotADuration", cpcPods, []func(*unstructured.Unstructured){set("spec.kubernetes.egressCheck", map[string]any{"url": "http://echo.example.com/ip", "interval": "hourly"})}, []string{"spec.kubernetes.egressCheck.interval", "must be a duration such as 30m"}},
		// Common mistakes get a message saying what to write.
		{"WildcardDestination", nsPod, []func(*unstructured.Unstructured){set("spec.forProvider.proxy.allowedDestinations", []any{"*.stripe.com"})}, []string{"spec.forProvider.proxy.allowedDestinations[0]", "a wildcard is written with a leading dot: .stripe.com"}},
		{"ZoneIsARegion", nsGCP, []func(*unstructured.Unstructured){set("spec.forProvider.zone", "europe-west1")}, []string{"spec.forProvider.zone", "a region such as europe-west1 is not a zone"}},
		{"ProxmoxURLWithUserInfo", cpcPVE, []func(*unstructured.Unstructured){set("spec.proxmox.url", "https://root%40pam:S3CRET@pve.example:8006")}, []string{"spec.proxmox.url", "no spaces, user info, query or fragment"}},
		{"ProxmoxURLWithAQuery", cpcPVE, []func(*unstructured.Unstructured){set("spec.proxmox.url", "https://pve.example:8006?token=S3CRET")}, []string{"spec.proxmox.url", "no spaces, user info, query or fragment"}},
		{"ProxmoxURLWithTheAPIPath", cpcPVE, []func(*unstructured.Unstructured){set("spec.proxmox.url", "https://pve.example:8006/api2/json")}, []string{"spec.proxmox.url", "without a path: the provider adds /api2/json"}},
		{"HostAddressPortTooHigh", cpcKVM, []func(*unstructured.Unstructured){set("spec.kvm.hosts", []any{map[string]any{"name": "beelink", "address": "10.0.0.5:99999", "user": "proxy", "bridge": "br0"}})}, []string{"spec.kvm.hosts[0].address", "the port must be 1 to 65535"}},
		{"InstallationIDNotAName", cpcPods, []func(*unstructured.Unstructured){set("spec.installationID", "Prod EU")}, []string{"spec.installationID", "should match"}},
		// Tenancy: a namespaced config never acts with the provider's own identity.
		{"NamespacedConfigInjectedKubernetesIdentity", nsPC, []func(*unstructured.Unstructured){set("spec.kubernetes.credentials", map[string]any{"source": "InjectedIdentity"})}, []string{"spec.kubernetes.credentials.source", "InjectedIdentity is not allowed on a namespaced ProviderConfig"}},
		{"NamespacedConfigInjectedGCPIdentity", nsPC, []func(*unstructured.Unstructured){unset("spec.kubernetes"), set("spec.gcp", namespacedGCP(find(t, examples, nsConfig, "ClusterProviderConfig", "gcp-prod")))}, []string{"spec.gcp.credentials.source", "InjectedIdentity is not allowed on a namespaced ProviderConfig"}},
		// Never an open proxy: without auth, no client CIDR broader than /8 or /32, however spelt.
		{"OpenToTheInternet", nsPod, []func(*unstructured.Unstructured){unset("spec.forProvider.proxy.auth"), set("spec.forProvider.proxy.allowedClientCIDRs", []any{"0.0.0.0/0"})}, []string{"spec.forProvider.proxy.allowedClientCIDRs", "without auth", "auth.enabled: true", "which makes them allowed"}},
		{"OpenAsTwoHalves", clPod, []func(*unstructured.Unstructured){unset("spec.forProvider.proxy.auth"), set("spec.forProvider.proxy.allowedClientCIDRs", []any{"0.0.0.0/1", "128.0.0.0/1"})}, []string{"spec.forProvider.proxy.allowedClientCIDRs", "broader than /8"}},
		{"OpenIPv6", nsKVM, []func(*unstructured.Unstructured){unset("spec.forProvider.proxy.auth"), set("spec.forProvider.proxy.allowedClientCIDRs", []any{"2000::/3"})}, []string{"spec.forProvider.proxy.allowedClientCIDRs", "/32 (IPv6)"}},
		{"OpenIPv6All", nsGCP, []func(*unstructured.Unstructured){set("spec.forProvider.proxy.auth", map[string]any{"enabled": false}), set("spec.forProvider.proxy.allowedClientCIDRs", []any{"::/0"})}, []string{"spec.forProvider.proxy.allowedClientCIDRs", "without auth"}},
		{"OpenSlash7", nsPod, []func(*unstructured.Unstructured){unset("spec.forProvider.proxy.auth"), set("spec.forProvider.proxy.allowedClientCIDRs", []any{"10.0.0.0/8", "12.0.0.0/7"})}, []string{"spec.forProvider.proxy.allowedClientCIDRs", "without auth"}},
		// ... and no more than a /8 of IPv4 and a /32 of IPv6 together, however split or spelt.
		{"OpenBySixtyFourSlash8s", nsPod, []func(*unstructured.Unstructured){unset("spec.forProvider.proxy.auth"), set("spec.forProvider.proxy.allowedClientCIDRs", slash8s(64))}, []string{"spec.forProvider.proxy.allowedClientCIDRs", "together may admit at most a /8 of IPv4"}},
		{"OpenByTwoSlash8s", clPod, []func(*unstructured.Unstructured){unset("spec.forProvider.proxy.auth"), set("spec.forProvider.proxy.allowedClientCIDRs", []any{"10.0.0.0/8", "11.0.0.0/8"})}, []string{"spec.forProvider.proxy.allowedClientCIDRs", "together may admit at most a /8 of IPv4"}},
		{"OpenBySlash8AndOneMore", nsKVM, []func(*unstructured.Unstructured){unset("spec.forProvider.proxy.auth"), set("spec.forProvider.proxy.allowedClientCIDRs", []any{"10.0.0.0/8", "192.0.2.1/32"})}, []string{"spec.forProvider.proxy.allowedClientCIDRs", "together may admit at most a /8 of IPv4"}},
		{"OpenByNAT64", nsPod, []func(*unstructured.Unstructured){unset("spec.forProvider.proxy.auth"), set("spec.forProvider.proxy.allowedClientCIDRs", []any{"64:ff9b::/96"})}, []string{"spec.forProvider.proxy.allowedClientCIDRs", "together may admit at most a /8 of IPv4"}},
		{"OpenByNAT64NextToIPv4", nsGCP, []func(*unstructured.Unstructured){set("spec.forProvider.proxy.auth", map[string]any{"enabled": false}), set("spec.forProvider.proxy.allowedClientCIDRs", []any{"10.0.0.0/8", "64:ff9b::b00:0/104"})}, []string{"spec.forProvider.proxy.allowedClientCIDRs", "together may admit at most a /8 of IPv4"}},
		{"OpenBy6to4NextToIPv4", nsPod, []func(*unstructured.Unstructured){unset("spec.forProvider.proxy.auth"), set("spec.forProvider.proxy.allowedClientCIDRs", []any{"10.0.0.0/8", "2002:b00::/32"})}, []string{"spec.forProvider.proxy.allowedClientCIDRs", "together may admit at most a /8 of IPv4"}},
		{"OpenByCoveringIPv4Mapped", nsPod, []func(*unstructured.Unstructured){unset("spec.forProvider.proxy.auth"), set("spec.forProvider.proxy.allowedClientCIDRs", []any{"::/64"})}, []string{"spec.forProvider.proxy.allowedClientCIDRs", "together may admit at most a /8 of IPv4"}},
		{"OpenIPv6ByTwoSlash32s", nsPod, []func(*unstructured.Unstructured){unset("spec.forProvider.proxy.auth"), set("spec.forProvider.proxy.allowedClientCIDRs", []any{"2001:db8::/32", "2001:db9::/32"})}, []string{"spec.forProvider.proxy.allowedClientCIDRs", "together may admit at most a /32 of IPv6"}},
		// Admission adds sizes: an overlap counts twice (the controller computes the exact union).
		{"OverlapCountsTwiceAtAdmission", nsPod, []func(*unstructured.Unstructured){unset("spec.forProvider.proxy.auth"), set("spec.forProvider.proxy.allowedClientCIDRs", []any{"10.0.0.0/8", "10.1.0.0/16"})}, []string{"spec.forProvider.proxy.allowedClientCIDRs", "overlapping entries count twice"}},
		{"IPv4MappedClientCIDR", nsPod, []func(*unstructured.Unstructured){set("spec.forProvider.proxy.allowedClientCIDRs", []any{"::ffff:0.0.0.0/96"})}, []string{"spec.forProvider.proxy.allowedClientCIDRs[0]", "must be a CIDR"}},
		// No pivot: IP literals as destinations, never-openable destination CIDRs, the proxy's own port.
		{"DestinationIPLiteral", nsPod, []func(*unstructured.Unstructured){set("spec.forProvider.proxy.allowedDestinations", []any{"example.com", "169.254.169.254"})}, []string{"spec.forProvider.proxy.allowedDestinations[1]", "not an IP address", "allowedDestinationCIDRs"}},
		{"DestinationDecimalIP", nsPod, []func(*unstructured.Unstructured){set("spec.forProvider.proxy.allowedDestinations", []any{"2130706433"})}, []string{"spec.forProvider.proxy.allowedDestinations[0]", "not an IP address"}},
		{"DestinationHexIP", nsPod, []func(*unstructured.Unstructured){set("spec.forProvider.proxy.allowedDestinations", []any{"0x7F000001"})}, []string{"spec.forProvider.proxy.allowedDestinations[0]", "not an IP address"}},
		{"DestinationShortIP", clPod, []func(*unstructured.Unstructured){set("spec.forProvider.proxy.allowedDestinations", []any{"127.1"})}, []string{"spec.forProvider.proxy.allowedDestinations[0]", "not an IP address"}},
		{"DestinationTrailingDot", nsPod, []func(*unstructured.Unstructured){set("spec.forProvider.proxy.allowedDestinations", []any{"metadata.google.internal."})}, []string{"spec.forProvider.proxy.allowedDestinations[0]", "should match"}},
		{"OpenLoopback", nsPod, []func(*unstructured.Unstructured){set("spec.forProvider.proxy.allowedDestinationCIDRs", []any{"127.0.0.0/8"})}, []string{"spec.forProvider.proxy.allowedDestinationCIDRs[0]", "must lie inside a private range"}},
		{"OpenMetadata", nsPod, []func(*unstructured.Unstructured){set("spec.forProvider.proxy.allowedDestinationCIDRs", []any{"10.0.0.0/8", "169.254.169.254/32"})}, []string{"spec.forProvider.proxy.allowedDestinationCIDRs[1]", "must lie inside a private range"}},
		{"OpenEverything", nsKVM, []func(*unstructured.Unstructured){set("spec.forProvider.proxy.allowedDestinationCIDRs", []any{"0.0.0.0/0"})}, []string{"spec.forProvider.proxy.allowedDestinationCIDRs[0]", "must lie inside a private range"}},
		{"OpenNAT64Loopback", nsKVM, []func(*unstructured.Unstructured){set("spec.forProvider.proxy.allowedDestinationCIDRs", []any{"64:ff9b::7f00:1/128"})}, []string{"spec.forProvider.proxy.allowedDestinationCIDRs[0]", "must lie inside a private range"}},
		{"OpenLocalUseNAT64", nsKVM, []func(*unstructured.Unstructured){set("spec.forProvider.proxy.allowedDestinationCIDRs", []any{"64:ff9b:1::/48"})}, []string{"spec.forProvider.proxy.allowedDestinationCIDRs[0]", "must lie inside a private range", "local-use NAT64"}},
		{"OpenIPv4MappedLoopback", nsKVM, []func(*unstructured.Unstructured){set("spec.forProvider.proxy.allowedDestinationCIDRs", []any{"::ffff:127.0.0.1/128"})}, []string{"spec.forProvider.proxy.allowedDestinationCIDRs[0]", "must be a CIDR"}},
		{"ProxyPortIsAConnectPort", nsPod, []func(*unstructured.Unstructured){set("spec.forProvider.proxy.port", int64(8443)), set("spec.forProvider.proxy.allowedPorts", []any{int64(443), int64(8443)})}, []string{"spec.forProvider.proxy.port", "loop back"}},
		{"ProxyPortIs443", nsPod, []func(*unstructured.Unstructured){set("spec.forProvider.proxy.port", int64(443))}, []string{"spec.forProvider.proxy.port", "must not be 80, 443"}},
		{"CatalogueImageURLMetadata", cpcKVM, []func(*unstructured.Unstructured){set("spec.kvm.images.debian-12.url", "http://[fd00:ec2::254]/latest/")}, []string{"spec.kvm.images[debian-12].url", "not loopback"}},
		{"GCPNetworkTagWithTheProvidersPrefix", cpcGCP, []func(*unstructured.Unstructured){set("spec.gcp.networkTags", []any{"egress-proxy", "egressproxy-3bd1b4f9fcbd965ce7906b0f"})}, []string{"spec.gcp.networkTags[1]", "the provider's own"}},
		// gcp.endpoint: the platform team's (cluster-scoped configs), HTTPS, nothing but a base URL.
		{"NamespacedConfigGCPEndpoint", nsPC, []func(*unstructured.Unstructured){unset("spec.kubernetes"), set("spec.gcp", namespacedGCPWithEndpoint(find(t, examples, nsConfig, "ClusterProviderConfig", "gcp-prod"), "https://compute.example.com"))}, []string{"spec.gcp.endpoint", "not allowed on a namespaced ProviderConfig"}},
		{"GCPEndpointNotHTTPS", cpcGCP, []func(*unstructured.Unstructured){set("spec.gcp.endpoint", "http://compute.example.com")}, []string{"spec.gcp.endpoint", "must be an https:// URL"}},
		{"GCPEndpointUserinfo", cpcGCP, []func(*unstructured.Unstructured){set("spec.gcp.endpoint", "https://compute.googleapis.com@evil.example.com")}, []string{"spec.gcp.endpoint", "no user info"}},
		{"GCPEndpointQuery", cpcGCP, []func(*unstructured.Unstructured){set("spec.gcp.endpoint", "https://compute.example.com/?alt=x")}, []string{"spec.gcp.endpoint", "must be an https:// URL"}},
		{"KubernetesNamespaceNotAName", cpcPods, []func(*unstructured.Unstructured){set("spec.kubernetes.namespace", "Egress_Proxies")}, []string{"spec.kubernetes.namespace", "should match"}},
	}
	// KVM images: a URL's host is never the machine itself or a metadata service, however spelt.
	for _, c := range []struct{ name, url string }{
		{"ImageURLLoopback", "http://127.0.0.1:8080/img.qcow2"},
		{"ImageURLLocalhost", "http://LocalHost/img.qcow2"},
		{"ImageURLLocalhostTrailingDot", "http://localhost./img.qcow2"},
		{"ImageURLMetadata", "http://169.254.169.254/computeMetadata/v1/"},
		{"ImageURLMetadataName", "http://metadata.google.internal/computeMetadata/v1/"},
		{"ImageURLIPv6Loopback", "http://[::1]/img.qcow2"},
		{"ImageURLMappedLoopback", "http://[::ffff:127.0.0.1]/img.qcow2"},
		{"ImageURLDecimal", "http://2130706433/img.qcow2"},
		{"ImageURLUnspecified", "http://0.0.0.0/img.qcow2"},
		{"ImageURLAlibabaMetadata", "http://100.100.100.200/latest/meta-data/"},
		{"ImageURLUserinfoTrick", "http://mirror.example.com@169.254.169.254/img"},
		// /etc/hosts names for ::1 in every pod, and RFC 6761's .localhost.
		{"ImageURLIP6Localhost", "http://ip6-localhost/img.qcow2"},
		{"ImageURLIP6Loopback", "http://IP6-Loopback:8080/img.qcow2"},
		{"ImageURLLocalhost6", "http://localhost6/img.qcow2"},
		{"ImageURLSubdomainOfLocalhost", "http://mirror.localhost/img.qcow2"},
		{"ImageURLLocalhostLocaldomain", "http://localhost.localdomain/img.qcow2"},
	} {
		cases = append(cases, rejection{c.name, nsKVM, []func(*unstructured.Unstructured){set("spec.forProvider.image", c.url)}, []string{"spec.forProvider.image", "not loopback"}})
	}
	// Sets crossplane-runtime does not support: the reconciler would stop
	// on them before anything, the resource's deletion included.
	for _, c := range []struct {
		name string
		base example
		set  []any
	}{
		{"PoliciesCreateDelete", nsKVM, []any{"Create", "Delete"}},
		{"PoliciesObserveUpdateDelete", clPod, []any{"Observe", "Update", "Delete"}},
		{"PoliciesObserveDeleteLateInitialize", nsGCP, []any{"Observe", "Delete", "LateInitialize"}},
		{"PoliciesAllAndObserve", nsPod, []any{"*", "Observe"}},
	} {
		cases = append(cases, rejection{"Unsupported" + c.name, c.base, []func(*unstructured.Unstructured){set("spec.managementPolicies", c.set)}, []string{"spec.managementPolicies", "a set crossplane-runtime supports"}})
	}
	// create sends the example base, renamed name and changed by mutate.
	create := func(t *testing.T, base example, name string, mutate []func(*unstructured.Unstructured)) error {
		t.Helper()
		u := find(t, examples, base.group, base.kind, base.name)
		u.SetName(name)
		for _, m := range mutate {
			m(u)
		}
		return kube.Create(ctx, u)
	}
	for _, tc := range cases {
		t.Run("Rejects"+tc.name, func(t *testing.T) {
			err := create(t, tc.base, "bad-"+strings.ToLower(tc.name), tc.mutate)
			if err == nil {
				t.Fatalf("accepted, want a rejection naming %q", tc.want)
			}
			t.Logf("rejected: %v", err)
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("rejection does not say %q:\n%v", w, err)
				}
			}
		})
	}

	// What the rules above must not refuse.
	accepts := []struct {
		name   string
		base   example
		mutate []func(*unstructured.Unstructured)
	}{
		{"ImageURLByName", nsKVM, []func(*unstructured.Unstructured){set("spec.forProvider.image", "https://cloud.debian.org/images/cloud/bookworm/latest/debian-12-genericcloud-amd64.qcow2")}},
		{"ImageURLRoutableAddress", nsKVM, []func(*unstructured.Unstructured){set("spec.forProvider.image", "http://203.0.113.7:8080/img.qcow2")}},
		{"ImageURLRoutableIPv6", nsKVM, []func(*unstructured.Unstructured){set("spec.forProvider.image", "http://[2001:db8::7]/img.qcow2")}},
		{"SplitSlash8WithoutAuth", nsPod, []func(*unstructured.Unstructured){unset("spec.forProvider.proxy.auth"), set("spec.forProvider.proxy.allowedClientCIDRs", []any{"10.0.0.0/9", "10.128.0.0/9", "2001:db8::/33", "2001:db8:8000::/33"})}},
		{"SixtyFourNarrowWithoutAuth", nsPod, []func(*unstructured.Unstructured){unset("spec.forProvider.proxy.auth"), set("spec.forProvider.proxy.allowedClientCIDRs", slash24s(64))}},
		{"SixtyFourSlash8sWithAuth", nsPod, []func(*unstructured.Unstructured){set("spec.forProvider.proxy.allowedClientCIDRs", slash8s(64))}},
		{"NarrowClientsWithoutAuth", nsPod, []func(*unstructured.Unstructured){unset("spec.forProvider.proxy.auth"), set("spec.forProvider.proxy.allowedClientCIDRs", []any{"10.0.0.0/8", "2001:db8::/32"})}},
		{"OpenPrivateDestinations", nsPod, []func(*unstructured.Unstructured){set("spec.forProvider.proxy.allowedDestinationCIDRs", []any{"10.20.0.0/16", "192.168.1.10/32", "fd12:3456::/32", "100.64.0.0/10"})}},
		{"NamespacedConfigWithKubeconfigSecret", nsPC, nil},
		{"DestinationsWithUnderscores", nsPod, []func(*unstructured.Unstructured){set("spec.forProvider.proxy.allowedDestinations", []any{"my_host.corp.example", "_dmarc.example.com", ".my_zone.example"})}},
		{"GCPPrivateEndpoint", cpcGCP, []func(*unstructured.Unstructured){set("spec.gcp.endpoint", "https://compute-myendpoint.p.googleapis.com")}},
		{"ProxmoxURLWithATrailingSlash", cpcPVE, []func(*unstructured.Unstructured){set("spec.proxmox.url", "https://pve.example:8006/")}},
		{"HostAddressIPv6", cpcKVM, []func(*unstructured.Unstructured){set("spec.kvm.hosts", []any{map[string]any{"name": "beelink", "address": "[fd00::5]:22", "user": "proxy", "bridge": "br0"}})}},
		{"GoDurations", cpcKVM, []func(*unstructured.Unstructured){set("spec.kvm.unusedImageRetention", "0s"), set("spec.orphans", map[string]any{"minAge": "1h30m"}), set("spec.kvm.egressCheck", map[string]any{"url": "http://echo.example.com/ip", "interval": "1.5h"})}},
		{"EgressCheckEveryMinute", cpcPods, []func(*unstructured.Unstructured){set("spec.kubernetes.egressCheck", map[string]any{"url": "http://echo.example.com/ip", "interval": "1m"})}},
		{"EgressCheckURLWithPortAndPath", cpcKVM, []func(*unstructured.Unstructured){set("spec.kvm.egressCheck", map[string]any{"url": "https://echo.example.com:8443/v1/ip%2Fv4"})}},
		{"EgressCheckURLPort65535", cpcPVE, []func(*unstructured.Unstructured){set("spec.proxmox.egressCheck", map[string]any{"url": "http://echo.example.com:65535"})}},
		{"EgressCheckURLPort1", cpcPVE, []func(*unstructured.Unstructured){set("spec.proxmox.egressCheck", map[string]any{"url": "http://203.0.113.7:1/ip"})}},
		{"EgressCheckURLIPv6", cpcGCP, []func(*unstructured.Unstructured){set("spec.gcp.egressCheck", map[string]any{"url": "http://[2001:db8::1]:8080/ip"})}},
		{"EgressCheckURLIPv4MappedIPv6", cpcPods, []func(*unstructured.Unstructured){set("spec.kubernetes.egressCheck", map[string]any{"url": "http://[::ffff:203.0.113.7]/ip"})}},
		{"EgressCheckURLIPv4MappedIPv6Hex", cpcPods, []func(*unstructured.Unstructured){set("spec.kubernetes.egressCheck", map[string]any{"url": "http://[::FFFF:cb00:7107]/ip"})}},
		{"GCPEndpointAddressAndPort", cpcGCP, []func(*unstructured.Unstructured){set("spec.gcp.endpoint", "https://127.0.0.1:8443/")}},
		{"PoliciesPaused", nsKVM, []func(*unstructured.Unstructured){set("spec.managementPolicies", []any{})}},
		{"PoliciesObserveOnly", nsGCP, []func(*unstructured.Unstructured){set("spec.managementPolicies", []any{"Observe"})}},
		{"PoliciesWithoutDelete", clPod, []func(*unstructured.Unstructured){set("spec.managementPolicies", []any{"Observe", "Create", "Update", "LateInitialize"})}},
		{"PoliciesObserveDelete", nsPod, []func(*unstructured.Unstructured){set("spec.managementPolicies", []any{"Observe", "Delete"})}},
	}
	for _, tc := range accepts {
		t.Run("Accepts"+tc.name, func(t *testing.T) {
			if err := create(t, tc.base, "ok-"+strings.ToLower(tc.name), tc.mutate); err != nil {
				t.Fatalf("rejected: %v", err)
			}
		})
	}

	updates := []struct {
		name   string
		base   example
		mutate func(*unstructured.Unstructured)
		want   []string // empty: the update is accepted
	}{
		{"HostIsImmutable", nsKVM, set("spec.forProvider.host", "other"), []string{"spec.forProvider.host", "host is immutable"}},
		{"MachineTypeIsImmutable", nsKVM, set("spec.forProvider.machineType", "large"), []string{"spec.forProvider.machineType", "machineType is immutable"}},
		{"CloudInitIsImmutable", nsKVM, unset("spec.forProvider.cloudInit"), []string{"spec.forProvider.cloudInit", "cloudInit is immutable"}},
		{"ImageIsImmutable", nsGCP, set("spec.forProvider.image", "debian-12"), []string{"spec.forProvider.image", "image is immutable"}},
		{"AddressTypeIsImmutable", nsGCP, set("spec.forProvider.address.type", "Ephemeral"), []string{"spec.forProvider.address", "address.type is immutable"}},
		{"StaticAddressBlockCannotGo", nsGCP, unset("spec.forProvider.address"), []string{"spec.forProvider.address", "address.type is immutable"}},
		{"ProxyBlockIsMutable", nsPod, set("spec.forProvider.proxy.allowedClientCIDRs", []any{"10.1.0.0/16", "fd00::/8"}), nil},
		{"AuthCannotBeTurnedOffWhileOpen", nsPod, func(u *unstructured.Unstructured) {
			set("spec.forProvider.proxy.allowedClientCIDRs", []any{"0.0.0.0/0"})(u)
			set("spec.forProvider.proxy.auth.enabled", false)(u)
		}, []string{"spec.forProvider.proxy.allowedClientCIDRs", "without auth"}},
		{"OpenWithAuthIsAllowed", nsPod, set("spec.forProvider.proxy.allowedClientCIDRs", []any{"0.0.0.0/0", "::/0"}), nil},
		{"InstallationIDCanBeSetOnce", cpcPods, set("spec.installationID", "prod-eu"), nil},
		{"InstallationIDCannotChange", cpcPods, set("spec.installationID", "prod-us"), []string{"spec.installationID", "cannot change once set"}},
	}
	// No address block is Ephemeral: writing the block of the default
	// later changes nothing and is accepted.
	t.Run("UpdateDefaultAddressBlockMayBeWritten", func(t *testing.T) {
		if err := create(t, nsGCP, "ok-default-address", []func(*unstructured.Unstructured){unset("spec.forProvider.address")}); err != nil {
			t.Fatal(err)
		}
		u := &unstructured.Unstructured{}
		u.SetGroupVersionKind(schema.GroupVersionKind{Group: nsGCP.group, Version: "v1alpha1", Kind: nsGCP.kind})
		ex := find(t, examples, nsGCP.group, nsGCP.kind, nsGCP.name)
		if err := kube.Get(ctx, client.ObjectKey{Namespace: ex.GetNamespace(), Name: "ok-default-address"}, u); err != nil {
			t.Fatal(err)
		}
		set("spec.forProvider.address", map[string]any{"type": "Ephemeral"})(u)
		if err := kube.Update(ctx, u); err != nil {
			t.Errorf("writing address {type: Ephemeral} on a GCPProxy made without one: %v", err)
		}
	})
	for _, tc := range updates {
		t.Run("Update"+tc.name, func(t *testing.T) {
			u := &unstructured.Unstructured{}
			u.SetGroupVersionKind(schema.GroupVersionKind{Group: tc.base.group, Version: "v1alpha1", Kind: tc.base.kind})
			ex := find(t, examples, tc.base.group, tc.base.kind, tc.base.name)
			if err := kube.Get(ctx, client.ObjectKeyFromObject(ex), u); err != nil {
				t.Fatal(err)
			}
			tc.mutate(u)
			err := kube.Update(ctx, u)
			if len(tc.want) == 0 {
				if err != nil {
					t.Fatalf("update rejected: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("update accepted, want a rejection naming %q", tc.want)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("rejection does not say %q:\n%v", w, err)
				}
			}
		})
	}
}
