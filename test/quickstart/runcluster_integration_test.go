//go:build linux

package quickstart_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/egressproxy/provider-egressproxy/internal/devenv/controlplane"
	"github.com/egressproxy/provider-egressproxy/internal/devenv/localcrossplane"
	xpt "github.com/egressproxy/provider-egressproxy/internal/devenv/localcrossplane/crossplanetest"
	"github.com/egressproxy/provider-egressproxy/internal/devenv/testenv"
)

// TestRunClusterIntegration is `make run` with KUBECONFIG set
// (hack/run-cluster.sh), run as a user would on their own cluster:
//
//   - InstallsIntoCrossplane: a cluster that runs Crossplane core (package
//     manager and RBAC manager) but none of the packages, its registry at
//     XPKG_REPO with its CA in SSL_CERT_FILE. make run builds and pushes
//     the packages and installs them with crossplane xpkg install: the
//     Provider, Function and Configuration turn Healthy, and a
//     ProxmoxProxy on the fake Proxmox VE turns Ready through the
//     installed provider (its pod's process, under the ServiceAccount
//     Crossplane made).
//   - RefusesASecondInstall: make run again is refused, naming the
//     installed Provider.
//   - UnreachableCluster: KUBECONFIG names a server that does not answer;
//     make run says so and stops.
//   - OutOfClusterWithoutCrossplane: a plain control plane, with no
//     namespace crossplane-system. make run says there is no Crossplane,
//     applies the CRDs, makes the provider's namespace crossplane-system
//     and runs the provider as a process here (its installation ID kept
//     there); a ProxmoxProxy turns Ready through it. Then SIGINT, as
//     Ctrl-C, and nothing make run started is left running.
func TestRunClusterIntegration(t *testing.T) {
	root, err := controlplane.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}

	installed := t.Run("InstallsIntoCrossplane", func(t *testing.T) {
		c := xpt.Start(t, xpt.Options{Activations: []string{"*"}, Namespaces: []string{"team-a"}})
		env := clusterEnv(t, c.CP.KubeconfigPath, trustBundle(t, c.CAFile))
		t0 := time.Now()
		out := makeRunOnce(t, root, env, true, "XPKG_REPO="+c.Repo)
		t.Logf("FIGURE make run with KUBECONFIG (build, push, install, Healthy): %.1fs", time.Since(t0).Seconds())
		for _, want := range []string{
			"make run: the cluster in KUBECONFIG=" + c.CP.KubeconfigPath + " runs Crossplane",
			"make run: installed v",
		} {
			if !strings.Contains(out, want) {
				t.Errorf("make run printed no %q:\n%s", want, out)
			}
		}
		for kind, name := range map[string]string{"Provider": xpt.ProviderObject, "Function": xpt.FunctionObject, "Configuration": xpt.ConfigurationPackage} {
			o := xpt.U("pkg.crossplane.io/v1", kind, "", name)
			xpt.WaitCondition(t, c.Kube, o, "Healthy", time.Minute)
			if pkg, _, _ := unstructured.NestedString(o.Object, "spec", "package"); !strings.HasPrefix(pkg, c.Repo+"/") {
				t.Errorf("%s %s installs package %q; want one pushed to XPKG_REPO=%s", kind, name, pkg, c.Repo)
			}
		}
		pve, _ := xpt.ProxmoxProxy(t, c.Kube, "team-a")
		xpt.WaitCondition(t, c.Kube, pve, "Ready", 3*time.Minute)
		// Through the installed provider: its pod's process is the one
		// that runs.
		if l := c.Pods.Logs(xpt.ProviderObject); !strings.Contains(l, "egress-pve") {
			t.Errorf("the installed provider's log names no egress-pve; the ProxmoxProxy was not reconciled by it:\n%s", l)
		}

		t.Run("RefusesASecondInstall", func(t *testing.T) {
			out := makeRunOnce(t, root, env, false, "XPKG_REPO="+c.Repo)
			want := "make run: provider.pkg.crossplane.io/" + xpt.ProviderObject + " is installed in this cluster already"
			if !strings.Contains(out, want) {
				t.Errorf("the second make run printed no %q:\n%s", want, out)
			}
		})
	})
	if !installed {
		t.Log("InstallsIntoCrossplane failed; OutOfClusterWithoutCrossplane runs anyway")
	}

	// A KUBECONFIG whose server does not answer: make run says so and
	// stops, rather than taking it for a cluster without Crossplane.
	t.Run("UnreachableCluster", func(t *testing.T) {
		kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
		if err := os.WriteFile(kubeconfig, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: not-a-secret}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
`), 0o600); err != nil {
			t.Fatal(err)
		}
		out := makeRunOnce(t, root, clusterEnv(t, kubeconfig, ""), false)
		if want := "runcluster: cannot reach the cluster in KUBECONFIG=" + kubeconfig; !strings.Contains(out, want) {
			t.Errorf("make run at an unreachable cluster printed no %q:\n%s", want, out)
		}
		if strings.Contains(out, "no Crossplane") {
			t.Errorf("make run took an unreachable cluster for one without Crossplane:\n%s", out)
		}
	})

	t.Run("OutOfClusterWithoutCrossplane", func(t *testing.T) {
		// No kube-controller-manager: nothing here needs one.
		cp := controlplane.ForTest(t, controlplane.Options{})
		// The provider's namespace is not made here: a cluster without
		// Crossplane has none.
		kube := xpt.Client(t, cp, "team-a")
		ns := &corev1.Namespace{}
		if err := kube.Get(context.Background(), client.ObjectKey{Name: xpt.Namespace}, ns); !apierrors.IsNotFound(err) {
			t.Fatalf("the plain control plane has a namespace %s (%v); want none", xpt.Namespace, err)
		}
		// The provider's listeners on ports of their own: the fixed
		// defaults may be another test's at the same moment.
		m := startMakeRun(t, root, clusterEnv(t, cp.KubeconfigPath, ""),
			"ARGS=--metrics-bind-address=127.0.0.1:0 --health-probe-bind-address=127.0.0.1:0")
		out := m.waitFor(t, "make run to say there is no Crossplane", 20*time.Minute, "make run: no Crossplane in the cluster in KUBECONFIG="+cp.KubeconfigPath)
		if !strings.Contains(out, "running the provider out of cluster") {
			t.Errorf("make run did not say it runs the provider out of cluster:\n%s", out)
		}
		out = m.waitFor(t, "make run to run bin/provider", 10*time.Minute, "make run: running bin/provider")
		if want := "make run: created the namespace " + xpt.Namespace + ", the provider's"; !strings.Contains(out, want) {
			t.Errorf("make run did not say %q:\n%s", want, out)
		}
		// The provider works in it: it keeps its installation ID there.
		testenv.WaitFor(t, "the provider's installation-ID ConfigMap in "+xpt.Namespace, time.Minute, func() (bool, string) {
			cm := &corev1.ConfigMap{}
			err := kube.Get(context.Background(), client.ObjectKey{Namespace: xpt.Namespace, Name: "provider-egressproxy-installation"}, cm)
			if err != nil {
				return false, err.Error()
			}
			return cm.Data["id"] != "", fmt.Sprintf("data %v", cm.Data)
		})
		crds := packageCRDs(t, root)
		testenv.WaitFor(t, fmt.Sprintf("the %d CRDs of package/crds to be established", len(crds)), 5*time.Minute, func() (bool, string) {
			var missing []string
			for _, name := range crds {
				crd := xpt.U("apiextensions.k8s.io/v1", "CustomResourceDefinition", "", name)
				if err := kube.Get(context.Background(), client.ObjectKeyFromObject(crd), crd); err != nil {
					missing = append(missing, name+": "+err.Error())
				} else if st, _ := localcrossplane.Condition(crd, "Established"); st != "True" {
					missing = append(missing, name+" not established")
				}
			}
			return len(missing) == 0, strings.Join(missing, "; ")
		})
		pve, _ := xpt.ProxmoxProxy(t, kube, "team-a")
		t0 := time.Now()
		xpt.WaitCondition(t, kube, pve, "Ready", 3*time.Minute)
		t.Logf("ProxmoxProxy Ready through the out-of-cluster provider %.1fs after creation", time.Since(t0).Seconds())

		// The provider is a process make run started, and it stops with
		// Ctrl-C.
		procs := descendants(m.cmd.Process.Pid)
		provider := false
		for _, p := range procs {
			provider = provider || strings.HasPrefix(p.cmd, filepath.Join("bin", "provider")+" ")
		}
		if !provider {
			t.Errorf("no bin/provider among the processes make run started: %v", procs)
		}
		m.interrupt(t)
		var said []string
		for _, l := range strings.Split(m.out.String(), "\n") {
			if strings.HasPrefix(l, "make run") {
				said = append(said, l)
			}
		}
		t.Logf("make run said:\n%s", strings.Join(said, "\n"))
		// make waits for its children after SIGINT; what they started
		// gets a moment to exit too.
		testenv.WaitFor(t, "nothing make run started to be left running after Ctrl-C", 30*time.Second, func() (bool, string) {
			left := stillRunning(procs)
			return len(left) == 0, strings.Join(left, "; ")
		})
	})
}

// clusterEnv is this process's environment with KUBECONFIG naming the
// user's cluster, and SSL_CERT_FILE the bundle the CLI trusts (when
// given).
func clusterEnv(t *testing.T, kubeconfig, caBundle string) []string {
	t.Helper()
	env := append(withoutKubeconfig(os.Environ()), "KUBECONFIG="+kubeconfig)
	if caBundle != "" {
		env = append(env, "SSL_CERT_FILE="+caBundle)
	}
	return env
}

// trustBundle is what a user of a registry with a private CA puts in
// SSL_CERT_FILE (docs/install.md): the system's CAs and theirs.
func trustBundle(t *testing.T, caFile string) string {
	t.Helper()
	sys, err := os.ReadFile("/etc/ssl/certs/ca-certificates.crt")
	if err != nil {
		t.Fatalf("the system's CA bundle: %v", err)
	}
	ca, err := os.ReadFile(caFile) //nolint:gosec // the test's registry CA.
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "ca-bundle.pem")
	if err := os.WriteFile(p, append(append(sys, '\n'), ca...), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// makeRunOnce runs `make run ARGS` to its end (the Crossplane path
// installs and exits) and returns what it printed; it fails the test when
// make's success is not wantOK.
func makeRunOnce(t *testing.T, root string, env []string, wantOK bool, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Minute)
	defer cancel()
	c := exec.CommandContext(ctx, "make", append([]string{"--no-print-directory", "run"}, args...)...)
	c.Dir = root
	c.Env = env
	b, err := c.CombinedOutput()
	if (err == nil) != wantOK {
		t.Fatalf("make run %v: exit %v, want success %v:\n%s", args, err, wantOK, b)
	}
	t.Logf("make run %v printed:\n%s", args, b)
	return string(b)
}

// packageCRDs are the names of the CRDs in package/crds.
func packageCRDs(t *testing.T, root string) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(root, "package", "crds", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("package/crds: %v (%d files)", err, len(files))
	}
	var names []string
	for _, f := range files {
		b, err := os.ReadFile(f) //nolint:gosec // the repository's CRDs.
		if err != nil {
			t.Fatal(err)
		}
		objs, err := localcrossplane.DecodeYAML(string(b))
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		for _, o := range objs {
			names = append(names, o.GetName())
		}
	}
	return names
}
