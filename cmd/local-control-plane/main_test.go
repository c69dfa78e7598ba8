package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/egressproxy/provider-egressproxy/internal/devenv/controlplane"
	"github.com/egressproxy/provider-egressproxy/internal/devenv/testenv"
)

const helperEnv = "LOCAL_CONTROL_PLANE_TEST_HELPER"

// TestMain doubles as the command local-control-plane runs in the tests:
// with helperEnv set, the test binary checks the cluster through
// KUBECONFIG and exits 3.
func TestMain(m *testing.M) {
	testenv.RunAsChild(helperEnv, helper)
	os.Exit(m.Run())
}

func helper() int {
	cfg, err := clientcmd.BuildConfigFromFlags("", os.Getenv("KUBECONFIG"))
	if err != nil {
		fmt.Println("helper:", err)
		return 1
	}
	nss, err := kubernetes.NewForConfigOrDie(cfg).CoreV1().Namespaces().List(context.Background(), metav1.ListOptions{})
	if err != nil {
		fmt.Println("helper:", err)
		return 1
	}
	var names []string
	for _, n := range nss.Items {
		names = append(names, n.Name)
	}
	fmt.Println("helper: namespaces:", strings.Join(names, " "))
	if _, err := dynamic.NewForConfigOrDie(cfg).Resource(controlplane.WidgetsResource).Namespace("default").List(context.Background(), metav1.ListOptions{}); err != nil {
		fmt.Println("helper: widgets:", err)
		return 1
	}
	fmt.Println("helper: widgets CRD installed")
	return 3
}

// build compiles local-control-plane and returns it with the binaries'
// folder (built by hack/controlplane-bins.sh when missing).
func build(t *testing.T) (exe, bin string) {
	t.Helper()
	bin, err := controlplane.BinDir(t.Context(), nil)
	if err != nil {
		t.Fatalf("cannot get the control-plane binaries (hack/controlplane-bins.sh): %v", err)
	}
	exe = filepath.Join(t.TempDir(), "local-control-plane")
	if out, err := exec.Command("go", "build", "-o", exe, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return exe, bin
}

// assertNoneLeft checks that no process recorded in dir/pids, nor any
// process mentioning dir on its command line, still runs.
func assertNoneLeft(t *testing.T, dir string) {
	t.Helper()
	for _, name := range []string{"etcd", "kube-apiserver", "kube-controller-manager"} {
		b, err := os.ReadFile(filepath.Join(dir, "pids", name+".pid"))
		if err != nil {
			t.Errorf("%s: no PID file: %v", name, err)
			continue
		}
		pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
		if running(pid) {
			t.Errorf("%s (pid %d) still running", name, pid)
		}
	}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if strings.Contains(string(cmdline), dir) && running(pid) {
			t.Errorf("pid %d still running: %s", pid, strings.ReplaceAll(string(cmdline), "\x00", " "))
		}
	}
}

// running tells whether pid exists and is not a zombie.
func running(pid int) bool {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return false
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	return len(f) > 0 && f[0] != "Z" && f[0] != "X"
}

// TestLocalControlPlaneIntegrationWithRealBinaries runs local-control-plane
// with the real etcd, kube-apiserver and kube-controller-manager and this
// test binary as its command.
func TestLocalControlPlaneIntegrationWithRealBinaries(t *testing.T) {
	exe, bin := build(t)
	dir := filepath.Join(t.TempDir(), "cp")
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	helperArgs, helperEnviron := testenv.ChildArgs(helperEnv, "^$")
	cmd := exec.Command(exe, append([]string{"--crds", controlplane.WriteCRDs(t, controlplane.WidgetCRD), "--dir", dir, "--bin-dir", bin, "--kubeconfig-out", kubeconfig,
		"--"}, helperArgs...)...)
	cmd.Env = helperEnviron
	start := time.Now()
	out, err := cmd.CombinedOutput()
	t.Logf("ran in %.1fs:\n%s", time.Since(start).Seconds(), out)
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 3 {
		t.Fatalf("exit: %v, want code 3 (the command's)", err)
	}
	for _, want := range []string{
		"export KUBECONFIG=" + kubeconfig,
		"control plane up in",
		"helper: widgets CRD installed",
		"crossplane-system",
		"control plane stopped in",
	} {
		if !strings.Contains(string(out), want) {
			t.Errorf("output lacks %q", want)
		}
	}
	if _, err := clientcmd.LoadFromFile(kubeconfig); err != nil {
		t.Errorf("kubeconfig: %v", err)
	}
	assertNoneLeft(t, dir)
}

// TestLocalControlPlaneIntegrationSignalStopsEverything sends SIGTERM to
// local-control-plane running a command that ignores SIGTERM: the command is
// killed after the grace period, the exit code says so (128+9), and the
// control plane is gone.
func TestLocalControlPlaneIntegrationSignalStopsEverything(t *testing.T) {
	exe, bin := build(t)
	dir := filepath.Join(t.TempDir(), "cp")
	cmd := exec.Command(exe, "--crds", controlplane.WriteCRDs(t, controlplane.WidgetCRD), "--dir", dir, "--bin-dir", bin, "--grace", "1s",
		"--", "sh", "-c", `trap "" TERM; echo command-started; sleep 600`)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout = cmd.Stderr // unused: StderrPipe set Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill() }()
	lines := make(chan string, 100)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	var log []string
	deadline := time.After(2 * time.Minute)
wait:
	for {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("exited early:\n%s", strings.Join(log, "\n"))
			}
			log = append(log, l)
			if strings.Contains(l, "command-started") {
				break wait
			}
		case <-deadline:
			t.Fatalf("no command started:\n%s", strings.Join(log, "\n"))
		}
	}
	time.Sleep(500 * time.Millisecond) // let sh set its trap
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	for l := range lines {
		log = append(log, l)
	}
	err = cmd.Wait()
	t.Logf("output:\n%s", strings.Join(log, "\n"))
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 128+9 {
		t.Fatalf("exit: %v, want code 137 (command killed after the grace period)", err)
	}
	if !strings.Contains(strings.Join(log, "\n"), "killing it") {
		t.Errorf("no sign of the grace period running out")
	}
	assertNoneLeft(t, dir)
}
