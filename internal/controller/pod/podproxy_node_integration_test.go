//go:build linux

package pod_test

import (
	"context"
	"fmt"
	"maps"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/meta"
	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	nsproxy "github.com/egressproxy/provider-egressproxy/apis/namespaced/proxy/v1alpha1"
	nsv1alpha1 "github.com/egressproxy/provider-egressproxy/apis/namespaced/v1alpha1"
	spec "github.com/egressproxy/provider-egressproxy/apis/spec/v1alpha1"
	"github.com/egressproxy/provider-egressproxy/internal/backend/kubernetes"
	"github.com/egressproxy/provider-egressproxy/internal/devenv/controlplane"
	"github.com/egressproxy/provider-egressproxy/internal/devenv/testenv"
)

// crashMessage is what the crashing image's squid prints (hack/squidimage).
const crashMessage = "FATAL: squid-crashing: this squid exits at once"

// nodeEnv is env on a real node: pods run by a real kubelet in
// containerd, from the Squid image built here, with an upstream on a test
// host attached to the pod network.
type nodeEnv struct {
	*env
	node    *controlplane.Node
	image   testenv.SquidImage
	clients string // the CIDR the test's requests come from (the bridge's)
}

func startNode(t *testing.T) *nodeEnv {
	t.Helper()
	controlplane.RequireNode(t)
	img := testenv.BuildSquidImage(t)
	// The control plane's Stop (ForTest fails t on its error) checks,
	// still holding the machine's node lock, that the node left nothing
	// behind (controlplane.Leftovers); after it another test's node may
	// already run.
	// The configs name no image: the pods run the default, which is the
	// image hack/squid-image.sh builds, as in a released provider (there
	// by digest in the registry the packages are pushed to).
	e := startProvider(t, controlplane.Options{Node: &controlplane.NodeOptions{Images: []string{img.Tarball, img.CrashingTarball}}}, 4, img.Ref)
	n := e.ControlPlane.Node
	// Outside the cluster, where a real destination stands: a test host
	// in TestNet, which pods reach through this machine's routing (not the
	// pod network, a cluster network proxies are kept out of).
	var port int
	e.upstream, port = testenv.Upstream(t)
	e.port = int32(port)
	e.createConfigs(t, "")
	for name, image := range map[string]string{
		// Nothing serves it: containerd's pull fails (on loopback).
		"broken-image": "localhost/egressproxy/no-such-squid:1",
		"crashing":     img.CrashingRef,
	} {
		c := &nsv1alpha1.ClusterProviderConfig{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: nsv1alpha1.ClusterProviderConfigSpec{ProviderConfigSpec: spec.ProviderConfigSpec{Kubernetes: &spec.KubernetesConfig{
				Credentials: spec.KubernetesCredentials{Source: xpv2.CredentialsSourceInjectedIdentity},
				Namespace:   proxyNS, Image: image,
			}}}}
		e.Create(t, c)
	}
	t.Cleanup(func() {
		if t.Failed() {
			out, _ := exec.Command(n.Ctr()[0], append(n.Ctr()[1:], "containers", "list")...).CombinedOutput()
			t.Logf("containerd's containers:\n%s", out)
			logPodTails(t, n)
		}
	})
	// The test's requests to pods leave from the bridge's own address.
	return &nodeEnv{env: e, node: n, image: img, clients: n.PodCIDR.String()}
}

// logPodTails logs the end of every container log the node's kubelet
// still holds: Squid's access and cache logs, which say whether a request
// that went unanswered reached it and what it did with it.
func logPodTails(t *testing.T, n *controlplane.Node) {
	t.Helper()
	_ = filepath.WalkDir(filepath.Join(n.Dir, "kubelet", "pod-logs"), func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".log") {
			return nil //nolint:nilerr // a log that went meanwhile is skipped.
		}
		b, err := os.ReadFile(path) //nolint:gosec // the node's own folder.
		if err != nil {
			return nil //nolint:nilerr // as above.
		}
		lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
		t.Logf("%s, its last lines:\n%s", strings.TrimPrefix(path, n.Dir+"/"), strings.Join(lines[max(0, len(lines)-40):], "\n"))
		return nil
	})
}

// pod is the proxy's serving pod, by the status' pod detail.
func (e *nodeEnv) pod(t *testing.T, mg interface{ GetName() string }, name string) *corev1.Pod {
	t.Helper()
	p := &corev1.Pod{}
	if err := e.Kube.Get(context.Background(), types.NamespacedName{Namespace: proxyNS, Name: name}, p); err != nil {
		t.Fatalf("pod %s of %s: %v", name, mg.GetName(), err)
	}
	return p
}

// checkContainer asserts the pod runs the Squid image in containerd, as
// the pod spec says: squid as uid/gid 13, no capabilities, read-only root.
// It returns the container's ID.
func (e *nodeEnv) checkContainer(t *testing.T, p *corev1.Pod) string {
	t.Helper()
	if len(p.Status.ContainerStatuses) != 1 {
		t.Fatalf("pod %s container statuses %+v", p.Name, p.Status.ContainerStatuses)
	}
	cs := p.Status.ContainerStatuses[0]
	id, ok := strings.CutPrefix(cs.ContainerID, "containerd://")
	if !ok || cs.Image != e.image.Ref || !cs.Ready || p.Spec.NodeName != e.node.Name {
		t.Errorf("pod %s on %q: container %q image %q ready %v; want a ready containerd container of %s on %s",
			p.Name, p.Spec.NodeName, cs.ContainerID, cs.Image, cs.Ready, e.image.Ref, e.node.Name)
	}
	pid := e.taskPID(t, id)
	if pid == 0 {
		t.Fatalf("containerd runs no task for container %s", id)
	}
	cmdline, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	status, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if !strings.HasPrefix(string(cmdline), kubernetes.SquidBinary+"\x00-N\x00-f\x00"+kubernetes.ConfigMountPath+"/squid.conf") {
		t.Errorf("container process %d runs %q; want squid -N -f the mounted squid.conf", pid, cmdline)
	}
	for _, want := range []string{"Uid:\t13\t13\t13\t13", "Gid:\t13\t13\t13\t13", "CapEff:\t0000000000000000", "NoNewPrivs:\t1"} {
		if !strings.Contains(string(status), want+"\n") {
			t.Errorf("container process %d: /proc status lacks %q:\n%s", pid, want, status)
		}
	}
	// The root filesystem is read-only for it, the config readable. On a
	// busy machine ctr has returned nothing at all, and no error, from an
	// exec whose process exits at once: such an answer is asked again.
	var out []byte
	var err error
	for try := range 3 {
		out, err = exec.Command(e.node.Ctr()[0], append(e.node.Ctr()[1:], "tasks", "exec", "--exec-id", "probe"+strconv.Itoa(pid)+"-"+strconv.Itoa(try), id,
			"/bin/sh", "-c", "touch /probe 2>&1; cat "+kubernetes.ConfigMountPath+"/squid.conf >/dev/null && echo config-readable")...).CombinedOutput()
		if err != nil || len(out) > 0 {
			break
		}
	}
	if err != nil || !strings.Contains(string(out), "Read-only file system") || !strings.Contains(string(out), "config-readable") {
		t.Errorf("in the container, writing / and reading the config: %v: %s; want a read-only root and a readable squid.conf", err, out)
	}
	return id
}

// taskPID is the PID of the container's task, or 0 when none runs.
func (e *nodeEnv) taskPID(t *testing.T, id string) int {
	t.Helper()
	out, err := exec.Command(e.node.Ctr()[0], append(e.node.Ctr()[1:], "tasks", "list")...).CombinedOutput()
	if err != nil {
		t.Fatalf("ctr tasks list: %v: %s", err, out)
	}
	for _, l := range strings.Split(string(out), "\n") {
		if f := strings.Fields(l); len(f) >= 3 && f[0] == id && f[2] == "RUNNING" {
			pid, _ := strconv.Atoi(f[1])
			return pid
		}
	}
	return 0
}

// readyAt waits until p is Ready with status.atProvider.ip at host, the
// connection Secret's: the Secret is published before the status is
// written, so until then the status may name the old pod.
func (e *nodeEnv) readyAt(t *testing.T, p *nsproxy.PodProxy, host string) {
	t.Helper()
	e.WaitFor(t, p.Name+" Ready at "+host, func() (bool, string) {
		if err := e.Kube.Get(context.Background(), client.ObjectKeyFromObject(p), p); err != nil {
			return false, err.Error()
		}
		r := p.GetCondition(xpv2.TypeReady)
		return r.Status == corev1.ConditionTrue && p.Status.AtProvider.IP == host, fmt.Sprintf("Ready=%s, ip %q", r.Status, p.Status.AtProvider.IP)
	})
}

// closed waits until nothing answers on addr any more.
func (e *nodeEnv) closed(t *testing.T, addr string) {
	t.Helper()
	testenv.WaitFor(t, addr+" to stop answering", e.within(20*time.Second), func() (bool, string) {
		conn, err := (&net.Dialer{Timeout: time.Second}).Dial("tcp", addr)
		if err == nil {
			_ = conn.Close()
		}
		return err != nil, "still answering"
	})
}

// TestPodProxyRealNodeIntegration is PodProxy end to end on a real node:
// the provider's controllers on a real control plane with a kubelet,
// containerd and kube-proxy, the Squid image built here running as the
// driver's pod spec says (non-root, read-only root, no capabilities), the
// config Secret mounted where Squid reads it, real HTTP requests through
// the connection Secret's URL to an upstream on a test host attached to
// the pod network, a configuration change rolling the pod, and the
// conditions a broken image or a crash-looping container give.
func TestPodProxyRealNodeIntegration(t *testing.T) {
	e := startNode(t)
	ctx := context.Background()

	t.Run("NamespacedProxyServesRollsOutAndGoesAway", func(t *testing.T) {
		t.Parallel()
		start := time.Now()
		p := e.ready(t, e.payments(e.clients))
		t.Logf("PodProxy create-to-Ready on a real pod: %.2fs", time.Since(start).Seconds())
		obs := p.Status.AtProvider
		ip, err := netip.ParseAddr(obs.IP)
		if obs.State != "Running" || !obs.ProxyReachable || err != nil || !e.node.PodCIDR.Contains(ip) {
			t.Errorf("status.atProvider = %+v; want Running, reachable, an IP in the pod network %s", obs, e.node.PodCIDR)
		}
		d := e.ConnectionSecret(t, "team-a", "payments-proxy", "")
		if d["url"] != "http://"+obs.IP+":3128" {
			t.Errorf("connection Secret url %q; want http://%s:3128", d["url"], obs.IP)
		}
		if code, squidErr := e.get(t, d["url"]); code != http.StatusOK {
			sec := &corev1.Secret{}
			_ = e.Kube.Get(ctx, types.NamespacedName{Namespace: proxyNS, Name: meta.GetExternalName(p)}, sec)
			t.Fatalf("GET %s through %s = %d %q; want 200; squid.conf:\n%s", e.upstream, d["url"], code, squidErr, sec.Data[kubernetes.KeySquidConf])
		}
		e.checkObjects(t, p, false)
		first := e.checkContainer(t, e.pod(t, p, obs.Details["pod"]))

		// The bridge's clients no longer allowed: the pod rolls out, the
		// old container goes, and the new Squid refuses them.
		e.Update(t, p, func() { p.Spec.ForProvider.Proxy.AllowedClientCIDRs = []string{"10.99.0.0/16"} })
		mark := time.Now()
		d2 := e.ConnectionSecret(t, "team-a", "payments-proxy", d["host"])
		e.readyAt(t, p, d2["host"])
		t.Logf("rolled out to %s %.2fs after the change", d2["host"], time.Since(mark).Seconds())
		if code, squidErr := e.get(t, d2["url"]); code != http.StatusForbidden || squidErr != "ERR_ACCESS_DENIED 0" {
			t.Errorf("GET from %s after excluding it = %d %q; want 403 ERR_ACCESS_DENIED", e.node.Gateway, code, squidErr)
		}
		e.closed(t, net.JoinHostPort(d["host"], "3128"))
		testenv.WaitFor(t, "the first container to stop", e.within(20*time.Second), func() (bool, string) {
			return e.taskPID(t, first) == 0, "still running"
		})

		// Back in, with authentication: another rollout; the URL holds the
		// credentials, a request without them is challenged.
		e.Update(t, p, func() {
			p.Spec.ForProvider.Proxy.AllowedClientCIDRs = []string{e.clients}
			p.Spec.ForProvider.Proxy.Auth = &spec.ProxyAuth{Enabled: true, Username: "payments"}
		})
		d3 := e.ConnectionSecret(t, "team-a", "payments-proxy", d2["host"])
		e.readyAt(t, p, d3["host"])
		if d3["username"] != "payments" || d3["url"] != fmt.Sprintf("http://payments:%s@%s:3128", d3["password"], d3["host"]) {
			t.Errorf("connection Secret with auth: username %q, url with credentials %v", d3["username"], strings.Contains(d3["url"], d3["password"]))
		}
		if code, _ := e.get(t, d3["url"]); code != http.StatusOK {
			t.Errorf("GET with the connection Secret's credentials = %d; want 200", code)
		}
		e.checkChallenged(t, d3)
		last := e.checkContainer(t, e.pod(t, p, p.Status.AtProvider.Details["pod"]))

		e.deleteLeavingNothing(t, p)
		e.closed(t, net.JoinHostPort(d3["host"], d3["port"]))
		if pid := e.taskPID(t, last); pid != 0 {
			t.Errorf("the container of the deleted proxy still runs (pid %d)", pid)
		}
	})

	// The egress check on a real pod: the address the provider publishes
	// is the one the upstream saw of a request through the proxy; a new
	// pod (a new address, as on another node) is seen and reported; and
	// the check's credential works from the provider's address, which is
	// not among the clients, without opening the proxy to it.
	t.Run("EgressAddressVerifiedThroughTheProxy", func(t *testing.T) {
		t.Parallel()
		p := nsPodProxy("team-a", "verified", "ClusterProviderConfig", "pods-echo")
		p.Spec.WriteConnectionSecretToReference = &xpv2.LocalSecretReference{Name: "verified-proxy"}
		p.Spec.ForProvider.Proxy.AllowedClientCIDRs = []string{e.clients}
		p.Spec.ForProvider.Proxy.AllowedPorts = []int32{443, e.port}
		p.Spec.ForProvider.Proxy.Auth = &spec.ProxyAuth{Enabled: true, Username: "verified"}
		e.ready(t, p)
		c := e.WaitForCondition(t, p, spec.TypeEgressVerified, corev1.ConditionTrue, "saw")
		obs := p.Status.AtProvider
		d := e.ConnectionSecret(t, "team-a", "verified-proxy", "")
		r, err := testenv.TryGetThroughProxy(d["url"], testenv.EchoURL(e.upstream))
		if err != nil || r.Status != http.StatusOK {
			t.Fatalf("GET the echo through the proxy as its user = %+v, %v", r, err)
		}
		seen := strings.TrimSpace(r.Body)
		if obs.EgressIP != seen || obs.EgressIPSource != spec.EgressIPVerified || obs.EgressIPVerifiedAt == nil || d["egressIP"] != seen {
			t.Errorf("egressIP %q (%s, at %v), connection Secret %q; want %s, the address the upstream saw, Verified (%s)", obs.EgressIP, obs.EgressIPSource, obs.EgressIPVerifiedAt, d["egressIP"], seen, c.Message)
		}
		if a, err := netip.ParseAddr(seen); err != nil || !e.node.PodCIDR.Contains(a) {
			t.Errorf("the upstream saw %q; want the pod's address in %s (pod traffic is not masqueraded here)", seen, e.node.PodCIDR)
		}

		// Clients elsewhere: the provider (at the bridge's address) is no
		// client any more, the pod rolls out with a new address, and the
		// check still reports it.
		e.Update(t, p, func() { p.Spec.ForProvider.Proxy.AllowedClientCIDRs = []string{"10.99.0.0/16"} })
		testenv.WaitFor(t, "the egress check to see the new pod's address", e.within(60*time.Second), func() (bool, string) {
			if err := e.Kube.Get(ctx, client.ObjectKeyFromObject(p), p); err != nil {
				return false, err.Error()
			}
			o := p.Status.AtProvider
			return o.EgressIP != "" && o.EgressIP != seen && o.EgressIP == o.IP, fmt.Sprintf("egressIP %q, ip %q", o.EgressIP, o.IP)
		})
		if c := p.GetCondition(spec.TypeEgressVerified); c.Status != corev1.ConditionTrue || c.Reason != "Changed" || !strings.Contains(c.Message, seen) {
			t.Errorf("EgressVerified after the move: %s %s %q; want True Changed naming the old address %s", c.Status, c.Reason, c.Message, seen)
		}
		e.WaitEvent(t, "team-a", p.Name, corev1.EventTypeWarning, "EgressIPChanged", "the egress address changed from "+seen)
		d2 := e.ConnectionSecret(t, "team-a", "verified-proxy", d["host"])
		if d2["egressIP"] != p.Status.AtProvider.EgressIP {
			t.Errorf("connection Secret egressIP %q after the move; want %s", d2["egressIP"], p.Status.AtProvider.EgressIP)
		}
		if code, squidErr := e.get(t, d2["url"]); code != http.StatusForbidden {
			t.Errorf("GET from %s, no client any more, as the user = %d %q; want 403: the check must not open the proxy", e.node.Gateway, code, squidErr)
		}
		e.deleteLeavingNothing(t, p)
	})

	// TLS to the proxy on a real pod: the proxy's certificate comes from a
	// cert-manager-style Secret of the team's namespace (issued by an
	// intermediate, for every address of the pod network, since the pod's
	// is not known before it runs); the connection Secret holds an
	// https:// URL and ca.crt, and curl and a Go client with nothing but
	// the Secret as their environment (and ca.crt as a file) fetch through
	// it; a renewed certificate rolls the pod, and the new one serves it.
	t.Run("TLSToTheProxyThroughTheConnectionSecret", func(t *testing.T) {
		t.Parallel()
		var hosts []string
		for a := e.node.PodCIDR.Masked().Addr(); e.node.PodCIDR.Contains(a); a = a.Next() {
			hosts = append(hosts, a.String())
		}
		certs := testenv.NewCerts(t, hosts...)
		sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "tls-proxy-cert"}, Type: corev1.SecretTypeTLS, Data: certs.Secret()}
		e.Create(t, sec)
		p := nsPodProxy("team-a", "tls", "ClusterProviderConfig", "pods")
		p.Spec.WriteConnectionSecretToReference = &xpv2.LocalSecretReference{Name: "tls-proxy"}
		p.Spec.ForProvider.Proxy.AllowedClientCIDRs = []string{e.clients}
		p.Spec.ForProvider.Proxy.AllowedPorts = []int32{443, e.port}
		p.Spec.ForProvider.Proxy.Auth = &spec.ProxyAuth{Enabled: true, Username: "tls"}
		p.Spec.ForProvider.Proxy.TLS = &spec.ProxyTLS{SecretRef: spec.SecretReference{Name: sec.Name}}
		e.ready(t, p)
		if c := p.GetCondition(spec.TypeSecure); c.Status != corev1.ConditionTrue || c.Reason != "TLS" {
			t.Errorf("Secure = %s %s %q; want True TLS", c.Status, c.Reason, c.Message)
		}
		fetch := func(d map[string]string) {
			t.Helper()
			if want := fmt.Sprintf("https://tls:%s@%s:3128", d["password"], d["host"]); d["url"] != want || d["HTTPS_PROXY"] != want || d["http_proxy"] != want {
				t.Errorf("connection Secret url %q; want https:// with the credentials", d["url"])
			}
			caFile := filepath.Join(t.TempDir(), "ca.crt")
			if err := os.WriteFile(caFile, []byte(d["ca.crt"]), 0o600); err != nil {
				t.Fatal(err)
			}
			for _, f := range testenv.FetchWithEnvCA(t, d, caFile, e.upstream) {
				if f.Status != http.StatusOK || f.Body != testenv.UpstreamBody || f.Remote != net.JoinHostPort(d["host"], d["port"]) {
					t.Errorf("%s with the connection Secret as its environment, through the TLS proxy: %d %q via %s; want 200 from the upstream via %s",
						f.Client, f.Status, f.Body, f.Remote, d["endpoint"])
				}
			}
			if r, err := testenv.TryGetThroughProxy("http://"+d["endpoint"], e.upstream); err == nil && (r.Status == http.StatusOK || r.Status == http.StatusProxyAuthRequired) {
				t.Errorf("plain HTTP to the TLS proxy got %d; want no HTTP answer", r.Status)
			}
		}
		d := e.ConnectionSecret(t, "team-a", "tls-proxy", "")
		if !strings.HasPrefix(d["ca.crt"], certs.CA) {
			t.Errorf("connection Secret ca.crt does not start with the Secret's ca.crt")
		}
		fetch(d)

		// cert-manager renews: the pod rolls with the new certificate (at
		// the next observation; the annotation asks for it now).
		renewed := testenv.NewCerts(t, hosts...)
		sec.Data = renewed.Secret()
		if err := e.Kube.Update(ctx, sec); err != nil {
			t.Fatal(err)
		}
		e.Update(t, p, func() { meta.AddAnnotations(p, map[string]string{"test.egressproxy.io/renewed": "1"}) })
		d2 := e.ConnectionSecret(t, "team-a", "tls-proxy", d["host"])
		e.WaitForCondition(t, p, xpv2.TypeReady, corev1.ConditionTrue, "")
		if !strings.HasPrefix(d2["ca.crt"], renewed.CA) {
			t.Errorf("after the renewal, ca.crt is not the new CA")
		}
		fetch(d2)
		e.deleteLeavingNothing(t, p)
	})

	// The egress check from inside the pod, for a cluster whose pods the
	// provider does not reach (a team's kubeconfig: the driver does not
	// dial pods there): the pod's reporting container fetches the echo
	// through the pod's own Squid on loopback, and the driver reads its
	// answer from the pod's log. The address published, Reported, is the
	// one the upstream saw of a request through the proxy; a new pod (a
	// new address, as on another node) reports its own, as a change.
	t.Run("EgressAddressReportedFromInsideThePod", func(t *testing.T) {
		t.Parallel()
		e.Create(t, &nsv1alpha1.ProviderConfig{ObjectMeta: metav1.ObjectMeta{Name: "team-pods-echo", Namespace: "team-b"},
			Spec: nsv1alpha1.NamespacedProviderConfigSpec{ProviderConfigSpec: spec.ProviderConfigSpec{Kubernetes: &spec.KubernetesConfig{
				Credentials: spec.KubernetesCredentials{Source: xpv2.CredentialsSourceSecret, SecretRef: &spec.SecretKeySelector{Name: "team-kubeconfig", Key: "kubeconfig"}},
				Namespace:   proxyNS, Image: e.image.Ref,
				EgressCheck: &spec.EgressCheck{URL: testenv.EchoURL(e.upstream)},
			}}}})
		p := nsPodProxy("team-b", "reported", "ProviderConfig", "team-pods-echo")
		p.Spec.WriteConnectionSecretToReference = &xpv2.LocalSecretReference{Name: "reported-proxy"}
		p.Spec.ForProvider.Proxy.AllowedClientCIDRs = []string{e.clients}
		p.Spec.ForProvider.Proxy.AllowedPorts = []int32{443, e.port}
		e.ready(t, p)
		c := e.WaitForCondition(t, p, spec.TypeEgressVerified, corev1.ConditionTrue, "from inside the instance")
		obs := p.Status.AtProvider
		pod := e.pod(t, p, obs.Details["pod"])
		if n := names(pod.Spec.Containers); !slices.Equal(n, []string{kubernetes.ContainerName, kubernetes.ReportContainerName}) {
			t.Errorf("pod containers %v; want squid and %s", n, kubernetes.ReportContainerName)
		}
		d := e.ConnectionSecret(t, "team-b", "reported-proxy", "")
		r, err := testenv.TryGetThroughProxy(d["url"], testenv.EchoURL(e.upstream))
		if err != nil || r.Status != http.StatusOK {
			t.Fatalf("GET the echo through the proxy = %+v, %v", r, err)
		}
		seen := strings.TrimSpace(r.Body)
		if obs.EgressIP != seen || obs.EgressIPSource != spec.EgressIPReported || obs.EgressIPVerifiedAt == nil || d["egressIP"] != seen || c.Reason != "Reported" {
			t.Errorf("egressIP %q (%s, at %v), connection Secret %q, condition %s %q; want %s, the address the upstream saw, Reported",
				obs.EgressIP, obs.EgressIPSource, obs.EgressIPVerifiedAt, d["egressIP"], c.Reason, c.Message, seen)
		}
		if a, err := netip.ParseAddr(seen); err != nil || a.String() != pod.Status.PodIP {
			t.Errorf("the upstream saw %q; want the pod's address %s (pod traffic is not masqueraded here)", seen, pod.Status.PodIP)
		}
		if age := time.Since(obs.EgressIPVerifiedAt.Time); age < 0 || age > 5*time.Minute {
			t.Errorf("egressIPVerifiedAt %v is not the time of the pod's check", obs.EgressIPVerifiedAt)
		}

		// A new pod (the pod deleted: its replacement gets another
		// address) reports its own address, as a change.
		if err := e.Kube.Delete(ctx, pod); err != nil {
			t.Fatal(err)
		}
		testenv.WaitFor(t, "the new pod's report", e.within(90*time.Second), func() (bool, string) {
			if err := e.Kube.Get(ctx, client.ObjectKeyFromObject(p), p); err != nil {
				return false, err.Error()
			}
			o := p.Status.AtProvider
			return o.EgressIP != "" && o.EgressIP != seen && o.EgressIP == o.IP, fmt.Sprintf("egressIP %q, ip %q", o.EgressIP, o.IP)
		})
		if c := p.GetCondition(spec.TypeEgressVerified); c.Reason != "Changed" || !strings.Contains(c.Message, seen) {
			t.Errorf("EgressVerified after the new pod: %s %s %q; want Changed naming the old address %s", c.Status, c.Reason, c.Message, seen)
		}
		e.WaitEvent(t, "team-b", p.Name, corev1.EventTypeWarning, "EgressIPChanged", "the egress address changed from "+seen)
		e.deleteLeavingNothing(t, p)
	})

	// The node's egress address changes under a pod that stays: a SNAT
	// rule of the test's (as a node pool's NAT gateway or a changed node
	// address would) makes the upstream see this machine's address on
	// its veth instead of the pod's. The next check (the config's
	// interval, 1m) sees the new address and reports it as a change.
	t.Run("EgressAddressChangeUnderTheSamePodIsSeen", func(t *testing.T) {
		t.Parallel()
		e.Create(t, &nsv1alpha1.ClusterProviderConfig{ObjectMeta: metav1.ObjectMeta{Name: "pods-echo-1m"},
			Spec: nsv1alpha1.ClusterProviderConfigSpec{ProviderConfigSpec: spec.ProviderConfigSpec{Kubernetes: &spec.KubernetesConfig{
				Credentials: spec.KubernetesCredentials{Source: xpv2.CredentialsSourceInjectedIdentity},
				Namespace:   proxyNS, Image: e.image.Ref,
				EgressCheck: &spec.EgressCheck{URL: testenv.EchoURL(e.upstream), Interval: &metav1.Duration{Duration: time.Minute}},
			}}}})
		p := nsPodProxy("team-a", "snat", "ClusterProviderConfig", "pods-echo-1m")
		p.Spec.ForProvider.Proxy.AllowedClientCIDRs = []string{e.clients}
		e.ready(t, p)
		e.WaitForCondition(t, p, spec.TypeEgressVerified, corev1.ConditionTrue, "saw")
		podIP := p.Status.AtProvider.IP
		if p.Status.AtProvider.EgressIP != podIP {
			t.Fatalf("egressIP %q before the change; want the pod's address %s", p.Status.AtProvider.EgressIP, podIP)
		}
		up, err := url.Parse(e.upstream)
		if err != nil {
			t.Fatal(err)
		}
		// The upstream stands in a /30 whose first address is this
		// machine's end of the veth (netnshost).
		gw := netip.MustParseAddr(up.Hostname()).Prev().String()
		testenv.InsertRule(t, "nat", "snat "+p.Name, "POSTROUTING", "-s", podIP+"/32", "-d", up.Hostname()+"/32", "-j", "SNAT", "--to-source", gw)
		start := time.Now()
		testenv.WaitFor(t, "the check to see the node's new egress address", e.within(5*time.Minute), func() (bool, string) {
			if err := e.Kube.Get(ctx, client.ObjectKeyFromObject(p), p); err != nil {
				return false, err.Error()
			}
			o := p.Status.AtProvider
			return o.EgressIP == gw, fmt.Sprintf("egressIP %q (pod %s)", o.EgressIP, o.IP)
		})
		t.Logf("the SNAT change was seen %.1fs after it", time.Since(start).Seconds())
		if o := p.Status.AtProvider; o.IP != podIP {
			t.Errorf("the pod changed (%s, was %s): the test wants the same pod", o.IP, podIP)
		}
		if c := p.GetCondition(spec.TypeEgressVerified); c.Reason != "Changed" || !strings.Contains(c.Message, podIP) || !strings.Contains(c.Message, gw) {
			t.Errorf("EgressVerified after the SNAT change: %s %s %q; want Changed from %s to %s", c.Status, c.Reason, c.Message, podIP, gw)
		}
		e.WaitEvent(t, "team-a", p.Name, corev1.EventTypeWarning, "EgressIPChanged", "the egress address changed from "+podIP+" to "+gw)
		e.deleteLeavingNothing(t, p)
	})

	t.Run("ClusterScopedProxyBehindAClusterIPService", func(t *testing.T) {
		t.Parallel()
		p := e.sharedEgress(8080, e.clients)
		start := time.Now()
		if err := e.Kube.Create(ctx, p); err != nil {
			t.Fatal(err)
		}
		e.WaitForCondition(t, p, xpv2.TypeReady, corev1.ConditionTrue, "")
		t.Logf("PodProxy with a Service create-to-Ready on a real pod: %.2fs", time.Since(start).Seconds())
		svc := &corev1.Service{}
		if err := e.Kube.Get(ctx, types.NamespacedName{Namespace: proxyNS, Name: meta.GetExternalName(p)}, svc); err != nil {
			t.Fatal(err)
		}
		d := e.ConnectionSecret(t, "crossplane-system", "shared-egress", "")
		e.checkObjects(t, p, true)
		e.checkContainer(t, e.pod(t, p, p.Status.AtProvider.Details["pod"]))
		// The Secret names the Service by its DNS name, which this machine
		// does not resolve; its cluster IP, through kube-proxy's rules,
		// reaches the pod.
		viaService := fmt.Sprintf("http://%s:%s@%s", d["username"], d["password"], net.JoinHostPort(svc.Spec.ClusterIP, d["port"]))
		testenv.WaitFor(t, "kube-proxy to route "+svc.Spec.ClusterIP, e.within(20*time.Second), func() (bool, string) {
			conn, err := (&net.Dialer{Timeout: time.Second}).Dial("tcp", net.JoinHostPort(svc.Spec.ClusterIP, d["port"]))
			if err != nil {
				return false, err.Error()
			}
			_ = conn.Close()
			return true, ""
		})
		if code, _ := e.get(t, viaService); code != http.StatusOK {
			t.Errorf("GET through the Service's cluster IP = %d; want 200", code)
		}
		e.deleteLeavingNothing(t, p)
	})

	// The kubelet, not only the driver, keeps a proxy's pod off a Secret of
	// its name that was not written for it (Create makes the Deployment
	// before it knows the Secret's name is free): the pod mounts the
	// resource's owner key by name. Here the proxy's own Secret loses that
	// key, as a Secret of someone else's would lack it, and the next pod
	// never starts.
	t.Run("PodNeverRunsOnASecretWithoutItsOwnerKey", func(t *testing.T) {
		t.Parallel()
		p := nsPodProxy("team-b", "owner-key", "ClusterProviderConfig", "pods")
		p.Spec.ForProvider.Proxy.AllowedClientCIDRs = []string{e.clients}
		e.ready(t, p)
		key := types.NamespacedName{Namespace: proxyNS, Name: meta.GetExternalName(p)}
		sec := &corev1.Secret{}
		if err := e.Kube.Get(ctx, key, sec); err != nil {
			t.Fatal(err)
		}
		owner := kubernetes.OwnerKey(string(p.GetUID()))
		if _, ok := sec.Data[owner]; !ok {
			t.Fatalf("the proxy's Secret has no key %s: %v", owner, slices.Sorted(maps.Keys(sec.Data)))
		}
		delete(sec.Data, owner)
		if err := e.Kube.Update(ctx, sec); err != nil {
			t.Fatal(err)
		}
		old := p.Status.AtProvider.Details["pod"]
		if err := e.Kube.Delete(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: proxyNS, Name: old}}); err != nil {
			t.Fatal(err)
		}
		var next string
		testenv.WaitFor(t, "the kubelet to refuse the next pod's Secret", e.within(60*time.Second), func() (bool, string) {
			evs := &corev1.EventList{}
			if err := e.Kube.List(ctx, evs, client.InNamespace(proxyNS)); err != nil {
				return false, err.Error()
			}
			for _, ev := range evs.Items {
				if ev.InvolvedObject.Kind == "Pod" && ev.InvolvedObject.Name != old && strings.HasPrefix(ev.InvolvedObject.Name, key.Name+"-") &&
					ev.Reason == "FailedMount" && strings.Contains(ev.Message, owner) {
					next = ev.InvolvedObject.Name
					return true, ""
				}
			}
			return false, fmt.Sprintf("%d events, none a FailedMount naming %s", len(evs.Items), owner)
		})
		np := e.pod(t, p, next)
		for _, cs := range np.Status.ContainerStatuses {
			if cs.State.Running != nil || cs.State.Terminated != nil || cs.RestartCount != 0 {
				t.Errorf("pod %s's container %s started on a Secret without its owner key: %+v", next, cs.Name, cs.State)
			}
		}
		if np.Status.Phase != corev1.PodPending {
			t.Errorf("pod %s is %s; want Pending", next, np.Status.Phase)
		}
		e.deleteLeavingNothing(t, p)
	})

	t.Run("ImageThatCannotBePulled", func(t *testing.T) {
		t.Parallel()
		p := nsPodProxy("team-b", "unpullable", "ClusterProviderConfig", "broken-image")
		p.Spec.ForProvider.Proxy.AllowedClientCIDRs = []string{e.clients}
		if err := e.Kube.Create(ctx, p); err != nil {
			t.Fatal(err)
		}
		c := e.WaitForCondition(t, p, xpv2.TypeReady, corev1.ConditionFalse, "ImagePull")
		t.Logf("Ready: %s %s", c.Reason, c.Message)
		if !strings.Contains(c.Message, "localhost/egressproxy/no-such-squid:1") {
			t.Errorf("Ready message %q does not name the image", c.Message)
		}
		e.deleteLeavingNothing(t, p)
	})

	t.Run("CrashLoopingContainer", func(t *testing.T) {
		t.Parallel()
		p := nsPodProxy("team-b", "crashing", "ClusterProviderConfig", "crashing")
		p.Spec.ForProvider.Proxy.AllowedClientCIDRs = []string{e.clients}
		if err := e.Kube.Create(ctx, p); err != nil {
			t.Fatal(err)
		}
		c := e.WaitForCondition(t, p, xpv2.TypeReady, corev1.ConditionFalse, "CrashLoopBackOff")
		t.Logf("Ready: %s %s", c.Reason, c.Message)
		if !strings.Contains(c.Message, crashMessage) || !strings.Contains(c.Message, "last exit 1") {
			t.Errorf("Ready message %q; want the container's last exit (1) and message %q", c.Message, crashMessage)
		}
		e.deleteLeavingNothing(t, p)
	})
}

func names(cs []corev1.Container) []string {
	n := make([]string, 0, len(cs))
	for _, c := range cs {
		n = append(n, c.Name)
	}
	return n
}
