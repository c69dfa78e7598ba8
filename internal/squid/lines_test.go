package squid

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

// longestLists are settings with every list as long as admission lets it
// be, each entry as long as it may be.
func longestLists() proxy.Settings {
	label := strings.Repeat("a", 60)
	s := proxy.Settings{Port: 3128, Auth: proxy.Auth{Enabled: true, Username: "team", Password: "pw"}}
	for i := range 256 {
		// 253 characters, none covering another.
		s.AllowedDestinations = append(s.AllowedDestinations, fmt.Sprintf("d%03d.%s.%s.%s.%s", i, label, label, label, strings.Repeat("b", 3+60-len(label))))
	}
	for i := range 64 {
		s.AllowedClientCIDRs = append(s.AllowedClientCIDRs, fmt.Sprintf("2001:db8:1111:2222:3333:4444:5555:%04x/128", 0x1000+i))
	}
	for i := range 32 {
		s.AllowedPorts = append(s.AllowedPorts, int32(10000+i))
	}
	return s
}

// splitAttack is an allow-list whose entries, each one admission takes,
// would put "http_access allow clients" at the start of a line a Squid
// reading buf bytes a line reads on its own, were the allow-list written
// on one line: the padding ends exactly at buf.
func splitAttack(buf int) proxy.Settings {
	const head = "acl dest dstdomain -n "
	label := strings.Repeat("a", 60)
	var dests []string
	n := len(head)
	for i := 0; ; i++ {
		d := fmt.Sprintf("a.a%03d.%s.%s.%s", i, label, label, label)
		if n+len(d)+1+len("a.") > buf {
			break
		}
		dests = append(dests, d)
		n += len(d) + 1
	}
	last, left := "a.b", buf-n-len("a.")-1
	for len(last) < left {
		last += "." + strings.Repeat("b", min(60, left-len(last)-1))
	}
	dests = append(dests, last, "a.http_access", "allow", "clients")
	return proxy.Settings{Port: 3128, AllowedClientCIDRs: []string{"10.20.0.0/16"}, AllowedPorts: []int32{443},
		AllowedDestinations: dests, Auth: proxy.Auth{Enabled: true, Username: "team", Password: "pw"}}
}

// asSquidReads splits conf as Squid reads it: lines of at most buf bytes,
// a longer one read as several.
func asSquidReads(conf string, buf int) []string {
	var out []string
	for l := range strings.SplitSeq(strings.TrimSuffix(conf, "\n"), "\n") {
		for len(l) > buf {
			out = append(out, l[:buf])
			l = l[buf:]
		}
		out = append(out, l)
	}
	return out
}

// aclValues are the values of every line of ACL name, in order.
func aclValues(conf, name, typ string) []string {
	var out []string
	for _, l := range lines(conf, "acl "+name+" "+typ+" ") {
		out = append(out, strings.Fields(strings.TrimPrefix(l, "acl "+name+" "+typ+" "))...)
	}
	return out
}

// TestLongListsStayWithinSquidLines: however long the lists a resource
// may hold, every squid.conf line fits Squid's, so that Squid reads the
// rules the provider wrote and nothing else, and every entry is kept.
func TestLongListsStayWithinSquidLines(t *testing.T) {
	short := validSettings()
	short.AllowedDestinations = []string{"example.com"}
	short.Auth = proxy.Auth{Enabled: true, Username: "team", Password: "pw"}
	want, err := Render(short, Options{UID: "u1"})
	if err != nil {
		t.Fatal(err)
	}
	for name, s := range map[string]proxy.Settings{
		"longest lists":                     longestLists(),
		"a split of the allow-list (glibc)": splitAttack(8191),
		"a split of the allow-list (musl)":  splitAttack(1023),
	} {
		t.Run(name, func(t *testing.T) {
			if err := Validate(s); err != nil {
				t.Fatalf("the settings are valid, but: %v", err)
			}
			f, err := Render(s, Options{UID: "u1"})
			if err != nil {
				t.Fatal(err)
			}
			for _, l := range strings.Split(f.SquidConf, "\n") {
				if len(l) > maxLine {
					t.Errorf("a line of %d bytes, over %d: %.80s…", len(l), maxLine, l)
				}
			}
			// Squid reads with fgets of BUFSIZ: 8192 bytes under glibc,
			// 1024 under musl.
			for _, buf := range []int{8191, 1023} {
				var rules []string
				for _, l := range asSquidReads(f.SquidConf, buf) {
					if strings.HasPrefix(l, "http_access ") {
						rules = append(rules, l)
					}
				}
				if w := lines(want.SquidConf, "http_access "); !slices.Equal(rules, w) {
					t.Errorf("a Squid reading %d bytes a line reads the rules\n%s\nwant\n%s", buf+1, strings.Join(rules, "\n"), strings.Join(w, "\n"))
				}
			}
			if got, w := aclValues(f.SquidConf, "dest", "dstdomain -n"), destinations(s.AllowedDestinations); !slices.Equal(got, w) {
				t.Errorf("the allow-list holds %d entries, want %d", len(got), len(w))
			}
			if got, w := aclValues(f.SquidConf, "clients", "src"), clientCIDRs(s.AllowedClientCIDRs); !slices.Equal(got, w) {
				t.Errorf("the clients are %v, want %v", got, w)
			}
			if got, w := aclValues(f.SquidConf, "SSL_ports", "port"), portStrings(connectPorts(s.AllowedPorts)); !slices.Equal(got, w) {
				t.Errorf("the CONNECT ports are %v, want %v", got, w)
			}
		})
	}
}

// TestRenderRefusesAnOverlongLine: a line that would still run past
// Squid's is refused, naming the limit, never written.
func TestRenderRefusesAnOverlongLine(t *testing.T) {
	s := validSettings()
	o := Options{UID: "u1", AccessLog: "stdio:/" + strings.Repeat("x", maxLine)}
	_, err := Render(s, o)
	if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("over the provider's limit of %d", maxLine)) || proxy.ClassOf(err) != proxy.ClassPermanent {
		t.Fatalf("Render with a %d-byte access_log = %v; want a Permanent refusal naming the limit", maxLine, err)
	}
}

// TestLongEgressCheckURLIsRefusedByName: an echo URL that admission
// takes (512 characters) but that, escaped as a pattern, would not fit a
// squid.conf line is refused naming egressCheck.url, before anything is
// rendered.
func TestLongEgressCheckURLIsRefusedByName(t *testing.T) {
	s := validSettings()
	s.EgressCheck = &proxy.EgressCheck{URL: "http://echo.example/" + strings.Repeat(".", 490), Username: CheckUsername, Password: "check-password-0123456789"}
	err := Validate(s)
	if err == nil || !strings.Contains(err.Error(), "egressCheck.url") || !strings.Contains(err.Error(), "is too long") {
		t.Fatalf("Validate with a %d-character echo URL of dots = %v; want egressCheck.url named as too long", len(s.EgressCheck.URL), err)
	}
	s.EgressCheck.URL = "http://echo.example/" + strings.Repeat("a", 490)
	if err := Validate(s); err != nil {
		t.Errorf("Validate with a %d-character echo URL that needs no escapes: %v", len(s.EgressCheck.URL), err)
	}
	// The longest admission takes (480), escaped as much as it can be.
	s.EgressCheck.URL = "http://echo.example/" + strings.Repeat(".", 460)
	if err := Validate(s); err != nil {
		t.Errorf("Validate with the longest echo URL admission takes, all dots: %v", err)
	}
}
