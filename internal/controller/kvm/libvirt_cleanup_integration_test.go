package kvm_test

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/egressproxy/provider-egressproxy/internal/backend/kvm/kvmtest"
)

// The real libvirtd is shared: by the packages of one make test, which run
// in parallel, and by every clone of the repository on this machine. What
// a test creates there is named after this process (runID), so that its
// clean-up, a Purge and the provider's orphan sweep (by installation ID)
// only ever match this run's domains and volumes.

// runID is this test process's own: its PID (which tells a killed run's
// leftovers from a live one's, see sweepDeadRuns) and a random part.
var runID = func() string {
	b := make([]byte, 2)
	_, _ = rand.Read(b)
	return fmt.Sprintf("%d-%s", os.Getpid(), hex.EncodeToString(b))
}()

// runName is base with this run's ID: a namespace, an installation ID.
func runName(base string) string { return base + "-" + runID }

var installationRE = regexp.MustCompile(`<installation>([^<]*)</installation>`)

// sweepDeadRuns removes the domains (and their overlays and seeds) that an
// earlier run of this test, killed before its Delete, left: those whose
// ownership mark names an installation runName(base) of a process that no
// longer runs. A domain of a run still going, of another installation or
// without the mark is left as it is.
func sweepDeadRuns(t *testing.T, h *kvmtest.Host, base string) {
	t.Helper()
	prefix := base + "-"
	for _, d := range h.Domains(t) {
		out, err := exec.Command("virsh", "-c", "qemu:///system", "metadata", d, "--uri", "https://egressproxy.io/kvm/v1alpha1").Output()
		if err != nil {
			continue // no mark: not the provider's
		}
		m := installationRE.FindStringSubmatch(string(out))
		if m == nil || !strings.HasPrefix(m[1], prefix) {
			continue
		}
		pidPart, _, ok := strings.Cut(strings.TrimPrefix(m[1], prefix), "-")
		pid, err := strconv.Atoi(pidPart)
		if !ok || err != nil || pid <= 0 || processRuns(pid) {
			continue
		}
		t.Logf("removing domain %s left by a killed run (installation %s)", d, m[1])
		h.Purge(d)
	}
}

// processRuns says whether a process pid exists (one of another user's
// included).
func processRuns(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

// instanceVolumes are the overlay and NoCloud seed volumes of a domain.
func instanceVolumes(domain string) []string {
	return []string{domain + ".qcow2", domain + "-seed.iso"}
}

// freeSubnet is a /24 in 192.168.0.0/16 for a network of the test's own
// that no route of this machine's covers or falls inside (another clone's
// test network included, once started), starting at an offset of this
// process's own so that concurrent runs try different ones first. libvirt
// itself refuses a network whose subnet a route already uses, so a race
// lost between here and net-create fails there, and the caller tries the
// next. skip lists subnets already tried.
func freeSubnet(t *testing.T, skip ...string) (prefix string) {
	t.Helper()
	out, err := exec.Command("ip", "-4", "route", "show", "table", "all").Output()
	if err != nil {
		t.Fatalf("ip route: %v", err)
	}
	var used []netip.Prefix
	for _, l := range strings.Split(string(out), "\n") {
		f := strings.Fields(l)
		if len(f) > 1 && slices.Contains([]string{"local", "broadcast", "unicast", "multicast", "anycast", "unreachable", "prohibit", "blackhole", "throw"}, f[0]) {
			f = f[1:]
		}
		if len(f) == 0 || f[0] == "default" {
			continue
		}
		p, err := netip.ParsePrefix(f[0])
		if err != nil {
			a, aerr := netip.ParseAddr(f[0])
			if aerr != nil {
				continue
			}
			p = netip.PrefixFrom(a, 32)
		}
		if p.Bits() > 0 {
			used = append(used, p)
		}
	}
	const first, last = 200, 254
	start := os.Getpid() % (last - first + 1)
	for i := range last - first + 1 {
		third := first + (start+i)%(last-first+1)
		cand := netip.MustParsePrefix(fmt.Sprintf("192.168.%d.0/24", third))
		if slices.Contains(skip, fmt.Sprintf("192.168.%d", third)) ||
			slices.ContainsFunc(used, func(p netip.Prefix) bool { return p.Overlaps(cand) }) {
			continue
		}
		return fmt.Sprintf("192.168.%d", third)
	}
	t.Fatalf("no free /24 in 192.168.%d.0-192.168.%d.0 (routes: %v)", first, last, used)
	return ""
}
