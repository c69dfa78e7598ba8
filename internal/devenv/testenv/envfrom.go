package testenv

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"
)

// fetchVar turns a re-executed test binary into the Go client of
// FetchWithEnv: its value is the URL to fetch.
const fetchVar = "EGRESSPROXY_TESTENV_FETCH"

// ServeFetch makes the test binary the Go client of FetchWithEnv when it
// was started as one, and otherwise returns at once. Call it first in the
// TestMain of a package that uses FetchWithEnv.
func ServeFetch() {
	target := os.Getenv(fetchVar)
	if target == "" {
		return
	}
	var remote string
	ctx := httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{
		GotConn: func(i httptrace.GotConnInfo) { remote = i.Conn.RemoteAddr().String() },
	})
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, target, nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	// The default transport: proxies from HTTP_PROXY, HTTPS_PROXY and
	// NO_PROXY (or their lower-case names), as any Go program.
	resp, err := (&http.Client{Timeout: 20 * time.Second}).Do(req)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	body, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	fmt.Printf("%d %s\n%s", resp.StatusCode, remote, body)
	os.Exit(0)
}

// Fetch is what one client process got.
type Fetch struct {
	// Client is "curl" or "go".
	Client string
	// Status is the HTTP status code.
	Status int
	// Remote is the host:port the client connected to: the proxy's when it
	// used the proxy, the target's when it did not.
	Remote string
	// Body of the response.
	Body string
}

// FetchWithEnv fetches target with curl and with a Go net/http client, each
// a process whose whole environment is env (a connection Secret mounted
// with envFrom, and nothing else: no PATH, no HOME, no proxy setting of
// this machine). The Go client is this test binary re-executed (see
// ServeFetch). Without curl, the test fails under CI and runs the Go
// client alone elsewhere.
func FetchWithEnv(t *testing.T, env map[string]string, target string) []Fetch {
	t.Helper()
	return FetchWithEnvCA(t, env, "", target)
}

// FetchWithEnvCA is FetchWithEnv through a proxy listening with TLS (an
// https:// proxy URL), whose CA is the file caFile (the connection
// Secret's ca.crt, mounted): curl is given it with --proxy-cacert (no
// environment variable of curl's applies to a proxy's certificate), the
// Go client with SSL_CERT_FILE, which Go's system roots read on Linux.
func FetchWithEnvCA(t *testing.T, env map[string]string, caFile, target string) []Fetch {
	t.Helper()
	environ := make([]string, 0, len(env)+1)
	for k, v := range env {
		environ = append(environ, k+"="+v)
	}
	if caFile != "" {
		environ = append(environ, "SSL_CERT_FILE="+caFile)
	}
	sort.Strings(environ)
	var out []Fetch
	if curl, err := exec.LookPath("curl"); err == nil {
		// -q: no .curlrc. The last line is what curl says it connected to.
		args := []string{"-q", "-sS", "--max-time", "20", "-w", "\n%{http_code} %{remote_ip} %{remote_port}"}
		if caFile != "" {
			args = append(args, "--proxy-cacert", caFile)
		}
		cmd := exec.Command(curl, append(args, target)...)
		cmd.Env = environ
		b, err := cmd.Output()
		if err != nil {
			t.Fatalf("curl %s with the connection Secret as its environment: %v: %s", target, err, stderr(err))
		}
		s := string(b)
		i := strings.LastIndexByte(s, '\n')
		f := strings.Fields(s[i+1:])
		if i < 0 || len(f) != 3 {
			t.Fatalf("curl printed %q; want the body and a last line with the code, remote IP and port", s)
		}
		code, _ := strconv.Atoi(f[0])
		out = append(out, Fetch{Client: "curl", Status: code, Remote: net.JoinHostPort(f[1], f[2]), Body: s[:i]})
	} else if CI() {
		t.Fatalf("curl is not installed (CI is set, so this test does not go without it): %v", err)
	} else {
		t.Logf("curl is not installed; fetching with the Go client only")
	}

	cmd := exec.Command(os.Args[0], "-test.run=^$") // the test binary itself
	cmd.Env = append(environ, fetchVar+"="+target)
	b, err := cmd.Output()
	if err != nil {
		t.Fatalf("Go client for %s with the connection Secret as its environment: %v: %s", target, err, stderr(err))
	}
	first, body, _ := strings.Cut(string(b), "\n")
	var code int
	var remote string
	if _, err := fmt.Sscanf(first, "%d %s", &code, &remote); err != nil {
		t.Fatalf("Go client printed %q: %v", b, err)
	}
	return append(out, Fetch{Client: "go", Status: code, Remote: remote, Body: body})
}

func stderr(err error) string {
	if ee, ok := err.(*exec.ExitError); ok { //nolint:errorlint // exec returns it unwrapped.
		return string(ee.Stderr)
	}
	return ""
}
