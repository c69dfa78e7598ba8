package main_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	nsproxy "github.com/egressproxy/provider-egressproxy/apis/namespaced/proxy/v1alpha1"
	nsv1alpha1 "github.com/egressproxy/provider-egressproxy/apis/namespaced/v1alpha1"
	spec "github.com/egressproxy/provider-egressproxy/apis/spec/v1alpha1"
	"github.com/egressproxy/provider-egressproxy/internal/backend/kubernetes"
	pcontroller "github.com/egressproxy/provider-egressproxy/internal/controller"
	"github.com/egressproxy/provider-egressproxy/internal/devenv/controlplane"
	"github.com/egressproxy/provider-egressproxy/internal/devenv/testenv"
)

// TestInstallationIDSurvivesItsConfigMapIntegration: the ConfigMap that
// keeps the installation ID is deleted and the provider restarted; it
// makes the ConfigMap again with the same ID, read back from the configs'
// status, and goes on treating its instances as its own (it updates a
// PodProxy's Deployment rather than calling it another installation's).
func TestInstallationIDSurvivesItsConfigMapIntegration(t *testing.T) {
	root, bin := buildProvider(t)
	cp := controlplane.ForTest(t, controlplane.Options{CRDDirectories: []string{filepath.Join(root, "package", "crds")}})
	s, err := pcontroller.Scheme()
	if err != nil {
		t.Fatal(err)
	}
	kube, err := client.New(cp.Config, client.Options{Scheme: s})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, ns := range []string{"crossplane-system", "egress-proxies", "team-a"} {
		if err := kube.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil && !kerrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	cpc := &nsv1alpha1.ClusterProviderConfig{ObjectMeta: metav1.ObjectMeta{Name: "pods"},
		Spec: nsv1alpha1.ClusterProviderConfigSpec{ProviderConfigSpec: spec.ProviderConfigSpec{Kubernetes: &spec.KubernetesConfig{
			Credentials: spec.KubernetesCredentials{Source: xpv2.CredentialsSourceInjectedIdentity}, Namespace: "egress-proxies"}}}}
	pp := &nsproxy.PodProxy{ObjectMeta: metav1.ObjectMeta{Name: "egress", Namespace: "team-a"}}
	pp.Spec.ProviderConfigReference = &xpv2.ProviderConfigReference{Kind: "ClusterProviderConfig", Name: "pods"}
	pp.Spec.ForProvider.Proxy = spec.ProxySettings{AllowedClientCIDRs: []string{"10.0.0.0/16"}}
	// A random ID, as a provider under Crossplane's RBAC (no read of the
	// kube-system namespace) makes: nothing else derives it.
	const random = "r5e1f0a7c"
	installation := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "crossplane-system", Name: "provider-egressproxy-installation"}, Data: map[string]string{"id": random}}
	for _, o := range []client.Object{installation, cpc, pp} {
		if err := kube.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}

	out := &testenv.Buffer{}
	start := func() func() {
		pctx, stop := context.WithCancel(ctx)
		cmd := exec.CommandContext(pctx, bin, "--poll-not-ready", "2s", "--config-check-interval", "2s",
			"--metrics-bind-address", "0", "--health-probe-bind-address", "0")
		cmd.Env = append(os.Environ(), "KUBECONFIG="+cp.KubeconfigPath, "GCE_METADATA_HOST=127.0.0.1:9")
		cmd.Stdout, cmd.Stderr = out, out
		cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		var stopped bool
		halt := func() {
			if !stopped {
				stopped = true
				stop()
				_ = cmd.Wait()
			}
		}
		t.Cleanup(func() {
			halt()
			if t.Failed() {
				t.Logf("provider output (tail):\n%s", tail(out.String(), 60))
			}
		})
		return halt
	}
	deployment := func() (*appsv1.Deployment, string) {
		l := &appsv1.DeploymentList{}
		if err := kube.List(ctx, l, client.InNamespace("egress-proxies"), client.MatchingLabels{kubernetes.LabelUID: string(pp.UID)}); err != nil {
			return nil, err.Error()
		}
		if len(l.Items) != 1 {
			return nil, "no Deployment of the PodProxy yet"
		}
		return &l.Items[0], ""
	}
	configMap := func() (string, error) {
		cm := &corev1.ConfigMap{}
		err := kube.Get(ctx, client.ObjectKey{Namespace: "crossplane-system", Name: "provider-egressproxy-installation"}, cm)
		return cm.Data["id"], err
	}

	stop := start()
	var id string
	testenv.WaitFor(t, "the PodProxy's Deployment and the config's status.installationID", 60*time.Second, func() (bool, string) {
		dep, why := deployment()
		if dep == nil {
			return false, why
		}
		id = dep.Labels[kubernetes.LabelInstallation]
		if err := kube.Get(ctx, client.ObjectKeyFromObject(cpc), cpc); err != nil {
			return false, err.Error()
		}
		return id != "" && cpc.Status.InstallationID == id, "status.installationID " + cpc.Status.InstallationID + ", Deployment's " + id
	})
	if id != random {
		t.Fatalf("the Deployment carries installation %q, want the ConfigMap's %q", id, random)
	}
	if kept, err := configMap(); err != nil || kept != id {
		t.Fatalf("ConfigMap data.id = %q, %v; want %q", kept, err, id)
	}
	stop()

	if err := kube.Delete(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "crossplane-system", Name: "provider-egressproxy-installation"}}); err != nil {
		t.Fatal(err)
	}
	start()
	testenv.WaitFor(t, "the ConfigMap made again", 30*time.Second, func() (bool, string) {
		got, err := configMap()
		if err != nil {
			return false, err.Error()
		}
		if got != id {
			t.Fatalf("the ConfigMap came back with installation ID %q, want %q (what the instances carry)", got, id)
		}
		return true, ""
	})

	// A change to the proxy reaches its Deployment: the provider still
	// takes the instance for its own.
	dep, _ := deployment()
	hash := dep.Annotations[kubernetes.AnnotationSpecHash]
	if err := kube.Get(ctx, client.ObjectKeyFromObject(pp), pp); err != nil {
		t.Fatal(err)
	}
	pp.Spec.ForProvider.Proxy.AllowedPorts = []int32{443, 8443}
	if err := kube.Update(ctx, pp); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, "the Deployment updated after the restart", 60*time.Second, func() (bool, string) {
		dep, why := deployment()
		if dep == nil {
			return false, why
		}
		u := &nsproxy.PodProxy{}
		_ = kube.Get(ctx, client.ObjectKeyFromObject(pp), u)
		c := u.GetCondition(xpv2.TypeSynced)
		return dep.Annotations[kubernetes.AnnotationSpecHash] != hash && dep.Labels[kubernetes.LabelInstallation] == id, "Synced=" + string(c.Status) + " " + c.Message
	})
}
