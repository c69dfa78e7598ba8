package kvm

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/digitalocean/go-libvirt"
	"github.com/google/go-cmp/cmp"
	"golang.org/x/crypto/ssh/knownhosts"
	"libvirt.org/go/libvirtxml"

	"github.com/egressproxy/provider-egressproxy/internal/proxy"
	"github.com/egressproxy/provider-egressproxy/internal/squid"
)

func TestClassify_table(t *testing.T) {
	cases := []struct {
		name string
		op   string
		err  error
		want proxy.Class
	}{
		{"NoDomain", proxy.OpGet, lverr(libvirt.ErrNoDomain, "Domain not found"), proxy.ClassNotFound},
		{"NoDomainInCreate", proxy.OpCreate, lverr(libvirt.ErrNoDomain, "Domain not found"), proxy.ClassTransient},
		{"NoStorageVol", proxy.OpDelete, lverr(libvirt.ErrNoStorageVol, "vol"), proxy.ClassNotFound},
		{"NoStorageVolInCreate", proxy.OpCreate, lverr(libvirt.ErrNoStorageVol, "vol"), proxy.ClassTransient},
		{"NoStoragePool", proxy.OpGet, lverr(libvirt.ErrNoStoragePool, "pool"), proxy.ClassPermanent},
		{"XMLError", proxy.OpCreate, lverr(libvirt.ErrXMLError, "xml"), proxy.ClassPermanent},
		{"NoSupport", proxy.OpCreate, lverr(libvirt.ErrNoSupport, "x"), proxy.ClassPermanent},
		{"InvalidArg", proxy.OpCreate, lverr(libvirt.ErrInvalidArg, "x"), proxy.ClassPermanent},
		{"AuthFailed", proxy.OpGet, lverr(libvirt.ErrAuthFailed, "x"), proxy.ClassPermanent},
		{"AccessDenied", proxy.OpGet, lverr(libvirt.ErrAccessDenied, "x"), proxy.ClassPermanent},
		{"OperationInvalid", proxy.OpDelete, lverr(libvirt.ErrOperationInvalid, "x"), proxy.ClassTransient},
		{"OtherLibvirt", proxy.OpGet, lverr(libvirt.ErrOperationTimeout, "busy"), proxy.ClassTransient},
		{"WrappedLibvirt", proxy.OpGet, fmt.Errorf("looking up: %w", lverr(libvirt.ErrNoDomain, "x")), proxy.ClassNotFound},
		{"SSHAuth", proxy.OpGet, &authRefusedError{err: errors.New("ssh: handshake failed: ssh: unable to authenticate, attempted methods [none publickey], no supported methods remain")}, proxy.ClassPermanent},
		// The phrase alone, which a host can put into what the SSH library
		// quotes, is not an authentication refusal.
		{"SSHAuthPhraseOnly", proxy.OpGet, errors.New("ssh: handshake failed: ssh: unable to authenticate, attempted methods [none publickey], no supported methods remain"), proxy.ClassTransient},
		{"SSHAuthPhraseInAlgorithms", proxy.OpGet, errors.New("ssh: handshake failed: ssh: no common algorithm for key exchange; we offered: [curve25519-sha256], peer offered: [ssh: unable to authenticate x]"), proxy.ClassTransient},
		{"HostKeyChanged", proxy.OpGet, fmt.Errorf("ssh: handshake failed: %w", &knownhosts.KeyError{Want: []knownhosts.KnownKey{{}}}), proxy.ClassPermanent},
		{"HostKeyUnknown", proxy.OpGet, fmt.Errorf("ssh: handshake failed: %w", &knownhosts.KeyError{}), proxy.ClassPermanent},
		{"SecretMissing", proxy.OpGet, fmt.Errorf("%w: Secret x does not exist", errCredentials), proxy.ClassTransient},
		{"FileMissing", proxy.OpGet, fs.ErrNotExist, proxy.ClassTransient},
		{"Cancelled", proxy.OpGet, context.Canceled, proxy.ClassTransient},
		{"Deadline", proxy.OpGet, context.DeadlineExceeded, proxy.ClassTransient},
		{"EOF", proxy.OpGet, io.EOF, proxy.ClassTransient},
		{"NetOpError", proxy.OpGet, &net.OpError{Op: "dial", Err: errors.New("connection refused")}, proxy.ClassTransient},
		{"AlreadyClassified", proxy.OpGet, proxy.Quotaf("full"), proxy.ClassQuota},
		{"Unknown", proxy.OpGet, errors.New("something"), proxy.ClassTransient},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := proxy.ClassOf(classify(tc.op, tc.err)); got != tc.want {
				t.Errorf("classify(%s, %v) = %s; want %s", tc.op, tc.err, got, tc.want)
			}
		})
	}
}

func TestMapState_table(t *testing.T) {
	cases := []struct {
		s      libvirt.DomainState
		reason int32
		ip     string
		want   proxy.State
	}{
		{libvirt.DomainNostate, 0, "", proxy.StateProvisioning},
		{libvirt.DomainRunning, 1, "", proxy.StateProvisioning},
		{libvirt.DomainRunning, 1, "10.0.0.2", proxy.StateRunning},
		{libvirt.DomainBlocked, 0, "10.0.0.2", proxy.StateRunning},
		{libvirt.DomainPaused, 0, "10.0.0.2", proxy.StateStopped},
		{libvirt.DomainShutdown, 0, "", proxy.StateStopped},
		{libvirt.DomainShutoff, 0, "", proxy.StateProvisioning}, // defined, never started
		{libvirt.DomainShutoff, 1, "", proxy.StateStopped},      // shut down
		{libvirt.DomainShutoff, 2, "", proxy.StateStopped},      // destroyed
		{libvirt.DomainCrashed, 0, "", proxy.StateStopped},
		{libvirt.DomainPmsuspended, 0, "", proxy.StateStopped},
		{libvirt.DomainState(99), 0, "", proxy.StateStopped},
	}
	for _, tc := range cases {
		if got := mapState(tc.s, tc.reason, tc.ip); got != tc.want {
			t.Errorf("mapState(%d, %d, %q) = %s; want %s", tc.s, tc.reason, tc.ip, got, tc.want)
		}
	}
}

func TestParseID(t *testing.T) {
	if h, n, err := parseID("hosts/lab/domains/web"); err != nil || h != "lab" || n != "web" {
		t.Errorf("parseID = %q %q %v", h, n, err)
	}
	for _, bad := range []string{"", "web", "hosts/lab/domains", "hosts/lab/domains/web/x", "host/lab/domains/web", "hosts/lab/vms/web", "hosts/Lab/domains/web", "hosts/lab/domains/Web"} {
		if _, _, err := parseID(bad); !proxy.IsPermanent(err) {
			t.Errorf("parseID(%q) = %v; want Permanent", bad, err)
		}
	}
}

// TestGet_addressSources: the agent first; the lease when the agent is
// not up; loopback and link-local never.
func TestGet_addressSources(t *testing.T) {
	e := newTestEnv(t)
	inst := createAndBootNot(t, e, "web")
	e.host.mu.Lock()
	e.host.domains["web"].leaseIP = "192.168.50.7"
	e.host.mu.Unlock()
	if got := e.mustGet(ref(inst)); got.IP != "192.168.50.7" || got.State != proxy.StateRunning {
		t.Errorf("with the agent down: IP %q, State %s; want the lease's address", got.IP, got.State)
	}
	e.host.boot("web", 3128)
	got := e.mustGet(ref(inst))
	if !strings.HasPrefix(got.IP, "192.168.122.") || !got.ProxyReachable {
		t.Errorf("with the agent up: IP %q reachable %t; want the agent's address", got.IP, got.ProxyReachable)
	}
	// Every source failing is Transient, never "no address".
	e.host.failNext["DomainInterfaceAddresses"] = []error{lverr(1, "a"), lverr(1, "b"), lverr(1, "c")}
	if _, err := e.d.Get(context.Background(), ref(inst)); !proxy.IsTransient(err) {
		t.Errorf("Get with every address source failing = %v; want Transient", err)
	}
}

// createAndBootNot creates an instance and lets the background finish,
// without booting it.
func createAndBootNot(t *testing.T, e *testEnv, name string) proxy.Instance {
	t.Helper()
	inst := e.mustCreate(e.request(name, "uid-"+name))
	e.waitBackground()
	return inst
}

// TestGet_progressWhileBooting: the condition message says what the
// instance waits for.
func TestGet_progressWhileBooting(t *testing.T) {
	e := newTestEnv(t)
	inst := createAndBootNot(t, e, "web")
	got := e.mustGet(ref(inst))
	if got.State != proxy.StateProvisioning || !strings.Contains(got.Progress, "waiting for an address") {
		t.Errorf("booting: %s %q", got.State, got.Progress)
	}
	e.host.boot("web", 3128)
	e.host.mu.Lock()
	e.host.squid = map[string]string{}
	e.host.mu.Unlock()
	got = e.mustGet(ref(inst))
	if got.State != proxy.StateRunning || got.ProxyReachable || !strings.Contains(got.Progress, "waiting for Squid to answer") || !strings.Contains(got.Progress, "192.168.122.") {
		t.Errorf("Squid not up: %s %t %q", got.State, got.ProxyReachable, got.Progress)
	}

	// Another resource's Squid (or the image's, named egress-proxy) on the
	// address is not this proxy's: not Ready, and the message says so.
	e.host.mu.Lock()
	for _, other := range []string{squid.Identity("uid-other"), squid.Identity("")} {
		e.host.squid = map[string]string{got.IP + ":3128": other}
		e.host.mu.Unlock()
		got = e.mustGet(ref(inst))
		if got.ProxyReachable || !strings.Contains(got.Progress, "not as this resource's") {
			t.Errorf("%s answering: %t %q; want not reachable, saying whose it is", other, got.ProxyReachable, got.Progress)
		}
		e.host.mu.Lock()
	}
	e.host.squid = map[string]string{got.IP + ":3128": squid.Identity("uid-web")}
	e.host.mu.Unlock()
	if got = e.mustGet(ref(inst)); !got.ProxyReachable {
		t.Errorf("its own Squid answering: %q; want reachable", got.Progress)
	}
}

// TestGet_startsADomainWhoseCreateStoppedBeforeStart: a crash between
// define and start leaves a domain Observe finds; Get starts it for its
// own resource only.
func TestGet_startsADomainWhoseCreateStoppedBeforeStart(t *testing.T) {
	e := newTestEnv(t)
	warm(t, e)
	e.host.failNext["DomainCreate"] = []error{errCrashed}
	req := e.request("web", "uid-1")
	if _, err := e.d.Create(context.Background(), req); err == nil {
		t.Fatal("Create did not fail")
	}
	starts := len(e.host.callsOf("DomainCreate"))
	foreign := proxy.Ref{ID: formatID("lab", "web"), Name: "web", Mark: proxy.Mark{UID: "someone-else", InstallationID: testInstallation}}
	if got := e.mustGet(foreign); got.State != proxy.StateProvisioning {
		t.Errorf("Get for another resource: %s", got.State)
	}
	if n := len(e.host.callsOf("DomainCreate")); n != starts {
		t.Errorf("Get for another resource started the domain")
	}
	own := proxy.Ref{ID: formatID("lab", "web"), Name: "web", Mark: req.Mark}
	e.mustGet(own)
	e.host.boot("web", 3128)
	if got := e.mustGet(own); got.State != proxy.StateRunning {
		t.Errorf("after Get resumed it: %s", got.State)
	}
}

// TestDelete_removesEverythingIncludingNVRAMAndStrayVolumes.
func TestDelete_removesEverythingIncludingNVRAMAndStrayVolumes(t *testing.T) {
	e := newTestEnv(t, func(e *testEnv) {
		im := e.cfg.Images["debian"]
		im.Firmware = "uefi"
		e.cfg.Images["debian"] = im
	})
	inst := createAndBoot(t, e, "web", "uid-1")
	e.host.mu.Lock()
	x := e.host.domains["web"].xml
	e.host.mu.Unlock()
	var dom libvirtxml.Domain
	if err := dom.Unmarshal(x); err != nil {
		t.Fatalf("domain XML does not parse: %v\n%s", err, x)
	}
	got := map[string]bool{
		"firmware efi":            dom.OS.Firmware == "efi",
		"secure boot off":         dom.OS.FirmwareInfo != nil && slices.Contains(dom.OS.FirmwareInfo.Features, libvirtxml.DomainOSFirmwareFeature{Enabled: "no", Name: "secure-boot"}),
		"machine q35":             dom.OS.Type.Machine == "q35",
		"guest agent channel":     len(dom.Devices.Channels) == 1 && dom.Devices.Channels[0].Target.VirtIO.Name == "org.qemu.guest_agent.0",
		"seed on scsi":            len(dom.Devices.Disks) == 2 && dom.Devices.Disks[1].Target.Bus == "scsi",
		"interface on bridge br0": len(dom.Devices.Interfaces) == 1 && dom.Devices.Interfaces[0].Source.Bridge != nil && dom.Devices.Interfaces[0].Source.Bridge.Bridge == "br0",
	}
	for what, ok := range got {
		if !ok {
			t.Errorf("domain XML: want %s:\n%s", what, x)
		}
	}
	if err := e.d.Delete(context.Background(), ref(inst)); err != nil {
		t.Fatal(err)
	}
	base := imageOf(e).volume()
	if diff := cmp.Diff([]string{base, base + ".sha256"}, e.host.volNames()); diff != "" {
		t.Errorf("volumes (-want +got):\n%s", diff)
	}
	// Volumes left without a domain (a crash mid-create) go too.
	e.host.mu.Lock()
	e.host.pools["default"].vols["stray.qcow2"] = &fakeVol{name: "stray.qcow2", format: "qcow2", capacity: 10 << 30, backing: "/var/lib/libvirt/images/" + base}
	e.host.pools["default"].vols["stray-seed.iso"] = &fakeVol{name: "stray-seed.iso", format: "raw", capacity: 64 << 10}
	e.host.mu.Unlock()
	if err := e.d.Delete(context.Background(), proxy.Ref{Name: "stray", Mark: inst.Mark, Placement: proxy.Placement{Location: "lab"}}); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{base, base + ".sha256"}, e.host.volNames()); diff != "" {
		t.Errorf("stray volumes left (-want +got):\n%s", diff)
	}
	// A host removed from the config: Delete succeeds without touching it.
	if err := e.d.Delete(context.Background(), proxy.Ref{ID: formatID("gone", "web"), Name: "web"}); err != nil {
		t.Errorf("Delete on a removed host = %v; want nil", err)
	}
}

// TestDelete_cancelsAPendingCreate: deleting while the image downloads
// leaves nothing behind once the download ends.
func TestDelete_cancelsAPendingCreate(t *testing.T) {
	e := newTestEnv(t)
	release := e.images.holdBodies()
	inst := e.mustCreate(e.request("web", "uid-1"))
	if err := e.d.Delete(context.Background(), ref(inst)); err != nil {
		t.Fatal(err)
	}
	release()
	time.Sleep(200 * time.Millisecond)
	if _, err := e.d.Get(context.Background(), ref(inst)); !proxy.IsNotFound(err) {
		t.Errorf("Get after Delete = %v; want NotFound", err)
	}
	if got := e.host.domainNames(); len(got) != 0 {
		t.Errorf("domains: %v", got)
	}
}

// TestUpdate_appliesProxySettingsThroughTheGuestAgent.
func TestUpdate_appliesProxySettingsThroughTheGuestAgent(t *testing.T) {
	e := newTestEnv(t)
	inst := createAndBoot(t, e, "web", "uid-1")
	req := e.request("web", "uid-1")
	req.Proxy.Port = 8080
	req.Proxy.Auth = proxy.Auth{Enabled: true, Username: "u", Password: "pw-S3NT1NEL-upd"}
	r := ref(inst)
	r.Mark = req.Mark
	got, err := e.d.Update(context.Background(), r, req)
	if err != nil {
		t.Fatal(err)
	}
	if got.SpecHash != proxy.Hash(req) {
		t.Errorf("SpecHash %q; want %q", got.SpecHash, proxy.Hash(req))
	}
	e.host.mu.Lock()
	files, execs := e.host.guestFiles, e.host.execs
	e.host.mu.Unlock()
	if files[stageDir+"/squid.conf"] == "" || files[stageDir+"/htpasswd"] == "" || len(execs) != 2 || !strings.Contains(execs[1], "egp_reload squid") {
		t.Errorf("guest files %v, execs %v; want the staging folder locked, then the files written and applied", keys(files), execs)
	}
	// The agent not up yet is Transient.
	e.host.mu.Lock()
	e.host.domains["web"].agentUp = false
	e.host.mu.Unlock()
	req.Proxy.Port = 8081
	if _, err := e.d.Update(context.Background(), r, req); !proxy.IsTransient(err) {
		t.Errorf("Update with the agent down = %v; want Transient", err)
	}
	if strings.Contains(e.logs.String(), "pw-S3NT1NEL-upd") {
		t.Error("the password leaked into the log")
	}
}

func keys(m map[string]string) []string {
	out := []string{}
	for k := range m {
		out = append(out, k)
	}
	return out
}

// TestCheck_reasons over the fake: a fresh connection per check, closed
// after; the pool's state and space in the details.
func TestCheck_reasons(t *testing.T) {
	cases := []struct {
		name   string
		setup  func(e *testEnv)
		reason string
	}{
		{"Reachable", func(*testEnv) {}, ReasonReachable},
		{"PoolNotFound", func(e *testEnv) { delete(e.host.pools, "default") }, ReasonPoolNotFound},
		{"PoolNotActive", func(e *testEnv) { e.host.pools["default"].state = libvirt.StoragePoolInactive }, ReasonPoolNotActive},
		{"Forbidden", func(e *testEnv) {
			e.host.failNext["ConnectGetLibVersion"] = []error{lverr(libvirt.ErrAccessDenied, "access denied")}
		}, proxy.ReasonForbidden},
		{"APIError", func(e *testEnv) {
			e.host.failNext["ConnectGetHostname"] = []error{lverr(libvirt.ErrInternalError, "boom")}
		}, proxy.ReasonAPIError},
		{"Unreachable", func(e *testEnv) {
			e.dialErr = &dialError{stageTCP, &net.OpError{Op: "dial", Err: errors.New("connection refused")}}
		}, proxy.ReasonUnreachable},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newTestEnv(t)
			tc.setup(e)
			h := e.d.Check(context.Background())
			th := h.Targets[0]
			want := tc.reason
			if want == ReasonReachable {
				if !th.Healthy || th.Details["poolAvailableGiB"] != "80" || th.Details["libvirtVersion"] != "9.0.0" || th.Details["hostname"] != "fakehost" {
					t.Errorf("Check = %+v", th)
				}
				want = ""
			}
			if th.Reason != want || th.Target != "lab" || th.Address != "fakehost:22" {
				t.Errorf("Check = %+v; want reason %q", th, want)
			}
			if e.b.pool.live(Target{Host: e.cfg.Hosts[0], Creds: e.cfg.Credentials}.key()) != nil {
				t.Error("Check left a pooled connection")
			}
		})
	}
	t.Run("ExpiredContextIsTimeout", func(t *testing.T) {
		e := newTestEnv(t)
		e.host.hang["ConnectGetHostname"] = make(chan struct{})
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		// The hung call never returns: a Check that waited for it instead
		// of its context would not return either. The bound only keeps a
		// broken Check from holding the suite; it is no speed target.
		done := make(chan proxy.TargetHealth, 1)
		go func() { done <- e.d.Check(ctx).Targets[0] }()
		select {
		case th := <-done:
			if th.Reason != proxy.ReasonTimeout {
				t.Errorf("Check = %+v; want reason %s", th, proxy.ReasonTimeout)
			}
		case <-time.After(time.Minute):
			t.Fatal("Check did not return after its context expired")
		}
	})
}

// TestList_skipsUnreadableMetadataAndFailsWholeOnHostError.
func TestList_skipsUnreadableMetadataAndFailsWholeOnHostError(t *testing.T) {
	e := newTestEnv(t)
	createAndBoot(t, e, "a", "uid-a")
	createAndBoot(t, e, "b", "uid-b")
	e.host.failNext["DomainGetMetadata"] = []error{lverr(libvirt.ErrInternalError, "mid teardown")}
	l, err := e.d.List(context.Background(), testInstallation)
	if err != nil || len(l) != 1 {
		t.Errorf("List = %v, %v; want one instance (one skipped)", l, err)
	}
	e.host.failNext["ConnectListAllDomains"] = []error{lverr(libvirt.ErrInternalError, "boom")}
	if _, err := e.d.List(context.Background(), testInstallation); !proxy.IsTransient(err) {
		t.Errorf("List with a host failing = %v; want a Transient error", err)
	}
}
