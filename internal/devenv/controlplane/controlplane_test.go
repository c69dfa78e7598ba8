package controlplane

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

func eventually(t *testing.T, timeout time.Duration, what string, cond func() (bool, error)) {
	t.Helper()
	start := time.Now()
	var lastErr error
	for time.Since(start) < timeout {
		ok, err := cond()
		if ok {
			t.Logf("%s after %.1fs", what, time.Since(start).Seconds())
			return
		}
		lastErr = err
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("%s: not within %s (last error: %v)", what, timeout, lastErr)
}

// TestControlPlaneIntegrationWithRealBinaries needs the real etcd,
// kube-apiserver and kube-controller-manager (hack/controlplane-bins.sh
// builds them; it fails, never skips, without them).
func TestControlPlaneIntegrationWithRealBinaries(t *testing.T) {
	cp := ForTest(t, Options{CRDDirectories: []string{WriteCRDs(t, WidgetCRD)}, ControllerManager: true})
	ctx := t.Context()

	for _, name := range []string{"etcd", "kube-apiserver", "kube-controller-manager"} {
		pid, ok := cp.PIDs()[name]
		if _, alive := procStartTime(pid); !ok || !alive {
			t.Fatalf("%s: no live process recorded (pids %v)", name, cp.PIDs())
		}
	}

	// The kubeconfig file works on its own.
	fileCfg, err := clientcmd.BuildConfigFromFlags("", cp.KubeconfigPath)
	if err != nil {
		t.Fatal(err)
	}
	cs := kubernetes.NewForConfigOrDie(fileCfg)
	v, err := cs.Discovery().ServerVersion()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := strconv.Atoi(v.Minor); err != nil || v.Major != "1" {
		t.Errorf("server version %s: major %q minor %q, want plain numbers (check the -X flags in hack/controlplane-bins.sh)", v.GitVersion, v.Major, v.Minor)
	}

	// The CRD was installed before Start returned.
	if _, err := dynamic.NewForConfigOrDie(cp.Config).Resource(WidgetsResource).Namespace("default").List(ctx, metav1.ListOptions{}); err != nil {
		t.Fatalf("listing widgets: %v", err)
	}

	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "cp-test"}}
	if _, err := cs.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	t.Run("GarbageCollectorDeletesDependents", func(t *testing.T) {
		cms := cs.CoreV1().ConfigMaps("cp-test")
		owner, err := cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "owner"}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		dep := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "dependent", OwnerReferences: []metav1.OwnerReference{{
			APIVersion: "v1", Kind: "ConfigMap", Name: owner.Name, UID: owner.UID,
		}}}}
		if _, err := cms.Create(ctx, dep, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if err := cms.Delete(ctx, owner.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		eventually(t, 30*time.Second, "dependent ConfigMap garbage-collected", func() (bool, error) {
			_, err := cms.Get(ctx, "dependent", metav1.GetOptions{})
			return apierrors.IsNotFound(err), err
		})
	})

	t.Run("DeploymentGetsPod", func(t *testing.T) {
		one := int32(1)
		labels := map[string]string{"app": "cp-test"}
		d := &appsv1.Deployment{
			ObjectMeta: metav1.ObjectMeta{Name: "web"},
			Spec: appsv1.DeploymentSpec{
				Replicas: &one,
				Selector: &metav1.LabelSelector{MatchLabels: labels},
				Template: corev1.PodTemplateSpec{
					ObjectMeta: metav1.ObjectMeta{Labels: labels},
					Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "web", Image: "example.invalid/web:1"}}},
				},
			},
		}
		if _, err := cs.AppsV1().Deployments("cp-test").Create(ctx, d, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		eventually(t, 30*time.Second, "Deployment's Pod created", func() (bool, error) {
			pods, err := cs.CoreV1().Pods("cp-test").List(ctx, metav1.ListOptions{LabelSelector: "app=cp-test"})
			return err == nil && len(pods.Items) > 0, err
		})
	})

	t.Run("NamespaceDeletionCompletes", func(t *testing.T) {
		nss := cs.CoreV1().Namespaces()
		if _, err := nss.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "doomed"}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := cs.CoreV1().ConfigMaps("doomed").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "content"}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if err := nss.Delete(ctx, "doomed", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		eventually(t, 30*time.Second, "namespace deleted", func() (bool, error) {
			_, err := nss.Get(ctx, "doomed", metav1.GetOptions{})
			return apierrors.IsNotFound(err), err
		})
	})

	// Stop leaves no process behind and removes the temporary folder.
	pids := cp.PIDs()
	start := time.Now()
	if err := cp.Stop(); err != nil {
		t.Fatal(err)
	}
	t.Logf("stopped in %.1fs", time.Since(start).Seconds())
	for name, pid := range pids {
		if _, alive := procStartTime(pid); alive {
			t.Errorf("%s (pid %d) still running after Stop", name, pid)
		}
	}
	if _, err := os.Stat(cp.Dir); !os.IsNotExist(err) {
		t.Errorf("temporary folder %s not removed: %v", cp.Dir, err)
	}
}

// TestControlPlaneIntegrationStartFailureLeavesNoProcess needs the real
// binaries: a CRD the apiserver rejects makes Start fail after etcd and
// kube-apiserver run; Start must stop them before returning its error.
func TestControlPlaneIntegrationStartFailureLeavesNoProcess(t *testing.T) {
	bin, err := BinDir(context.Background(), nil)
	if err != nil {
		t.Fatalf("cannot get the control-plane binaries: %v", err)
	}
	bad := strings.Replace(WidgetCRD, "name: widgets.test.egressproxy.io", "name: wrong.test.egressproxy.io", 1)
	dir := t.TempDir()
	start := time.Now()
	cp, err := Start(t.Context(), Options{BinDir: bin, Dir: dir, CRDDirectories: []string{WriteCRDs(t, bad)}})
	if err == nil {
		_ = cp.Stop()
		t.Fatal("Start with an invalid CRD succeeded")
	}
	t.Logf("Start failed as expected after %.1fs: %v", time.Since(start).Seconds(), firstLine(err.Error()))
	for _, name := range []string{"etcd", "kube-apiserver"} {
		b, err := os.ReadFile(filepath.Join(dir, "pids", name+".pid"))
		if err != nil {
			t.Fatalf("%s never started (%v): the test does not test what it should", name, err)
		}
		pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
		if _, alive := procStartTime(pid); alive {
			t.Errorf("%s (pid %d) still running after a failed Start", name, pid)
		}
	}
}

func firstLine(s string) string {
	l, _, _ := strings.Cut(s, "\n")
	return l
}
