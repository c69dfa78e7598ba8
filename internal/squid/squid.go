// Package squid renders squid.conf and htpasswd from the common proxy block
// (proxy.Settings), so that every backend (a Debian VM, a container) runs
// the same Squid policy: deny by default, serve only the allowed client
// CIDRs, CONNECT only to the allowed ports, optionally only to an allow-list
// of domains and only with basic-auth credentials, and cache nothing.
package squid

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

// Defaults for the empty fields of Options. The paths are those of Debian's
// squid package; the logs go to the standard streams because a container
// has nowhere else to put them.
const (
	// DefaultHtpasswdPath is where the htpasswd file is installed.
	DefaultHtpasswdPath = "/etc/squid/egressproxy.htpasswd" //nolint:gosec // A path, not a credential.
	// DefaultTLSCertPath and DefaultTLSKeyPath are where the proxy's
	// certificate chain and key are installed when it listens with TLS.
	DefaultTLSCertPath = "/etc/squid/egressproxy-tls.crt"
	DefaultTLSKeyPath  = "/etc/squid/egressproxy-tls.key"
	// DefaultAuthHelperPath is Debian's basic_ncsa_auth.
	DefaultAuthHelperPath = "/usr/lib/squid/basic_ncsa_auth"
	// DefaultPIDFile "none" writes no PID file.
	DefaultPIDFile = "none"
	// DefaultAccessLog writes one line per request to standard output.
	DefaultAccessLog = "stdio:/dev/stdout"
	// DefaultCacheLogPath sends Squid's own messages to standard error.
	DefaultCacheLogPath = "/dev/stderr"
	// DefaultShutdownLifetime is how long a stopping Squid waits for
	// active connections.
	DefaultShutdownLifetime = 10 * time.Second
)

// Realm is the basic-auth realm clients see in a 407 challenge.
const Realm = "egress-proxy"

// defaultConnectPorts are the CONNECT ports allowed when
// proxy.Settings.AllowedPorts is empty: HTTPS only.
var defaultConnectPorts = []int32{443}

// plainHTTPPorts are always allowed for requests other than CONNECT: a
// forward proxy serves plain http:// URLs itself, and Squid's own
// convention allows port 443 there too.
var plainHTTPPorts = []int32{80, 443}

// Options says where things live on the machine that runs Squid (a Debian
// VM, a container) and how Squid is run there. Options never let the proxy
// allow more: DeniedDestinationCIDRs only adds denials.
type Options struct {
	// HtpasswdPath is where the htpasswd file (Files.Htpasswd) will be
	// installed; default DefaultHtpasswdPath. Squid's effective user (proxy
	// on Debian) must be able to read it.
	HtpasswdPath string
	// TLSCertPath and TLSKeyPath are where Files.TLSCert and Files.TLSKey
	// will be installed; defaults DefaultTLSCertPath and
	// DefaultTLSKeyPath. Squid reads them at start (as root on a VM, as
	// its own user in a container, which must then be able to read them).
	TLSCertPath, TLSKeyPath string
	// AuthHelperPath is basic_ncsa_auth; default DefaultAuthHelperPath.
	AuthHelperPath string
	// PIDFile is Squid's pid_filename; default "none", so that several
	// squids (tests, a read-only root) never fight over /run/squid.pid.
	// Debian's systemd unit expects /run/squid.pid, and `squid -k
	// reconfigure` needs a PID file.
	PIDFile string
	// AccessLog is Squid's access_log destination; default
	// DefaultAccessLog. Squid opens it by path after dropping privileges, so
	// /dev/stdout fails when stdout is a socket (systemd's journal:
	// ENXIO) or a pipe owned by another user (a root container whose squid
	// drops to proxy). On a systemd VM use e.g.
	// "stdio:/var/log/squid/access.log" or "syslog:daemon.info".
	AccessLog string
	// CacheLogPath is Squid's cache_log (its own messages); default
	// DefaultCacheLogPath. When Squid cannot open it, it falls back to its
	// stderr with a warning instead of failing.
	CacheLogPath string
	// ListenAddress is the address to listen on, e.g. "127.0.0.1" in tests;
	// empty means every address, IPv4 and IPv6.
	ListenAddress string
	// EffectiveUser is cache_effective_user, the user a squid started as
	// root switches to; empty keeps the compiled-in default (proxy on
	// Debian). Squid refuses to run as root.
	EffectiveUser string
	// UID is the managed resource's UID: Squid calls itself Identity(UID)
	// (its visible_hostname), which is how Prober tells this resource's
	// Squid from any other answering at its address. Empty renders the
	// bare "egress-proxy" that identifies no resource.
	UID string
	// HtpasswdSalt is a non-secret seed, stable and unique per proxy (the
	// managed resource's UID, say), from which the password hash's salt is
	// derived. Rendering must be deterministic so that Hash only changes
	// when the settings do; the seed keeps equal credentials on two proxies
	// from hashing alike. Empty is allowed: the salt then depends on the
	// username only.
	HtpasswdSalt string
	// ShutdownLifetime is how long Squid lets active connections finish
	// after SIGTERM; default DefaultShutdownLifetime, below Kubernetes'
	// 30 s grace period (Squid's own default is 30 s). Squid waits this
	// long even when idle. Rounded down to whole seconds.
	ShutdownLifetime time.Duration
	// DeniedDestinationCIDRs are denied on top of NeverDestinations, and
	// cannot be opened by the resource: what the backend knows of the
	// network the proxy stands in (a cluster's Service and Pod networks,
	// its API server, the proxy's own addresses). CIDRs or bare addresses.
	DeniedDestinationCIDRs []string
	// OwnAddressesFile, when set, is a squid.conf fragment of the proxy
	// machine's own addresses, one "acl own_dst dst ADDRESS" line each,
	// written where Squid runs before it starts (a VM's interface
	// addresses): they are denied as destinations, so the proxy never
	// reaches the services of its own host by an address of its own.
	// squid.conf includes it, so Squid refuses to start without it or
	// with no address in it, where a missing list file would be an empty
	// ACL.
	OwnAddressesFile string
	// HostsFile is Squid's hosts_file, names resolved before DNS; empty
	// keeps Squid's /etc/hosts. Tests point it at names of their own.
	HostsFile string
	// DNSNameservers, when set, are the only DNS servers Squid asks (its
	// dns_nameservers); empty keeps the machine's resolv.conf.
	DNSNameservers []string
}

// Files are the rendered files. Htpasswd holds a password hash: keep it as
// secret as the password; TLSKey is a private key. String, GoString and
// Format redact them, so that logging a Files by accident leaks nothing.
type Files struct {
	// SquidConf is the squid.conf text. It never holds a secret.
	SquidConf string
	// Htpasswd is the htpasswd text for Options.HtpasswdPath; empty when
	// auth is off.
	Htpasswd string
	// TLSCert and TLSKey are the PEM certificate chain and private key for
	// Options.TLSCertPath and TLSKeyPath; empty when the proxy listens
	// without TLS.
	TLSCert, TLSKey string
}

// String describes f without its contents.
func (f Files) String() string {
	redacted := func(v string) string {
		if v == "" {
			return "none"
		}
		return "redacted"
	}
	return fmt.Sprintf("squid.Files{SquidConf: %d bytes, Htpasswd: %s, TLSCert: %d bytes, TLSKey: %s, Hash: %s}",
		len(f.SquidConf), redacted(f.Htpasswd), len(f.TLSCert), redacted(f.TLSKey), Hash(f))
}

// GoString is String, so that %#v redacts too.
func (f Files) GoString() string { return f.String() }

// Format makes every verb (%v, %+v, %s, %d, %x...) print String, since
// fmt would otherwise print the fields with verbs that do not call String.
func (f Files) Format(s fmt.State, _ rune) { _, _ = s.Write([]byte(f.String())) }

// Hash is a short, stable digest of the rendered files, for a rollout
// annotation: it changes exactly when one of them does. It is derived
// from the (slow) password hash, never from the password, so publishing
// it does not make guessing the password easier; a private key has far
// too much entropy to be guessed from a digest.
func Hash(f Files) string {
	h := sha256.New()
	parts := []string{f.SquidConf, f.Htpasswd}
	if f.TLSCert != "" || f.TLSKey != "" {
		// Only then: the digest of a proxy without TLS stays as it was.
		parts = append(parts, f.TLSCert, f.TLSKey)
	}
	for _, part := range parts {
		// Length prefixes keep ("ab", "c") and ("a", "bc") apart.
		var n [8]byte
		binary.BigEndian.PutUint64(n[:], uint64(len(part)))
		h.Write(n[:])
		h.Write([]byte(part))
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}

// Render validates s (see Validate) and o, and renders the files. It is
// deterministic: the same s and o give the same Files, so Hash is stable
// across reconciles. Errors are classified proxy.ClassPermanent and never
// hold the password.
func Render(s proxy.Settings, o Options) (Files, error) {
	if err := Validate(s); err != nil {
		return Files{}, err
	}
	o, err := o.withDefaults()
	if err != nil {
		return Files{}, err
	}

	var b strings.Builder
	w := func(lines ...string) {
		for _, l := range lines {
			b.WriteString(l)
			b.WriteByte('\n')
		}
	}

	w("# squid.conf rendered by provider-egressproxy (internal/squid).",
		"# Do not edit: it is rewritten from the managed resource.",
		"")

	listen := strconv.Itoa(int(s.Port))
	if o.ListenAddress != "" {
		listen = netip.AddrPortFrom(netip.MustParseAddr(o.ListenAddress), uint16(s.Port)).String()
	}
	port := "http_port " + listen
	if s.TLS != nil {
		// TLS only: the credentials never cross the network in clear, and
		// a client that forgot https:// gets no answer rather than a 407.
		// No tls-min-version: Debian's Squid 5, built with GnuTLS, refuses
		// it; the TLS library's defaults apply.
		port = "https_port " + listen + " tls-cert=" + o.TLSCertPath + " tls-key=" + o.TLSKeyPath
	}
	w(port)
	if s.TLS != nil && s.EgressCheck != nil {
		// The check from inside the instance (ReportScript) speaks no TLS:
		// a plain listener on loopback alone, which no client outside the
		// instance reaches.
		loop := netip.AddrFrom4([4]byte{127, 0, 0, 1})
		if o.ListenAddress != "" {
			loop = netip.MustParseAddr(o.ListenAddress)
		}
		w("http_port " + netip.AddrPortFrom(loop, uint16(ReportPort(s))).String()) //nolint:gosec // admission bounds the port.
	}
	w(
		// A name of the resource's, not the machine's host name (which would
		// show in error pages, and without which Squid does not start): the
		// readiness probe reads it back (Prober).
		"visible_hostname "+Identity(o.UID),
		"httpd_suppress_version_string on",
		"")

	w("# Process and logs.",
		"pid_filename "+o.PIDFile,
		"cache_log "+o.CacheLogPath,
		"access_log "+o.AccessLog,
		// Rotating would rename the log files, which are streams here.
		"logfile_rotate 0",
		// The ICMP pinger needs CAP_NET_RAW and only feeds netdb, which a
		// proxy without peers has no use for.
		"pinger_enable off",
		"netdb_filename none",
		fmt.Sprintf("shutdown_lifetime %d seconds", int(o.ShutdownLifetime/time.Second)))
	if o.EffectiveUser != "" {
		w("cache_effective_user " + o.EffectiveUser)
	}
	if o.HostsFile != "" {
		w("hosts_file " + o.HostsFile)
	}
	if len(o.DNSNameservers) > 0 {
		w("dns_nameservers " + strings.Join(o.DNSNameservers, " "))
	}
	w("")

	w("# No caching: an egress proxy forwards, it does not store.",
		"cache deny all",
		"",
		"# Do not reveal the proxy or the client to the destination.",
		"via off",
		"forwarded_for delete",
		"")

	w("# Who may use the proxy: only these clients.")
	w(aclLines("clients", "src", clientCIDRs(s.AllowedClientCIDRs))...)
	w("",
		"# CONNECT (tunnels, HTTPS) only to these ports; other requests to",
		"# these and the plain HTTP ports.")
	w(aclLines("SSL_ports", "port", portStrings(connectPorts(s.AllowedPorts)))...)
	w(aclLines("Safe_ports", "port", portStrings(safePorts(s.AllowedPorts)))...)
	w("# The proxy's own port: a request there would loop back into it.",
		"acl own_port port "+strconv.Itoa(int(s.Port)),
		"")
	dstACLs, dstRules := destinationACLs(s, o)
	if o.OwnAddressesFile != "" {
		dstACLs = append(dstACLs, "# The proxy machine's own addresses (acl own_dst), listed before each",
			"# start; Squid does not start without them.",
			"include "+o.OwnAddressesFile)
		dstRules = append([]string{"http_access deny own_dst"}, dstRules...)
	}
	w(dstACLs...)
	dests := destinations(s.AllowedDestinations)
	if len(dests) > 0 {
		w("",
			"# Destination allow-list. -n: never match an IP-address URL by",
			"# its reverse DNS, which whoever owns the address controls.")
		w(aclLines("dest", "dstdomain -n", dests)...)
	}
	check := s.EgressCheck
	if s.Auth.Enabled || check != nil {
		w("",
			"# Basic authentication against the htpasswd file (hashed",
			"# passwords only; the password is never in this file).",
			"auth_param basic program "+o.AuthHelperPath+" "+o.HtpasswdPath,
			"auth_param basic children 5 startup=1 idle=1",
			"auth_param basic realm "+Realm,
			// Short, so that a changed password takes effect soon even
			// without a restart; a check costs a few milliseconds.
			"auth_param basic credentialsttl 5 minutes",
			// Squid would otherwise lower-case usernames and never find a
			// mixed-case one in htpasswd.
			"auth_param basic casesensitive on")
	}
	if check != nil {
		// After auth_param, which proxy_auth needs.
		w("")
		w(egressCheckACLs(check)...)
	}
	switch {
	case s.Auth.Enabled && check != nil:
		// The user's name alone: the check's credential is in the same
		// htpasswd and must not count as the user's.
		w("acl authenticated proxy_auth " + s.Auth.Username)
	case s.Auth.Enabled:
		w("acl authenticated proxy_auth REQUIRED")
	}
	w("")
	// unlessCheck lets the egress check through a denial: the check's
	// request alone is exempt from the client, port and allow-list rules,
	// never from the destination denials.
	unlessCheck := func(rule string) string {
		if check == nil {
			return rule
		}
		return rule + " !egress_check"
	}

	// The order matters: Squid applies the first rule that matches. Every
	// check that can deny outright (403) comes before the authentication
	// check, so a client outside the CIDRs gets 403, never a 407 that would
	// invite it to try passwords.
	w("# Access rules, first match wins.",
		"# The cache manager would disclose the configuration and statistics.",
		"http_access deny manager",
		"http_access deny own_port",
		unlessCheck("http_access deny !Safe_ports"),
		unlessCheck("http_access deny CONNECT !SSL_ports"),
		unlessCheck("http_access deny !clients"))
	if len(dests) > 0 {
		// Before the dst rules below, so a name off the list is refused
		// without a DNS lookup.
		w(unlessCheck("http_access deny !dest"))
	}
	w(dstRules...)
	if s.Auth.Enabled {
		rule := "http_access deny !authenticated"
		if check != nil {
			// egress_check first: the rule must end on the proxy_auth ACL
			// so that wrong credentials still get a 407.
			rule = "http_access deny !egress_check !authenticated"
		}
		w("# Missing or wrong credentials: 407.", rule)
	}
	w("http_access allow clients")
	if check != nil {
		w("http_access allow egress_check")
	}
	w("http_access deny all")

	// Squid reads a longer line as two (maxLine), the rest as a directive
	// of its own: no line gets there, whatever a list holds.
	for l := range strings.Lines(b.String()) {
		if len(l) > maxLine+1 {
			return Files{}, proxy.Permanentf("squid.conf would hold a line of %d bytes, over the provider's limit of %d (a Squid built on musl reads the rest of a line over 1023 bytes as a directive of its own, one on glibc over 8191); it begins %.60q: shorten the value it comes from", len(l)-1, maxLine, l)
		}
	}
	f := Files{SquidConf: b.String()}
	if s.TLS != nil {
		f.TLSCert, f.TLSKey = s.TLS.Cert, s.TLS.Key
	}
	if s.Auth.Enabled {
		f.Htpasswd = htpasswdLine(s.Auth.Username, s.Auth.Password, o.HtpasswdSalt)
	}
	if check != nil {
		f.Htpasswd += htpasswdLine(check.Username, check.Password, o.HtpasswdSalt)
	}
	return f, nil
}

// withDefaults fills in o's empty fields and checks that every value is a
// single squid.conf token, since a space or a newline would change the
// configuration's meaning.
func (o Options) withDefaults() (Options, error) {
	def := func(v *string, d string) {
		if *v == "" {
			*v = d
		}
	}
	def(&o.HtpasswdPath, DefaultHtpasswdPath)
	def(&o.TLSCertPath, DefaultTLSCertPath)
	def(&o.TLSKeyPath, DefaultTLSKeyPath)
	def(&o.AuthHelperPath, DefaultAuthHelperPath)
	def(&o.PIDFile, DefaultPIDFile)
	def(&o.AccessLog, DefaultAccessLog)
	def(&o.CacheLogPath, DefaultCacheLogPath)
	if o.ShutdownLifetime == 0 {
		o.ShutdownLifetime = DefaultShutdownLifetime
	}

	var errs fieldErrors
	add := func(field, format string, args ...any) {
		errs = append(errs, &FieldError{Field: "options." + field, Detail: fmt.Sprintf(format, args...)})
	}
	for _, v := range []struct {
		field, value string
		path         bool
	}{
		{"htpasswdPath", o.HtpasswdPath, true},
		{"tlsCertPath", o.TLSCertPath, true},
		{"tlsKeyPath", o.TLSKeyPath, true},
		{"authHelperPath", o.AuthHelperPath, true},
		{"pidFile", o.PIDFile, o.PIDFile != "none"},
		{"accessLog", o.AccessLog, false},
		{"cacheLogPath", o.CacheLogPath, true},
		{"effectiveUser", o.EffectiveUser, false},
	} {
		if msg := checkToken(v.value); msg != "" {
			add(v.field, "%q %s", v.value, msg)
		} else if v.path && !strings.HasPrefix(v.value, "/") {
			add(v.field, "%q is not an absolute path", v.value)
		}
	}
	if strings.TrimFunc(o.UID, func(r rune) bool {
		return r == '-' || ('a' <= r && r <= 'z') || ('A' <= r && r <= 'Z') || ('0' <= r && r <= '9')
	}) != "" || len(o.UID) > 63 {
		add("uid", "%q is not a UID (letters, digits and dashes, at most 63)", o.UID)
	}
	if o.ListenAddress != "" {
		if a, err := netip.ParseAddr(o.ListenAddress); err != nil || a.Zone() != "" {
			add("listenAddress", "%q is not an IP address", o.ListenAddress)
		}
	}
	for i, d := range o.DeniedDestinationCIDRs {
		if _, err := parseCIDROrAddr(d); err != nil {
			add(fmt.Sprintf("deniedDestinationCIDRs[%d]", i), "%v", err)
		}
	}
	if o.OwnAddressesFile != "" {
		if msg := checkToken(o.OwnAddressesFile); msg != "" || !strings.HasPrefix(o.OwnAddressesFile, "/") {
			add("ownAddressesFile", "%q must be an absolute path without whitespace or quotes", o.OwnAddressesFile)
		}
	}
	if o.HostsFile != "" {
		if msg := checkToken(o.HostsFile); msg != "" || !strings.HasPrefix(o.HostsFile, "/") {
			add("hostsFile", "%q must be an absolute path without whitespace or quotes", o.HostsFile)
		}
	}
	for i, n := range o.DNSNameservers {
		if a, err := netip.ParseAddr(n); err != nil || a.Zone() != "" {
			add(fmt.Sprintf("dnsNameservers[%d]", i), "%q is not an IP address", n)
		}
	}
	if o.ShutdownLifetime < 0 {
		add("shutdownLifetime", "%s is negative", o.ShutdownLifetime)
	}
	if len(errs) > 0 {
		return o, proxy.Classify(proxy.ClassPermanent, errs)
	}
	return o, nil
}

// checkToken returns why v cannot be one squid.conf token, or "".
func checkToken(v string) string {
	if strings.IndexFunc(v, func(r rune) bool {
		return unicode.IsSpace(r) || unicode.IsControl(r) || r == '#' || r == '"' || r == '\''
	}) >= 0 {
		return "must not contain whitespace, control characters, '#' or quotes"
	}
	return ""
}

// clientCIDRs returns the client CIDRs as Squid should see them: masked,
// IPv4 written as IPv4, without duplicates or CIDRs inside another (Squid
// warns about those and drops them itself), sorted so that reordering the
// list does not cause a rollout.
//
// Squid turns 0.0.0.0/0 into "all", IPv6 included, and matches IPv4 clients
// as ::ffff:a.b.c.d, so ::/0 would admit every IPv4 client. Neither is
// what the user wrote, so 0.0.0.0/0 is written as two /1 halves and ::/0 as
// the IPv6 space outside ::/4 (Squid's own "ipv6") plus ::1.
func clientCIDRs(in []string) []string {
	var ps []netip.Prefix
	for _, c := range in {
		p := netip.MustParsePrefix(c).Masked() // Validate checked it.
		if a := p.Addr(); a.Is4In6() && p.Bits() >= v4Mapped.Bits() {
			p = netip.PrefixFrom(a.Unmap(), p.Bits()-v4Mapped.Bits())
		}
		switch {
		case p.Bits() == 0 && p.Addr().Is4():
			ps = append(ps, netip.MustParsePrefix("0.0.0.0/1"), netip.MustParsePrefix("128.0.0.0/1"))
		case p.Bits() == 0:
			for _, s := range []string{"::1/128", "1000::/4", "2000::/3", "4000::/2", "8000::/1"} {
				ps = append(ps, netip.MustParsePrefix(s))
			}
		default:
			ps = append(ps, p)
		}
	}
	// Compare in Squid's single address space, where IPv4 is IPv4-mapped.
	wide := func(p netip.Prefix) netip.Prefix {
		if p.Addr().Is4() {
			return netip.PrefixFrom(netip.AddrFrom16(p.Addr().As16()), p.Bits()+v4Mapped.Bits())
		}
		return p
	}
	return compactBy(ps, func(q, p netip.Prefix) bool {
		return wide(q).Bits() < wide(p).Bits() && wide(q).Contains(wide(p).Addr())
	})
}

// connectPorts returns the CONNECT ports: the allowed ports, or 443.
func connectPorts(allowed []int32) []int32 {
	if len(allowed) == 0 {
		return defaultConnectPorts
	}
	return sortedPorts(allowed)
}

// safePorts returns the ports other requests may go to.
func safePorts(allowed []int32) []int32 {
	return sortedPorts(append(slices.Clone(plainHTTPPorts), allowed...))
}

func sortedPorts(ports []int32) []int32 {
	out := slices.Clone(ports)
	slices.Sort(out)
	return slices.Compact(out)
}

func portStrings(ports []int32) []string {
	s := make([]string, len(ports))
	for i, p := range ports {
		s[i] = strconv.Itoa(int(p))
	}
	return s
}

// destinations returns the allow-list as Squid's dstdomain needs it:
// lower-case, sorted, and without entries that another covers, because
// Squid refuses to start when example.com and .example.com (or
// a.example.com and .example.com) are both listed.
func destinations(in []string) []string {
	ds := make([]string, len(in))
	for i, d := range in {
		ds[i] = strings.ToLower(d)
	}
	slices.Sort(ds)
	ds = slices.Compact(ds)
	var out []string
	for _, d := range ds {
		host := strings.TrimPrefix(d, ".")
		covered := false
		for _, o := range ds {
			if o != d && strings.HasPrefix(o, ".") && (host == o[1:] || strings.HasSuffix(host, o)) {
				covered = true
				break
			}
		}
		if !covered {
			out = append(out, d)
		}
	}
	return out
}

// htpasswdLine returns the htpasswd line for one user, with a SHA-512-crypt
// hash (see sha512crypt.go for why that scheme).
//
// The salt must be stable, or every render would change Hash and roll the
// proxy out again. It is derived from the username and a non-secret
// per-proxy seed, never from the password: a salt computed quickly from
// the password would let anyone holding the file test guesses against the
// salt and skip the slow hash.
func htpasswdLine(username, password, seed string) string {
	mac := hmac.New(sha256.New, []byte("provider-egressproxy htpasswd salt v1"))
	mac.Write([]byte(seed))
	mac.Write([]byte{0})
	mac.Write([]byte(username))
	sum := mac.Sum(nil)
	salt := make([]byte, sha512CryptMaxSalt)
	for i := range salt {
		salt[i] = cryptAlphabet[sum[i]&0x3f]
	}
	return username + ":" + sha512Crypt([]byte(password), salt, sha512CryptDefaultRounds) + "\n"
}

// ReportPort is the port the egress check from inside an instance
// (ReportScript) connects to on the instance's loopback: the proxy's own,
// or, when the proxy listens with TLS only, the plain loopback listener
// Render adds next to it (the port after the proxy's, or the one before
// the last port).
func ReportPort(s proxy.Settings) int32 {
	switch {
	case s.TLS == nil:
		return s.Port
	case s.Port >= 65535:
		return s.Port - 1
	default:
		return s.Port + 1
	}
}
