//go:build linux

package controlplane

import (
	"crypto/rand"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/netip"
	"os/exec"
	"slices"
	"strconv"
	"strings"
)

const cniBinDir = "/usr/lib/cni"

// bridgeUp creates the pod bridge with the gateway address, before the
// kubelet (whose node address it is) and before any pod (the CNI bridge
// plugin takes it as it is).
func (n *Node) bridgeUp() error {
	gw := netip.PrefixFrom(n.Gateway, n.PodCIDR.Bits()).String()
	for _, args := range [][]string{
		{"link", "add", n.Bridge, "type", "bridge"},
		{"addr", "add", gw, "dev", n.Bridge},
		{"link", "set", n.Bridge, "up"},
		// Cluster IPs by the bridge too: before kube-proxy's rules are in
		// place (or after they are gone) a connection to one goes nowhere,
		// never out of the machine's own interface.
		{"route", "add", n.serviceCIDR.String(), "dev", n.Bridge, "src", n.Gateway.String()},
	} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			return fmt.Errorf("ip %s: %w: %s", strings.Join(args, " "), err, out)
		}
	}
	return nil
}

// lastPodAddr is the last address host-local hands out: .200 of a /24.
func lastPodAddr(p netip.Prefix) netip.Addr {
	a := p.Addr().As4()
	a[3] = 200
	return netip.AddrFrom4(a)
}

func bridges() []string {
	ifs, _ := net.Interfaces()
	var out []string
	for _, i := range ifs {
		if strings.HasPrefix(i.Name, bridgePrefix) {
			out = append(out, i.Name)
		}
	}
	return out
}

// freeCIDRs picks two /24s in 10.213.0.0/16 that no route of this
// machine touches: the pod network, with the bridge name for it, and the
// Services' (routed onto the bridge: a range of the machine's own there
// would lose its traffic).
func freeCIDRs() (pods netip.Prefix, bridge string, services netip.Prefix, err error) {
	out, err := exec.Command("ip", "-4", "route", "show", "table", "all").Output()
	if err != nil {
		return netip.Prefix{}, "", netip.Prefix{}, fmt.Errorf("ip route: %w", err)
	}
	var used []netip.Prefix
	for _, l := range strings.Split(string(out), "\n") {
		f := strings.Fields(l)
		if len(f) == 0 {
			continue
		}
		dst := f[0]
		if dst == "default" || dst == "local" || dst == "broadcast" {
			if len(f) > 1 && dst != "default" {
				dst = f[1]
			} else {
				continue
			}
		}
		if !strings.Contains(dst, "/") {
			dst += "/32"
		}
		if p, err := netip.ParsePrefix(dst); err == nil {
			used = append(used, p)
		}
	}
	var free []int
	start, _ := rand.Int(rand.Reader, big.NewInt(250))
	for i := 0; i < 250 && len(free) < 2; i++ {
		n := (int(start.Int64())+i)%250 + 1
		if !slices.ContainsFunc(used, slash24(n).Overlaps) {
			free = append(free, n)
		}
	}
	if len(free) < 2 {
		return netip.Prefix{}, "", netip.Prefix{}, errors.New("no two free /24s in 10.213.0.0/16 for the pod network and the Services")
	}
	return slash24(free[0]), bridgePrefix + strconv.Itoa(free[0]), slash24(free[1]), nil
}

func slash24(n int) netip.Prefix {
	return netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 213, byte(n), 0}), 24)
}
