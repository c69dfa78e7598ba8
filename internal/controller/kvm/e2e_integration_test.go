package kvm_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/meta"
	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
	corev1 "k8s.io/api/core/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	nsproxy "github.com/egressproxy/provider-egressproxy/apis/namespaced/proxy/v1alpha1"
	nsv1alpha1 "github.com/egressproxy/provider-egressproxy/apis/namespaced/v1alpha1"
	spec "github.com/egressproxy/provider-egressproxy/apis/spec/v1alpha1"
	kvmbackend "github.com/egressproxy/provider-egressproxy/internal/backend/kvm"
	"github.com/egressproxy/provider-egressproxy/internal/backend/kvm/kvmtest"
	pcontroller "github.com/egressproxy/provider-egressproxy/internal/controller"
	"github.com/egressproxy/provider-egressproxy/internal/controller/external"
	"github.com/egressproxy/provider-egressproxy/internal/controller/kvm"
	"github.com/egressproxy/provider-egressproxy/internal/devenv/testenv"
	"github.com/egressproxy/provider-egressproxy/internal/devenv/testenv/providerenv"
)

func TestMain(m *testing.M) { testenv.Main(m, kvmtest.Down) }

// vendorData is the e2e config's vendorData: a script that leaves
// vendorDataMarker on the guest.
const (
	vendorDataMarker = "/var/lib/egressproxy-vendor-data"
	vendorData       = "#!/bin/sh\necho 'vendor-data ran' > " + vendorDataMarker + "\n"
)

// TestIntegrationKVMProxyEndToEnd is the real path: a Debian guest image
// built by hack/guest-image.sh and served over HTTP on loopback as the
// image URL, a real libvirtd (TCG) behind a real sshd set up by
// hack/libvirt-up.sh, the KVMProxy controllers running in-process on a real
// control plane with the production binding. A KVMProxy becomes Ready, a
// real request goes through the VM's Squid with the connection Secret's
// URL, and deleting the KVMProxy leaves no domain, overlay or seed.
// Traffic stays on this machine: the guest sits on an isolated network
// and the request's destination is the host's address on it.
func TestIntegrationKVMProxyEndToEnd(t *testing.T) {
	total := time.Now()
	phase := func(name string, since time.Time) { t.Logf("phase %-28s %6.1fs", name, time.Since(since).Seconds()) }

	t0 := time.Now()
	h := kvmtest.Up(t)
	phase("libvirt host up", t0)

	t0 = time.Now()
	image := kvmtest.GuestImage(t)
	phase("guest image", t0)
	sum, size := fileSHA256(t, image)
	t.Logf("guest image %s: %d MiB, sha256 %s", filepath.Base(image), size>>20, sum)

	// The image, served from a test host of the test's own (admission
	// refuses image URLs on loopback): the provider downloads it.
	imgSrv := testenv.NewTestHost(t).Serve(t, ":0", http.FileServer(http.Dir(filepath.Dir(image))))
	imageURL := "http://" + imgSrv.String() + "/" + filepath.Base(image)
	// The destination of the request through the proxy: the host itself,
	// on the isolated network.
	const hello = "hello from the host, through the VM's squid"
	dest := serve(t, net.JoinHostPort(h.Values["HOST_IP"], "80"), http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, hello)
	}))

	// The image URL's port is new each run, and so is the base volume's
	// name (it holds a digest of the URL): remove this run's base, so runs
	// do not pile up half-GiB bases. Only that one: the pool is shared with
	// concurrent runs, whose volumes are theirs.
	t.Cleanup(func() { h.DeleteVolumes(t, kvmbackend.BaseVolumes("debian-12", imageURL, sum, "qcow2", false)...) })

	t0 = time.Now()
	// The KVMProxy controllers with the production binding (kvm.New, its
	// real Connect) and the config health checks.
	e := providerenv.Start(t, providerenv.Options{
		Bindings: func(mgr ctrl.Manager, _ external.Options) []external.Binding {
			return []external.Binding{kvm.New(mgr, kvm.Options{})}
		},
		InstallationID: runName("e2e"), NotReadyPollInterval: 2 * time.Second, MaxConcurrentReconciles: 2,
		Health: pcontroller.HealthOptions{Timeout: 30 * time.Second},
	})
	kube := e.Kube
	phase("control plane and controllers", t0)

	ctx := context.Background()
	// The namespace, and so the domain's name, is this run's own: another
	// run's domain on the shared libvirtd never has it.
	ns := runName("team-e2e")
	for _, o := range []client.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}},
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "kvm-ssh", Namespace: "crossplane-system"},
			Data: map[string][]byte{"id_ed25519": h.Key, "known_hosts": h.KnownHosts}},
		&nsv1alpha1.ClusterProviderConfig{ObjectMeta: metav1.ObjectMeta{Name: "local-kvm"},
			Spec: nsv1alpha1.ClusterProviderConfigSpec{ProviderConfigSpec: spec.ProviderConfigSpec{KVM: &spec.KVMConfig{
				Credentials: spec.KVMCredentials{
					SSHKeySecretRef:     spec.SecretKeySelector{Namespace: "crossplane-system", Name: "kvm-ssh", Key: "id_ed25519"},
					KnownHostsSecretRef: &spec.SecretKeySelector{Namespace: "crossplane-system", Name: "kvm-ssh", Key: "known_hosts"},
				},
				DiskSizeGB: 3,
				// The platform's own setup, beside the provider's.
				VendorData:   vendorData,
				Images:       map[string]spec.KVMImage{"debian-12": {URL: imageURL, SHA256: sum, Format: "qcow2", Firmware: "bios"}},
				MachineTypes: map[string]spec.KVMMachineType{"small": {VCPUs: 2, MemoryMiB: 768}},
				Hosts: []spec.KVMHost{{Name: "local", Address: h.Values["SSH_ADDRESS"], User: h.Values["SSH_USER"],
					Socket: h.Values["SOCKET"], Pool: h.Values["POOL"], Network: h.Values["NETWORK"], DomainType: "qemu"}},
			}}}},
	} {
		if err := kube.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}

	p := &nsproxy.KVMProxy{
		ObjectMeta: metav1.ObjectMeta{Name: "e2e", Namespace: ns},
		Spec: nsproxy.KVMProxySpec{
			ManagedResourceSpec: providerenv.ManagedSpec("local-kvm", "e2e-proxy"),
			ForProvider: spec.KVMProxyParameters{
				Proxy: spec.ProxySettings{
					AllowedClientCIDRs: []string{h.Values["HOST_IP"] + "/32"},
					// The destination is the host on the isolated (private)
					// network, which a proxy reaches only when opened.
					AllowedDestinationCIDRs: []string{h.Values["HOST_IP"] + "/32"},
					Auth:                    &spec.ProxyAuth{Enabled: true},
				},
			},
		},
	}
	// A run killed before its Delete leaves its domain: removed when that
	// run's process is gone (a live run's is left alone).
	sweepDeadRuns(t, h, "e2e")
	t0 = time.Now()
	if err := kube.Create(ctx, p); err != nil {
		t.Fatal(err)
	}
	// Every distinct Ready message on the way, so the log shows the
	// download's percentages, the boot and the wait for Squid.
	last := ""
	testenv.WaitFor(t, "the KVMProxy to become Ready", 15*time.Minute, func() (bool, string) {
		if err := kube.Get(ctx, client.ObjectKeyFromObject(p), p); err != nil {
			return false, err.Error()
		}
		r, s := p.GetCondition(xpv2.TypeReady), p.GetCondition(xpv2.TypeSynced)
		if msg := fmt.Sprintf("Ready=%s %s | Synced=%s %s", r.Status, r.Message, s.Status, s.Message); msg != last {
			t.Logf("%6.1fs %s", time.Since(t0).Seconds(), msg)
			last = msg
		}
		return r.Status == corev1.ConditionTrue, last
	})
	phase("KVMProxy Ready", t0)
	obs := p.Status.AtProvider
	t.Logf("status.atProvider: id %s, state %s, ip %s, endpoint %s", obs.ID, obs.State, obs.IP, obs.Endpoint)
	if obs.State != "Running" || !obs.ProxyReachable || obs.ID != "hosts/local/domains/"+meta.GetExternalName(p) {
		t.Errorf("status.atProvider = %+v", obs)
	}

	t0 = time.Now()
	conn := &corev1.Secret{}
	if err := kube.Get(ctx, types.NamespacedName{Namespace: ns, Name: "e2e-proxy"}, conn); err != nil {
		t.Fatal(err)
	}
	proxyURL, err := url.Parse(string(conn.Data["url"]))
	if err != nil || proxyURL.User == nil {
		t.Fatalf("connection secret url %q: %v", proxyURL.Redacted(), err)
	}
	var body string
	name := meta.GetExternalName(p)
	t.Cleanup(func() {
		if t.Failed() && slices.Contains(h.Domains(t), name) {
			t.Logf("guest diagnostics:\n%s", h.GuestExec(t, name,
				"systemctl status squid --no-pager -l | tail -20; journalctl -b -u squid --no-pager | tail -30; tail -40 /var/log/cloud-init-output.log; ss -ltnp"))
		}
		if t.Failed() {
			h.Purge(name) // this run's domain, its overlay and seed only
		}
	})
	testenv.WaitFor(t, "a request through the VM's squid", 2*time.Minute, func() (bool, string) {
		r, err := testenv.TryGetThroughProxy(proxyURL.String(), "http://"+dest+"/")
		if err != nil {
			return false, err.Error()
		}
		body = r.Body
		return r.Status == http.StatusOK, fmt.Sprint(r.Status, " ", r.SquidError)
	})
	if body != hello {
		t.Errorf("body through the proxy = %q", body)
	}
	// Without the password Squid says 407: the proxy is never open.
	noAuth := *proxyURL
	noAuth.User = nil
	if r, err := testenv.TryGetThroughProxy(noAuth.String(), "http://"+dest+"/"); err != nil || r.Status != http.StatusProxyAuthRequired {
		t.Errorf("request without credentials = %+v, %v; want 407", r, err)
	}
	phase("requests through squid", t0)

	// The guest's first boot ends without an error: a runcmd that fails
	// after configuring Squid still serves, but reads as broken to whoever
	// looks (cloud-init status: error).
	t0 = time.Now()
	testenv.WaitFor(t, "cloud-init to be done on the guest", 5*time.Minute, func() (bool, string) {
		out := h.GuestExec(t, name, "cloud-init status --long")
		if strings.Contains(out, "status: error") {
			t.Fatalf("cloud-init on the guest ended with an error:\n%s", out)
		}
		return strings.Contains(out, "status: done"), out
	})
	phase("cloud-init done", t0)
	// The config's vendorData ran on the guest, and the provider's setup
	// with it.
	if out := h.GuestExec(t, name, "cat "+vendorDataMarker); strings.TrimSpace(out) != "vendor-data ran" {
		t.Errorf("the config's vendorData did not run on the guest: %s holds %q", vendorDataMarker, out)
	}

	// The proxy block changes in place: the guest agent writes Squid's new
	// config and reloads it; the connection Secret follows.
	t0 = time.Now()
	if err := kube.Get(ctx, client.ObjectKeyFromObject(p), p); err != nil {
		t.Fatal(err)
	}
	port := int32(3129)
	p.Spec.ForProvider.Proxy.Port = &port
	if err := kube.Update(ctx, p); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, "the proxy to serve on the new port", 3*time.Minute, func() (bool, string) {
		if err := kube.Get(ctx, types.NamespacedName{Namespace: ns, Name: "e2e-proxy"}, conn); err != nil {
			return false, err.Error()
		}
		u, err := url.Parse(string(conn.Data["url"]))
		if err != nil || u.Port() != "3129" {
			_ = kube.Get(ctx, client.ObjectKeyFromObject(p), p)
			return false, fmt.Sprintf("url port %s; %s", u.Port(), p.GetCondition(xpv2.TypeSynced).Message)
		}
		r, err := testenv.TryGetThroughProxy(u.String(), "http://"+dest+"/")
		if err != nil {
			return false, err.Error()
		}
		return r.Status == http.StatusOK, fmt.Sprint(r.Status, " ", r.SquidError)
	})
	phase("update in place", t0)

	t0 = time.Now()
	if err := kube.Delete(ctx, p); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, "the KVMProxy to be gone", 3*time.Minute, func() (bool, string) {
		err := kube.Get(ctx, client.ObjectKeyFromObject(p), p)
		return kerrors.IsNotFound(err), fmt.Sprint(err)
	})
	phase("delete", t0)
	if slices.Contains(h.Domains(t), name) {
		t.Errorf("domain %s is still on the host", name)
	}
	for _, v := range h.Volumes(t) {
		if v == name+".qcow2" || v == name+"-seed.iso" {
			t.Errorf("volume %s is still in the pool", v)
		}
	}
	phase("total", total)
}

func serve(t *testing.T, addr string, h http.Handler) string {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("listen %s: %v", addr, err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return ln.Addr().String()
}

func fileSHA256(t *testing.T, path string) (string, int64) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil)), n
}
