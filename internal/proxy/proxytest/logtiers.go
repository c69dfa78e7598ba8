package proxytest

import (
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/egressproxy/provider-egressproxy/internal/proxy"
	"github.com/egressproxy/provider-egressproxy/internal/squid"
)

// WithSentinels is req with a sentinel in every secret of its own: the
// proxy password and the cloud-init. secrets names them, with the
// htpasswd line the backends render from the password (salted with the
// UID, as every backend renders it), for CheckLogTiers. A backend's own
// secrets (a token, a key) are the caller's to add.
func WithSentinels(req proxy.Request) (proxy.Request, map[string]string) {
	req = secretRequest(req, 1)
	secrets := map[string]string{"Proxy.Auth.Password": sentinelPassword1, "CloudInit": sentinelCloudInit1}
	if f, err := squid.Render(req.Proxy, squid.Options{HtpasswdSalt: req.Mark.UID}); err == nil {
		for i, line := range strings.Split(strings.TrimSpace(f.Htpasswd), "\n") {
			if _, hash, ok := strings.Cut(line, ":"); ok {
				secrets["htpasswd line "+strconv.Itoa(i)] = hash
			}
		}
	}
	return req, secrets
}

var levelField = regexp.MustCompile(`"level"=(\d+)`)

// CheckLogTiers checks log, written by a funcr logger (its "level"=N
// field) at the highest verbosity the provider has: each message of
// want[n] is logged at level n exactly (a line at another level is in
// the wrong tier), and no secret is in any line of any level, as is or
// base64-encoded.
func CheckLogTiers(t testing.TB, log string, secrets map[string]string, want map[int][]string) {
	t.Helper()
	levels := map[string][]int{} // message: the levels it was logged at
	for _, line := range strings.Split(log, "\n") {
		if line == "" {
			continue
		}
		for label, s := range secrets {
			if s == "" {
				continue
			}
			if form, ok := leaks(line, s); ok {
				t.Errorf("the log holds %s: %s", label, excerpt(line, form))
			}
		}
		m := levelField.FindStringSubmatch(line)
		_, rest, ok := strings.Cut(line, `"msg"="`)
		if m == nil || !ok {
			continue
		}
		msg, _, _ := strings.Cut(rest, `"`)
		lv, _ := strconv.Atoi(m[1])
		levels[msg] = append(levels[msg], lv)
	}
	tiers := make([]int, 0, len(want))
	for n := range want {
		tiers = append(tiers, n)
	}
	sort.Ints(tiers)
	for _, n := range tiers {
		for _, msg := range want[n] {
			got, ok := levels[msg]
			switch {
			case !ok:
				t.Errorf("no line %q in the log (tier V(%d))", msg, n)
			case !allEqual(got, n):
				t.Errorf("line %q logged at levels %v; want V(%d) only", msg, got, n)
			}
		}
	}
}

func allEqual(l []int, n int) bool {
	for _, x := range l {
		if x != n {
			return false
		}
	}
	return true
}
