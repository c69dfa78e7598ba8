package pod_test

import (
	"fmt"
	"testing"
	"time"

	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	nsproxy "github.com/egressproxy/provider-egressproxy/apis/namespaced/proxy/v1alpha1"
	nsv1alpha1 "github.com/egressproxy/provider-egressproxy/apis/namespaced/v1alpha1"
	spec "github.com/egressproxy/provider-egressproxy/apis/spec/v1alpha1"
	"github.com/egressproxy/provider-egressproxy/internal/devenv/testenv"
)

// TestPodProxyNamespaceDeletionIntegration: kubectl delete namespace of a
// tenant's namespace completes, with the real namespace controller
// (kube-controller-manager) deleting in its own order, and leaves no pod,
// Deployment, Secret, Service or NetworkPolicy of its proxies: a Ready
// PodProxy on the ClusterProviderConfig pods (the namespace holds no
// Secret of its own for it), and two on the tenant's own ProviderConfig,
// whose target cluster is reached through the tenant's kubeconfig Secret,
// one with a password Secret. Each round is a namespace of its own; the
// second deletes it while the proxies are still being created.
func TestPodProxyNamespaceDeletionIntegration(t *testing.T) {
	e := start(t)
	for i, ready := range []bool{true, false, true} {
		t.Run(fmt.Sprintf("Round%d", i+1), func(t *testing.T) {
			ns := fmt.Sprintf("tenant-pods-%d", i+1)
			e.Create(t,
				&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}},
				&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "kubeconfig", Namespace: ns}, Data: map[string][]byte{"kubeconfig": e.ControlPlane.Kubeconfig}},
				&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "proxy-password", Namespace: ns}, StringData: map[string]string{"password": "tenant-password-0123"}},
				&nsv1alpha1.ProviderConfig{ObjectMeta: metav1.ObjectMeta{Name: "own-pods", Namespace: ns},
					Spec: nsv1alpha1.NamespacedProviderConfigSpec{ProviderConfigSpec: spec.ProviderConfigSpec{Kubernetes: &spec.KubernetesConfig{
						Credentials: spec.KubernetesCredentials{Source: xpv2.CredentialsSourceSecret, SecretRef: &spec.SecretKeySelector{Name: "kubeconfig", Key: "kubeconfig"}},
						Namespace:   proxyNS,
					}}}},
			)
			platform := nsPodProxy(ns, "platform", "ClusterProviderConfig", "pods")
			platform.Spec.WriteConnectionSecretToReference = &xpv2.LocalSecretReference{Name: "platform-proxy"}
			own := nsPodProxy(ns, "own", "ProviderConfig", "own-pods")
			own.Spec.WriteConnectionSecretToReference = &xpv2.LocalSecretReference{Name: "own-proxy"}
			withPassword := nsPodProxy(ns, "own-password", "ProviderConfig", "own-pods")
			withPassword.Spec.ForProvider.Proxy.Auth = &spec.ProxyAuth{Enabled: true, PasswordSecretRef: &spec.SecretKeySelector{Name: "proxy-password", Key: "password"}}
			proxies := []*nsproxy.PodProxy{platform, own, withPassword}
			for _, p := range proxies {
				e.Create(t, p)
			}
			e.WaitProtected(t, ns, "own-pods", "kubeconfig")
			if ready {
				for _, p := range proxies {
					e.WaitReady(t, p)
				}
			}
			uids := make([]types.UID, 0, len(proxies))
			for _, p := range proxies {
				uids = append(uids, p.GetUID())
			}

			start := time.Now()
			e.DeleteNamespace(t, ns, e.within(3*time.Minute))
			t.Logf("namespace %s gone %.1fs after its delete", ns, time.Since(start).Seconds())
			testenv.WaitFor(t, "the proxies' objects in "+proxyNS+" to be gone", e.within(30*time.Second), func() (bool, string) {
				var left []string
				for _, uid := range uids {
					left = append(left, e.objects(t, uid)...)
				}
				return len(left) == 0, fmt.Sprintf("these remain: %v", left)
			})
			e.CheckNoFinalizerLeft(t, proxyNS)
		})
	}
}
