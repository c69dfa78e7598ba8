package kvm_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
	corev1 "k8s.io/api/core/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	nsproxy "github.com/egressproxy/provider-egressproxy/apis/namespaced/proxy/v1alpha1"
	nsv1alpha1 "github.com/egressproxy/provider-egressproxy/apis/namespaced/v1alpha1"
	spec "github.com/egressproxy/provider-egressproxy/apis/spec/v1alpha1"
	"github.com/egressproxy/provider-egressproxy/internal/backend/kvm/kvmtest"
	pcontroller "github.com/egressproxy/provider-egressproxy/internal/controller"
	"github.com/egressproxy/provider-egressproxy/internal/controller/external"
	"github.com/egressproxy/provider-egressproxy/internal/controller/kvm"
	"github.com/egressproxy/provider-egressproxy/internal/devenv/testenv"
	"github.com/egressproxy/provider-egressproxy/internal/devenv/testenv/providerenv"
	"github.com/egressproxy/provider-egressproxy/internal/squid"
)

var kvmRounds = flag.Int("kvm-rounds", 3, "BenchmarkKVMProxyCreateToReady: measured rounds, after one that brings the base image into the pool.")

// kvmPhases are the milestones of a KVMProxy's create-to-Ready, in order,
// each timed from the create.
var kvmPhases = []string{"defined", "started", "DHCP address", "Squid answering", "Squid configured", "cloud-init done", "provider Ready"}

// BenchmarkKVMProxyCreateToReady times a KVMProxy's create-to-Ready by
// phase on the real libvirtd (hack/libvirt-up.sh) with the guest image of
// hack/guest-image.sh, the base image already in the pool (a first round,
// reported apart, brings it there): the domain defined, started, its first
// DHCP lease, Squid answering on its port (any Squid: the image's own
// starts with its default configuration), Squid answering with this
// resource's configuration (the provider's probe, squid.Ask; both from
// the host every 100 ms), cloud-init done (the guest agent's `cloud-init
// status`), and the provider's Ready; then cloud-init's slowest modules
// (`cloud-init analyze blame`). It prints each round and the medians, and appends
// them to BENCH_DATA/kvm.jsonl (hack/bench-kvm.sh draws them). A
// benchmark, not a test: nothing is asserted of the times. Run it with
// -benchtime 1x (make bench-kvm ROUNDS=3).
func BenchmarkKVMProxyCreateToReady(b *testing.B) {
	h := kvmtest.Up(b)
	image := kvmtest.GuestImage(b)
	sum := benchSHA256(b, image)
	imgSrv := testenv.NewTestHost(b).Serve(b, ":0", http.FileServer(http.Dir(filepath.Dir(image))))
	imageURL := "http://" + imgSrv.String() + "/" + filepath.Base(image)
	before := h.Volumes(b)
	b.Cleanup(func() {
		for _, v := range h.Volumes(b) {
			if !slices.Contains(before, v) {
				h.Virsh(b, "vol-delete", "--pool", h.Values["POOL"], v)
			}
		}
	})
	e := providerenv.Start(b, providerenv.Options{
		Bindings: func(mgr ctrl.Manager, _ external.Options) []external.Binding {
			return []external.Binding{kvm.New(mgr, kvm.Options{})}
		},
		// The provider's defaults: what a user waits for.
		InstallationID: "bench-kvm", NotReadyPollInterval: 10 * time.Second, MaxConcurrentReconciles: 2,
		Health: pcontroller.HealthOptions{Timeout: 30 * time.Second},
	})
	kube := e.Kube
	ctx := context.Background()
	for _, o := range []client.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team-bench"}},
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "kvm-ssh", Namespace: "crossplane-system"},
			Data: map[string][]byte{"id_ed25519": h.Key, "known_hosts": h.KnownHosts}},
		&nsv1alpha1.ClusterProviderConfig{ObjectMeta: metav1.ObjectMeta{Name: "bench-kvm"},
			Spec: nsv1alpha1.ClusterProviderConfigSpec{ProviderConfigSpec: spec.ProviderConfigSpec{KVM: &spec.KVMConfig{
				Credentials: spec.KVMCredentials{
					SSHKeySecretRef:     spec.SecretKeySelector{Namespace: "crossplane-system", Name: "kvm-ssh", Key: "id_ed25519"},
					KnownHostsSecretRef: &spec.SecretKeySelector{Namespace: "crossplane-system", Name: "kvm-ssh", Key: "known_hosts"},
				},
				DiskSizeGB:   3,
				Images:       map[string]spec.KVMImage{"debian-12": {URL: imageURL, SHA256: sum, Format: "qcow2", Firmware: "bios"}},
				MachineTypes: map[string]spec.KVMMachineType{"small": {VCPUs: 2, MemoryMiB: 768}},
				Hosts: []spec.KVMHost{{Name: "local", Address: h.Values["SSH_ADDRESS"], User: h.Values["SSH_USER"],
					Socket: h.Values["SOCKET"], Pool: h.Values["POOL"], Network: h.Values["NETWORK"], DomainType: "qemu"}},
			}}}},
	} {
		if err := kube.Create(ctx, o); err != nil {
			b.Fatal(err)
		}
	}

	run := time.Now().UTC().Format("20060102T150405")
	all := map[string][]float64{}
	for round := 0; round <= *kvmRounds; round++ {
		at := kvmRound(ctx, b, h, kube, round)
		var row []string
		prev := 0.0
		for _, ph := range kvmPhases {
			s, ok := at[ph]
			if !ok {
				row = append(row, ph+" -")
				continue
			}
			row = append(row, fmt.Sprintf("%s %.1f s (+%.1f)", ph, s, s-prev))
			prev = s
		}
		load := benchLoad()
		if round == 0 {
			b.Logf("round 0 (the base image brought into the pool; not counted): %s; load %s", strings.Join(row, ", "), load)
			continue
		}
		b.Logf("round %d: %s; load %s", round, strings.Join(row, ", "), load)
		for _, ph := range kvmPhases {
			if s, ok := at[ph]; ok {
				all[ph] = append(all[ph], s)
			}
		}
		appendKVM(b, run, round, at, load)
	}
	var med []string
	prev := 0.0
	for _, ph := range kvmPhases {
		m := benchMedian(all[ph])
		med = append(med, fmt.Sprintf("%s %.1f s (+%.1f)", ph, m, m-prev))
		prev = m
	}
	b.Logf("medians over %d rounds, from the create: %s", *kvmRounds, strings.Join(med, ", "))
	b.Logf("the provider's share (Squid answering with the resource's configuration -> provider Ready): median %.2f s (target under 1 s)",
		benchMedian(all["provider Ready"])-benchMedian(all["Squid configured"]))
}

// kvmRound creates one KVMProxy, records when each phase was first seen
// (seconds after the create), and deletes it.
func kvmRound(ctx context.Context, b *testing.B, h *kvmtest.Host, kube client.Client, round int) map[string]float64 {
	b.Helper()
	p := &nsproxy.KVMProxy{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("bench-%d", round), Namespace: "team-bench"},
		Spec: nsproxy.KVMProxySpec{
			ManagedResourceSpec: providerenv.ManagedSpec("bench-kvm", fmt.Sprintf("bench-%d-proxy", round)),
			ForProvider: spec.KVMProxyParameters{Proxy: spec.ProxySettings{
				AllowedClientCIDRs: []string{h.Values["HOST_IP"] + "/32"},
			}},
		},
	}
	if stale := external.InstanceName(p); slices.Contains(h.Domains(b), stale) {
		h.Purge(stale)
	}
	t0 := time.Now()
	if err := kube.Create(ctx, p); err != nil {
		b.Fatal(err)
	}
	// Each phase is watched on its own, so a slow check (the guest
	// agent's answer) never delays seeing another.
	var mu sync.Mutex
	at := map[string]float64{}
	mark := func(ph string) {
		mu.Lock()
		defer mu.Unlock()
		if _, ok := at[ph]; !ok {
			at[ph] = time.Since(t0).Seconds()
		}
	}
	seen := func(ph string) bool {
		mu.Lock()
		defer mu.Unlock()
		_, ok := at[ph]
		return ok
	}
	name := external.InstanceName(p)
	var ipMu sync.Mutex
	ip := ""
	addr := func() string {
		ipMu.Lock()
		defer ipMu.Unlock()
		return ip
	}
	deadline := t0.Add(20 * time.Minute)
	var wg sync.WaitGroup
	watch := func(every time.Duration, phases []string, check func()) {
		wg.Go(func() {
			for time.Now().Before(deadline) {
				done := true
				for _, ph := range phases {
					done = done && seen(ph)
				}
				if done {
					return
				}
				check()
				time.Sleep(every)
			}
		})
	}
	watch(100*time.Millisecond, []string{"provider Ready"}, func() {
		got := &nsproxy.KVMProxy{}
		if err := kube.Get(ctx, client.ObjectKeyFromObject(p), got); err == nil && got.GetCondition(xpv2.TypeReady).Status == corev1.ConditionTrue {
			mark("provider Ready")
		}
	})
	watch(100*time.Millisecond, []string{"defined", "started", "DHCP address"}, func() {
		if st, err := virsh("domstate", name); err == nil {
			mark("defined")
			if strings.TrimSpace(st) == "running" {
				mark("started")
			}
		}
		if seen("started") && addr() == "" {
			if a := leaseAddress(name); a != "" {
				ipMu.Lock()
				ip = a
				ipMu.Unlock()
				mark("DHCP address")
			}
		}
	})
	watch(100*time.Millisecond, []string{"Squid answering"}, func() {
		if a := addr(); a != "" && squidAnswers(net.JoinHostPort(a, "3128")) {
			mark("Squid answering")
		}
	})
	watch(100*time.Millisecond, []string{"Squid configured"}, func() {
		a := addr()
		if a == "" {
			return
		}
		actx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		got, err := squid.Ask(actx, nil, net.JoinHostPort(a, "3128"))
		if err == nil && got == squid.Identity(string(p.GetUID())) {
			mark("Squid configured")
		}
	})
	watch(time.Second, []string{"cloud-init done"}, func() {
		if addr() != "" && strings.Contains(h.GuestExec(b, name, "cloud-init status"), "status: done") {
			mark("cloud-init done")
		}
	})
	wg.Wait()
	if _, ok := at["cloud-init done"]; ok {
		// Where the guest's share goes: cloud-init's slowest modules.
		var top []string
		for _, l := range strings.Split(h.GuestExec(b, name, "cloud-init analyze blame"), "\n") {
			if l = strings.TrimSpace(l); strings.HasSuffix(l, ")") && len(top) < 8 {
				top = append(top, l)
			}
		}
		b.Logf("round %d: cloud-init's slowest modules (cloud-init analyze blame): %s", round, strings.Join(top, ", "))
	}
	if len(at) < len(kvmPhases) {
		_ = kube.Get(ctx, client.ObjectKeyFromObject(p), p)
		b.Logf("round %d: not every phase seen within 20 minutes: %v (Ready: %s)", round, at, p.GetCondition(xpv2.TypeReady).Message)
	}
	if err := kube.Delete(ctx, p); err != nil && !kerrors.IsNotFound(err) {
		b.Fatal(err)
	}
	testenv.WaitFor(b, "the KVMProxy to be gone", 5*time.Minute, func() (bool, string) {
		err := kube.Get(ctx, client.ObjectKeyFromObject(p), p)
		return kerrors.IsNotFound(err), fmt.Sprint(err)
	})
	return at
}

func virsh(args ...string) (string, error) {
	out, err := exec.Command("virsh", append([]string{"-c", "qemu:///system"}, args...)...).Output()
	return string(out), err
}

// leaseAddress is the IPv4 address of name's DHCP lease, "" before it has
// one.
func leaseAddress(name string) string {
	out, err := virsh("domifaddr", name, "--source", "lease")
	if err != nil {
		return ""
	}
	for _, l := range strings.Split(out, "\n") {
		for _, f := range strings.Fields(l) {
			if a, _, ok := strings.Cut(f, "/"); ok && net.ParseIP(a).To4() != nil {
				return a
			}
		}
	}
	return ""
}

// squidAnswers reports whether an HTTP proxy answers at addr (any status:
// this host is not among its clients' addresses only if the config says
// so; an answer is what counts).
func squidAnswers(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, 300*time.Millisecond)
	if err != nil {
		return false
	}
	defer func() { _ = c.Close() }()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if _, err := io.WriteString(c, "GET cache_object://localhost/ HTTP/1.0\r\n\r\n"); err != nil {
		return false
	}
	buf := make([]byte, 5)
	_, err = io.ReadFull(c, buf)
	return err == nil && string(buf) == "HTTP/"
}

func appendKVM(b *testing.B, run string, round int, at map[string]float64, load string) {
	dir := os.Getenv("BENCH_DATA")
	if dir == "" {
		return
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		b.Logf("results: %v", err)
		return
	}
	f, err := os.OpenFile(filepath.Join(dir, "kvm.jsonl"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		b.Logf("results: %v", err)
		return
	}
	defer func() { _ = f.Close() }()
	prev := 0.0
	for _, ph := range kvmPhases {
		s, ok := at[ph]
		if !ok {
			continue
		}
		line, _ := json.Marshal(map[string]any{"run": run, "round": round, "phase": ph, "seconds": s - prev, "sinceCreate": s, "load": load})
		_, _ = f.Write(append(line, '\n'))
		prev = s
	}
}

func benchMedian(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func benchLoad() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	return strings.Join(strings.Fields(string(b))[:3], " ")
}

func benchSHA256(b *testing.B, path string) string {
	f, err := os.Open(path)
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		b.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil))
}
