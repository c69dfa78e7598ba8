package kvm_test

import (
	"context"
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
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
	"github.com/egressproxy/provider-egressproxy/internal/devenv/forwarding"
	"github.com/egressproxy/provider-egressproxy/internal/devenv/netnshost"
	"github.com/egressproxy/provider-egressproxy/internal/devenv/testenv"
	"github.com/egressproxy/provider-egressproxy/internal/devenv/testenv/providerenv"
)

// TestIntegrationKVMProxyEgressBehindNAT is the egress check on a real
// guest behind the host's NAT: a libvirt network of the test's own in
// forward mode nat, whose only way out is the veth of a test host in a
// network namespace of the test's (so traffic never leaves the machine),
// masquerades the guest to the host's address on that veth. The address
// the provider publishes is Verified and is the one the upstream saw of a
// request through the proxy, not the guest's own DHCP address (the
// host's guestNetwork is NAT, so no backend figure is published). Then a
// firewall rule of the test's keeps the provider's probe from the guest:
// the guest's own check, through its own Squid, read back through the
// guest agent, gives the same address, Reported.
func TestIntegrationKVMProxyEgressBehindNAT(t *testing.T) {
	total := time.Now()
	phase := func(name string, since time.Time) { t.Logf("phase %-28s %6.1fs", name, time.Since(since).Seconds()) }
	h := kvmtest.Up(t)
	image := kvmtest.GuestImage(t)
	sum, _ := fileSHA256(t, image)
	imgSrv := testenv.NewTestHost(t).Serve(t, ":0", http.FileServer(http.Dir(filepath.Dir(image))))
	imageURL := "http://" + imgSrv.String() + "/" + filepath.Base(image)

	// The upstream, where the vendor stands: it answers with the address it
	// saw at testenv.EchoURL.
	upHost := testenv.NewTestHost(t)
	upAddr := upHost.Serve(t, ":0", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == netnshost.EchoPath {
			netnshost.Echo(w, r)
			return
		}
		_, _ = fmt.Fprint(w, testenv.UpstreamBody)
	}))
	upstream := "http://" + upAddr.String() + "/"
	echo := testenv.EchoURL(upstream)

	// The NAT network: out through the upstream host's veth only. It is
	// transient (net-create: nothing goes into /etc/libvirt, and a run
	// killed before its clean-up leaves nothing a libvirtd restart, or
	// hack/libvirt-down.sh, does not remove), on a /24 no route of this
	// machine's uses yet, so concurrent runs each have their own.
	netName := fmt.Sprintf("egressproxy-nat-%d", os.Getpid()%100000)
	bridge := fmt.Sprintf("virbr-epn%d", os.Getpid()%100000)
	dir := t.TempDir()
	// libvirt turns forwarding on for a NAT network and never off: the
	// test holds it, with whatever else of the project needs it now (a
	// node's pods in another test), and the last of them puts it back.
	fwd, err := forwarding.Take("kvm-nat")
	if err != nil {
		t.Fatal(err)
	}
	// After the network's destroy below (clean-ups run last first).
	t.Cleanup(func() {
		if err := fwd.Release(anotherNetworkForwards(t)); err != nil {
			t.Errorf("letting go of ip_forward: %v", err)
		}
	})
	var natSubnet string
	var tried []string
	for attempt := 0; ; attempt++ {
		natSubnet = freeSubnet(t, tried...)
		// DNS off: the guest reaches the upstream by address, and libvirt's
		// dnsmasq would forward its lookups to this machine's resolvers.
		xml := fmt.Sprintf(`<network>
  <name>%s</name>
  <forward mode='nat' dev='%s'/>
  <bridge name='%s' stp='on' delay='0'/>
  <dns enable='no'/>
  <ip address='%s.1' netmask='255.255.255.0'>
    <dhcp><range start='%s.10' end='%s.250'/></dhcp>
  </ip>
</network>
`, netName, upHost.Netns+"o", bridge, natSubnet, natSubnet, natSubnet)
		xmlFile := filepath.Join(dir, "net.xml")
		if err := os.WriteFile(xmlFile, []byte(xml), 0o600); err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command("virsh", "-c", "qemu:///system", "net-create", xmlFile).CombinedOutput()
		if err == nil {
			break
		}
		// Another run took the subnet between the look at the routes and
		// here: libvirt refuses a subnet in use; the next is tried.
		if attempt >= 5 || !strings.Contains(string(out), "in use") {
			t.Fatalf("virsh net-create %s on %s.0/24: %v: %s", netName, natSubnet, err, out)
		}
		t.Logf("subnet %s.0/24 taken meanwhile (%s); trying another", natSubnet, strings.TrimSpace(string(out)))
		tried = append(tried, natSubnet)
	}
	t.Logf("NAT network %s on %s.0/24", netName, natSubnet)
	t.Cleanup(func() { _ = exec.Command("virsh", "-c", "qemu:///system", "net-destroy", netName).Run() })

	// The volumes this run adds to the shared pool: its own base (the
	// image URL's port is this run's) and the overlay and seed of its own
	// domain, should its Delete not have run. No other volume.
	var instance string // the domain's name, once the KVMProxy is made
	t.Cleanup(func() {
		vols := kvmbackend.BaseVolumes("debian-12", imageURL, sum, "qcow2", false)
		if instance != "" && !slices.Contains(h.Domains(t), instance) {
			vols = append(vols, instanceVolumes(instance)...)
		}
		h.DeleteVolumes(t, vols...)
	})

	e := providerenv.Start(t, providerenv.Options{
		Bindings: func(mgr ctrl.Manager, _ external.Options) []external.Binding {
			return []external.Binding{kvm.New(mgr, kvm.Options{})}
		},
		InstallationID: runName("nat"), NotReadyPollInterval: 2 * time.Second, PollInterval: 5 * time.Second, MaxConcurrentReconciles: 2,
		Health: pcontroller.HealthOptions{Timeout: 30 * time.Second},
	})
	kube := e.Kube
	ctx := context.Background()
	hostIP := natSubnet + ".1"
	// The namespace, and so the domain's name, is this run's own.
	ns := runName("team-nat")
	for _, o := range []client.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}},
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "kvm-ssh", Namespace: "crossplane-system"},
			Data: map[string][]byte{"id_ed25519": h.Key, "known_hosts": h.KnownHosts}},
		&nsv1alpha1.ClusterProviderConfig{ObjectMeta: metav1.ObjectMeta{Name: "nat-kvm"},
			Spec: nsv1alpha1.ClusterProviderConfigSpec{ProviderConfigSpec: spec.ProviderConfigSpec{KVM: &spec.KVMConfig{
				Credentials: spec.KVMCredentials{
					SSHKeySecretRef:     spec.SecretKeySelector{Namespace: "crossplane-system", Name: "kvm-ssh", Key: "id_ed25519"},
					KnownHostsSecretRef: &spec.SecretKeySelector{Namespace: "crossplane-system", Name: "kvm-ssh", Key: "known_hosts"},
				},
				DiskSizeGB:   3,
				Images:       map[string]spec.KVMImage{"debian-12": {URL: imageURL, SHA256: sum, Format: "qcow2", Firmware: "bios"}},
				MachineTypes: map[string]spec.KVMMachineType{"small": {VCPUs: 2, MemoryMiB: 768}},
				// guestNetwork defaults to NAT: no backend figure.
				Hosts: []spec.KVMHost{{Name: "local", Address: h.Values["SSH_ADDRESS"], User: h.Values["SSH_USER"],
					Socket: h.Values["SOCKET"], Pool: h.Values["POOL"], Network: netName, DomainType: "qemu"}},
				EgressCheck: &spec.EgressCheck{URL: echo, Interval: &metav1.Duration{Duration: time.Minute}},
			}}}},
	} {
		if err := kube.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	p := &nsproxy.KVMProxy{
		ObjectMeta: metav1.ObjectMeta{Name: "nat", Namespace: ns},
		Spec: nsproxy.KVMProxySpec{
			ManagedResourceSpec: providerenv.ManagedSpec("nat-kvm", "nat-proxy"),
			ForProvider: spec.KVMProxyParameters{Proxy: spec.ProxySettings{
				AllowedClientCIDRs: []string{hostIP + "/32"},
				AllowedPorts:       []int32{443, int32(upAddr.Port())},
				Auth:               &spec.ProxyAuth{Enabled: true},
			}},
		},
	}
	// What a killed run of this test left on the host (a live run's is
	// left alone).
	sweepDeadRuns(t, h, "nat")
	instance = external.InstanceName(p)
	t0 := time.Now()
	if err := kube.Create(ctx, p); err != nil {
		t.Fatal(err)
	}
	name := meta.GetExternalName(p)
	t.Cleanup(func() {
		if t.Failed() && slices.Contains(h.Domains(t), name) {
			t.Logf("guest diagnostics:\n%s", h.GuestExec(t, name,
				"ip -4 addr; systemctl status squid egressproxy-egress-check --no-pager -l | tail -30; cat /var/lib/egressproxy/egress-check.report; tail -20 /var/log/cloud-init-output.log"))
			h.Purge(name)
		}
	})
	last := ""
	testenv.WaitFor(t, "the KVMProxy to be Ready and its egress verified", 40*time.Minute, func() (bool, string) {
		if err := kube.Get(ctx, client.ObjectKeyFromObject(p), p); err != nil {
			return false, err.Error()
		}
		r, c := p.GetCondition(xpv2.TypeReady), p.GetCondition(spec.TypeEgressVerified)
		if msg := fmt.Sprintf("Ready=%s %s | EgressVerified=%s %s %s", r.Status, r.Message, c.Status, c.Reason, c.Message); msg != last {
			t.Logf("%6.1fs %s", time.Since(t0).Seconds(), msg)
			last = msg
		}
		return r.Status == corev1.ConditionTrue && c.Reason == "Verified", last
	})
	phase("Ready and verified", t0)

	obs := p.Status.AtProvider
	conn := &corev1.Secret{}
	if err := kube.Get(ctx, types.NamespacedName{Namespace: ns, Name: "nat-proxy"}, conn); err != nil {
		t.Fatal(err)
	}
	r, err := testenv.TryGetThroughProxy(string(conn.Data["url"]), echo)
	if err != nil || r.Status != http.StatusOK {
		t.Fatalf("GET the echo through the proxy as its user = %+v, %v", r, err)
	}
	seen := strings.TrimSpace(r.Body)
	guest, _ := netip.ParseAddr(obs.IP)
	t.Logf("the guest's own address %s; the upstream saw %s; egressIP %s (%s)", obs.IP, seen, obs.EgressIP, obs.EgressIPSource)
	if obs.EgressIP != seen || obs.EgressIPSource != spec.EgressIPVerified || string(conn.Data["egressIP"]) != seen {
		t.Errorf("egressIP %q (%s), connection Secret %q; want %s, what the upstream saw, Verified", obs.EgressIP, obs.EgressIPSource, conn.Data["egressIP"], seen)
	}
	if !netip.MustParsePrefix(natSubnet+".0/24").Contains(guest) || seen == obs.IP || seen != upHost.Gateway.String() {
		t.Errorf("guest %s, upstream saw %s; want the guest in %s.0/24 masqueraded to the host's address on the upstream's veth, %s", obs.IP, seen, natSubnet, upHost.Gateway)
	}

	// The provider's probe is kept from the guest (a rule of the test's,
	// on this machine's output): the guest's own check stands for it.
	t0 = time.Now()
	testenv.InsertRule(t, "filter", name, "OUTPUT", "-d", obs.IP, "-p", "tcp", "--dport", "3128", "-j", "REJECT", "--reject-with", "tcp-reset")
	testenv.WaitFor(t, "the guest's own report", 5*time.Minute, func() (bool, string) {
		if err := kube.Get(ctx, client.ObjectKeyFromObject(p), p); err != nil {
			return false, err.Error()
		}
		c := p.GetCondition(spec.TypeEgressVerified)
		return c.Reason == "Reported", fmt.Sprintf("%s %s %q; Ready %s %q", c.Status, c.Reason, c.Message, p.GetCondition(xpv2.TypeReady).Status, p.GetCondition(xpv2.TypeReady).Message)
	})
	phase("reported by the guest", t0)
	obs = p.Status.AtProvider
	if obs.EgressIP != seen || obs.EgressIPSource != spec.EgressIPReported || obs.EgressIPVerifiedAt == nil || p.GetCondition(xpv2.TypeReady).Status != corev1.ConditionTrue {
		t.Errorf("reported: egressIP %q (%s, at %v), Ready %s; want %s Reported, Ready on the guest's word", obs.EgressIP, obs.EgressIPSource, obs.EgressIPVerifiedAt, p.GetCondition(xpv2.TypeReady).Status, seen)
	}

	t0 = time.Now()
	if err := kube.Delete(ctx, p); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, "the KVMProxy to be gone", 3*time.Minute, func() (bool, string) {
		err := kube.Get(ctx, client.ObjectKeyFromObject(p), p)
		return kerrors.IsNotFound(err), fmt.Sprint(err)
	})
	phase("delete", t0)
	phase("total", total)
}

// anotherNetworkForwards reports whether a libvirt network of the
// machine's that forwards (nat, route, open: libvirt turned forwarding on
// for it) is active: it then needs forwarding left on. The project's own
// (another run's egressproxy-nat-*, which holds forwarding itself, and the
// isolated egressproxy-test) do not count.
func anotherNetworkForwards(t *testing.T) bool {
	t.Helper()
	out, err := exec.Command("virsh", "-c", "qemu:///system", "net-list", "--name").Output()
	if err != nil {
		return true
	}
	for _, n := range strings.Fields(string(out)) {
		if strings.HasPrefix(n, "egressproxy-nat-") || n == "egressproxy-test" {
			continue
		}
		x, err := exec.Command("virsh", "-c", "qemu:///system", "net-dumpxml", n).Output()
		if err != nil || strings.Contains(string(x), "<forward mode='nat'") || strings.Contains(string(x), "<forward mode='route'") || strings.Contains(string(x), "<forward mode='open'") {
			t.Logf("leaving ip_forward on: network %s forwards", n)
			return true
		}
	}
	return false
}
