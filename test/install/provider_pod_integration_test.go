//go:build linux

package install_test

import (
	"context"
	"fmt"
	"net/url"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/egressproxy/provider-egressproxy/internal/devenv/controlplane"
	"github.com/egressproxy/provider-egressproxy/internal/devenv/localcrossplane"
	xpt "github.com/egressproxy/provider-egressproxy/internal/devenv/localcrossplane/crossplanetest"
	"github.com/egressproxy/provider-egressproxy/internal/devenv/testenv"
)

// TestProviderPodIntegration: the provider Crossplane's package manager
// installs runs as a real pod on the real node (internal/devenv/controlplane's
// Options.Node): containerd pulls the package's runtime image from the
// test's TLS registry (trusting its CA through certs.d/hosts.toml), the
// kubelet runs it under the ServiceAccount Crossplane made, with the
// token the kubelet projects, and the ProviderRevision turns Healthy from
// the pod's real readiness. A ProxmoxProxy then becomes Ready through it.
//
// What the test environment needs that a cluster would not (the runtime
// config provider-pod below; docs/development.md, "The provider as a real
// pod"): the control plane's kube-apiserver listens on 127.0.0.1 only,
// so the pod uses the host's network and KUBERNETES_SERVICE_HOST/PORT
// name that address (a ClusterIP Service cannot forward to loopback);
// envtest turns off the ServiceAccount admission plugin, so the runtime
// config mounts the token volume the plugin would add (a projected
// serviceAccountToken and the cluster's CA, from a kube-root-ca.crt
// ConfigMap the test writes as kube-controller-manager would).
func TestProviderPodIntegration(t *testing.T) {
	controlplane.RequireNode(t)
	ctx := context.Background()
	dir := t.TempDir()
	tools := xpt.GetTools(t)
	reg, caFile, repo := xpt.Registry(t, dir)
	root, cliBin, bins := tools.Root, tools.CLI, tools.CoreBins
	pkgs := filepath.Join(dir, "xpkg")
	const v = "v0.2.0"
	xpt.Script(t, root, []string{"VERSION=" + v, "XPKG_REPO=" + repo, "PLATFORMS=linux/" + goruntime.GOARCH}, "xpkg.sh", pkgs)
	xpt.CLI(t, cliBin, []string{"SSL_CERT_FILE=" + caFile}, "xpkg", "push", "-f",
		filepath.Join(pkgs, providerName+"-"+v+"-"+goruntime.GOARCH+".xpkg"), repo+"/"+providerName+":"+v)

	cp := controlplane.ForTest(t, controlplane.Options{
		CRDDirectories:    []string{filepath.Join(bins, "crds")},
		ControllerManager: true,
		Node:              &controlplane.NodeOptions{RegistryCAs: map[string][]byte{reg.Host: reg.CAPEM}},
	})
	t.Logf("FIGURE node Ready in %.1fs", cp.Node.ReadyIn.Seconds())
	kube := xpt.Client(t, cp, crossplaneNS, "team-a")
	for _, o := range []client.Object{
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: crossplaneNS, Name: "crossplane"}},
		// What kube-controller-manager's root-ca-cert-publisher writes in
		// every namespace.
		&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: crossplaneNS, Name: "kube-root-ca.crt"}, Data: map[string]string{"ca.crt": string(cp.Config.CAData)}},
	} {
		if err := kube.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	xpt.StartCore(t, localcrossplane.CoreOptions{BinDir: bins, Kubeconfig: cp.KubeconfigPath, Dir: dir, CAFile: caFile})
	t.Cleanup(func() {
		if t.Failed() {
			out, _ := exec.Command(cp.Node.Ctr()[0], append(cp.Node.Ctr()[1:], "containers", "list")...).CombinedOutput() //nolint:gosec // ctr of the test's node.
			t.Logf("containerd's containers:\n%s", out)
			pl := &corev1.PodList{}
			_ = kube.List(ctx, pl, client.InNamespace(crossplaneNS))
			for _, p := range pl.Items {
				t.Logf("pod %s: phase %s, conditions %+v, containers %+v", p.Name, p.Status.Phase, p.Status.Conditions, p.Status.ContainerStatuses)
			}
		}
	})

	api, err := url.Parse(cp.Config.Host)
	if err != nil {
		t.Fatal(err)
	}
	healthPort := testenv.FreePort(t)
	xpt.ApplyYAML(t, kube, fmt.Sprintf(`
apiVersion: apiextensions.crossplane.io/v1alpha1
kind: ManagedResourceActivationPolicy
metadata:
  name: egressproxy-proxmox
spec:
  activate: [proxmoxproxies.proxy.m.egressproxy.io]
---
apiVersion: pkg.crossplane.io/v1beta1
kind: DeploymentRuntimeConfig
metadata:
  name: provider-pod
spec:
  deploymentTemplate:
    spec:
      selector: {}
      template:
        spec:
          hostNetwork: true
          dnsPolicy: ClusterFirstWithHostNet
          volumes:
            - name: kube-api-access
              projected:
                sources:
                  - serviceAccountToken: {path: token, expirationSeconds: 3607}
                  - configMap: {name: kube-root-ca.crt, items: [{key: ca.crt, path: ca.crt}]}
                  - downwardAPI: {items: [{path: namespace, fieldRef: {fieldPath: metadata.namespace}}]}
          containers:
            - name: package-runtime
              args: [--metrics-bind-address=0, --health-probe-bind-address=127.0.0.1:%[3]d]
              env:
                - {name: KUBERNETES_SERVICE_HOST, value: %[1]q}
                - {name: KUBERNETES_SERVICE_PORT, value: %[2]q}
              volumeMounts:
                - {name: kube-api-access, mountPath: /var/run/secrets/kubernetes.io/serviceaccount, readOnly: true}
              readinessProbe:
                httpGet: {host: 127.0.0.1, port: %[3]d, path: /readyz}
                periodSeconds: 2
                timeoutSeconds: 5
`, api.Hostname(), api.Port(), healthPort))

	t0 := time.Now()
	xpt.CLI(t, cliBin, []string{"KUBECONFIG=" + cp.KubeconfigPath}, "xpkg", "install", "provider", repo+"/"+providerName+":"+v, providerObj, "--runtime-config=provider-pod")
	var pod corev1.Pod
	testenv.WaitFor(t, "the provider's pod to be Running and Ready on the node", 5*time.Minute, func() (bool, string) {
		pl := &corev1.PodList{}
		if err := kube.List(ctx, pl, client.InNamespace(crossplaneNS), client.HasLabels{"pkg.crossplane.io/provider"}); err != nil {
			return false, err.Error()
		}
		var seen []string
		for _, p := range pl.Items {
			ready := false
			for _, c := range p.Status.Conditions {
				if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
					ready = true
				}
			}
			var st []string
			for _, c := range p.Status.ContainerStatuses {
				st = append(st, fmt.Sprintf("%s ready=%v restarts=%d state=%+v last=%+v", c.Name, c.Ready, c.RestartCount, c.State, c.LastTerminationState))
			}
			seen = append(seen, fmt.Sprintf("%s on %q %s %v", p.Name, p.Spec.NodeName, p.Status.Phase, st))
			if p.Spec.NodeName == cp.Node.Name && p.Status.Phase == corev1.PodRunning && ready {
				pod = p
				return true, ""
			}
		}
		return false, strings.Join(seen, "; ")
	})
	t.Logf("FIGURE install to the provider's pod Ready on the real node: %.1fs", time.Since(t0).Seconds())
	cs := pod.Status.ContainerStatuses[0]
	if cs.ImageID == "" || !strings.HasPrefix(cs.Image, repo+"/"+providerName) {
		t.Errorf("the pod's container runs image %q (ID %q); want the package pulled from %s", cs.Image, cs.ImageID, repo)
	}
	if want := pod.Spec.ServiceAccountName; !strings.HasPrefix(want, providerObj) {
		t.Errorf("the pod runs as ServiceAccount %q; want the one Crossplane made for the revision", want)
	}
	var r *unstructured.Unstructured
	testenv.WaitFor(t, "the ProviderRevision to be Healthy", 3*time.Minute, func() (bool, string) {
		var seen string
		r, seen = activeRevision(t, kube, "ProviderRevision", "pkg.crossplane.io/package", providerObj)
		if r == nil {
			return false, seen
		}
		h, _ := localcrossplane.Condition(r, "RevisionHealthy")
		rh, _ := localcrossplane.Condition(r, "RuntimeHealthy")
		return h == "True" && rh == "True", seen
	})
	t.Logf("FIGURE install to ProviderRevision %s Healthy (provider as a real pod): %.1fs", r.GetName(), time.Since(t0).Seconds())

	// A proxy through it: a ProxmoxProxy against the fake Proxmox VE.
	pve, _ := xpt.ProxmoxProxy(t, kube, "team-a")
	t1 := time.Now()
	xpt.WaitCondition(t, kube, pve, "Ready", 3*time.Minute)
	t.Logf("ProxmoxProxy Ready through the provider pod %.1fs after creation", time.Since(t1).Seconds())

	if err := kube.Get(ctx, client.ObjectKeyFromObject(&pod), &pod); err != nil {
		t.Fatal(err)
	}
	if n := pod.Status.ContainerStatuses[0].RestartCount; n != 0 {
		t.Errorf("the provider's container restarted %d times; want none", n)
	}
}
