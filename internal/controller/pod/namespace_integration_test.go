package pod_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
	corev1 "k8s.io/api/core/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	nsproxy "github.com/egressproxy/provider-egressproxy/apis/namespaced/proxy/v1alpha1"
	nsv1alpha1 "github.com/egressproxy/provider-egressproxy/apis/namespaced/v1alpha1"
	spec "github.com/egressproxy/provider-egressproxy/apis/spec/v1alpha1"
	"github.com/egressproxy/provider-egressproxy/internal/backend/kubernetes"
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
// second deletes it while the proxies are still being created, the others
// hold the proxies' pods until the namespace controller has deleted
// everything else in it.
func TestPodProxyNamespaceDeletionIntegration(t *testing.T) {
	e := start(t)
	ctx := context.Background()
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
			var held []*corev1.Pod
			if ready {
				// Each proxy's pod is held, as its grace period would hold
				// it, until the namespace controller has deleted everything
				// else (usages, config, Secrets): the order that needs the
				// most of the proxies' Delete.
				for _, uid := range uids {
					held = append(held, e.hold(t, uid))
				}
			}

			start := time.Now()
			if err := e.Kube.Delete(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
				t.Fatal(err)
			}
			if ready {
				e.WaitSwept(t, ns, e.within(2*time.Minute))
				// Long enough for the proxies to reconcile without their
				// usages and with their config and Secrets being deleted.
				time.Sleep(3 * time.Second)
				for _, p := range proxies {
					if err := e.Kube.Get(ctx, client.ObjectKeyFromObject(p), p); err != nil {
						t.Fatalf("proxy %s: %v; want it being deleted, held by its pod", p.Name, err)
					}
				}
				for _, pod := range held {
					e.release(t, pod)
				}
			}
			e.WaitNamespaceGone(t, ns, e.within(3*time.Minute))
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

// hold puts holdFinalizer on the pod of the proxy with this MR UID and
// returns it; release takes it away.
func (e *env) hold(t *testing.T, uid types.UID) *corev1.Pod {
	t.Helper()
	pods := &corev1.PodList{}
	if err := e.Kube.List(context.Background(), pods, client.MatchingLabels{kubernetes.LabelUID: string(uid)}); err != nil || len(pods.Items) != 1 {
		t.Fatalf("the proxy's pods: %v, %d", err, len(pods.Items))
	}
	pod := &pods.Items[0]
	e.Update(t, pod, func() { pod.Finalizers = append(pod.Finalizers, holdFinalizer) })
	t.Cleanup(func() { e.release(t, pod) })
	return pod
}

// release takes holdFinalizer off pod.
func (e *env) release(t *testing.T, pod *corev1.Pod) {
	t.Helper()
	patch := client.RawPatch(types.JSONPatchType, []byte(`[{"op":"remove","path":"/metadata/finalizers"}]`))
	if err := e.Kube.Patch(context.Background(), pod, patch); err != nil && !kerrors.IsNotFound(err) && !kerrors.IsInvalid(err) {
		t.Errorf("releasing pod %s: %v", pod.Name, err)
	}
}
