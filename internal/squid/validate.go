package squid

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

// FieldError is one problem with one field of proxy.Settings. Field uses
// the names of the managed resource's spec (allowedClientCIDRs[1],
// auth.username) so a user can find what to fix. Neither Field nor Detail
// ever holds the password, nor the username (a username field is where a
// pasted "user:password" would land).
type FieldError struct {
	// Field is the path of the offending field, with an index for list
	// items.
	Field string
	// Detail says what is wrong and what is wanted.
	Detail string
}

// Error returns "field: detail".
func (e *FieldError) Error() string { return e.Path() + ": " + e.Detail }

// Path is the field as a user finds it: the proxy block's fields under
// the managed resource's spec.forProvider.proxy, the egress check's in
// the ProviderConfig that names it, a backend's rendering options as
// they are.
func (e *FieldError) Path() string {
	switch {
	case strings.HasPrefix(e.Field, "egressCheck."):
		return "the ProviderConfig's " + e.Field
	case strings.HasPrefix(e.Field, "options."):
		return e.Field // the backend's own rendering options, not a user's field
	default:
		return "spec.forProvider.proxy." + e.Field
	}
}

// fieldErrors is every problem Validate found, so that a user fixes them
// all in one round instead of one per reconcile.
type fieldErrors []*FieldError

// Error joins the problems on one line, for a condition message.
func (es fieldErrors) Error() string {
	msgs := make([]string, len(es))
	for i, e := range es {
		msgs[i] = e.Error()
	}
	return strings.Join(msgs, "; ")
}

// Unwrap lets errors.As find each *FieldError.
func (es fieldErrors) Unwrap() []error {
	out := make([]error, len(es))
	for i, e := range es {
		out[i] = e
	}
	return out
}

// Limits that keep values sane; none is a Squid limit that users meet.
const (
	maxUsernameLen = 128
	maxPasswordLen = 1024
	// minOpenPasswordLen is the least password of a proxy whose clients
	// are broader than a proxy without auth may serve.
	minOpenPasswordLen = 16
	maxDomainLen       = 253
	maxLabelLen        = 63
)

// v4Mapped is the IPv4-mapped IPv6 range. Squid stores every address as
// IPv6 and IPv4 clients as ::ffff:a.b.c.d, so an IPv6 CIDR that covers this
// range admits every IPv4 client too.
var v4Mapped = netip.MustParsePrefix("::ffff:0:0/96")

// Validate checks settings before they are rendered, and reports every
// problem at once, each naming its field. The error is classified
// proxy.ClassPermanent (retrying cannot help until the user changes the
// resource); errors.As finds each *FieldError in it.
//
// The rules keep the proxy from ever being open by accident: at least one
// client CIDR is required (0.0.0.0/0 is accepted, but only when written),
// and a bare address is refused rather than guessed to be a /32.
func Validate(s proxy.Settings) error {
	var errs fieldErrors
	add := func(field, format string, args ...any) {
		errs = append(errs, &FieldError{Field: field, Detail: fmt.Sprintf(format, args...)})
	}

	if s.Port < 1 || s.Port > 65535 {
		add("port", "%d is out of range (want 1-65535)", s.Port)
	}

	if len(s.AllowedClientCIDRs) == 0 {
		add("allowedClientCIDRs", "at least one CIDR is required: the proxy never serves everyone by default")
	}
	entriesOK := true
	for i, c := range s.AllowedClientCIDRs {
		if msg := checkCIDR(c); msg != "" {
			add(fmt.Sprintf("allowedClientCIDRs[%d]", i), "%s", msg)
			entriesOK = false
		} else if msg := checkOpen(c); msg != "" && !s.Auth.Enabled {
			add(fmt.Sprintf("allowedClientCIDRs[%d]", i), "%s", msg)
			entriesOK = false
		}
	}
	// The limit holds for the entries together too (once each entry is
	// sound, so that one broad entry is reported once).
	if entriesOK && !s.Auth.Enabled {
		if msg := checkOpenUnion(s.AllowedClientCIDRs); msg != "" {
			add("allowedClientCIDRs", "%s", msg)
		}
	}

	for i, p := range s.AllowedPorts {
		if p < 1 || p > 65535 {
			add(fmt.Sprintf("allowedPorts[%d]", i), "%d is out of range (want 1-65535)", p)
		}
	}
	// A request to the proxy's own port could reach the proxy itself (by
	// an address of its own that no list knows: a NAT, a load balancer) and
	// loop; so its port is never a destination port.
	if s.Port >= 1 && s.Port <= 65535 && slices.Contains(safePorts(s.AllowedPorts), s.Port) || (len(s.AllowedPorts) == 0 && slices.Contains(defaultConnectPorts, s.Port)) {
		add("port", "%d is also a destination port (plain HTTP goes to 80 and 443, CONNECT to allowedPorts, 443 by default); a request there could loop back into the proxy: listen on another port, such as 3128", s.Port)
	}

	for i, c := range s.AllowedDestinationCIDRs {
		if msg := checkDestinationCIDR(c); msg != "" {
			add(fmt.Sprintf("allowedDestinationCIDRs[%d]", i), "%s", msg)
		}
	}

	for i, d := range s.AllowedDestinations {
		if msg := checkDestination(d); msg != "" {
			add(fmt.Sprintf("allowedDestinations[%d]", i), "%s", msg)
		}
	}

	if s.Auth.Enabled {
		if msg := checkUsername(s.Auth.Username); msg != "" {
			add("auth.username", "%s", msg)
		}
		if msg := checkPassword(s.Auth.Password); msg != "" {
			// The password comes from the Secret the resource names (or is
			// generated), so the user fixes it there.
			add("auth.passwordSecretRef", "%s", msg)
		} else if len(s.Auth.Password) < minOpenPasswordLen && broaderThanWithoutAuth(s.AllowedClientCIDRs) {
			// Only the password stands between such a proxy and everyone
			// its clients' ranges hold: Squid does not slow guessing down.
			add("auth.passwordSecretRef", "the password is shorter than %d bytes, and the clients' ranges are broader than a proxy without auth may serve (a /8 of IPv4, a /32 of IPv6), so only the password keeps the proxy from being open: use a longer one, or leave passwordSecretRef out for a generated one", minOpenPasswordLen)
		}
	}
	if c := s.EgressCheck; c != nil {
		errs = append(errs, checkEgressCheck(s, c)...)
	}
	if t := s.TLS; t != nil && (t.Cert == "" || t.Key == "" || t.CA == "") {
		// LoadTLS checks the Secret's content; this is the contract's.
		add("tls", "needs a certificate, its key and a CA")
	}

	if len(errs) == 0 {
		return nil
	}
	return proxy.Classify(proxy.ClassPermanent, errs)
}

// checkCIDR returns what is wrong with one client CIDR, or "".
func checkCIDR(c string) string {
	p, err := netip.ParsePrefix(c)
	if err != nil {
		if a, aerr := netip.ParseAddr(c); aerr == nil && !strings.Contains(c, "/") {
			bits := 32
			example := "10.0.0.0/8"
			if a.Is6() {
				bits = 128
				example = "fd00::/8"
			}
			return fmt.Sprintf("%q is not a CIDR (want e.g. %s; for this one address write %s/%d)", c, example, a.WithZone(""), bits)
		}
		return fmt.Sprintf("%q is not a CIDR (want e.g. 10.0.0.0/8)", c)
	}
	// ::/0 is handled when rendering; narrower IPv6 CIDRs that still cover
	// the IPv4-mapped range would silently admit every IPv4 client.
	m := p.Masked()
	if m.Addr().Is6() && !m.Addr().Is4In6() && m.Bits() > 0 && m.Bits() < v4Mapped.Bits() && m.Contains(v4Mapped.Addr()) {
		return fmt.Sprintf("%q also covers every IPv4 client (Squid sees IPv4 clients as ::ffff:0:0/96); list IPv6 and IPv4 CIDRs separately", c)
	}
	return ""
}

// Without auth, the clients are a short, explicit list: no client CIDR
// broader than these, so that the proxy is never open to much of the
// internet, whether written as 0.0.0.0/0 or as its halves.
const (
	MinOpenPrefixV4 = 8
	MinOpenPrefixV6 = 32
)

// checkOpen returns why a client CIDR needs auth, or "".
func checkOpen(c string) string {
	p := normalize(netip.MustParsePrefix(c))
	if p.Addr().Is4() && p.Bits() < MinOpenPrefixV4 || p.Addr().Is6() && p.Bits() < MinOpenPrefixV6 {
		return fmt.Sprintf("%q is broader than /%d (IPv4) or /%d (IPv6), too many clients for a proxy without a password; narrow it, or turn on auth (auth.enabled: true), which makes it allowed", c, MinOpenPrefixV4, MinOpenPrefixV6)
	}
	return ""
}

// checkDestination returns what is wrong with one allow-list entry, or "".
// Squid's dstdomain takes "example.com" (that host only) and
// ".example.com" (it and every subdomain); anything else would either fail
// Squid's parse or match something other than what the user meant.
func checkDestination(d string) string {
	switch {
	case d == "":
		return "must not be empty (want e.g. example.com or .example.com)"
	case strings.IndexFunc(d, unicode.IsSpace) >= 0:
		return fmt.Sprintf("%q contains whitespace (want e.g. example.com or .example.com)", d)
	case strings.Contains(d, "*"):
		return fmt.Sprintf("%q has a wildcard; write a leading dot instead (.example.com matches example.com and every subdomain)", d)
	case strings.Contains(d, "/") || strings.Contains(d, ":") || strings.Contains(d, "@"):
		return fmt.Sprintf("%q is not a domain name (no scheme, port, path or IP address; want e.g. example.com or .example.com)", d)
	}
	if !utf8.ValidString(d) || strings.IndexFunc(d, func(r rune) bool { return r > unicode.MaxASCII }) >= 0 {
		return fmt.Sprintf("%q is not ASCII; write an internationalized name in its xn-- (punycode) form", d)
	}
	name := strings.TrimPrefix(d, ".")
	if len(name) > maxDomainLen {
		return fmt.Sprintf("%q is longer than %d characters", d, maxDomainLen)
	}
	if strings.HasSuffix(name, ".") {
		return fmt.Sprintf("%q must not end with a dot", d)
	}
	if _, err := netip.ParseAddr(name); err == nil {
		return fmt.Sprintf("%q is an IP address; the allow-list takes domain names only", d)
	}
	labels := strings.Split(name, ".")
	for _, l := range labels {
		if l == "" {
			return fmt.Sprintf("%q has an empty label (want e.g. example.com or .example.com)", d)
		}
		if len(l) > maxLabelLen {
			return fmt.Sprintf("%q has a label longer than %d characters", d, maxLabelLen)
		}
		if l[0] == '-' || l[len(l)-1] == '-' {
			return fmt.Sprintf("%q has a label that starts or ends with '-'", d)
		}
		for _, r := range l {
			if !isDomainChar(r) {
				return fmt.Sprintf("%q contains %q; domain names take letters, digits, '-' and '_' (and a leading '.')", d, r)
			}
		}
	}
	// An all-digit last label is never a real top-level domain; such names
	// are IP addresses in disguise (10.1, 192.168.0.1.2) and would only
	// match by accident.
	if last := strings.ToLower(labels[len(labels)-1]); strings.Trim(last, "0123456789") == "" || strings.HasPrefix(last, "0x") && strings.Trim(last[2:], "0123456789abcdef") == "" {
		return fmt.Sprintf("%q looks like an IP address; the allow-list takes domain names only", d)
	}
	return ""
}

func isDomainChar(r rune) bool {
	return r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_'
}

// checkUsername returns what is wrong with the username, or "". It never
// quotes the username: a user who pastes "user:password" into it would see
// the password in a condition message.
func checkUsername(u string) string {
	switch {
	case u == "":
		return "must not be empty when auth is enabled"
	case len(u) > maxUsernameLen:
		return fmt.Sprintf("must be at most %d bytes", maxUsernameLen)
	case strings.Contains(u, ":"):
		// htpasswd lines and Basic credentials both split at the first ':'.
		return "must not contain ':' (it separates username and password)"
	case strings.HasPrefix(u, "#"):
		// basic_ncsa_auth skips htpasswd lines that start with '#'.
		return "must not start with '#' (the htpasswd file would treat the line as a comment)"
	case u == "REQUIRED":
		// The name goes into a proxy_auth ACL, where REQUIRED is any user
		// (the egress check's credential included).
		return "must not be REQUIRED (Squid reads it as any valid user); choose another name"
	case strings.HasPrefix(u, "-"), strings.HasPrefix(u, `"`), strings.HasPrefix(u, "'"):
		// In an ACL, Squid reads a leading '-' as an option and a quoted
		// value as a file to read the names from.
		return "must not start with '-' or a quote (Squid would read an ACL option or a file name); start with a letter, digit, '.' or '_'"
	case !utf8.ValidString(u):
		return "must be valid UTF-8"
	case strings.IndexFunc(u, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }) >= 0:
		return "must not contain whitespace or control characters"
	}
	return ""
}

// broaderThanWithoutAuth reports whether the client ranges (each sound)
// are more than a proxy without auth may serve.
func broaderThanWithoutAuth(cidrs []string) bool {
	for _, c := range cidrs {
		if checkCIDR(c) != "" {
			return false
		}
		if checkOpen(c) != "" {
			return true
		}
	}
	return checkOpenUnion(cidrs) != ""
}

// checkPassword returns what is wrong with the password, or "". It never
// quotes the password.
func checkPassword(p string) string {
	switch {
	case p == "":
		return "the password is empty; auth needs one"
	case len(p) > maxPasswordLen:
		return fmt.Sprintf("the password must be at most %d bytes", maxPasswordLen)
	case strings.IndexFunc(p, unicode.IsControl) >= 0:
		// A NUL or a newline cannot reach basic_ncsa_auth intact; a
		// trailing newline is the usual slip when a Secret is made from a
		// file.
		return "the password must not contain control characters (a trailing newline, say)"
	}
	return ""
}
