package kvm

import (
	"context"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/egressproxy/provider-egressproxy/internal/devenv/testenv"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

// TestSlotsShareAHostAmongTenants: on a host with two download slots, a
// tenant runs one, a second tenant another, and the platform's catalogue
// images one besides; freed slots go to the waiters in arrival order.
func TestSlotsShareAHostAmongTenants(t *testing.T) {
	s := newSlots()
	done, cancel := context.WithCancel(context.Background())
	cancel()
	// now takes a slot if one is free at once.
	now := func(owner string) bool { return s.acquire(done, "lab", owner, 2) == nil }
	a, b, c := "namespace team-a", "namespace team-b", "namespace team-c"
	if !now(a) {
		t.Fatal("the first download of an idle host waited")
	}
	if now(a) {
		t.Error("one tenant took both of the host's two slots")
	}
	if !now(b) {
		t.Error("tenant B waited behind tenant A's download")
	}
	if !now(platformImages) {
		t.Error("the platform's catalogue image waited behind the tenants' downloads")
	}
	if now(c) || now(platformImages) {
		t.Error("a fourth download ran on a host allowing two")
	}

	got := make(chan string, 2)
	for i, o := range []string{a, c} {
		go func() {
			if err := s.acquire(context.Background(), "lab", o, 2); err == nil {
				got <- o
			}
		}()
		testenv.WaitFor(t, o+" to queue", 5*time.Second, func() (bool, string) {
			s.mu.Lock()
			defer s.mu.Unlock()
			return len(s.hosts["lab"].waiting) == i+1, ""
		})
	}
	next := func(want string) {
		t.Helper()
		select {
		case o := <-got:
			if o != want {
				t.Errorf("the freed slot went to %s, want %s", o, want)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("no waiter got the freed slot, want %s", want)
		}
	}
	s.release("lab", a)
	next(a)
	s.release("lab", b)
	next(c)
	for _, o := range []string{a, c, platformImages} {
		s.release("lab", o)
	}
	if len(s.hosts) != 0 {
		t.Errorf("slots keep %d hosts with no download, want none", len(s.hosts))
	}
}

// TestSlowTenantImagesLeaveTheHostsSlotsToOthers: on the platform's host,
// tenant A names two images on a server that declares their length and
// then stalls; tenant B's image and the platform's catalogue image
// download meanwhile, and A's second image waits for A's first.
func TestSlowTenantImagesLeaveTheHostsSlotsToOthers(t *testing.T) {
	slow, fast := newImageServer(t, 3<<20), newImageServer(t, 3<<20)
	e := newTestEnv(t, func(e *testEnv) { e.cfg.URLGuard = onlyAllowing(t) })
	// The tenants' public mirrors, answered by the loopback servers.
	mirrors := map[string]string{"203.0.113.10": slow.Listener.Addr().String(), "203.0.113.11": fast.Listener.Addr().String()}
	e.b.http = &http.Client{Transport: &http.Transport{Proxy: func(r *http.Request) (*url.URL, error) {
		if addr, ok := mirrors[r.URL.Host]; ok {
			return &url.URL{Scheme: "http", Host: addr}, nil
		}
		return nil, nil
	}}}
	release := slow.holdBodies()
	defer release()
	create := func(ns, name, image string) proxy.Instance {
		t.Helper()
		req := e.request(name, "uid-"+name)
		req.Placement.Image = image
		inst, err := e.d.Create(proxy.WithTenant(context.Background(), ns), req)
		if err != nil {
			t.Fatalf("Create(%s): %v", name, err)
		}
		return inst
	}
	create("team-a", "a1", "http://203.0.113.10/a1.qcow2")
	create("team-a", "a2", "http://203.0.113.10/a2.qcow2")
	testenv.WaitFor(t, "tenant A's first download to start", 5*time.Second, func() (bool, string) {
		return slow.gets.Load() == 1, ""
	})
	b := create("team-b", "b", "http://203.0.113.11/b.qcow2")
	p := create("", "p", "debian")
	for _, inst := range []proxy.Instance{b, p} {
		testenv.WaitFor(t, inst.Name+"'s image to download", 5*time.Second, func() (bool, string) {
			pe := e.b.pendingFor(Target{Host: e.cfg.Hosts[0]}.endpoint() + "/" + inst.Name)
			return pe == nil || strings.Contains(e.mustGet(ref(inst)).Progress, "booting"), e.mustGet(ref(inst)).Progress
		})
	}
	if n := slow.gets.Load(); n != 1 {
		t.Errorf("tenant A's slow server got %d downloads at once, want 1 (its share of the host's 2)", n)
	}
}

// TestSilentImageServerFreesItsSlot: a server that sends part of an image
// and then nothing: the download stops after the idle budget, with an
// error naming the image and nothing of its URL's user info or query.
func TestSilentImageServerFreesItsSlot(t *testing.T) {
	const sig = "S3NT1NEL-sig-31c9"
	e := newTestEnv(t, func(e *testEnv) {
		e.cfg.Images["debian"] = Image{URL: strings.Replace(e.images.URL, "http://", "http://user:"+sig+"@", 1) + "/debian.qcow2?sig=" + sig, SHA256: e.images.sha()}
	})
	e.b.budgets.ImageIdle = 200 * time.Millisecond
	release := e.images.holdBodies()
	defer release()
	inst := e.mustCreate(e.request("web", "uid-1"))
	err := e.waitFailure(ref(inst))
	if !proxy.IsTransient(err) || !strings.Contains(err.Error(), "image debian: its server sent nothing for 200ms, so the download was stopped") {
		t.Errorf("the silent download failed with %v (%s), want a Transient error naming the image and the idle budget", err, proxy.ClassOf(err))
	}
	if strings.Contains(err.Error(), sig) {
		t.Errorf("the error %q quotes the URL's user info or query", err)
	}
	e.b.downloads.mu.Lock()
	defer e.b.downloads.mu.Unlock()
	if len(e.b.downloads.hosts) != 0 {
		t.Error("the stopped download still holds its slot")
	}
}
