package kvm

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

// poolEnv is a connPool over dial, with a clock the test moves and a count
// of the dials made.
type poolEnv struct {
	p     *connPool
	dials atomic.Int32
	skew  atomic.Int64 // added to the clock, in nanoseconds
}

func newPoolEnv(t *testing.T, dial dialFunc) *poolEnv {
	t.Helper()
	e := &poolEnv{}
	e.p = newConnPool(func(ctx context.Context, t Target) (*conn, error) {
		e.dials.Add(1)
		return dial(ctx, t)
	}, noop.NewTracerProvider().Tracer(""), func(context.Context) logr.Logger { return logr.Discard() })
	e.p.now = func() time.Time { return time.Now().Add(time.Duration(e.skew.Load())) }
	t.Cleanup(e.p.close)
	return e
}

func (e *poolEnv) advance(d time.Duration) { e.skew.Add(int64(d)) }

// silentHost accepts TCP connections on loopback and never answers; it
// counts the connections.
func silentHost(t *testing.T) (string, *atomic.Int32) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var accepted atomic.Int32
	var mu sync.Mutex
	var open []net.Conn
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			mu.Lock()
			open = append(open, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range open {
			_ = c.Close()
		}
	})
	return ln.Addr().String(), &accepted
}

// eventually waits for cond, failing after a while.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// silentTarget is a tenant's host that accepts TCP and never answers,
// reached with the production dialer and a short dial budget.
func silentTarget(t *testing.T) (*poolEnv, Target, *atomic.Int32) {
	t.Helper()
	addr, accepted := silentHost(t)
	d := &sshDialer{budgets: Budgets{Dial: 200 * time.Millisecond}.withDefaults(), tracer: noop.NewTracerProvider().Tracer("")}
	e := newPoolEnv(t, d.dial)
	key, _ := sshMaterialForTest(t)
	tgt := Target{Host: Host{Name: "silent", Address: addr, User: "proxy"}, Creds: Credentials{Key: key, InsecureIgnoreHostKey: true},
		Config: "ProviderConfig team-a/kvm"}
	return e, tgt, accepted
}

// TestPool_silentHostHoldsOneDial: ten callers for a host that never
// answers share one dial and all get its failure, not their own deadline;
// callers within failedDialMemory get it from memory, naming when the host
// is dialled again; after that a new dial is made.
func TestPool_silentHostHoldsOneDial(t *testing.T) {
	e, tgt, accepted := silentTarget(t)
	errs := make(chan error, 10)
	for range 10 {
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_, err := e.p.get(ctx, tgt)
			errs <- err
		}()
	}
	for range 10 {
		err := <-errs
		var de *dialError
		if !errors.As(err, &de) || !proxy.IsTransient(err) {
			t.Errorf("get = %v (%s); want the dial's Transient failure", err, proxy.ClassOf(err))
		}
	}
	eventually(t, "the dial to reach the host", func() bool { return accepted.Load() >= 1 })
	if n := e.dials.Load(); n != 1 {
		t.Errorf("%d dials for ten callers; want one", n)
	}

	_, err := e.p.get(context.Background(), tgt)
	var de *dialError
	if !proxy.IsTransient(err) || !errors.As(err, &de) || proxy.RetryAfterOf(err) <= 0 || proxy.RetryAfterOf(err) > failedDialMemory {
		t.Errorf("get after the failure = %v (%s, retry after %v); want the dial's Transient failure, retried within %v",
			err, proxy.ClassOf(err), proxy.RetryAfterOf(err), failedDialMemory)
	}
	for _, want := range []string{"libvirt host silent did not answer", "tried again after"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("get after the failure = %v; want it to say %q", err, want)
		}
	}
	if err != nil && strings.Contains(err.Error(), string(tgt.Creds.Key)) {
		t.Fatal("the error quotes the key")
	}
	if n := e.dials.Load(); n != 1 {
		t.Errorf("%d dials; a failure within %v was dialled again", n, failedDialMemory)
	}

	e.advance(failedDialMemory + time.Second)
	if _, err := e.p.get(context.Background(), tgt); err == nil {
		t.Fatal("get of a silent host succeeded")
	}
	eventually(t, "the second dial to reach the host", func() bool { return accepted.Load() >= 2 })
	if n := e.dials.Load(); n != 2 {
		t.Errorf("%d dials after the memory ran out; want a second one", n)
	}
}

// TestPool_newCredentialsDialDespiteAFailure: the failure is remembered
// for the host and the credentials it was dialled with; a config fixed
// with a new key dials at once.
func TestPool_newCredentialsDialDespiteAFailure(t *testing.T) {
	e, tgt, accepted := silentTarget(t)
	if _, err := e.p.get(context.Background(), tgt); err == nil {
		t.Fatal("get of a silent host succeeded")
	}
	fixed := tgt
	fixed.Creds.Key, _ = sshMaterialForTest(t)
	if _, err := e.p.get(context.Background(), fixed); err == nil || strings.Contains(err.Error(), "tried again after") {
		t.Errorf("get with a new key = %v; want a dial of its own", err)
	}
	eventually(t, "the new key's dial to reach the host", func() bool { return accepted.Load() >= 2 })
	if n := e.dials.Load(); n != 2 {
		t.Errorf("%d dials; want one per key", n)
	}
}

// TestPool_quickRefusalIsNotRemembered: a dial that fails at once costs
// nothing to retry, so the next get dials again (a host back up is used at
// once).
func TestPool_quickRefusalIsNotRemembered(t *testing.T) {
	var refuse atomic.Bool
	refuse.Store(true)
	e := newPoolEnv(t, func(context.Context, Target) (*conn, error) {
		if refuse.Load() {
			return nil, &dialError{stageTCP, io.EOF}
		}
		return &conn{link: newLink(nil, time.Second)}, nil
	})
	tgt := Target{Host: Host{Name: "lab", Address: "lab:22"}, Config: testProvider}
	if _, err := e.p.get(context.Background(), tgt); !proxy.IsTransient(err) {
		t.Fatalf("get of a refusing host = %v; want Transient", err)
	}
	refuse.Store(false)
	if _, err := e.p.get(context.Background(), tgt); err != nil {
		t.Errorf("get once the host is back = %v", err)
	}
}

// TestPool_waiterStopsAtItsOwnDeadline: a caller whose ctx ends stops
// waiting at once; the dial goes on, and its connection serves the next
// get without another dial.
func TestPool_waiterStopsAtItsOwnDeadline(t *testing.T) {
	release := make(chan struct{})
	e := newPoolEnv(t, func(context.Context, Target) (*conn, error) {
		<-release
		return &conn{link: newLink(nil, time.Second)}, nil
	})
	tgt := Target{Host: Host{Name: "lab", Address: "lab:22"}, Config: testProvider}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { _, err := e.p.get(ctx, tgt); done <- err }()
	eventually(t, "the dial to start", func() bool { return e.dials.Load() == 1 })
	cancel()
	if err := <-done; !proxy.IsTransient(err) || !errors.Is(err, context.Canceled) {
		t.Errorf("get whose ctx ended = %v; want Transient wrapping the cancellation", err)
	}
	close(release)
	eventually(t, "the dialled connection to be pooled", func() bool { return e.p.size() == 1 })
	if _, err := e.p.get(context.Background(), tgt); err != nil || e.dials.Load() != 1 {
		t.Errorf("get after the dial = %v with %d dials; want the pooled connection", err, e.dials.Load())
	}
}

// TestPool_closeEndsADialInFlight: closing the pool ends a dial still
// running, and its waiter gets an error.
func TestPool_closeEndsADialInFlight(t *testing.T) {
	e := newPoolEnv(t, func(ctx context.Context, _ Target) (*conn, error) {
		<-ctx.Done()
		return nil, ctx.Err()
	})
	done := make(chan error, 1)
	go func() {
		_, err := e.p.get(context.Background(), Target{Host: Host{Name: "lab", Address: "lab:22"}})
		done <- err
	}()
	eventually(t, "the dial to start", func() bool { return e.dials.Load() == 1 })
	e.p.close()
	if err := <-done; !proxy.IsTransient(err) {
		t.Errorf("get while the pool closed = %v; want Transient", err)
	}
}

// TestPool_credentialChangeRetiresOnlyTheSameConfigs: new credentials of
// one config retire the connection that config built from the old ones;
// another config's connection to the same host is left alone.
func TestPool_credentialChangeRetiresOnlyTheSameConfigs(t *testing.T) {
	e := newPoolEnv(t, func(context.Context, Target) (*conn, error) {
		return &conn{link: newLink(nil, time.Second)}, nil
	})
	h := Host{Name: "lab", Address: "lab:22"}
	a := Target{Host: h, Creds: Credentials{Key: []byte("a")}, Config: "ClusterProviderConfig kvm"}
	b := Target{Host: h, Creds: Credentials{Key: []byte("b")}, Config: "ProviderConfig team-a/kvm"}
	for _, tgt := range []Target{a, b} {
		if _, err := e.p.get(context.Background(), tgt); err != nil {
			t.Fatal(err)
		}
	}
	oldA, oldB := e.p.live(a.key()), e.p.live(b.key())
	if oldA == nil || oldB == nil {
		t.Fatal("another config's get took a connection away")
	}
	rotated := a
	rotated.Creds.Key = []byte("a2")
	if _, err := e.p.get(context.Background(), rotated); err != nil {
		t.Fatal(err)
	}
	if oldA.link.usable() {
		t.Error("the connection built from the rotated credentials was not retired")
	}
	if !oldB.link.usable() {
		t.Error("a credential change of one config retired another config's connection")
	}
}

// TestPool_configsOnOneHostKeepTheirConnections: two configs reach one
// libvirt host with keys of their own. A call on one config's connection
// after the other's get succeeds, and alternating calls use two
// connections, none closed.
func TestPool_configsOnOneHostKeepTheirConnections(t *testing.T) {
	e := newSSHEnv(t, Budgets{})
	ctx := context.Background()
	credsB := e.creds()
	credsB.Key = e.srv.newClientKey(t, true)
	a := e.b.Driver(Config{Name: "ClusterProviderConfig kvm", Credentials: e.creds(), Hosts: []Host{e.host}})
	b := e.b.Driver(Config{Name: "ProviderConfig team-a/kvm", Credentials: credsB, Hosts: []Host{e.host}})
	apiA, err := a.conn(ctx, e.host)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.conn(ctx, e.host); err != nil {
		t.Fatal(err)
	}
	if _, err := apiA.ConnectGetLibVersion(ctx); err != nil {
		t.Fatalf("config A's call after config B's get: %v", err)
	}
	for i := range 20 {
		d := []*Driver{a, b}[i%2]
		api, err := d.conn(ctx, e.host)
		if err == nil {
			_, err = api.ConnectGetLibVersion(ctx)
		}
		if err != nil {
			t.Fatalf("call %d (%s): %v", i, d.cfg.Name, err)
		}
	}
	if n := e.srv.conns.Load(); n != 2 {
		t.Errorf("%d SSH connections; want one per config", n)
	}
	for _, d := range []*Driver{a, b} {
		if c := e.b.pool.live(d.target(e.host).key()); c == nil {
			t.Errorf("%s's connection was closed", d.cfg.Name)
		}
	}
}
