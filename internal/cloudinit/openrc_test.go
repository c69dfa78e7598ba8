package cloudinit

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/egressproxy/provider-egressproxy/internal/cloudinit/guesttest"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
	"github.com/egressproxy/provider-egressproxy/internal/squid"
)

// TestEgressCheckOnOpenRC: on an Alpine guest (OpenRC, no bash) the seed
// installs bash, installs the check's OpenRC service, adds it to the
// default runlevel and starts it after Squid; a KVM update's script run
// again restarts it without adding it twice; seeded again with the check
// turned off (Proxmox), the service is stopped, out of the runlevel, and
// none of its files stays.
func TestEgressCheckOnOpenRC(t *testing.T) {
	g := guesttest.New(t)
	g.OpenRC()
	r := &EgressReport{Request: "GET http://echo.example/ HTTP/1.1\r\n\r\n", Port: 3129}
	g.Boot(must(UserData(Options{Squid: render(t, false), EgressReport: r})))

	want := []string{
		"rc-update add squid default", "rc-service squid start", "rc-service squid restart",
		"apk add --no-cache bash",
		"rc-update add " + openRCService + " default", "rc-service " + openRCService + " restart",
	}
	if got := g.RCCalls(); !slices.Equal(got, want) {
		t.Errorf("the first boot ran\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if got, ok := g.ReadFile(openRCServicePath); !ok || got != openRCScript {
		t.Fatalf("%s is %q; want the check's service", openRCServicePath, got)
	}
	if fi, err := os.Stat(g.Path(openRCServicePath)); err != nil || fi.Mode().Perm() != 0o755 {
		t.Errorf("%s: %v, %v; want mode 0755 (OpenRC runs only executable scripts)", openRCServicePath, fi, err)
	}
	if out, err := exec.Command("sh", "-n", g.Path(openRCServicePath)).CombinedOutput(); err != nil {
		t.Errorf("the service is not valid sh: %v: %s", err, out)
	}

	before := len(g.RCCalls())
	g.Exec("sh", "-ec", GuestFunctions+"; "+EgressCheckStart)
	if got := g.RCCalls()[before:]; !slices.Equal(got, []string{"rc-service " + openRCService + " restart"}) {
		t.Errorf("the check started again ran %q; want a restart only", got)
	}

	g.WriteFile(ReportPath, "egressproxy-egress-check 1700000000 200 203.0.113.7\n")
	before = len(g.RCCalls())
	g.Boot(must(UserData(Options{Squid: render(t, false)})))
	if got := g.RCCalls()[before:]; !slices.Contains(got, "rc-service "+openRCService+" stop") || !slices.Contains(got, "rc-update del "+openRCService+" default") {
		t.Errorf("the check turned off ran %q; want it stopped and out of the default runlevel", got)
	}
	for p := range g.Files() {
		if strings.Contains(p, "egress-check") {
			t.Errorf("%s stays on a guest whose seed has no check", p)
		}
	}
}

// TestEgressCheckRepeats runs the check as the OpenRC service runs it,
// against a stand-in for the instance's Squid: it reports at once, again
// at each interval (the echo's answer changes between), ends by itself
// once its request is removed (turned off), and at once on a stop, also
// while it retries a Squid that does not answer.
func TestEgressCheckRepeats(t *testing.T) {
	if _, err := exec.LookPath("bash"); err != nil {
		t.Fatalf("the check needs bash: %v", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	// The request the provider writes for a check.
	req, err := squid.ReportRequest(proxy.EgressCheck{URL: "http://echo.example/", Username: "p", Password: "p"})
	if err != nil {
		t.Fatal(err)
	}
	var answer atomic.Value
	answer.Store("203.0.113.7")
	// As Squid forwards the check's request to the echo.
	srv := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.String() != "http://echo.example/" || r.Header.Get("Proxy-Authorization") != "Basic cDpw" {
			http.Error(w, "not the check's request", http.StatusBadRequest)
			return
		}
		_, _ = fmt.Fprint(w, answer.Load())
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	addr, _ := ln.Addr().(*net.TCPAddr)
	port := int32(addr.Port) //nolint:gosec // A TCP port.

	g := guesttest.New(t)
	var script, args string
	for _, f := range EgressCheckFiles(&EgressReport{Request: req, Port: port}) {
		g.WriteFile(f.Path, f.Content)
		switch f.Path {
		case reportScriptPath:
			script = f.Content
		case openRCStagedPath:
			out, err := exec.Command("sh", "-c", `. "$1"; printf '%s\n%s' "$command" "$command_args"`, "sh", g.Path(f.Path)).Output()
			if err != nil {
				t.Fatal(err)
			}
			cmd, a, _ := strings.Cut(string(out), "\n")
			if cmd != reportScriptPath || a != "--every 3600" {
				t.Fatalf("the OpenRC service runs %q %q; want %s --every 3600", cmd, a, reportScriptPath)
			}
			args = a
		}
	}
	// Every second rather than hourly.
	run := func(every string) (*exec.Cmd, chan error) {
		c := g.Command("bash", "-c", script, "egress-check", strings.Fields(args)[0], every)
		c.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- c.Wait() }()
		t.Cleanup(func() { _ = syscall.Kill(-c.Process.Pid, syscall.SIGKILL) })
		return c, done
	}
	reports := func(ip string) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for time.Now().Before(deadline) {
			if line, _ := g.ReadFile(ReportPath); strings.HasPrefix(line, "egressproxy-egress-check ") && strings.HasSuffix(line, " 200 "+ip+"\n") {
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
		line, _ := g.ReadFile(ReportPath)
		t.Fatalf("the report is %q; want the echo's %s", line, ip)
	}
	ends := func(done chan error, within time.Duration, why string) {
		t.Helper()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("the check ended with %v %s; want 0", err, why)
			}
		case <-time.After(within):
			t.Fatalf("the check runs on %s", why)
		}
	}

	_, done := run("1")
	reports("203.0.113.7")
	answer.Store("203.0.113.8")
	reports("203.0.113.8")
	if err := os.Remove(g.Path(reportRequestPath)); err != nil {
		t.Fatal(err)
	}
	ends(done, 10*time.Second, "after its request was removed")

	g.WriteFile(reportRequestPath, req)
	answer.Store("203.0.113.9")
	c, done := run("3600")
	reports("203.0.113.9")
	if err := c.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	ends(done, 5*time.Second, "after a stop (SIGTERM)")

	// Squid gone: the check retries every 5 s, and a stop ends that too.
	_ = srv.Close()
	c, done = run("3600")
	time.Sleep(time.Second)
	if err := c.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	ends(done, 3*time.Second, "after a stop (SIGTERM) while it retries")
}
