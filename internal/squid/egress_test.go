package squid

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

func TestRenderEgressCheck(t *testing.T) {
	base := proxy.Settings{Port: 3128, AllowedClientCIDRs: []string{"10.0.0.0/8"}}
	cases := map[string]struct {
		url      string
		auth     bool
		wantACLs []string
		wantAuth string
	}{
		"PlainHTTP": {url: "http://echo.example.com:8080/ip", wantACLs: []string{
			"acl egress_check_method method GET",
			`acl egress_check_url url_regex -i ^http://echo\.example\.com:8080/ip$`,
		}},
		"DefaultPortMayBeLeftOut": {url: "http://Echo.example.com", wantACLs: []string{
			"acl egress_check_method method GET",
			`acl egress_check_url url_regex -i ^http://echo\.example\.com(:80)?/$`,
		}},
		"HTTPSIsATunnelToTheHost": {url: "https://api.ipify.org/", wantACLs: []string{
			"acl egress_check_method method CONNECT",
			`acl egress_check_url url_regex -i ^api\.ipify\.org:443$`,
		}},
		"IPv6": {url: "http://[2001:db8::1]:81/x", wantACLs: []string{
			"acl egress_check_method method GET",
			`acl egress_check_url url_regex -i ^http://\[2001:db8::1\]:81/x$`,
		}},
		"WithTheUsersAuth": {url: "http://echo.example.com/ip", auth: true, wantACLs: []string{
			"acl egress_check_method method GET",
			`acl egress_check_url url_regex -i ^http://echo\.example\.com(:80)?/ip$`,
		}, wantAuth: "acl authenticated proxy_auth team"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			s := base
			s.EgressCheck = &proxy.EgressCheck{URL: tc.url, Username: CheckUsername, Password: "check-secret"}
			if tc.auth {
				s.Auth = proxy.Auth{Enabled: true, Username: "team", Password: "team-secret"}
			}
			f, err := Render(s, Options{UID: "uid"})
			if err != nil {
				t.Fatal(err)
			}
			got := append(lines(f.SquidConf, "acl egress_check_method"), lines(f.SquidConf, "acl egress_check_url")...)
			if diff := cmp.Diff(tc.wantACLs, got); diff != "" {
				t.Errorf("check ACLs (-want +got):\n%s", diff)
			}
			if got := lines(f.SquidConf, "acl authenticated"); tc.wantAuth != "" && (len(got) != 1 || got[0] != tc.wantAuth) {
				t.Errorf("user ACL %q, want %q: the check's credential must not count as the user's", got, tc.wantAuth)
			}
			users := 1
			if tc.auth {
				users = 2
			}
			if n := strings.Count(f.Htpasswd, "\n"); n != users || !strings.Contains(f.Htpasswd, CheckUsername+":$6$") {
				t.Errorf("htpasswd has %d lines, want %d with the check's user", n, users)
			}
			if strings.Contains(f.SquidConf, "check-secret") || strings.Contains(f.Htpasswd, "check-secret") {
				t.Error("the check's password is in the rendered files")
			}
			want := []string{"http_access deny !clients !egress_check", "http_access allow clients", "http_access allow egress_check", "http_access deny all"}
			if got := lines(f.SquidConf, "http_access"); !containsInOrder(got, want) {
				t.Errorf("access rules %q lack %q in that order", got, want)
			}
		})
	}
	// Without a check nothing changes: no rule, no user.
	f, err := Render(base, Options{UID: "uid"})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(f.SquidConf, "egress_check") || f.Htpasswd != "" {
		t.Errorf("a proxy without a check renders its ACLs or a user:\n%s", f.SquidConf)
	}
}

func containsInOrder(got, want []string) bool {
	i := 0
	for _, g := range got {
		if i < len(want) && g == want[i] {
			i++
		}
	}
	return i == len(want)
}

func TestValidateEgressCheck(t *testing.T) {
	s := proxy.Settings{Port: 3128, AllowedClientCIDRs: []string{"10.0.0.0/8"}, Auth: proxy.Auth{Enabled: true, Username: CheckUsername, Password: "pw"}}
	cases := map[string]struct {
		url, field string
	}{
		"Query":      {url: "http://echo.example.com/ip?format=json", field: "egressCheck.url"},
		"UserInfo":   {url: "http://u:p@echo.example.com/ip", field: "egressCheck.url"},
		"Scheme":     {url: "ftp://echo.example.com/ip", field: "egressCheck.url"},
		"SameAsUser": {url: "http://echo.example.com/ip", field: "auth.username"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			s.EgressCheck = &proxy.EgressCheck{URL: tc.url, Username: CheckUsername, Password: "check-secret"}
			err := Validate(s)
			var fe *FieldError
			if !errors.As(err, &fe) || !strings.Contains(err.Error(), tc.field+":") || !proxy.IsPermanent(err) {
				t.Errorf("Validate = %v; want a permanent error naming %s", err, tc.field)
			}
			if err != nil && strings.Contains(err.Error(), "check-secret") {
				t.Errorf("the error quotes the check's password: %v", err)
			}
		})
	}
}

// TestAnEchoAnsweringLoopbackOrLinkLocalVerifiesNothing: an echo endpoint
// beside the proxy (or one that lies) answering a loopback or link-local
// address, plain or in JSON, gives no egress address, and the error says
// why without quoting the answer.
func TestAnEchoAnsweringLoopbackOrLinkLocalVerifiesNothing(t *testing.T) {
	for _, body := range []string{"127.0.0.1", "127.8.9.10\n", "::1", "::ffff:127.0.0.1", "169.254.169.254", "fe80::1",
		`{"ip":"127.0.0.1"}`, `{"origin":"169.254.1.2, 203.0.113.7"}`, `{"address":"fe80::1"}`} {
		got, err := ParseEcho([]byte(body))
		if err == nil || got != "" {
			t.Errorf("ParseEcho(%q) = %q, %v; want no address and an error", body, got, err)
			continue
		}
		if !strings.Contains(err.Error(), "loopback") && !strings.Contains(err.Error(), "link-local") {
			t.Errorf("ParseEcho(%q): %v; want it to say loopback or link-local", body, err)
		}
		if strings.Contains(err.Error(), strings.Trim(body, "\n")) {
			t.Errorf("ParseEcho(%q): %v quotes the answer", body, err)
		}
	}
}

// TestAnEchoAnswerOverTheCapVerifiesNothing: an answer longer than the
// 4 KiB read is refused, not cut off and read as another address; one
// that fits is read.
func TestAnEchoAnswerOverTheCapVerifiesNothing(t *testing.T) {
	for _, tc := range []struct {
		body, want string
	}{
		{strings.Repeat(" ", maxEchoAnswer-len("203.0.113.7")) + "203.0.113.7", "203.0.113.7"},
		{strings.Repeat(" ", maxEchoAnswer+1-len("203.0.113.71")) + "203.0.113.71", ""},
	} {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		// A proxy that answers every request with the echo's body.
		srv := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			_, _ = io.WriteString(w, tc.body)
		})}
		go func() { _ = srv.Serve(ln) }()
		got, err := AskEgress(t.Context(), nil, ln.Addr().String(), proxy.EgressCheck{URL: "http://echo.example/ip", Username: CheckUsername, Password: "p"})
		_ = srv.Close()
		if got != tc.want || (tc.want == "") != (err != nil) {
			t.Errorf("an answer of %d bytes: AskEgress = %q, %v; want %q", len(tc.body), got, err, tc.want)
		}
	}
}

func TestParseEcho(t *testing.T) {
	for body, want := range map[string]string{
		"203.0.113.7\n":                       "203.0.113.7",
		"::ffff:203.0.113.7":                  "203.0.113.7",
		`{"ip":"2001:db8::7"}`:                "2001:db8::7",
		`{"origin": "203.0.113.7, 10.0.0.1"}`: "203.0.113.7",
	} {
		if got, err := ParseEcho([]byte(body)); err != nil || got != want {
			t.Errorf("ParseEcho(%q) = %q, %v; want %s", body, got, err, want)
		}
	}
	for _, body := range []string{"<html>hello</html>", `{"ip":"not an address"}`, "", "0.0.0.0", `{"ip":"::"}`, "224.0.0.1", "fe80::1%eth0"} {
		if got, err := ParseEcho([]byte(body)); err == nil || strings.Contains(err.Error(), "hello") {
			t.Errorf("ParseEcho(%q) = %q, %v; want an error that does not quote the answer", body, got, err)
		}
	}
}

func TestEgressChecker(t *testing.T) {
	var calls atomic.Int32
	answer := atomic.Value{}
	answer.Store("203.0.113.7")
	fail := atomic.Bool{}
	var elapsed atomic.Int64
	start := time.Now()
	c := &EgressChecker{Wait: time.Second, RetryInterval: time.Hour, Ask: func(_ context.Context, addr string, ch proxy.EgressCheck) (string, error) {
		calls.Add(1)
		if fail.Load() {
			return "", errors.New("refused with " + ch.Password)
		}
		return answer.Load().(string), nil //nolint:forcetypeassert // a string.
	}, Now: func() time.Time { return start.Add(time.Duration(elapsed.Load())) }}
	check := proxy.EgressCheck{URL: "http://echo.example/ip", Username: CheckUsername, Password: "sentinel-check-password"}
	ctx := t.Context()

	if got := c.Check(ctx, nil, "uid", "i1", "10.0.0.5:3128", check, time.Hour); got.IP != "203.0.113.7" || got.At.IsZero() {
		t.Fatalf("first Check = %+v; want the echo's address", got)
	}
	c.Check(ctx, nil, "uid", "i1", "10.0.0.5:3128", check, time.Hour)
	if n := calls.Load(); n != 1 {
		t.Errorf("two Checks within the interval sent %d checks; want 1", n)
	}
	// Another address (the pod moved to another node): checked at once.
	answer.Store("203.0.113.8")
	if got := c.Check(ctx, nil, "uid", "i1", "10.0.0.6:3128", check, time.Hour); got.IP != "203.0.113.8" || calls.Load() != 2 {
		t.Errorf("Check at a new address = %+v after %d checks; want the new address at once", got, calls.Load())
	}
	// The instance was updated or recreated at the same address: at once.
	answer.Store("203.0.113.9")
	if got := c.Check(ctx, nil, "uid", "i2", "10.0.0.6:3128", check, time.Hour); got.IP != "203.0.113.9" || calls.Load() != 3 {
		t.Errorf("Check of a changed instance = %+v after %d checks; want a new check at once", got, calls.Load())
	}
	// The interval passed: checked again; a failure keeps the address last
	// seen, and says why without the password.
	fail.Store(true)
	elapsed.Add(int64(time.Hour))
	got := c.Check(ctx, nil, "uid", "i2", "10.0.0.6:3128", check, time.Hour)
	if got.IP != "203.0.113.9" || got.Error == "" || strings.Contains(got.Error, check.Password) {
		t.Errorf("failed re-check = %+v; want the last address, an error, no password", got)
	}
	// An update in place (a new version of the same instance) is checked
	// as soon as Squid's idle connection from the last check is gone, not
	// after the interval; its failure keeps the address.
	n := calls.Load()
	if got := c.Check(ctx, nil, "uid", "i2#v2", "10.0.0.6:3128", check, time.Hour); calls.Load() != n || !got.Next.Equal(start.Add(time.Hour+IdleConnectionGap)) {
		t.Errorf("an update in place right after a check: %d checks sent, next due %v; want none yet, due %v after the last", calls.Load()-n, got.Next, IdleConnectionGap)
	}
	elapsed.Add(int64(IdleConnectionGap))
	if got := c.Check(ctx, nil, "uid", "i2#v2", "10.0.0.6:3128", check, time.Hour); calls.Load() != n+1 || got.IP != "203.0.113.9" || got.Moved || got.Error == "" {
		t.Errorf("failed check of an instance updated in place = %+v after %d checks; want it sent, the last address kept, not Moved", got, calls.Load()-n)
	}
	// A failed check of another instance, or of the proxy elsewhere,
	// keeps nothing of the last one's address, and says it moved.
	if got := c.Check(ctx, nil, "uid", "i3", "10.0.0.6:3128", check, time.Hour); got.IP != "" || got.Error == "" || !got.Moved {
		t.Errorf("failed check of a recreated instance = %+v; want no address, an error, Moved", got)
	}
	if got := c.Check(ctx, nil, "uid", "i3", "10.0.0.7:3128", check, 0); got.IP != "" || !got.Moved {
		t.Errorf("failed check at yet another address = %+v; want no address, still Moved", got)
	}
	fail.Store(false)
	if got := c.Check(ctx, nil, "uid", "i3", "10.0.0.8:3128", check, 0); got.IP != "203.0.113.9" || got.Moved {
		t.Errorf("check after the failures = %+v; want the address, no longer Moved", got)
	}
	fail.Store(true)
	c.Forget("uid")
	if got := c.Check(ctx, nil, "uid", "i2", "10.0.0.6:3128", check, time.Hour); got.IP != "" {
		t.Errorf("Check after Forget = %+v; want nothing known", got)
	}
}

// TestEgressCheckerLeavesSquidsIdleConnectionToExpire: however short the
// interval, a check is not sent until Squid has dropped its idle
// connection to the echo endpoint from the last one, so that each check
// sees the address a new connection leaves from; Next says when.
func TestEgressCheckerLeavesSquidsIdleConnectionToExpire(t *testing.T) {
	var calls atomic.Int32
	fail := atomic.Bool{}
	var elapsed atomic.Int64
	start := time.Now()
	c := &EgressChecker{Wait: time.Second, RetryInterval: time.Second, Ask: func(context.Context, string, proxy.EgressCheck) (string, error) {
		calls.Add(1)
		if fail.Load() {
			return "", errors.New("no answer")
		}
		return "203.0.113.7", nil
	}, Now: func() time.Time { return start.Add(time.Duration(elapsed.Load())) }}
	check := proxy.EgressCheck{URL: "http://echo.example/ip", Username: CheckUsername, Password: "p"}
	ctx := t.Context()
	at := func(d time.Duration) Egress {
		elapsed.Store(int64(d))
		return c.Check(ctx, nil, "uid", "i1", "10.0.0.5:3128", check, time.Minute)
	}
	if got := at(0); got.IP == "" || !got.Next.Equal(start.Add(IdleConnectionGap)) {
		t.Fatalf("first check = %+v; want an address, the next due %v after it", got, IdleConnectionGap)
	}
	// A minute and a bit later, with a minute's interval: Squid may still
	// hold the last check's connection.
	if at(62 * time.Second); calls.Load() != 1 {
		t.Errorf("a check 62s after the last, with a 1m interval: %d sent; want none yet", calls.Load()-1)
	}
	fail.Store(true)
	if got := at(IdleConnectionGap); calls.Load() != 2 || got.Error == "" || !got.Next.Equal(start.Add(2*IdleConnectionGap)) {
		t.Errorf("at the gap: %d checks, %+v; want the second, failed, its retry due a gap later (not RetryInterval's 1s)", calls.Load(), got)
	}
	if at(IdleConnectionGap + 2*time.Second); calls.Load() != 2 {
		t.Errorf("a retry 2s after a failure: %d checks; want it held back to the gap", calls.Load())
	}
}

// TestEgressCheckerForgetsKeysNoOneAsksAbout: a proxy deleted without a
// last look, a check turned off or a replica gone leaves a key no Check
// asks about again; it is dropped after ForgetAfter, and a key still
// asked about stays.
func TestEgressCheckerForgetsKeysNoOneAsksAbout(t *testing.T) {
	var elapsed atomic.Int64
	start := time.Now()
	c := &EgressChecker{ForgetAfter: time.Hour, Ask: func(context.Context, string, proxy.EgressCheck) (string, error) {
		return "203.0.113.7", nil
	}, Now: func() time.Time { return start.Add(time.Duration(elapsed.Load())) }}
	check := proxy.EgressCheck{URL: "http://echo.example/ip", Username: CheckUsername, Password: "pw"}
	ctx := t.Context()
	for _, k := range []string{"gone", "kept"} {
		if got := c.Check(ctx, nil, k, "i1", "10.0.0.5:3128", check, time.Hour); got.IP == "" {
			t.Fatalf("Check(%s) = %+v; want an address", k, got)
		}
	}
	for range 4 {
		elapsed.Add(int64(20 * time.Minute))
		c.Check(ctx, nil, "kept", "i1", "10.0.0.5:3128", check, time.Hour)
	}
	c.mu.Lock()
	_, gone := c.entries["gone"]
	_, kept := c.entries["kept"]
	n := len(c.entries)
	c.mu.Unlock()
	if gone || !kept || n != 1 {
		t.Errorf("after 80 minutes: the unasked key kept %v, the asked one kept %v, %d keys; want only the asked one", gone, kept, n)
	}
}

// TestACutOffEchoAnswerVerifiesNothing: an answer whose connection drops
// before its declared length (203.0.113.71 cut to 203.0.113.7) is a
// failed check, never another address.
func TestACutOffEchoAnswerVerifiesNothing(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		hj, ok := w.(http.Hijacker)
		if !ok {
			t.Error("no hijacker")
			return
		}
		conn, buf, err := hj.Hijack()
		if err != nil {
			t.Error(err)
			return
		}
		_, _ = buf.WriteString("HTTP/1.1 200 OK\r\nContent-Length: 12\r\n\r\n203.0.113.7")
		_ = buf.Flush()
		_ = conn.Close()
	}))
	defer srv.Close()
	ip, err := AskEgress(t.Context(), nil, strings.TrimPrefix(srv.URL, "http://"), proxy.EgressCheck{URL: "http://echo.example/ip", Username: CheckUsername, Password: "pw"})
	if err == nil || strings.Contains(err.Error(), "203.0.113.7") {
		t.Errorf("AskEgress = %q, %v; want an error quoting nothing of the answer", ip, err)
	}
}
