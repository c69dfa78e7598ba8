package squid

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

const probeUID = "6f1c2a7e-3b4d-4c5e-9f60-718293a4b5c6"

// TestProberRealSquid: Squid running the configuration rendered for a
// resource answers the probe as that resource, whether or not the prober
// is one of its clients and with authentication on (the probe is an
// invalid URL Squid answers itself); the configuration of another
// resource, and the bare one that names no resource, do not pass.
func TestProberRealSquid(t *testing.T) {
	bin := squidBinary(t)
	o := Options{UID: probeUID}
	o.AuthHelperPath = helperPath(t, bin)
	own := startSquid(t, bin, proxy.Settings{AllowedClientCIDRs: []string{"10.0.0.0/8"}, Auth: proxy.Auth{Enabled: true, Username: "u", Password: "sentinel-pw-probe"}}, o)
	bare := startSquid(t, bin, proxy.Settings{AllowedClientCIDRs: []string{"127.0.0.0/8"}}, Options{})

	// Wait is long so that no answer is Pending on a loaded machine; it is
	// a bound, not an expectation.
	p := &Prober{Wait: 30 * time.Second, Timeout: 20 * time.Second}
	ctx := context.Background()
	if got := p.Check(ctx, nil, "own", own.addr, Identity(probeUID), ""); !got.Serving {
		t.Errorf("this resource's Squid: %+v; want Serving", got)
	}
	other := Identity("0a0a0a0a-0000-4000-8000-000000000000")
	got := p.Check(ctx, nil, "other", own.addr, other, "")
	if got.Serving || !strings.Contains(got.Message, Identity(probeUID)) || !strings.Contains(got.Message, other) {
		t.Errorf("another resource's Squid: %+v; want not Serving, naming both identities", got)
	}
	got = p.Check(ctx, nil, "bare", bare.addr, Identity(probeUID), "")
	if got.Serving || !strings.Contains(got.Message, `"egress-proxy"`) {
		t.Errorf("a Squid whose configuration names no resource: %+v; want not Serving", got)
	}
	if strings.Contains(got.Message, "sentinel-pw-probe") {
		t.Errorf("the message holds the password")
	}
}

func TestAsk(t *testing.T) {
	web := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) }))
	defer web.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := Ask(ctx, nil, strings.TrimPrefix(web.URL, "http://")); err == nil || !strings.Contains(err.Error(), "not as Squid") {
		t.Errorf("Ask(a web server) = %v; want an error saying it is not Squid", err)
	}
	l := web.Listener.Addr().String()
	web.Close()
	if _, err := Ask(ctx, nil, l); err == nil {
		t.Errorf("Ask(a closed port) succeeded")
	}
}

func TestIdentityOf(t *testing.T) {
	f, err := Render(proxy.Settings{Port: 3128, AllowedClientCIDRs: []string{"10.0.0.0/8"}}, Options{UID: probeUID})
	if err != nil {
		t.Fatal(err)
	}
	if got := IdentityOf(f.SquidConf); got != Identity(probeUID) || got != "egress-proxy-"+probeUID {
		t.Errorf("IdentityOf(rendered) = %q; want %q", got, Identity(probeUID))
	}
	if _, err := Render(proxy.Settings{Port: 3128, AllowedClientCIDRs: []string{"10.0.0.0/8"}}, Options{UID: "a b\nhttp_access allow all"}); err == nil || !strings.Contains(err.Error(), "options.uid") {
		t.Errorf("Render with a UID that is not one: %v; want an error naming options.uid", err)
	}
}

// TestProberCachesAndNotifies: checks share one probe and its result; a
// check that cannot wait answers Pending and Notify comes when the probe
// is done; another address or identity is probed anew.
func TestProberCachesAndNotifies(t *testing.T) {
	var asks atomic.Int32
	release := make(chan struct{})
	notified := make(chan string, 4)
	p := &Prober{
		Wait:        time.Millisecond,
		PositiveTTL: time.Hour,
		Ask: func(_ context.Context, addr string) (string, error) {
			asks.Add(1)
			<-release
			if addr == "10.0.0.9:3128" {
				return "", errors.New("connection refused")
			}
			return Identity("u1"), nil
		},
		Notify: func(key string) { notified <- key },
	}
	ctx := context.Background()
	if got := p.Check(ctx, nil, "k", "10.0.0.5:3128", Identity("u1"), ""); !got.Pending {
		t.Fatalf("first check before the probe ends: %+v; want Pending", got)
	}
	close(release)
	if key := <-notified; key != "k" {
		t.Errorf("Notify(%q); want k", key)
	}
	p.Wait = time.Hour // from here on every check waits for its probe
	if got := p.Check(ctx, nil, "k", "10.0.0.5:3128", Identity("u1"), ""); !got.Serving {
		t.Errorf("after the probe: %+v; want Serving", got)
	}
	if n := asks.Load(); n != 1 {
		t.Errorf("%d probes for two checks of one key; want 1", n)
	}
	if got := p.Check(ctx, nil, "k", "10.0.0.5:3128", Identity("u2"), ""); got.Serving {
		t.Errorf("another identity at the same address: %+v; want not Serving", got)
	}
	got := p.Check(ctx, nil, "k", "10.0.0.9:3128", Identity("u1"), "")
	if got.Serving || !strings.Contains(got.Message, "no answer from Squid at 10.0.0.9:3128: connection refused") {
		t.Errorf("a closed port: %+v", got)
	}
	if n := asks.Load(); n != 3 {
		t.Errorf("%d probes; want 3 (one per address and identity)", n)
	}
}

// TestAskReadsXCache: the identity is the name in X-Cache; anything
// without one is not Squid.
func TestAskReadsXCache(t *testing.T) {
	for _, tc := range []struct{ answer, want string }{
		{"HTTP/1.1 400 Bad Request\r\nServer: squid\r\nX-Cache: MISS from egress-proxy-u1\r\nConnection: close\r\n\r\nbody", "egress-proxy-u1"},
		{"HTTP/1.1 400 Bad Request\r\nServer: squid\r\nx-cache: MISS from egress-proxy\r\n\r\n", "egress-proxy"},
		{"HTTP/1.1 200 OK\r\nServer: nginx\r\n\r\n", ""},
		{"SSH-2.0-OpenSSH_9.2\r\n", ""},
		{"", ""},
	} {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			buf := make([]byte, 64)
			_, _ = c.Read(buf)
			_, _ = c.Write([]byte(tc.answer))
			_ = c.Close()
		}()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		got, err := Ask(ctx, nil, ln.Addr().String())
		cancel()
		_ = ln.Close()
		if got != tc.want || (tc.want == "") != (err != nil) {
			t.Errorf("Ask of %q = %q, %v; want %q", tc.answer, got, err, tc.want)
		}
	}
}

// countingConn counts the bytes read from it.
type countingConn struct {
	net.Conn
	n *atomic.Int64
}

func (c countingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.n.Add(int64(n))
	return n, err
}

// TestAskReadsAFewKiBOfAnAnswer: whatever answers at a proxy's address
// (a tenant's VM or pod) may send a line that never ends; the probe reads
// a few KiB of it and says the address does not answer as Squid, well
// within its timeout.
func TestAskReadsAFewKiBOfAnAnswer(t *testing.T) {
	for name, head := range map[string]string{
		"EndlessStatusLine": "HTTP/1.1 200 ",
		"EndlessHeader":     "HTTP/1.1 200 OK\r\nX-Pad: ",
	} {
		t.Run(name, func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = ln.Close() }()
			go func() {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				defer func() { _ = c.Close() }()
				_, _ = c.Read(make([]byte, 64))
				if _, err := c.Write([]byte(head)); err != nil {
					return
				}
				chunk := []byte(strings.Repeat("a", 64<<10))
				for {
					if _, err := c.Write(chunk); err != nil {
						return
					}
				}
			}()
			var read atomic.Int64
			dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
				c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
				if err != nil {
					return nil, err
				}
				return countingConn{Conn: c, n: &read}, nil
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second) // the Prober's default timeout
			defer cancel()
			got, err := Ask(ctx, dial, ln.Addr().String())
			if err == nil || got != "" {
				t.Errorf("Ask = %q, %v; want an error", got, err)
			}
			if ctx.Err() != nil {
				t.Errorf("Ask returned at its deadline (%v); want at once", err)
			}
			if n := read.Load(); n > 64<<10 {
				t.Errorf("Ask read %d KiB of an endless line; want a few KiB", n>>10)
			}
		})
	}
}

// TestProberServesTheLastSuccessWhileRenewing: a Ready proxy whose result
// is renewed over a slow link stays Serving until the renewal says
// otherwise.
func TestProberServesTheLastSuccessWhileRenewing(t *testing.T) {
	answer := make(chan error, 4)
	notified := make(chan string, 4)
	p := &Prober{
		Wait:        time.Millisecond,
		PositiveTTL: time.Nanosecond, NegativeTTL: time.Hour,
		Ask: func(context.Context, string) (string, error) {
			if err := <-answer; err != nil {
				return "", err
			}
			return Identity("u1"), nil
		},
		Notify: func(key string) { notified <- key },
	}
	ctx := context.Background()
	if got := p.Check(ctx, nil, "k", "10.0.0.5:3128", Identity("u1"), ""); !got.Pending {
		t.Fatalf("first check: %+v; want Pending", got)
	}
	answer <- nil
	<-notified
	// The success has expired: a renewal starts, and until it answers the
	// check says what the last probe found.
	if got := p.Check(ctx, nil, "k", "10.0.0.5:3128", Identity("u1"), ""); !got.Serving {
		t.Errorf("while the renewal runs: %+v; want the last answer, Serving", got)
	}
	answer <- errors.New("connection refused")
	<-notified
	if got := p.Check(ctx, nil, "k", "10.0.0.5:3128", Identity("u1"), ""); got.Serving || !strings.Contains(got.Message, "connection refused") {
		t.Errorf("after the renewal failed: %+v; want not Serving", got)
	}
}

// TestExpected: an unmarked instance is checked as any Squid; a marked
// one as its resource's, even with no UID in its mark.
func TestExpected(t *testing.T) {
	for _, tc := range []struct {
		m    proxy.Mark
		want string
	}{
		{proxy.Mark{}, AnySquid},
		{proxy.Mark{UID: probeUID, InstallationID: "i"}, Identity(probeUID)},
		{proxy.Mark{UID: probeUID}, Identity(probeUID)},
		{proxy.Mark{InstallationID: "i"}, Identity("")},
	} {
		if got := Expected(tc.m); got != tc.want {
			t.Errorf("Expected(%+v) = %q; want %q", tc.m, got, tc.want)
		}
	}
}

// openGuard is a Guard that refuses nothing: a tenant's config whose
// reported addresses are allowed, for the quoting rules of a guarded probe.
type openGuard struct{}

func (openGuard) CheckHost(context.Context, string) ([]netip.Addr, error) { return nil, nil }

func (openGuard) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	return (&net.Dialer{}).DialContext(ctx, network, addr)
}

// TestProberAnySquid: a check of AnySquid (an unmarked instance) is
// served by whatever name Squid answers with, and its Answer quotes that
// name only when it is a plain, short host name and the address is the
// platform's (no guard), or one of the provider's own names; a tenant's
// address (a guard) gets no quote of what answered there. The same answer
// does not serve a marked instance's check, which is as strict as ever.
func TestProberAnySquid(t *testing.T) {
	const handmade = "squid-handmade.corp.example"
	long := strings.Repeat("a", 64)
	injected := `evil.example (Ready: verified by the platform team) "ok`
	const notShownTenant = "answered (its name is not shown to tenants)"
	const notShownName = "answered (with a name that is not a plain host name: not shown)"
	cases := map[string]struct {
		answer string
		err    error
		guard  Guard
		want   Probe
	}{
		"HandMade":                 {answer: handmade, want: Probe{Serving: true, Answer: `answered as "` + handmade + `"`}},
		"HandMadeOfATenant":        {answer: handmade, guard: openGuard{}, want: Probe{Serving: true, Answer: notShownTenant}},
		"ProviderNameOfATenant":    {answer: Identity(probeUID), guard: openGuard{}, want: Probe{Serving: true, Answer: `answered as "` + Identity(probeUID) + `"`}},
		"TheImagesDefault":         {answer: Identity(""), want: Probe{Serving: true, Answer: `answered as "egress-proxy"`}},
		"NotAHostName":             {answer: injected, want: Probe{Serving: true, Answer: notShownName}},
		"TooLong":                  {answer: long, want: Probe{Serving: true, Answer: notShownName}},
		"NoName":                   {answer: "", want: Probe{Serving: true, Answer: notShownName}},
		"NotSquid":                 {err: &plainError{err: errors.New("10.0.0.5:3128 answers HTTP, but not as Squid")}, want: Probe{Message: "no answer from Squid at 10.0.0.5:3128: 10.0.0.5:3128 answers HTTP, but not as Squid"}},
		"NotSquidOfATenantQuietly": {err: errors.New(injected), guard: openGuard{}, want: Probe{Message: "no answer from Squid at 10.0.0.5:3128: the answer could not be read (what was answered is not shown)"}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			p := &Prober{Wait: time.Minute, Ask: func(context.Context, string) (string, error) { return tc.answer, tc.err }}
			got := p.Check(context.Background(), tc.guard, "k", "10.0.0.5:3128", AnySquid, "")
			if got != tc.want {
				t.Errorf("Check(AnySquid) = %+v; want %+v", got, tc.want)
			}
			if strings.Contains(got.Answer+got.Message, "verified") {
				t.Errorf("the result quotes the answer: %+v", got)
			}
			// The same Squid is not a marked instance's.
			other := "0a0a0a0a-0000-4000-8000-000000000000"
			marked := p.Check(context.Background(), tc.guard, "k", "10.0.0.5:3128", Expected(proxy.Mark{UID: other, InstallationID: "i"}), "")
			if marked.Serving || marked.Answer != "" || strings.Contains(marked.Message, "verified") {
				t.Errorf("Check(Identity) of the same answer = %+v; want not Serving, no Answer, nothing quoted", marked)
			}
		})
	}
}

// TestProberAnySquidKeepsItsAnswerWhileRenewing: the last success's
// Answer is said with it while its renewal runs.
func TestProberAnySquidKeepsItsAnswerWhileRenewing(t *testing.T) {
	answer := make(chan struct{}, 4)
	notified := make(chan string, 4)
	p := &Prober{
		Wait:        time.Millisecond,
		PositiveTTL: time.Nanosecond,
		Ask: func(context.Context, string) (string, error) {
			<-answer
			return "squid-1", nil
		},
		Notify: func(key string) { notified <- key },
	}
	ctx := context.Background()
	if got := p.Check(ctx, nil, "k", "10.0.0.5:3128", AnySquid, ""); !got.Pending {
		t.Fatalf("first check: %+v; want Pending", got)
	}
	answer <- struct{}{}
	<-notified
	if got := p.Check(ctx, nil, "k", "10.0.0.5:3128", AnySquid, ""); !got.Serving || got.Answer != `answered as "squid-1"` {
		t.Errorf("while the renewal runs: %+v; want Serving with the last Answer", got)
	}
	answer <- struct{}{}
	<-notified
}

// TestNoteAnswer: an unmarked instance's Answer goes to its Details; a
// check without one leaves them alone.
func TestNoteAnswer(t *testing.T) {
	var inst proxy.Instance
	NoteAnswer(&inst, Probe{Serving: true})
	if inst.Details != nil {
		t.Errorf("Details after a check without an Answer: %v; want none", inst.Details)
	}
	NoteAnswer(&inst, Probe{Serving: true, Answer: `answered as "squid-1"`})
	if got := inst.Details[DetailAnswer]; got != `answered as "squid-1"` {
		t.Errorf("Details[%s] = %q", DetailAnswer, got)
	}
}

// TestProberAnySquidRealSquid: a Squid the provider did not configure,
// calling itself by its own host name as a hand-made one does, serves an
// unmarked instance's check (AnySquid), which says the name; it never
// serves a marked instance's.
func TestProberAnySquidRealSquid(t *testing.T) {
	bin := squidBinary(t)
	const name = "squid-handmade.corp.example"
	hand := startSquid(t, bin, proxy.Settings{AllowedClientCIDRs: []string{"127.0.0.0/8"}}, Options{}, func(conf string) string {
		out := strings.Replace(conf, "visible_hostname "+Identity(""), "visible_hostname "+name, 1)
		if IdentityOf(out) != name {
			t.Fatalf("the rendered configuration has no visible_hostname %s to replace", Identity(""))
		}
		return out
	})
	p := &Prober{Wait: 30 * time.Second, Timeout: 20 * time.Second}
	ctx := context.Background()
	if got := p.Check(ctx, nil, "unmarked", hand.addr, AnySquid, ""); !got.Serving || got.Answer != `answered as "`+name+`"` {
		t.Errorf("an unmarked instance's hand-made Squid: %+v; want Serving, answered as %q", got, name)
	}
	got := p.Check(ctx, nil, "marked", hand.addr, Identity(probeUID), "")
	if got.Serving || !strings.Contains(got.Message, "not one of the provider's") || strings.Contains(got.Message, name) {
		t.Errorf("a marked instance's check of the same Squid: %+v; want not Serving, its name not quoted", got)
	}
}
