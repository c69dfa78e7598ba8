package proxmox

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"testing"

	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

// TestClassify: every error is classified once, by where it came from:
// the API's status and text (with the real 500 texts), TLS verification,
// the network.
func TestClassify(t *testing.T) {
	api := func(status int, msg string) error {
		return &APIError{Method: "GET", Path: "/x", Status: status, Message: msg}
	}
	cases := []struct {
		err  error
		want proxy.Class
	}{
		{api(500, "Configuration file 'nodes/pve1/qemu-server/100.conf' does not exist"), proxy.ClassNotFound},
		{api(500, "VM is locked (backup)"), proxy.ClassTransient},
		{api(500, "can't lock file '/var/lock/qemu-server/lock-100.conf' - got timeout"), proxy.ClassTransient},
		{api(500, "unable to create VM 100: config file already exists"), proxy.ClassTransient},
		{api(500, "detected modified configuration - file changed by other user? Try again."), proxy.ClassTransient},
		{api(500, "QEMU guest agent is not running"), proxy.ClassTransient},
		{api(500, "can't clone VM to node 'pve2' (VM uses local storage)"), proxy.ClassPermanent},
		{api(595, "No route to host"), proxy.ClassTransient},
		{api(596, "Connection timed out"), proxy.ClassTransient},
		{api(400, "Parameter verification failed."), proxy.ClassPermanent},
		{api(401, "invalid token value!"), proxy.ClassPermanent},
		{api(403, "Permission check failed (/vms/100, VM.Allocate)"), proxy.ClassPermanent},
		{api(501, "Method 'GET /nodes/pve1/nope' not implemented"), proxy.ClassPermanent},
		{fmt.Errorf("wrapped: %w", api(500, "VM is locked (clone)")), proxy.ClassTransient},
		{&callError{what: "GET /version", err: x509.UnknownAuthorityError{}}, proxy.ClassPermanent},
		{&callError{what: "GET /version", err: x509.HostnameError{Host: "pve"}}, proxy.ClassPermanent},
		{&callError{what: "GET /version", err: &net.OpError{Op: "dial", Err: errors.New("connection refused")}}, proxy.ClassTransient},
		{context.DeadlineExceeded, proxy.ClassTransient},
		{proxy.Quotaf("full"), proxy.ClassQuota},
	}
	for _, c := range cases {
		if got := proxy.ClassOf(classify(c.err)); got != c.want {
			t.Errorf("classify(%v) = %s; want %s", c.err, got, c.want)
		}
	}
}

// TestProbeWindow: the window is deterministic per UID, inside the range,
// without repeats, and different UIDs start at different places.
func TestProbeWindow(t *testing.T) {
	a := probeWindow("uid-a", 100000, 199999)
	if b := probeWindow("uid-a", 100000, 199999); fmt.Sprint(a) != fmt.Sprint(b) {
		t.Errorf("the window of one UID changed: %v, %v", a, b)
	}
	if len(a) != maxProbes {
		t.Errorf("window of %d; want %d", len(a), maxProbes)
	}
	if probeWindow("uid-b", 100000, 199999)[0] == a[0] {
		t.Errorf("two UIDs start at the same VMID %d", a[0])
	}
	small := probeWindow("uid-a", 100, 104)
	seen := map[int]bool{}
	for _, id := range small {
		if id < 100 || id > 104 || seen[id] {
			t.Errorf("window %v leaves the range or repeats", small)
		}
		seen[id] = true
	}
	if len(small) != 5 {
		t.Errorf("window %v; want the whole small range", small)
	}
}

// TestDescriptionRoundTrip: what the driver writes in a description it
// reads back, and an admin's own lines survive.
func TestDescriptionRoundTrip(t *testing.T) {
	in := description{name: "n", mark: proxy.Mark{UID: "u", InstallationID: "i"}, port: 3128, seedNode: "pve1",
		seedVolID: "local:iso/x.iso", applying: "abc", applyingSince: 42, rest: []string{"owner: team payments"}}
	rebooted := in
	rebooted.rebootedBefore = []string{"UPID:pve1:0000A1B2:00C0FFEE:0000002A:qmreboot:100:root@pam:"}
	for _, in := range []description{in, rebooted} {
		out := parseDescription(in.String())
		if fmt.Sprintf("%+v", in) != fmt.Sprintf("%+v", out) {
			t.Errorf("round trip:\n in %+v\nout %+v", in, out)
		}
	}
	tg := parseTags("prod;" + MarkTags(proxy.Mark{UID: "u-1", InstallationID: "inst"}, "0123"))
	if !tg.managed || tg.mark.UID != "u-1" || tg.mark.InstallationID != "inst" || tg.spec != "0123" || fmt.Sprint(tg.others) != "[prod]" {
		t.Errorf("tags parsed as %+v", tg)
	}
}
